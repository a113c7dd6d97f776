//! Error classification: what an HTTP answer or an error event means for
//! the session, as a [`StreamError`].
//!
//! Non-2xx statuses, their headers (`x-should-retry`, `retry-after-ms`,
//! `retry-after`, `location`) and error bodies; 2xx answers that are not an
//! event stream; transport failures; `event: error` and OpenAI `{"error":
//! ..}` chunks inside a stream. The table in the crate docs is this
//! module's contract. Nothing here sends or reads anything.

use std::time::{Duration, SystemTime};

use futures_util::{Stream, StreamExt};
use reqwest::StatusCode;
use reqwest::header::{CONTENT_ENCODING, CONTENT_TYPE, HeaderMap, HeaderName, LOCATION};
use serde::Deserialize;
use warden_core::{ResumeCause, StreamError, retryable_status};

use crate::json::json_error_message;

/// The `kind` of the fatal [`StreamError::Api`] for a 2xx answer that is
/// not an event stream (another content type, or a compressed body).
pub const NOT_AN_EVENT_STREAM: &str = "not_an_event_stream";

/// A fatal error when a 2xx answer cannot be an event stream: a
/// `content-encoding` other than `identity` (warden asks for none), or a
/// `content-type` other than `text/event-stream` (an HTML page or a JSON
/// document: the wrong endpoint). A missing `content-type` is accepted.
pub(crate) fn not_an_event_stream(status: StatusCode, headers: &HeaderMap) -> Option<StreamError> {
    let fatal = |message: String| StreamError::Api {
        status: Some(status.as_u16()),
        kind: NOT_AN_EVENT_STREAM.to_owned(),
        message,
        retryable: false,
        retry_after: None,
    };
    let header = |name: HeaderName| {
        headers
            .get(name)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).trim().to_owned())
    };
    if let Some(encoding) = header(CONTENT_ENCODING) {
        if !encoding.is_empty() && !encoding.eq_ignore_ascii_case("identity") {
            return Some(fatal(format!(
                "the response body is compressed (content-encoding: {encoding}), which warden did not ask for; a proxy in between may be compressing it"
            )));
        }
    }
    let content_type = header(CONTENT_TYPE)?;
    let mime = content_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    (mime != "text/event-stream").then(|| {
        fatal(format!(
            "expected an event stream (text/event-stream) but the server sent {content_type}: wrong endpoint or content type (check the URL)"
        ))
    })
}

/// Fails the stream with a clear error when the body starts with the gzip
/// magic bytes although no `content-encoding` said so (decoded as text it
/// would be reported as invalid UTF-8).
pub(crate) fn refuse_gzip_magic<S, B>(
    bytes: S,
) -> impl Stream<Item = Result<B, StreamError>> + Send + 'static
where
    S: Stream<Item = Result<B, StreamError>> + Send + 'static,
    B: AsRef<[u8]> + Send + 'static,
{
    let mut first = true;
    bytes.map(move |chunk| {
        let chunk = chunk?;
        if first && !chunk.as_ref().is_empty() {
            first = false;
            if chunk.as_ref().starts_with(&[0x1f, 0x8b]) {
                return Err(StreamError::Api {
                    status: None,
                    kind: NOT_AN_EVENT_STREAM.to_owned(),
                    message: "the response body is gzip-compressed data without a content-encoding header, not an event stream".to_owned(),
                    retryable: false,
                    retry_after: None,
                });
            }
        }
        Ok(chunk)
    })
}

/// A transport failure: connecting, sending, or reading the body.
pub(crate) fn connection_error(e: reqwest::Error) -> StreamError {
    StreamError::Connection {
        message: error_chain(&e.without_url()),
    }
}

/// An error and its sources, `: `-joined (a source whose text the message
/// already ends with is not repeated).
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut message = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !message.ends_with(&text) {
            message.push_str(": ");
            message.push_str(&text);
        }
        source = s.source();
    }
    message
}

#[derive(Debug, Default, Deserialize)]
struct ErrorEnvelope {
    #[serde(default)]
    error: Option<ErrorBody>,
}

/// An error object, Anthropic's (`{type, message}`) or OpenAI's (`{message,
/// type, code}`).
#[derive(Debug, Default, Deserialize)]
pub(crate) struct ErrorBody {
    #[serde(rename = "type", default)]
    pub(crate) kind: Option<String>,
    #[serde(default)]
    pub(crate) message: Option<String>,
    #[serde(default)]
    pub(crate) code: Option<serde_json::Value>,
}

impl ErrorBody {
    /// `type`, else a string `code`.
    fn kind(&self) -> Option<String> {
        self.kind.clone().or_else(|| match &self.code {
            Some(serde_json::Value::String(code)) => Some(code.clone()),
            _ => None,
        })
    }

    fn says_prompt_too_long(&self) -> bool {
        let code_says = matches!(&self.code, Some(serde_json::Value::String(c)) if c == "context_length_exceeded");
        code_says || self.message.as_deref().is_some_and(is_prompt_too_long)
    }
}

