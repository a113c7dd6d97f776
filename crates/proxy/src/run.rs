//! Running one proxied request: the pass-through path, and the watched
//! path's attempts (watchdog, retries, continuation, the held response
//! head); a whole answer assembled from them in [`whole`].

mod whole;

use std::collections::VecDeque;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::Response;
use bytes::Bytes;
use futures_util::StreamExt as _;
use rand::SeedableRng as _;
use serde_json::Value;
use tokio::sync::oneshot;
use tokio::time::Instant;
use tracing::Instrument as _;
use warden_core::StreamError;
use warden_llm::sse::{Parsed, SseParser};

use crate::access::{AccessRecord, Outcome, Recovery};
use crate::config::ProxyConfig;
use crate::headers;
use crate::spans::{PROXY_ATTEMPT, PROXY_CONTINUE, PROXY_KILL, PROXY_REQUEST};
use crate::splice::{self, Resume, Splice};
use crate::upstream::{self, Protocol, Upstream, error_response};

/// What every request of a running proxy shares.
pub(crate) struct Inner {
    pub(crate) config: ProxyConfig,
    pub(crate) http: reqwest::Client,
    pub(crate) watchdog: warden_core::watchdog::WatchdogHandle,
    pub(crate) admission: warden_core::Admission,
    /// Cancelled when the proxy ends its open responses (shutdown).
    pub(crate) stopping: tokio_util::sync::CancellationToken,
}

/// Why a request ends when its deadline passes.
fn past_deadline() -> StreamError {
    StreamError::Interrupted {
        reason: "the request's deadline passed".to_owned(),
    }
}

