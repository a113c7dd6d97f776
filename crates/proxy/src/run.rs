//! Running one proxied request: the pass-through path, and the watched
//! path's attempts (watchdog, retries, continuation, the held response
//! head).

use std::collections::VecDeque;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use bytes::Bytes;
use futures_util::StreamExt as _;
use rand::SeedableRng as _;
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tracing::Instrument as _;
use warden_core::StreamError;
use warden_llm::sse::{Parsed, SseEvent, SseParser};

use crate::spans::{PROXY_ATTEMPT, PROXY_CONTINUE, PROXY_KILL, PROXY_REQUEST};
use crate::{AccessRecord, Inner, Upstream, error_response, headers};

/// How a broken stream goes on, once the client has bytes of it.
pub(crate) enum Resume {
    /// The same request again (nothing of the reply has reached the client
    /// but the message's start; the new start is dropped).
    Again,
    /// This request instead: the reply so far, and a request to continue it.
    Continue(Value),
    /// Neither is possible: end the stream with the provider's error event.
    GiveUp,
}

/// A protocol's splicing of upstream attempts into one downstream stream.
pub(crate) trait Splice: Send + 'static {
    /// Appends to `out` what the client gets for one upstream event; an
    /// error breaks the attempt (a retryable error event, a frame that is
    /// not the protocol's JSON, a continuation that does not fit).
    fn event(&mut self, event: &SseEvent, out: &mut String) -> Result<(), StreamError>;
    /// The terminal event has been forwarded: the response is complete.
    fn done(&self) -> bool;
    /// After a broken attempt whose stream the client has part of.
    fn resume(&mut self, original: &Value) -> Resume;
    /// The provider's retryable error event, which ends the stream.
    fn error_event(&self, message: &str) -> String;
}

/// What the handler answers with.
enum Head {
    /// 200 with these headers; the body comes through the channel.
    Stream(HeaderMap),
    /// A whole answer (an upstream error passed on, or the proxy's own).
    Answer(Response),
}

/// How one upstream attempt ended.
enum Ended {
    /// The terminal event reached the client.
    Complete,
    /// The client went away.
    ClientGone,
    /// An upstream answer was passed on whole (an error that is not
    /// retried, or a non-stream answer).
    Answered,
    /// It broke. `answer` is the upstream's error answer, if it gave one.
    Failed {
        error: StreamError,
        killed: bool,
        answer: Option<Box<(StatusCode, HeaderMap, Bytes)>>,
    },
}

fn upstream_url(inner: &Inner, upstream: Upstream, uri: &axum::http::Uri) -> String {
    let base = match upstream {
        Upstream::Anthropic => &inner.config.anthropic_upstream,
        Upstream::OpenAi => &inner.config.openai_upstream,
    };
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
    span.record("warden.outcome", record.outcome);
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
pub(crate) async fn passthrough(
    inner: Arc<Inner>,
    upstream: Upstream,
    request: Request,
    record: AccessRecord,
    started: Instant,
) -> Response {
    let span = request_span(&record);
    let (parts, body) = request.into_parts();
    let body = reqwest::Body::wrap_stream(body.into_data_stream());
    send_through(inner, upstream, parts, body, record, started)
        .instrument(span)
        .await
}

async fn send_through(
    inner: Arc<Inner>,
    upstream: Upstream,
    parts: axum::http::request::Parts,
    body: reqwest::Body,
    mut record: AccessRecord,
    started: Instant,
) -> Response {
    let url = upstream_url(&inner, upstream, &parts.uri);
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
            record.status = 502;
            record.outcome = "upstream_error";
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
            r.outcome = "upstream_error";
        }
        chunk
    });
    out.body(Body::from_stream(body)).unwrap_or_else(|_| {
        error_response(upstream, StatusCode::BAD_GATEWAY, "bad upstream answer")
    })
}

fn upstream_name(u: Upstream) -> &'static str {
    match u {
        Upstream::Anthropic => "anthropic",
        Upstream::OpenAi => "openai",
    }
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
    match std::error::Error::source(e) {
        Some(source) => format!("{kind}: {source}"),
        None => kind.to_owned(),
    }
}