/// Whether a provider message says the prompt does not fit the context
/// window (Anthropic: `prompt is too long: N tokens > M maximum`; OpenAI:
/// `This model's maximum context length is N tokens ...`).
pub(crate) fn is_prompt_too_long(message: &str) -> bool {
    let m = message.to_ascii_lowercase();
    m.contains("prompt is too long")
        || m.contains("prompt too long")
        || m.contains("maximum context length")
        || m.contains("context_length_exceeded")
}

/// Whether an error a provider reports inside a stream (an Anthropic
/// `event: error`, an OpenAI `{"error": …}` chunk, a Responses `error`
/// event) is worth another attempt: the overload, server, rate-limit and
/// timeout kinds. The one rule for warden's sources and its proxy.
pub fn is_retryable_error_kind(kind: &str) -> bool {
    matches!(
        kind,
        "overloaded_error"
            | "api_error"
            | "rate_limit_error"
            | "timeout_error"
            | "server_error"
            | "server_is_overloaded"
            | "rate_limit_exceeded"
    )
}

/// An error object reported inside a stream (`{type, message}` or
/// `{message, type, code}`) as [`StreamError::Api`] without a status,
/// retryable when [`is_retryable_error_kind`] says so. Its kind is `type`,
/// else a string `code`, else `error`.
pub fn stream_error(error: &serde_json::Value) -> StreamError {
    stream_error_event(ErrorBody::deserialize(error).unwrap_or_default())
}

/// [`stream_error`] of a parsed error object.
pub(crate) fn stream_error_event(error: ErrorBody) -> StreamError {
    let kind = error.kind().unwrap_or_else(|| "error".to_owned());
    let retryable = is_retryable_error_kind(&kind);
    StreamError::Api {
        status: None,
        kind,
        message: error.message.unwrap_or_default(),
        retryable,
        retry_after: None,
    }
}

/// Classifies a non-2xx response like the official SDKs:
///
/// 0. a redirect (3xx) → fatal [`StreamError::Api`] of kind `redirect`
///    naming the `Location` (redirects are never followed);
/// 1. `x-should-retry: true` → retryable [`StreamError::Api`], whatever the
///    status;
/// 2. 401, 403 → [`StreamError::Unauthorized`];
/// 3. 400 saying the prompt is too long → [`StreamError::ContextOverflow`]
///    (`prompt_too_long`);
/// 4. otherwise [`StreamError::Api`], retryable when `x-should-retry: false`
///    is absent and the status is 408, 409, 429 or ≥ 500.
///
/// `retry_after` comes from `retry-after-ms`, else `retry-after` (seconds
/// or an HTTP date), capped at `cap`.
pub fn classify_response(
    status: StatusCode,
    headers: &HeaderMap,
    body: &[u8],
    cap: Duration,
) -> StreamError {
    let code = status.as_u16();
    let error = match serde_json::from_slice::<ErrorEnvelope>(body) {
        Ok(envelope) => envelope.error.unwrap_or_default(),
        Err(e) => {
            if !body.is_empty() {
                tracing::debug!(
                    event = "llm.error_body_unparsed",
                    status = code,
                    reason = %json_error_message(&e),
                    "error body is not a JSON error object"
                );
            }
            ErrorBody::default()
        }
    };
    let should_retry = match headers
        .get("x-should-retry")
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
    {
        Some(v) if v.eq_ignore_ascii_case("true") => Some(true),
        Some(v) if v.eq_ignore_ascii_case("false") => Some(false),
        _ => None,
    };
    let retry_after = retry_after(headers, cap, SystemTime::now());
    let message = error.message.clone().unwrap_or_else(|| {
        status
            .canonical_reason()
            .map_or_else(|| format!("HTTP {code}"), str::to_owned)
    });

    if status.is_redirection() {
        // Never followed: the API key must not go to another place.
        let target = headers
            .get(LOCATION)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
        return StreamError::Api {
            status: Some(code),
            kind: "redirect".to_owned(),
            message: match target {
                Some(to) => format!(
                    "the server redirects to {to}; redirects are not followed (the API key is only sent to the configured URL): use that URL if you trust it"
                ),
                None => "the server redirects (without a Location); redirects are not followed"
                    .to_owned(),
            },
            retryable: false,
            retry_after: None,
        };
    }
    if should_retry != Some(true) {
        if matches!(code, 401 | 403) {
            return StreamError::Unauthorized { message };
        }
        if code == 400 && error.says_prompt_too_long() {
            return StreamError::ContextOverflow {
                reason: ResumeCause::PromptTooLong,
                message,
            };
        }
    }
    let retryable = should_retry.unwrap_or_else(|| retryable_status(code));
    StreamError::Api {
        status: Some(code),
        kind: error.kind().unwrap_or_else(|| "http_error".to_owned()),
        message,
        retryable,
        retry_after,
    }
}

