//! Where a request goes and in which protocol: the upstream (from its
//! headers), the watched protocols (from its route), and error answers in
//! the provider's own shape.

use axum::body::Body;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::{Bytes, BytesMut};

/// Which API a request is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Upstream {
    /// The Anthropic API.
    Anthropic,
    /// The OpenAI API.
    OpenAi,
    /// Google's Gemini API.
    Gemini,
}

impl Upstream {
    /// Its name, as the access log and the admission pools name it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Anthropic => "anthropic",
            Self::OpenAi => "openai",
            Self::Gemini => "gemini",
        }
    }
}

/// Whether `path` is an API path (`/v1/…`, Gemini's `/v1beta/…`), which
/// goes to an upstream; other paths go to
/// [`ProxyConfig::other_upstream`](crate::ProxyConfig::other_upstream) if
/// set, else are answered by the proxy.
pub(crate) fn is_api_path(path: &str) -> bool {
    path == "/v1" || path.starts_with("/v1/") || is_gemini_path(path)
}

/// Whether `path` is one of Gemini's (`/v1beta/…`).
fn is_gemini_path(path: &str) -> bool {
    path == "/v1beta" || path.starts_with("/v1beta/")
}

impl Upstream {
    /// The upstream of a request: Gemini for a `/v1beta/…` path (its
    /// API's; no other provider's has it); Anthropic when it carries an
    /// `anthropic-version` header (every Anthropic client sends one); else
    /// OpenAI.
    pub(crate) fn of(path: &str, headers: &HeaderMap) -> Self {
        if is_gemini_path(path) {
            Self::Gemini
        } else if headers.contains_key("anthropic-version") {
            Self::Anthropic
        } else {
            Self::OpenAi
        }
    }
}

/// What a Gemini request asks for, from its path and query.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GeminiCall {
    /// `…:streamGenerateContent?alt=sse`: an event stream.
    Stream,
    /// `…:generateContent`: the whole answer.
    Whole,
    /// Anything else (`countTokens`, a stream without `alt=sse`, which is
    /// a JSON array): passed through.
    Other,
}

impl GeminiCall {
    /// The call of `uri`.
    pub(crate) fn of(uri: &axum::http::Uri) -> Self {
        let path = uri.path();
        let sse = uri
            .query()
            .is_some_and(|q| q.split('&').any(|pair| pair == "alt=sse"));
        if path.ends_with(":streamGenerateContent") && sse {
            Self::Stream
        } else if path.ends_with(":generateContent") {
            Self::Whole
        } else {
            Self::Other
        }
    }

    /// The path and query a whole answer is asked for as a stream with:
    /// `:streamGenerateContent`, its query kept, `alt=sse` added.
    pub(crate) fn as_stream(uri: &axum::http::Uri) -> String {
        let path = uri.path();
        let path = path.strip_suffix(":generateContent").unwrap_or(path);
        match uri.query() {
            Some(q) if !q.is_empty() => format!("{path}:streamGenerateContent?{q}&alt=sse"),
            _ => format!("{path}:streamGenerateContent?alt=sse"),
        }
    }
}

/// A streaming protocol the proxy watches; each has its route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Protocol {
    /// Anthropic Messages, `POST /v1/messages`.
    Messages,
    /// OpenAI chat completions, `POST /v1/chat/completions`.
    ChatCompletions,
    /// OpenAI Responses, `POST /v1/responses`.
    Responses,
    /// Gemini, `POST /v1beta/models/<model>:streamGenerateContent?alt=sse`
    /// (and `:generateContent`).
    Gemini,
}

impl Protocol {
    /// Whether a non-streaming request of this protocol is sent upstream as
    /// a stream and its answer assembled (Responses requests are passed
    /// through: a background response is the API's own way to outlive a
    /// connection).
    pub(crate) fn assembles(self) -> bool {
        matches!(self, Self::Messages | Self::ChatCompletions | Self::Gemini)
    }