/// A watched request: buffered, then sent in attempts until its stream is
/// complete, continued where it broke.
pub(crate) async fn watched(
    inner: Arc<Inner>,
    upstream: Upstream,
    request: Request,
    record: AccessRecord,
    started: Instant,
) -> Response {
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
    let json: Option<Value> = serde_json::from_slice(&bytes).ok();
    let splice: Option<Box<dyn Splice>> = match &json {
        Some(v) if v.get("stream").and_then(Value::as_bool) == Some(true) => {
            match parts.uri.path() {
                "/v1/messages" => Some(Box::new(crate::anthropic::Anthropic::default())),
                "/v1/chat/completions" => Some(Box::new(crate::chat::Chat::default())),
                "/v1/responses" => Some(Box::new(crate::responses::Responses::default())),
                _ => None,
            }
        }
        _ => None,
    };
    let (Some(splice), Some(json)) = (splice, json) else {
        // Not a stream (or not JSON: the upstream says what is wrong).
        return send_through(
            inner,
            upstream,
            parts,
            reqwest::Body::from(bytes),
            record,
            started,
        )
        .instrument(span)
        .await;
    };
    let (head_tx, head_rx) = oneshot::channel();
    let (body_tx, body_rx) = mpsc::channel::<Bytes>(16);
    let url = upstream_url(&inner, upstream, &parts.uri);
    let send_headers = headers::watched_request(&parts.headers);
    let run = Run {
        inner,
        upstream,
        url,
        headers: send_headers,
        original: json,
        original_bytes: bytes,
        splice,
        head: Some(head_tx),
        body: body_tx,
        record,
        started,
    };
    tokio::spawn(run.drive().instrument(span));
    match head_rx.await {
        Ok(Head::Stream(headers)) => {
            let body = futures_util::stream::unfold(body_rx, |mut rx| async move {
                rx.recv()
                    .await
                    .map(|b| (Ok::<_, std::convert::Infallible>(b), rx))
            });
            let mut response = Response::new(Body::from_stream(body));
            *response.headers_mut() = headers;
            response
        }
        Ok(Head::Answer(response)) => response,
        Err(_) => error_response(
            upstream,
            StatusCode::BAD_GATEWAY,
            "warden proxy: the request ended without an answer",
        ),
    }
}

struct Run {
    inner: Arc<Inner>,
    upstream: Upstream,
    url: String,
    headers: HeaderMap,
    original: Value,
    original_bytes: Bytes,
    splice: Box<dyn Splice>,
    /// Until the client has its response head.
    head: Option<oneshot::Sender<Head>>,
    body: mpsc::Sender<Bytes>,
    record: AccessRecord,
    started: Instant,
}

impl Run {
    async fn drive(mut self) {
        let pool = upstream_name(self.upstream);
        let mut rng = rand::rngs::SmallRng::from_rng(&mut rand::rng());
        let mut body = self.original_bytes.clone();
        let mut attempts = 0u32;
        let outcome = loop {
            attempts += 1;
            let span = tracing::info_span!(
                PROXY_ATTEMPT,
                otel.name = PROXY_ATTEMPT,
                warden.attempt = attempts,
                warden.outcome = tracing::field::Empty,
            );
            let permit = self.inner.admission.admit(pool).await;
            let ended = self.attempt(body.clone()).instrument(span.clone()).await;
            drop(permit);
            let (error, killed, answer) = match ended {
                Ended::Complete => {
                    span.record("warden.outcome", "complete");
                    break "complete";
                }
                Ended::ClientGone => {
                    span.record("warden.outcome", "client_gone");
                    break "client_gone";
                }
                Ended::Answered => {
                    span.record("warden.outcome", "answered");
                    break "upstream_error";
                }
                Ended::Failed {
                    error,
                    killed,
                    answer,
                } => (error, killed, answer),
            };
            span.record("warden.outcome", error.code());
            if killed {
                self.record.kills += 1;
                tracing::info!(
                    event = PROXY_KILL,
                    attempt = attempts,
                    "upstream stream went silent; killed"
                );
            }
            if let StreamError::Api {
                status: Some(429),
                retry_after: Some(wait),
                ..
            } = &error
            {
                self.inner.admission.hold(pool, *wait);
            }
            let delay = self
                .inner
                .config
                .retry
                .next_delay(attempts, &error, &mut rng);
            let Some(delay) = delay else {
                self.give_up(&error, answer).await;
                break "error_event";
            };
            let resume = self.splice.resume(&self.original);
            if self.head.is_some() {
                // Nothing reached the client: the same request again.
                body = self.original_bytes.clone();
            } else {
                match resume {
                    Resume::Again => body = self.original_bytes.clone(),
                    Resume::Continue(request) => {
                        self.record.continuations += 1;
                        tracing::info!(
                            event = PROXY_CONTINUE,
                            attempt = attempts,
                            "continuing the broken reply"
                        );
                        body = Bytes::from(serde_json::to_vec(&request).unwrap_or_default());
                    }
                    Resume::GiveUp => {
                        self.give_up(&error, None).await;
                        break "error_event";
                    }
                }
            }
            tokio::select! {
                () = tokio::time::sleep(delay) => {}
                () = self.body.closed(), if self.head.is_none() => break "client_gone",
            }
        };
        self.record.attempts = attempts;
        self.record.outcome = outcome;
        if self.record.status == 0 {
            self.record.status = 200;
        }
        finish(&self.inner, self.record, self.started);
    }

