//! A watched request: its entry (the body buffered, a whole answer asked
//! for turned into a stream) and the [`Pump`] that pulls its attempts one
//! chunk at a time for whoever sends the response.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use bytes::Bytes;
use futures_util::{FutureExt as _, StreamExt as _};
use rand::SeedableRng as _;
use serde_json::Value;
use tokio::time::Instant;
use tracing::Instrument as _;

use super::attempt::{Current, Failure};
use super::passthrough::{Logged, send_through};
use super::{Inner, UNREACHABLE, base_of, finish, request_span, upstream_url, whole};
use crate::access::{AccessRecord, Outcome};
use crate::circuit::{Pass, Probe};
use crate::headers;
use crate::splice::{self, Splice};
use crate::upstream::{GeminiCall, Protocol, Upstream, error_response};

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
    let probe = match refuse(&inner, upstream, &record, started) {
        Ok(probe) => probe,
        Err(refused) => return *refused,
    };
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
    // Gemini says in its path whether it streams, the others in the body.
    let gemini = (protocol == Protocol::Gemini).then(|| GeminiCall::of(&parts.uri));
    let streamed = match gemini {
        Some(call) => json.as_ref().map(|_| match call {
            GeminiCall::Stream => Some(true),
            GeminiCall::Whole => Some(false),
            GeminiCall::Other => None,
        }),
        None => json
            .as_ref()
            .map(|v| v.get("stream").and_then(Value::as_bool)),
    };
    // A whole answer asked for: sent upstream as a stream (watched like
    // any other) and assembled here.
    let whole = matches!(streamed, Some(None | Some(false)))
        && gemini != Some(GeminiCall::Other)
        && protocol.assembles()
        && json.as_ref().is_some_and(Value::is_object);
    // (Gemini's stream of the same request is another path, the body as
    // it is.)
    if whole
        && gemini.is_none()
        && let Some(v) = json.as_mut()
    {
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
    let splice = (whole || streamed == Some(Some(true)))
        .then(|| splice::for_protocol(protocol, inner.config.hold_thinking));
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
    let url = match gemini {
        Some(GeminiCall::Whole) => format!(
            "{}{}",
            base_of(&inner, upstream).trim_end_matches('/'),
            GeminiCall::as_stream(&parts.uri)
        ),
        _ => upstream_url(base_of(&inner, upstream), &parts.uri),
    };
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
        probe,
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
        assembled: whole.then_some(protocol),
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

/// The answer to a request while `upstream`'s circuit is open (a copy of
/// its access `record` written), or `Ok` when it may go — with the
/// circuit's probe when it goes as one, to hold until it ends: nothing is
/// copied for a request that goes.
pub(super) fn refuse(
    inner: &Inner,
    upstream: Upstream,
    record: &AccessRecord,
    started: Instant,
) -> Result<Option<Probe>, Box<Response>> {
    let (cause, next_probe_in) = match inner.circuit(upstream).pass() {
        Pass::Go => return Ok(None),
        Pass::Probe(probe) => return Ok(Some(probe)),
        Pass::Refuse {
            cause,
            next_probe_in,
        } => (cause, next_probe_in),
    };
    let response = inner.refused(upstream, &cause, next_probe_in);
    let mut record = record.clone();
    record.status = response.status().as_u16();
    record.outcome = Outcome::UpstreamError;
    record.code = Some(UNREACHABLE);
    finish(inner, record, started);
    Err(Box::new(response))
}

/// How long the end of an upstream body may take after the reply's last
/// event (the chunked body's terminator, usually in the same read) for
/// its connection to go back to the pool.
const RELEASE_WITHIN: std::time::Duration = std::time::Duration::from_secs(1);

/// The most frames read after the reply's last event before the rest is
/// left to a task of its own.
const RELEASE_NOW: usize = 16;

/// After the reply's last event: the rest of the upstream body is read
/// (at once when it is there, usually; else in a task of its own), so
/// that a connection whose answer ends cleanly goes back to the pool
/// (`client`) before the client has its end; one whose end does not come
/// soon is closed with it.
fn release(current: Current) {
    let mut frames = current.frames;
    for _ in 0..RELEASE_NOW {
        match frames.next().now_or_never() {
            Some(Some(Ok(_))) => {}
            // Its end (or a break): the body is done with.
            Some(_) => return,
            None => break,
        }
    }
    tokio::spawn(async move {
        let drained = async { while let Some(Ok(_)) = frames.next().await {} };
        let _ = tokio::time::timeout(RELEASE_WITHIN, drained).await;
    });
}

/// What the next pull of a watched request gives.
pub(super) enum Step {
    /// The first bytes of the stream, and the response's headers.
    Head(HeaderMap, Bytes),
    /// More bytes of the stream.
    Chunk(Bytes),
    /// A whole answer instead of a stream (only before any byte was sent).
    Answer(Response),
    /// The stream is over.
    End,
}

/// The most capacity a stream's output buffer keeps between chunks.
const OUT_KEEP: usize = 16 * 1024;

/// A watched request's attempts, pulled one chunk at a time by whoever
/// sends the response.
pub(super) struct Pump {
    pub(super) inner: Arc<Inner>,
    pub(super) upstream: Upstream,
    pub(super) url: String,
    pub(super) headers: HeaderMap,
    pub(super) original: Value,
    pub(super) original_bytes: Bytes,
    /// The next attempt's request body.
    pub(super) body: Bytes,
    pub(super) splice: Box<dyn Splice>,
    /// The client has bytes of the stream (and its head).
    pub(super) sent: bool,
    pub(super) done: bool,
    pub(super) attempts: u32,
    pub(super) current: Option<Current>,
    /// A break found after output that was returned first.
    pub(super) pending: Option<Failure>,
    /// What [`read`](Self::read) writes the client's bytes into; empty
    /// between reads, its capacity kept (no growth per event).
    pub(super) out: String,
    pub(super) rng: rand::rngs::SmallRng,
    /// When the request must be over (`ProxyConfig::deadline`), if ever.
    pub(super) deadline: Option<Instant>,
    /// The next request sent is a continuation (counted when it is sent:
    /// a client gone during the backoff before it leaves none).
    pub(super) continuing: bool,
    /// The protocol of an answer assembled here (a client that asked for
    /// no stream): the client sees none of it until it is whole, so a
    /// stream that cannot be continued is started over unseen.
    pub(super) assembled: Option<Protocol>,
    pub(super) logged: Logged,
}

impl Pump {
    pub(super) fn record(&mut self) -> &mut AccessRecord {
        self.logged.record.get_or_insert_with(|| AccessRecord {
            id: 0,
            upstream: "",
            method: String::new(),
            path: String::new(),
            status: 0,
            duration_ms: 0,
            attempts: 0,
            kills: 0,
            continuations: 0,
            outcome: Outcome::ClientGone,
            code: None,
        })
    }

    pub(super) fn end(&mut self, outcome: Outcome) {
        self.done = true;
        self.current = None;
        let r = self.record();
        r.outcome = outcome;
        if r.status == 0 {
            r.status = 200;
        }
    }

    pub(super) async fn next(&mut self) -> Step {
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
                if let Some(current) = self.current.take() {
                    release(current);
                }
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
}