    /// The upstream that speaks it.
    pub(crate) fn upstream(self) -> Upstream {
        match self {
            Self::Messages => Upstream::Anthropic,
            Self::ChatCompletions | Self::Responses => Upstream::OpenAi,
            Self::Gemini => Upstream::Gemini,
        }
    }
}

/// A JSON error answer in the provider's shape.
pub(crate) fn error_response(upstream: Upstream, status: StatusCode, message: &str) -> Response {
    error_response_coded(upstream, status, message, None)
}

/// A JSON error answer in the provider's shape, with a `code` for the
/// OpenAI shape (the Anthropic shape has none: the message names it;
/// Gemini's `code` is the HTTP status, its `status` the gRPC one).
pub(crate) fn error_response_coded(
    upstream: Upstream,
    status: StatusCode,
    message: &str,
    code: Option<&str>,
) -> Response {
    let body = match upstream {
        Upstream::Anthropic => serde_json::json!({
            "type": "error",
            "error": {"type": anthropic_error_type(status), "message": message},
        }),
        Upstream::OpenAi => serde_json::json!({
            "error": {"message": message, "type": openai_error_type(status), "param": null, "code": code},
        }),
        Upstream::Gemini => gemini_error(status, message),
    };
    let mut response = (status, Body::from(body.to_string())).into_response();
    response.headers_mut().insert(
        axum::http::header::CONTENT_TYPE,
        axum::http::HeaderValue::from_static("application/json"),
    );
    response
}

/// An upstream's whole answer (an error answer, or what came instead of a
/// stream), read up to `limit` bytes
/// ([`ProxyConfig::max_reply_bytes`](crate::ProxyConfig::max_reply_bytes));
/// past it, nothing more is read and the error is a `502` in the
/// provider's shape naming the cap. A body that breaks off is empty.
pub(crate) async fn read_capped(
    mut body: crate::client::UpstreamBody,
    limit: usize,
    upstream: Upstream,
) -> Result<Bytes, Response> {
    use futures_util::StreamExt as _;
    let too_large = || {
        let message = format!(
            "warden proxy: the upstream's answer passed --max-reply-bytes ({limit} bytes); the \
             rest was not read (EREPLY_TOO_LARGE)"
        );
        error_response_coded(
            upstream,
            StatusCode::BAD_GATEWAY,
            &message,
            Some("reply_too_large"),
        )
    };
    let declared = body.declared_len().unwrap_or(0);
    if u64::try_from(limit).is_ok_and(|limit| declared > limit) {
        return Err(too_large());
    }
    let mut read = BytesMut::new();
    loop {
        match body.next().await {
            Some(Ok(chunk)) if read.len().saturating_add(chunk.len()) > limit => {
                return Err(too_large());
            }
            Some(Ok(chunk)) => read.extend_from_slice(&chunk),
            None => return Ok(read.freeze()),
            Some(Err(_)) => return Ok(Bytes::new()),
        }
    }
}

fn anthropic_error_type(status: StatusCode) -> &'static str {
    match status.as_u16() {
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        429 => "rate_limit_error",
        400..=499 => "invalid_request_error",
        500 | 502 | 504 => "api_error",
        _ => "overloaded_error",
    }
}

/// Gemini's error object for `status`: `{"error":{"code","message",
/// "status"}}`.
pub(crate) fn gemini_error(status: StatusCode, message: &str) -> serde_json::Value {
    let grpc = match status.as_u16() {
        400 => "INVALID_ARGUMENT",
        401 => "UNAUTHENTICATED",
        403 => "PERMISSION_DENIED",
        404 => "NOT_FOUND",
        413 => "INVALID_ARGUMENT",
        429 => "RESOURCE_EXHAUSTED",
        502..=504 | 529 => "UNAVAILABLE",
        _ => "INTERNAL",
    };
    serde_json::json!({"error": {"code": status.as_u16(), "message": message, "status": grpc}})
}

fn openai_error_type(status: StatusCode) -> &'static str {
    match status.as_u16() {
        400..=499 => "invalid_request_error",
        _ => "server_error",
    }
}