    /// Ends the request after `error`: the upstream's own error answer or
    /// the proxy's while the client has no head yet, else the provider's
    /// error event on the open stream.
    async fn give_up(
        &mut self,
        error: &StreamError,
        answer: Option<Box<(StatusCode, HeaderMap, Bytes)>>,
    ) {
        let message = format!("warden proxy: the upstream stream failed: {}", error.code());
        match self.head.take() {
            Some(head) => {
                let response = match answer {
                    Some(answer) => {
                        let (status, headers, bytes) = *answer;
                        let mut r = Response::new(Body::from(bytes));
                        *r.status_mut() = status;
                        *r.headers_mut() = headers::end_to_end(&headers);
                        r
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
                self.record.status = response.status().as_u16();
                let _ = head.send(Head::Answer(response));
            }
            None => {
                let frame = self.splice.error_event(&message);
                let _ = self.body.send(Bytes::from(frame)).await;
            }
        }
    }

    async fn attempt(&mut self, body: Bytes) -> Ended {
        let (expired_tx, mut expired) = oneshot::channel();
        let guard = match self.inner.watchdog.watch(None, move |e| {
            let _ = expired_tx.send(e);
        }) {
            Ok(g) => g,
            Err(e) => {
                return Ended::Failed {
                    error: StreamError::Internal {
                        message: e.to_string(),
                    },
                    killed: false,
                    answer: None,
                };
            }
        };
        let beat = guard.heartbeat();
        let killed = |e: Result<warden_core::Expiry, oneshot::error::RecvError>| match e {
            Ok(expiry) => Ended::Failed {
                error: expiry.into(),
                killed: true,
                answer: None,
            },
            Err(_) => Ended::Failed {
                error: StreamError::Internal {
                    message: "the watchdog stopped".to_owned(),
                },
                killed: false,
                answer: None,
            },
        };
        let send = self
            .inner
            .http
            .post(&self.url)
            .headers(self.headers.clone())
            .body(body)
            .send();
        let body_tx = self.body.clone();
        let response = tokio::select! {
            r = send => r,
            e = &mut expired => return killed(e),
            () = body_tx.closed() => return Ended::ClientGone,
        };
        let response = match response {
            Ok(r) => r,
            Err(e) => {
                return Ended::Failed {
                    error: StreamError::Connection {
                        message: reason(&e),
                    },
                    killed: false,
                    answer: None,
                };
            }
        };
        let status = response.status();
        let response_headers = response.headers().clone();
        let is_stream = response_headers
            .get(axum::http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        if !status.is_success() || !is_stream {
            let bytes = tokio::select! {
                b = response.bytes() => b.unwrap_or_default(),
                e = &mut expired => return killed(e),
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
            if !error.is_retryable() {
                if let Some(head) = self.head.take() {
                    let mut r = Response::new(Body::from(bytes));
                    *r.status_mut() = status;
                    *r.headers_mut() = headers::end_to_end(&response_headers);
                    self.record.status = status.as_u16();
                    let _ = head.send(Head::Answer(r));
                    return Ended::Answered;
                }
            }
            return Ended::Failed {
                error,
                killed: false,
                answer: Some(Box::new((status, response_headers, bytes))),
            };
        }
        beat.beat();
        let stream_headers = headers::watched_response(&response_headers);
        let mut parser = SseParser::new(self.inner.config.max_frame_bytes);
        let mut frames = VecDeque::new();
        let mut stream = response.bytes_stream();
        let mut out = String::new();
        loop {
            let chunk = tokio::select! {
                c = stream.next() => c,
                e = &mut expired => return killed(e),
                () = body_tx.closed() => return Ended::ClientGone,
            };
            let bytes = match chunk {
                Some(Ok(b)) => b,
                Some(Err(e)) => {
                    return Ended::Failed {
                        error: StreamError::Connection {
                            message: reason(&e),
                        },
                        killed: false,
                        answer: None,
                    };
                }
                None => {
                    return Ended::Failed {
                        error: StreamError::Truncated {
                            message: "the upstream closed the stream before its last event"
                                .to_owned(),
                        },
                        killed: false,
                        answer: None,
                    };
                }
            };
            let fed = parser.feed(&bytes, &mut frames);
            let mut broke = fed.err();
            for frame in frames.drain(..) {
                beat.beat();
                match frame {
                    Parsed::Event(event) => {
                        if let Err(e) = self.splice.event(&event, &mut out) {
                            broke = Some(e);
                            break;
                        }
                    }
                    Parsed::KeepAlive => {
                        if self.head.is_none() {
                            out.push_str(":\n\n");
                        }
                    }
                }
                if self.splice.done() {
                    break;
                }
            }
            if !out.is_empty() {
                if let Some(head) = self.head.take() {
                    self.record.status = 200;
                    let _ = head.send(Head::Stream(stream_headers.clone()));
                }
                if body_tx
                    .send(Bytes::from(std::mem::take(&mut out)))
                    .await
                    .is_err()
                {
                    return Ended::ClientGone;
                }
            }
            if self.splice.done() {
                return Ended::Complete;
            }
            if let Some(error) = broke {
                return Ended::Failed {
                    error,
                    killed: false,
                    answer: None,
                };
            }
        }
    }
}