/// The server-requested wait: `retry-after-ms` (milliseconds), else
/// `retry-after` (seconds, or an HTTP date relative to `now`; a past date
/// is zero), capped at `cap`. Negative or unparsable values are ignored.
pub(crate) fn retry_after(headers: &HeaderMap, cap: Duration, now: SystemTime) -> Option<Duration> {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
    };
    let seconds = |v: &str| -> Option<Duration> {
        let s: f64 = v.parse().ok()?;
        if !s.is_finite() || s < 0.0 {
            return None;
        }
        // Too large for a Duration: as long as it gets.
        Some(Duration::try_from_secs_f64(s).unwrap_or(Duration::MAX))
    };
    let wait = header("retry-after-ms")
        .and_then(|v| seconds(v).map(|d| d / 1000))
        .or_else(|| {
            let v = header("retry-after")?;
            seconds(v).or_else(|| {
                let at = httpdate::parse_http_date(v).ok()?;
                Some(at.duration_since(now).unwrap_or(Duration::ZERO))
            })
        })?;
    Some(wait.min(cap))
}

#[cfg(test)]
mod tests {
    use reqwest::header::HeaderValue;

    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (n, v) in pairs {
            map.insert(*n, HeaderValue::from_str(v).expect("valid"));
        }
        map
    }

    const CAP: Duration = Duration::from_secs(60);

    #[test]
    fn retry_after_ms_wins_over_retry_after() {
        let h = headers(&[("retry-after-ms", "1500.5"), ("retry-after", "7")]);
        assert_eq!(
            retry_after(&h, CAP, SystemTime::now()),
            Some(Duration::from_micros(1_500_500))
        );
        let h = headers(&[("retry-after-ms", "soon"), ("retry-after", "7")]);
        assert_eq!(
            retry_after(&h, CAP, SystemTime::now()),
            Some(Duration::from_secs(7))
        );
    }

    #[test]
    fn retry_after_http_date_is_relative_and_capped() {
        let now = httpdate::parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT").expect("date");
        let h = headers(&[("retry-after", "Sun, 06 Nov 1994 08:49:49 GMT")]);
        assert_eq!(retry_after(&h, CAP, now), Some(Duration::from_secs(12)));
        let h = headers(&[("retry-after", "Sun, 06 Nov 1994 08:00:00 GMT")]);
        assert_eq!(retry_after(&h, CAP, now), Some(Duration::ZERO));
        let h = headers(&[("retry-after", "Mon, 07 Nov 1994 08:49:37 GMT")]);
        assert_eq!(retry_after(&h, CAP, now), Some(CAP));
        let h = headers(&[("retry-after", "1e300")]);
        assert_eq!(retry_after(&h, CAP, now), Some(CAP));
    }

    #[test]
    fn bad_retry_after_values_are_ignored() {
        for v in ["-1", "NaN", "inf", "later", ""] {
            let h = headers(&[("retry-after", v)]);
            assert_eq!(retry_after(&h, CAP, SystemTime::now()), None, "{v}");
        }
    }

    #[test]
    fn one_rule_says_which_stream_errors_are_retried() {
        for kind in [
            "overloaded_error",
            "api_error",
            "rate_limit_error",
            "server_error",
        ] {
            assert!(is_retryable_error_kind(kind), "{kind}");
            let e = stream_error(&serde_json::json!({"type": kind, "message": "m"}));
            assert!(e.is_retryable(), "{kind}: {e:?}");
        }
        for kind in ["invalid_request_error", "authentication_error", "error", ""] {
            assert!(!is_retryable_error_kind(kind), "{kind}");
        }
        // OpenAI's shape: a string `code` when there is no `type`.
        let e = stream_error(&serde_json::json!({"message": "m", "code": "rate_limit_exceeded"}));
        assert!(e.is_retryable(), "{e:?}");
        assert!(!stream_error(&serde_json::Value::Null).is_retryable());
    }

    #[test]
    fn prompt_too_long_wording() {
        assert!(is_prompt_too_long(
            "prompt is too long: 210000 tokens > 200000 maximum"
        ));
        assert!(is_prompt_too_long(
            "This model's maximum context length is 128000 tokens."
        ));
        assert!(!is_prompt_too_long("max_tokens: must be positive"));
    }

    #[test]
    fn openai_context_length_code_is_a_context_overflow() {
        let body = br#"{"error":{"message":"too many","type":"invalid_request_error","code":"context_length_exceeded"}}"#;
        let e = classify_response(StatusCode::BAD_REQUEST, &HeaderMap::new(), body, CAP);
        assert_eq!(e.resume_failure_cause(), Some(ResumeCause::PromptTooLong));
    }

    #[test]
    fn a_non_json_body_gets_the_status_reason() {
        let e = classify_response(
            StatusCode::BAD_GATEWAY,
            &HeaderMap::new(),
            b"<html>bad gateway</html>",
            CAP,
        );
        assert_eq!(
            e,
            StreamError::Api {
                status: Some(502),
                kind: "http_error".into(),
                message: "Bad Gateway".into(),
                retryable: true,
                retry_after: None,
            }
        );
    }
}
