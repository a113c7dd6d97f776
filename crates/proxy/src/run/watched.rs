//! A watched request's entry: its body buffered, a whole answer asked
//! for turned into a stream, the [`Pump`] built and either streamed to the
//! client as it pulls or assembled (`whole`).

use std::sync::Arc;

use axum::body::Body;
use axum::extract::Request;
use axum::http::StatusCode;
use axum::response::Response;
use bytes::Bytes;
use futures_util::StreamExt as _;
use rand::SeedableRng as _;
use serde_json::Value;
use tokio::time::Instant;
use tracing::Instrument as _;

use super::passthrough::{Logged, send_through};
use super::state::{Pump, Step};
use super::{Inner, base_of, refuse, request_span, upstream_url, whole};
use crate::access::{AccessRecord, Outcome};
use crate::headers;
use crate::splice;
use crate::upstream::{GeminiCall, Protocol, error_response};

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
        protocol,
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
        headed: false,
        content: false,
        silent: 0,
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
