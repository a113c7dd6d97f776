//! The answer to a client that asked for no stream: the watched stream
//! fed to its assembler (`assemble`) as each chunk arrives, and the
//! provider's error shape for what cannot be an answer — a reply past
//! its cap, tool input that is not JSON, an upstream answer that is
//! neither an event stream nor JSON.

use std::collections::VecDeque;

use axum::body::Body;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse as _, Response};
use serde_json::json;
use warden_llm::sse::{Parsed, SseParser};

use super::report;
use super::state::{Pump, Step};
use crate::access::{Outcome, RecoveryEvent};
use crate::assemble::{Assembled, AssemblyError, Budget, ChatCompletions, Gemini, Messages, Whole};
use crate::upstream::{Protocol, Upstream, error_response, error_response_coded};

/// The spliced stream's events may be a little larger than the upstream's
/// (a block index rewritten); they are read with this much more than the
/// frame limit.
const FRAME_SLACK: usize = 64 * 1024;

/// Drives `pump` to its end and answers with the whole message (or chat
/// completion) its spliced stream makes, assembled as each chunk arrives
/// (the stream itself is not kept): the JSON the API would have given a
/// non-streaming request; an error answer in the provider's shape when the
/// stream ended with an error event, when the reply passed its cap or a
/// tool input is not JSON; the upstream's own answer when it gave a JSON
/// one instead of a stream, and an error naming it when it gave anything
/// else.
pub(crate) async fn answer(mut pump: Pump, protocol: Protocol) -> Response {
    let upstream = pump.upstream;
    let max_reply = pump.inner.config.max_reply_bytes;
    let mut budget = Budget::new(max_reply);
    let frame_limit = pump
        .inner
        .config
        .max_frame_bytes
        .saturating_add(FRAME_SLACK);
    let mut parser = SseParser::new(frame_limit);
    let mut frames = VecDeque::new();
    let fresh = || match protocol {
        Protocol::ChatCompletions => Whole::Chat(ChatCompletions::default()),
        Protocol::Gemini => Whole::Gemini(Gemini::default()),
        _ => Whole::Messages(Messages::default()),
    };
    let mut whole = fresh();
    let mut headers = HeaderMap::new();
    loop {
        let bytes = match pump.next().await {
            // The stream's start; a second one when the pump started over
            // (what came before cannot be continued): assembled afresh.
            Step::Head(h, b) => {
                headers = h;
                budget = Budget::new(max_reply);
                parser = SseParser::new(frame_limit);
                frames.clear();
                whole = fresh();
                b
            }
            Step::Chunk(b) => b,
            Step::Answer(response) => return as_json(&mut pump, response),
            Step::End => break,
        };
        if let Err(e) = parser.feed(&bytes, &mut frames) {
            // The spliced stream is written by the proxy from well-formed
            // events: this is not expected.
            let message = format!("warden proxy: the stream cannot be assembled: {}", e.code());
            pump.record().status = StatusCode::BAD_GATEWAY.as_u16();
            pump.end(Outcome::UpstreamError);
            return error_response(upstream, StatusCode::BAD_GATEWAY, &message);
        }
        let fed = frames.drain(..).try_for_each(|frame| match frame {
            Parsed::Event(event) => whole.event(&event, &mut budget),
            Parsed::KeepAlive => Ok(()),
        });
        if let Err(error) = fed {
            return gave_up(pump, &error);
        }
    }
    let assembled = match whole.finish() {
        Ok(a) => a,
        Err(error) => return gave_up(pump, &error),
    };
    let (status, body) = match assembled {
        Assembled::Answer(answer) => (StatusCode::OK, answer),
        Assembled::Error(error) => {
            let status = match upstream {
                Upstream::Anthropic => {
                    StatusCode::from_u16(529).unwrap_or(StatusCode::SERVICE_UNAVAILABLE)
                }
                Upstream::OpenAi | Upstream::Gemini => StatusCode::SERVICE_UNAVAILABLE,
            };
            let body = match upstream {
                Upstream::Anthropic => json!({"type": "error", "error": error}),
                Upstream::OpenAi | Upstream::Gemini => json!({"error": error}),
            };
            (status, body)
        }
        Assembled::Incomplete => {
            pump.record().status = StatusCode::BAD_GATEWAY.as_u16();
            return error_response(
                upstream,
                StatusCode::BAD_GATEWAY,
                "warden proxy: the upstream stream ended before its last event",
            );
        }
    };
    pump.record().status = status.as_u16();
    // The splice's copy of the reply goes before the answer is written,
    // into a buffer of about its size (not grown by doubling).
    drop(pump);
    let mut json = Vec::with_capacity(budget.used.saturating_add(4096));
    if serde_json::to_writer(&mut json, &body).is_err() {
        json = body.to_string().into_bytes();
    }
    drop(body);
    let mut response = (status, Body::from(json)).into_response();
    for (name, value) in &headers {
        if name != header::CONTENT_TYPE && name != header::CONTENT_LENGTH {
            response.headers_mut().append(name.clone(), value.clone());
        }
    }
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    response
}

/// Ends the request after `error`: reported as a give-up, answered `502`
/// in the provider's shape; the attempt is dropped (nothing more is read).
fn gave_up(mut pump: Pump, error: &AssemblyError) -> Response {
    let path = pump.record().path.clone();
    let gave_up = RecoveryEvent::GaveUp {
        upstream: pump.upstream.name(),
        path,
        request: pump.record().id,
        attempts: pump.attempts,
        code: error.code(),
        reason: error.to_string(),
    };
    report(&pump.inner, gave_up);
    let response = error_response_coded(
        pump.upstream,
        StatusCode::BAD_GATEWAY,
        &format!("warden proxy: {error}"),
        Some(error.openai_code()),
    );
    pump.record().status = StatusCode::BAD_GATEWAY.as_u16();
    pump.end(Outcome::UpstreamError);
    response
}

/// A whole answer the upstream gave instead of a stream: passed on when it
/// is JSON (what the client asked for), else an error in the provider's
/// shape naming what came — the upstream's status when it is an error
/// (4xx, 5xx: the SDKs' retry rules go by it), else `502`.
fn as_json(pump: &mut Pump, response: Response) -> Response {
    let content_type = response
        .headers()
        .get(header::CONTENT_TYPE)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        .unwrap_or_default();
    let essence = content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    if essence == "application/json" || essence.ends_with("+json") {
        return response;
    }
    let status = response.status();
    let shown: String = if content_type.is_empty() {
        "no content type".to_owned()
    } else {
        content_type.chars().take(100).collect()
    };
    let message = format!(
        "warden proxy: the upstream answered {status} with {shown} to a request the proxy sent \
         as a stream: neither an event stream nor JSON (EMALFORMED)"
    );
    let status = if status.is_client_error() || status.is_server_error() {
        status
    } else {
        StatusCode::BAD_GATEWAY
    };
    pump.record().status = status.as_u16();
    error_response_coded(pump.upstream, status, &message, Some("upstream_not_json"))
}
