//! The pass-through path: a request that is not watched, sent on as it is
//! with both bodies streamed, and the local answer to a path no upstream
//! is configured for.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{Method, StatusCode};
use axum::response::Response;
use futures_util::StreamExt as _;
use tokio::time::Instant;
use tracing::Instrument as _;

use super::pump::refuse;
use super::{Inner, UNREACHABLE, base_of, finish, reason, report, request_span, upstream_url};
use crate::access::{AccessRecord, Outcome, RecoveryEvent};
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
    if base == base_of(&inner, upstream)
        && let Some(refused) = refuse(&inner, upstream, &record, started)
    {
        return refused;
    }
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
            report(
                &inner,
                RecoveryEvent::Unreachable {
                    upstream: upstream.name(),
                    path: record.path.clone(),
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
pub(super) struct Logged {
    pub(super) inner: Arc<Inner>,
    pub(super) record: Option<AccessRecord>,
    pub(super) started: Instant,
    pub(super) span: tracing::Span,
}

impl Drop for Logged {
    fn drop(&mut self) {
        if let Some(record) = self.record.take() {
            let _entered = self.span.enter();
            finish(&self.inner, record, self.started);
        }
    }
}