/// Sleeps until `deadline`; never, without one.
async fn until(deadline: Option<Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Why an attempt ends when the proxy shuts down.
fn shutting_down() -> StreamError {
    StreamError::Interrupted {
        reason: "the proxy is shutting down".to_owned(),
    }
}

/// Hands `recovery` to the configured recovery log, if any.
fn report(inner: &Inner, recovery: Recovery) {
    if let Some(log) = &inner.config.recovery_log {
        log(&recovery);
    }
}

/// The access record of a request to `upstream`, before it is answered.
pub(crate) fn new_record(upstream: Upstream, request: &Request) -> AccessRecord {
    AccessRecord {
        upstream: upstream.name(),
        method: request.method().to_string(),
        path: request.uri().path().to_owned(),
        status: 0,
        duration_ms: 0,
        attempts: 1,
        kills: 0,
        continuations: 0,
        outcome: Outcome::Passthrough,
    }
}

/// Where requests to `upstream` go.
pub(crate) fn base_of(inner: &Inner, upstream: Upstream) -> &str {
    match upstream {
        Upstream::Anthropic => &inner.config.anthropic_upstream,
        Upstream::OpenAi => &inner.config.openai_upstream,
    }
}

fn upstream_url(base: &str, uri: &axum::http::Uri) -> String {
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    format!("{}{path}", base.trim_end_matches('/'))
}

fn finish(inner: &Inner, mut record: AccessRecord, started: Instant) {
    record.duration_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    let span = tracing::Span::current();
    span.record("warden.status", record.status);
    span.record("warden.attempts", record.attempts);
    span.record("warden.kills", record.kills);
    span.record("warden.continuations", record.continuations);
    span.record("warden.outcome", record.outcome.as_str());
    if let Some(log) = &inner.config.access_log {
        log(&record);
    }
}

fn request_span(record: &AccessRecord) -> tracing::Span {
    tracing::info_span!(
        PROXY_REQUEST,
        otel.name = PROXY_REQUEST,
        warden.upstream = record.upstream,
        warden.path = %record.path,
        warden.status = tracing::field::Empty,
        warden.attempts = tracing::field::Empty,
        warden.kills = tracing::field::Empty,
        warden.continuations = tracing::field::Empty,
        warden.outcome = tracing::field::Empty,
    )
}

/// A request that is not watched: sent on as it is, both bodies streamed.
/// `base` is where it goes; `upstream` says in which shape the proxy's own
/// error answers are written.
pub(crate) async fn passthrough(
    inner: Arc<Inner>,
    upstream: Upstream,
    base: String,
    request: Request,
    record: AccessRecord,
    started: Instant,
) -> Response {
    let span = request_span(&record);
    let (parts, body) = request.into_parts();
    let body = reqwest::Body::wrap_stream(body.into_data_stream());
    send_through(inner, upstream, &base, parts, body, record, started)
        .instrument(span)
        .await
}

/// A request no upstream is configured for, answered here: `200` for
/// `HEAD /` and `GET /` (clients probing for a server), else `404` in the
/// provider's error shape. Nothing is forwarded.
pub(crate) fn local(
    inner: &Inner,
    upstream: Upstream,
    request: &Request,
    mut record: AccessRecord,
    started: Instant,
) -> Response {
    let span = request_span(&record);
    let _entered = span.enter();
    let path = request.uri().path();
    let probe = path == "/" && matches!(*request.method(), Method::GET | Method::HEAD);
    let response = if probe {
        Response::new(Body::empty())
    } else {
        error_response(
            upstream,
            StatusCode::NOT_FOUND,
            &format!(
                "warden proxy: {path} is not an Anthropic or OpenAI API path (those start with \
                 /v1/), and no upstream is configured for other paths; nothing was forwarded"
            ),
        )
    };
    record.status = response.status().as_u16();
    record.outcome = Outcome::Local;
    finish(inner, record, started);
    response
}

async fn send_through(
    inner: Arc<Inner>,
    upstream: Upstream,
    base: &str,
    parts: axum::http::request::Parts,
    body: reqwest::Body,
    mut record: AccessRecord,
    started: Instant,
) -> Response {
    let url = upstream_url(base, &parts.uri);
    let sent = inner
        .http
        .request(parts.method, url)
        .headers(headers::end_to_end(&parts.headers))
        .body(body)
        .send()
        .await;
    let response = match sent {
        Ok(r) => r,
        Err(e) => {
            report(
                &inner,
                Recovery::Unreachable {
                    upstream: upstream.name(),
                    path: record.path.clone(),
                    reason: reason(&e),
                },
            );
            record.status = 502;
            record.outcome = Outcome::UpstreamError;
            finish(&inner, record, started);
            return error_response(
                upstream,
                StatusCode::BAD_GATEWAY,
                &format!(
                    "warden proxy: the upstream cannot be reached: {}",
                    reason(&e)
                ),
            );
        }
    };
    record.status = response.status().as_u16();
    let mut out = Response::builder().status(response.status());
    if let Some(h) = out.headers_mut() {
        *h = headers::end_to_end(response.headers());
    }
    // The record is written when the body is done with, however it ended.
    let mut logged = Logged {
        inner: Arc::clone(&inner),
        record: Some(record),
        started,
        span: tracing::Span::current(),
    };
    let body = response.bytes_stream().map(move |chunk| {
        if let (Err(_), Some(r)) = (&chunk, logged.record.as_mut()) {
            r.outcome = Outcome::UpstreamError;
        }
        chunk
    });
    out.body(Body::from_stream(body)).unwrap_or_else(|_| {
        error_response(upstream, StatusCode::BAD_GATEWAY, "bad upstream answer")
    })
}

/// Writes its access record when dropped (when the response body is done
/// with, whatever ended it).
struct Logged {
    inner: Arc<Inner>,
    record: Option<AccessRecord>,
    started: Instant,
    span: tracing::Span,
}

impl Drop for Logged {
    fn drop(&mut self) {
        if let Some(record) = self.record.take() {
            let _entered = self.span.enter();
            finish(&self.inner, record, self.started);
        }
    }
}

/// The reason of a client error, without the URL (which may carry a
/// query string the user did not mean to log).
fn reason(e: &reqwest::Error) -> String {
    let kind = if e.is_timeout() {
        "timed out"
    } else if e.is_connect() {
        "connection failed"
    } else if e.is_body() || e.is_decode() {
        "the body broke off"
    } else {
        "request failed"
    };
    // Every cause, innermost last ("client error (Connect): tcp connect
    // error: Connection refused (os error 111)"), none of them a URL (the
    // error's own text, which names it, is left out).
    match std::error::Error::source(e) {
        Some(source) => format!("{kind}: {}", warden_llm::error_chain(source)),
        None => kind.to_owned(),
    }
}

/// A watched request: buffered, then sent in attempts until its stream is
/// complete, continued where it broke.
pub(crate) async fn watched(
    inner: Arc<Inner>,
    protocol: Protocol,
    request: Request,
    record: AccessRecord,
    started: Instant,
) -> Response {
    let upstream = protocol.upstream();
    let span = request_span(&record);
    let (parts, body) = request.into_parts();
    let bytes = match axum::body::to_bytes(body, inner.config.max_body_bytes).await {
        Ok(b) => b,
        Err(_) => {
            return error_response(
                upstream,
                StatusCode::PAYLOAD_TOO_LARGE,
                &format!(
                    "request body over {} bytes (or not readable)",
                    inner.config.max_body_bytes
                ),
            );
        }
    };
    // Copied out of hyper's read buffer, of which it is a slice: kept for
    // the stream's life (each retry re-sends it), it would keep that 8 KiB
    // buffer alive while hyper allocates another to watch the connection.
    let mut bytes = Bytes::copy_from_slice(&bytes);
    let mut json: Option<Value> = serde_json::from_slice(&bytes).ok();
    let streamed = json
        .as_ref()
        .map(|v| v.get("stream").and_then(Value::as_bool));
    // A whole answer asked for: sent upstream as a stream (watched like
    // any other) and assembled here.
    let whole = matches!(streamed, Some(None | Some(false)))
        && protocol.assembles()
        && json.as_ref().is_some_and(Value::is_object);
    if whole && let Some(v) = json.as_mut() {
        v["stream"] = Value::Bool(true);
        if protocol == Protocol::ChatCompletions && v.get("stream_options").is_none() {
            // The usage of the whole answer arrives in a last chunk only
            // when asked for.
            v["stream_options"] = serde_json::json!({"include_usage": true});
        }
        match serde_json::to_vec(v) {
            Ok(b) => bytes = Bytes::from(b),
            Err(e) => {
                return error_response(
                    upstream,
                    StatusCode::INTERNAL_SERVER_ERROR,
                    &format!("warden proxy: cannot re-encode the request as a stream: {e}"),
                );
            }
        }
    }
    let splice = (whole || streamed == Some(Some(true))).then(|| splice::for_protocol(protocol));
    let (Some(splice), Some(json)) = (splice, json) else {
        // Not JSON (the upstream says what is wrong), or a Responses
        // request that is not a stream.
        let base = base_of(&inner, upstream).to_owned();
        return send_through(
            inner,
            upstream,
            &base,
            parts,
            reqwest::Body::from(bytes),
            record,
            started,
        )
        .instrument(span)
        .await;
    };
    let url = upstream_url(base_of(&inner, upstream), &parts.uri);
    let mut record = record;
    // Until the stream ends one way or another, the client left.
    record.outcome = Outcome::ClientGone;
    // Counted as each request goes upstream.
    record.attempts = 0;
    let logged = Logged {
        inner: Arc::clone(&inner),
        record: Some(record),
        started,
        span: span.clone(),
    };
    let inner_deadline = inner.config.deadline;
    let mut pump = Pump {
        headers: headers::watched_request(&parts.headers),
        inner,
        upstream,
        url,
        original: json,
        body: bytes.clone(),
        original_bytes: bytes,
        splice,
        sent: false,
        done: false,
        attempts: 0,
        current: None,
        pending: None,
        out: String::new(),
        rng: rand::rngs::SmallRng::from_rng(&mut rand::rng()),
        deadline: inner_deadline.map(|d| started + d),
        continuing: false,
        logged,
    };
    if whole {
        return whole::answer(pump, protocol).instrument(span).await;
    }
    match pump.next().instrument(span.clone()).await {
        Step::Head(headers, first) => {
            // The rest of the body is pulled by the connection as it
            // writes: no task of its own, and a client that goes away
            // drops the upstream stream with it.
            let rest = futures_util::stream::unfold(pump, move |mut pump| {
                let span = span.clone();
                async move {
                    match pump.next().instrument(span).await {
                        Step::Chunk(b) | Step::Head(_, b) => Some((b, pump)),
                        Step::Answer(_) | Step::End => None,
                    }
                }
            });
            let body = futures_util::stream::once(std::future::ready(first))
                .chain(rest)
                .map(Ok::<_, std::convert::Infallible>);
            let mut response = Response::new(Body::from_stream(body));
            *response.headers_mut() = headers;
            response
        }
        Step::Answer(response) => response,
        Step::Chunk(_) | Step::End => error_response(
            upstream,
            StatusCode::BAD_GATEWAY,
            "warden proxy: the request ended without an answer",
        ),
    }
}

/// What the next pull of a watched request gives.
enum Step {
    /// The first bytes of the stream, and the response's headers.
    Head(HeaderMap, Bytes),
    /// More bytes of the stream.
    Chunk(Bytes),
    /// A whole answer instead of a stream (only before any byte was sent).
    Answer(Response),
    /// The stream is over.
    End,
}

/// Why an attempt broke.
struct Failure {
    error: StreamError,
    killed: bool,
    /// The upstream's own error answer, if it gave one.
    answer: Option<Box<(StatusCode, HeaderMap, Bytes)>>,
}

impl Failure {
    fn of(error: StreamError) -> Self {
        Self {
            error,
            killed: false,
            answer: None,
        }
    }

    fn killed(expiry: Result<warden_core::watchdog::Expiry, oneshot::error::RecvError>) -> Self {
        match expiry {
            Ok(e) => Self {
                error: e.into(),
                killed: true,
                answer: None,
            },
            Err(_) => Self::of(StreamError::Internal {
                message: "the watchdog stopped".to_owned(),
            }),
        }
    }
}

/// The attempt being read.
struct Current {
    stream: futures_util::stream::BoxStream<'static, reqwest::Result<Bytes>>,
    headers: HeaderMap,
    parser: SseParser,
    frames: VecDeque<Parsed>,
    /// Unwatches the attempt when dropped.
    _guard: warden_core::watchdog::WatchGuard,
    beat: warden_core::watchdog::Heartbeat,
    expired: oneshot::Receiver<warden_core::watchdog::Expiry>,
    /// The progress allowance's entry (beaten by content only), if any.
    progress: Option<(
        warden_core::watchdog::WatchGuard,
        warden_core::watchdog::Heartbeat,
        oneshot::Receiver<warden_core::watchdog::Expiry>,
    )>,
    span: tracing::Span,
}

/// The most capacity a stream's output buffer keeps between chunks.
const OUT_KEEP: usize = 16 * 1024;

/// A watched request's attempts, pulled one chunk at a time by whoever
/// sends the response.
struct Pump {
    inner: Arc<Inner>,
    upstream: Upstream,
    url: String,
    headers: HeaderMap,
    original: Value,
    original_bytes: Bytes,
    /// The next attempt's request body.
    body: Bytes,
    splice: Box<dyn Splice>,
    /// The client has bytes of the stream (and its head).
    sent: bool,
    done: bool,
    attempts: u32,
    current: Option<Current>,
    /// A break found after output that was returned first.
    pending: Option<Failure>,
    /// What [`read`](Self::read) writes the client's bytes into; empty
    /// between reads, its capacity kept (no growth per event).
    out: String,
    rng: rand::rngs::SmallRng,
    /// When the request must be over (`ProxyConfig::deadline`), if ever.
    deadline: Option<Instant>,
    /// The next request sent is a continuation (counted when it is sent:
    /// a client gone during the backoff before it leaves none).
    continuing: bool,
    logged: Logged,
}

impl Pump {
    fn record(&mut self) -> &mut AccessRecord {
        self.logged.record.get_or_insert_with(|| AccessRecord {
            upstream: "",
            method: String::new(),
            path: String::new(),
            status: 0,
            duration_ms: 0,
            attempts: 0,
            kills: 0,
            continuations: 0,
            outcome: Outcome::ClientGone,
        })
    }

    fn end(&mut self, outcome: Outcome) {
        self.done = true;
        self.current = None;
        let r = self.record();
        r.outcome = outcome;
        if r.status == 0 {
            r.status = 200;
        }
    }

    async fn next(&mut self) -> Step {
        loop {
            if self.done {
                return Step::End;
            }
            if let Some(failure) = self.pending.take() {
                if let Some(step) = self.failed(failure).await {
                    return step;
                }
                continue;
            }
            if self.current.is_none() {
                match self.open().await {
                    Ok(Some(current)) => self.current = Some(current),
                    Ok(None) => continue,
                    Err(answer) => return answer,
                }
            }
            let span = self
                .current
                .as_ref()
                .map_or_else(tracing::Span::none, |c| c.span.clone());
            let (out, failure) = self.read().instrument(span.clone()).await;
            let headers = match (&self.current, self.sent) {
                (Some(c), false) => c.headers.clone(),
                _ => HeaderMap::new(),
            };
            if let Some(failure) = failure {
                span.record("warden.outcome", failure.error.code());
                self.current = None;
                if out.is_empty() {
                    if let Some(step) = self.failed(failure).await {
                        return step;
                    }
                    continue;
                }
                self.pending = Some(failure);
            }
            if self.splice.done() {
                span.record("warden.outcome", "complete");
                self.end(Outcome::Complete);
            }
            if out.is_empty() {
                self.out = out;
                continue;
            }
            // One allocation of the exact size per chunk; the buffer the
            // events were written into keeps its capacity for the next.
            let bytes = Bytes::copy_from_slice(out.as_bytes());
            // Kept unless an unusually large chunk grew it: an open stream
            // must not hold a big buffer for the rest of its life.
            if out.capacity() <= OUT_KEEP {
                self.out = out;
                self.out.clear();
            }
            if self.sent {
                return Step::Chunk(bytes);
            }
            self.sent = true;
            self.record().status = 200;
            return Step::Head(headers, bytes);
        }
    }

    /// Starts an attempt: `Ok(Some)` streaming, `Ok(None)` broke (already
    /// handled: go on), `Err` with a whole answer for the client.
    async fn open(&mut self) -> Result<Option<Current>, Step> {
        self.attempts += 1;
        let span = tracing::info_span!(
            PROXY_ATTEMPT,
            otel.name = PROXY_ATTEMPT,
            warden.attempt = self.attempts,
            warden.outcome = tracing::field::Empty,
        );
        let pool = self.upstream.name();
        let admitted = tokio::select! {
            permit = self.inner.admission.admit(pool) => Some(permit),
            () = self.inner.stopping.cancelled() => None,
        };
        let Some(permit) = admitted else {
            return Err(self.give_up(&shutting_down(), None));
        };
        drop(permit);
        let opened = self.send().instrument(span.clone()).await;
        match opened {
            Ok(Ok(mut current)) => {
                current.span = span;
                Ok(Some(current))
            }
            Ok(Err(answer)) => {
                span.record("warden.outcome", "answered");
                self.record().status = answer.status().as_u16();
                self.end(Outcome::UpstreamError);
                Err(Step::Answer(answer))
            }
            Err(failure) => {
                span.record("warden.outcome", failure.error.code());
                match self.failed(failure).await {
                    Some(step) => Err(step),
                    None => Ok(None),
                }
            }
        }
    }

    /// Sends the attempt's request: the stream, a whole answer to pass on
    /// (`Ok(Err)`), or why it failed.
    async fn send(&mut self) -> Result<Result<Current, Response>, Failure> {
        let (expired_tx, mut expired) = oneshot::channel();
        let guard = self
            .inner
            .watchdog
            .watch(None, move |e| {
                let _ = expired_tx.send(e);
            })
            .map_err(|e| {
                Failure::of(StreamError::Internal {
                    message: e.to_string(),
                })
            })?;
        let beat = guard.heartbeat();
        // The access log counts what the upstream was sent.
        let continuing = std::mem::take(&mut self.continuing);
        let record = self.record();
        record.attempts += 1;
        if continuing {
            record.continuations += 1;
        }
        let send = self
            .inner
            .http
            .post(&self.url)
            .headers(self.headers.clone())
            .body(self.body.clone())
            .send();
        let response = tokio::select! {
            r = send => r,
            e = &mut expired => return Err(Failure::killed(e)),
            () = self.inner.stopping.cancelled() => return Err(Failure::of(shutting_down())),
            () = until(self.deadline) => return Err(Failure::of(past_deadline())),
        };
        let response = response.map_err(|e| {
            Failure::of(StreamError::Connection {
                message: reason(&e),
            })
        })?;
        let status = response.status();
        let response_headers = response.headers().clone();
        let is_stream = response_headers
            .get(axum::http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        if !status.is_success() || !is_stream {
            let limit = self.inner.config.max_reply_bytes;
            let bytes = tokio::select! {
                b = upstream::read_capped(response, limit, self.upstream) => b,
                e = &mut expired => return Err(Failure::killed(e)),
            };
            let bytes = match bytes {
                Ok(b) => b,
                Err(too_large) if !self.sent => return Ok(Err(too_large)),
                // Judged by its status alone: the client has a stream.
                Err(_) => Bytes::new(),
            };
            let error = if status.is_success() {
                StreamError::Malformed {
                    message: "the upstream answered a stream request without an event stream"
                        .to_owned(),
                }
            } else {
                warden_llm::classify_response(
                    status,
                    &response_headers,
                    &bytes,
                    self.inner.config.retry.max_retry_after,
                )
            };
            if !error.is_retryable() && !self.sent {
                return Ok(Err(answer(status, &response_headers, bytes)));
            }
            return Err(Failure {
                error,
                killed: false,
                answer: Some(Box::new((status, response_headers, bytes))),
            });
        }
        beat.beat();
        // The progress allowance: a second entry of the same watchdog,
        // beaten only by content (never by pings or comments).
        let progress = match self.inner.config.progress_timeout {
            Some(allowance) => {
                let (tx, rx) = oneshot::channel();
                let guard = self
                    .inner
                    .watchdog
                    .watch(Some(allowance), move |e| {
                        let _ = tx.send(e);
                    })
                    .map_err(|e| {
                        Failure::of(StreamError::Internal {
                            message: e.to_string(),
                        })
                    })?;
                let beat = guard.heartbeat();
                Some((guard, beat, rx))
            }
            None => None,
        };
        Ok(Ok(Current {
            stream: Box::pin(response.bytes_stream()),
            headers: headers::watched_response(&response_headers),
            parser: SseParser::new(self.inner.config.max_frame_bytes),
            frames: VecDeque::new(),
            _guard: guard,
            beat,
            expired,
            progress,
            span: tracing::Span::none(),
        }))
    }

    /// Reads the current attempt until it has output for the client, ends
    /// complete, or breaks: the output, and the break if any.
    async fn read(&mut self) -> (String, Option<Failure>) {
        let mut out = std::mem::take(&mut self.out);
        let Some(current) = self.current.as_mut() else {
            return (out, None);
        };
        loop {
            let no_progress = async {
                match current.progress.as_mut() {
                    Some((_, _, expired)) => expired.await.ok(),
                    None => std::future::pending().await,
                }
            };
            let chunk = tokio::select! {
                c = current.stream.next() => c,
                e = &mut current.expired => return (out, Some(Failure::killed(e))),
                e = no_progress => {
                    let failure = match e {
                        Some(e) => Failure {
                            error: StreamError::NoProgress {
                                idle_for: e.silent_for,
                                allowance: e.timeout,
                            },
                            killed: true,
                            answer: None,
                        },
                        None => Failure::of(StreamError::Internal {
                            message: "the watchdog stopped".to_owned(),
                        }),
                    };
                    return (out, Some(failure));
                }
                () = self.inner.stopping.cancelled() => {
                    return (out, Some(Failure::of(shutting_down())));
                }
                () = until(self.deadline) => return (out, Some(Failure::of(past_deadline()))),
            };
            let bytes = match chunk {
                Some(Ok(b)) => b,
                Some(Err(e)) => {
                    let failure = Failure::of(StreamError::Connection {
                        message: reason(&e),
                    });
                    return (out, Some(failure));
                }
                None => {
                    let failure = Failure::of(StreamError::Truncated {
                        message: "the upstream closed the stream before its last event".to_owned(),
                    });
                    return (out, Some(failure));
                }
            };
            let mut broke = current
                .parser
                .feed(&bytes, &mut current.frames)
                .err()
                .map(Failure::of);
            while let Some(frame) = current.frames.pop_front() {
                current.beat.beat();
                match frame {
                    Parsed::Event(event) => {
                        if event.event != "ping"
                            && let Some((_, beat, _)) = &current.progress
                        {
                            beat.beat();
                        }
                        if let Err(e) = self.splice.event(&event, &mut out) {
                            broke = Some(Failure::of(e));
                            break;
                        }
                    }
                    Parsed::KeepAlive => {
                        if self.sent {
                            out.push_str(":\n\n");
                        }
                    }
                }
                if self.splice.done() {
                    return (out, None);
                }
            }
            if broke.is_some() || !out.is_empty() {
                current.frames.clear();
                return (out, broke);
            }
        }
    }

    /// After a broken attempt: `None` to try again (after the backoff),
    /// or the step that ends the request.
    async fn failed(&mut self, failure: Failure) -> Option<Step> {
        let Failure {
            error,
            killed,
            answer,
        } = failure;
        let pool = self.upstream.name();
        if killed {
            self.record().kills += 1;
            tracing::info!(
                event = PROXY_KILL,
                attempt = self.attempts,
                "upstream stream went silent; killed"
            );
            let killed = Recovery::Killed {
                upstream: pool,
                path: self.record().path.clone(),
                attempt: self.attempts,
            };
            report(&self.inner, killed);
        }
        if let StreamError::Api {
            status: Some(429),
            retry_after: Some(wait),
            ..
        } = &error
        {
            self.inner.admission.hold(pool, *wait);
        }
        if self.inner.stopping.is_cancelled() {
            return Some(self.give_up(&shutting_down(), None));
        }
        if self.deadline.is_some_and(|d| Instant::now() >= d) {
            return Some(self.give_up(&past_deadline(), answer));
        }
        let delay = self
            .inner
            .config
            .retry
            .next_delay(self.attempts, &error, &mut self.rng);
        let Some(delay) = delay else {
            return Some(self.give_up(&error, answer));
        };
        let resume = self.splice.resume(&self.original);
        let path = self.record().path.clone();
        let retrying = Recovery::Retrying {
            upstream: pool,
            path: path.clone(),
            attempt: self.attempts,
            code: error.code(),
            delay,
        };
        if !self.sent {
            // Nothing reached the client: the same request again.
            self.body = self.original_bytes.clone();
            report(&self.inner, retrying);
        } else {
            match resume {
                Resume::Again => {
                    self.body = self.original_bytes.clone();
                    report(&self.inner, retrying);
                }
                Resume::Continue(request) => {
                    report(
                        &self.inner,
                        Recovery::Continuing {
                            upstream: pool,
                            path,
                            attempt: self.attempts,
                            code: error.code(),
                            delay,
                        },
                    );
                    self.continuing = true;
                    tracing::info!(
                        event = PROXY_CONTINUE,
                        attempt = self.attempts,
                        "continuing the broken reply"
                    );
                    match serde_json::to_vec(&request) {
                        Ok(body) => self.body = Bytes::from(body),
                        Err(e) => {
                            // Never an empty or partial body upstream: the
                            // stream ends here, with the provider's error.
                            tracing::error!(error = %e, "cannot encode the continuation request");
                            let error = StreamError::Internal {
                                message: format!("cannot encode the continuation request: {e}"),
                            };
                            return Some(self.give_up(&error, None));
                        }
                    }
                }
                Resume::GiveUp => return Some(self.give_up(&error, None)),
            }
        }
        tokio::select! {
            () = tokio::time::sleep(delay) => None,
            () = self.inner.stopping.cancelled() => Some(self.give_up(&shutting_down(), None)),
            () = until(self.deadline) => Some(self.give_up(&past_deadline(), None)),
        }
    }

    /// Ends the request after `error`: the upstream's own error answer or
    /// the proxy's while the client has nothing yet, else the provider's
    /// error event on the open stream.
    fn give_up(
        &mut self,
        error: &StreamError,
        upstream_answer: Option<Box<(StatusCode, HeaderMap, Bytes)>>,
    ) -> Step {
        let message = format!("warden proxy: the upstream stream failed: {}", error.code());
        let gave_up = Recovery::GaveUp {
            upstream: self.upstream.name(),
            path: self.record().path.clone(),
            attempts: self.attempts,
            code: error.code(),
            reason: error.to_string(),
        };
        report(&self.inner, gave_up);
        if self.sent {
            self.end(Outcome::ErrorEvent);
            return Step::Chunk(Bytes::from(self.splice.error_event(&message)));
        }
        let response = match upstream_answer {
            Some(a) => {
                let (status, headers, bytes) = *a;
                answer(status, &headers, bytes)
            }
            None => error_response(
                self.upstream,
                match self.upstream {
                    Upstream::Anthropic => {
                        StatusCode::from_u16(529).unwrap_or(StatusCode::SERVICE_UNAVAILABLE)
                    }
                    Upstream::OpenAi => StatusCode::SERVICE_UNAVAILABLE,
                },
                &message,
            ),
        };
        self.record().status = response.status().as_u16();
        self.end(Outcome::UpstreamError);
        Step::Answer(response)
    }
}

/// An upstream answer passed on whole.
fn answer(status: StatusCode, headers: &HeaderMap, bytes: Bytes) -> Response {
    let mut r = Response::new(Body::from(bytes));
    *r.status_mut() = status;
    *r.headers_mut() = headers::end_to_end(headers);
    r
}
