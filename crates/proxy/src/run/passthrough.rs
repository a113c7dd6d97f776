//! The pass-through path: a request that is not watched, sent on as it is
//! with both bodies streamed, and the local answer to a path no upstream
//! is configured for.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{Method, StatusCode};
use axum::response::Response;
use futures_util::{StreamExt as _, TryStreamExt as _};
use tokio::time::Instant;
use tracing::Instrument as _;

use super::{
    Inner, UNREACHABLE, base_of, finish, reason, refuse, report, request_span, upstream_url,
};
use crate::access::{AccessRecord, Outcome, RecoveryEvent};
use crate::circuit::Probe;
use crate::headers;
use crate::upstream::{Upstream, error_response};

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
    // Held until the upstream's answer (or its failure) is known, or the
    // client goes: the circuit's probe, when this request is one.
    let _probe = if base == base_of(&inner, upstream) {
        match refuse(&inner, upstream, &record, started) {
            Ok(probe) => probe,
            Err(refused) => return *refused,
        }
    } else {
        None
    };
    let (parts, body) = request.into_parts();
    // A failure reading the client's body is told apart from the
    // upstream's by its type (see `client_body_error`).
    let body = body.into_data_stream().map_err(ClientBody);
    send_through(
        inner,
        upstream,
        &base,
        parts,
        reqwest::Body::wrap_stream(body),
        record,
        started,
    )
    .instrument(span)
    .await
}

/// Why the client's own request body could not be read (a malformed
/// chunked upload, a client gone mid-upload): the request fails, but the
/// upstream is not to blame and its circuit does not count it.
#[derive(Debug)]
struct ClientBody(axum::Error);

impl std::fmt::Display for ClientBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", warden_llm::error_chain(&self.0))
    }
}

impl std::error::Error for ClientBody {}

/// The client's body failure behind `e`, if that is what failed.
fn client_body_error(e: &reqwest::Error) -> Option<&ClientBody> {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(error) = source {
        if let Some(body) = error.downcast_ref::<ClientBody>() {
            return Some(body);
        }
        source = error.source();
    }
    None
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
                "warden proxy: {path} is not an Anthropic, OpenAI or Gemini API path (those start \
                 with /v1/ or /v1beta/), and no upstream is configured for other paths; nothing \
                 was forwarded"
            ),
        )
    };
    record.status = response.status().as_u16();
    record.outcome = Outcome::Local;
    finish(inner, record, started);
    response
}

pub(super) async fn send_through(
    inner: Arc<Inner>,
    upstream: Upstream,
    base: &str,
    parts: axum::http::request::Parts,
    body: reqwest::Body,
    mut record: AccessRecord,
    started: Instant,
) -> Response {
    let url = upstream_url(base, &parts.uri);
    // The circuit is the API upstream's, not that of `--other-upstream`.
    let api = base == base_of(&inner, upstream);
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
            if let Some(body) = client_body_error(&e) {
                // The client's body broke, not the upstream: a 400 naming
                // it, and the circuit is not told.
                record.status = 400;
                finish(&inner, record, started);
                return error_response(
                    upstream,
                    StatusCode::BAD_REQUEST,
                    &format!("warden proxy: the request's body could not be read: {body}"),
                );
            }
            report(
                &inner,
                RecoveryEvent::Unreachable {
                    upstream: upstream.name(),
                    path: record.path.clone(),
                    request: record.id,
                    reason: reason(&e),
                },
            );
            if api {
                inner.unreachable(upstream, &reason(&e));
            }
            record.status = 502;
            record.outcome = Outcome::UpstreamError;
            record.code = Some(UNREACHABLE);
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
    if api {
        inner.reached(upstream);
    }
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
        probe: None,
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
/// with, whatever ended it), and frees the circuit's probe slot if the
/// request was its probe.
pub(super) struct Logged {
    pub(super) inner: Arc<Inner>,
    pub(super) record: Option<AccessRecord>,
    pub(super) started: Instant,
    pub(super) span: tracing::Span,
    /// The circuit's probe, when the request is one.
    pub(super) probe: Option<Probe>,
}

impl Drop for Logged {
    fn drop(&mut self) {
        if let Some(record) = self.record.take() {
            let _entered = self.span.enter();
            finish(&self.inner, record, self.started);
        }
    }
}
