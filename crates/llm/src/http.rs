//! The HTTP side shared by both sources: the client, the request, and the
//! classification of error responses.

use std::fmt;
use std::time::{Duration, SystemTime};

use futures_util::{Stream, StreamExt, TryStreamExt};
use reqwest::StatusCode;
use reqwest::header::{
    ACCEPT, ACCEPT_ENCODING, CONTENT_ENCODING, CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue,
    LOCATION,
};
use serde::Deserialize;
use warden_core::{EventStream, ResumeCause, StreamError, TurnRequest, retryable_status};

use crate::decode::{Protocol, decode_frames, json_error_message};
use crate::transcript::{Conversation, Transcripts, replay_stream};

/// Bytes of an error response body read for its message; the rest is
/// dropped.
const MAX_ERROR_BODY: usize = 64 * 1024;

/// HTTP settings shared by [`AnthropicOptions`](crate::AnthropicOptions)
/// and [`OpenAiOptions`](crate::OpenAiOptions).
///
/// `Debug` prints the names of the extra headers, never their values.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct HttpOptions {
    /// How long establishing the TCP (and TLS) connection may take. Default
    /// 10 s. There is deliberately no read or total timeout: silence on an
    /// open stream is the watchdog's business.
    pub connect_timeout: Duration,
    /// The largest SSE event accepted, in bytes (its non-comment lines, line
    /// ends included). Default 1 MiB. A larger event fails the stream with
    /// [`StreamError::FrameTooLarge`] as soon as the limit is crossed.
    pub max_frame_bytes: usize,
    /// The longest server-requested wait (`retry-after-ms`, `retry-after`)
    /// reported in [`StreamError::Api::retry_after`]; longer requests are
    /// capped to it. Default 60 s.
    pub max_retry_after: Duration,
    /// Headers added to every request, after the provider's own (a header of
    /// the same name replaces the default one, e.g. `anthropic-version`).
    /// Values are marked sensitive. Default none.
    pub extra_headers: Vec<(String, String)>,
    /// Where conversations are kept, making the source resumable (see
    /// [`Transcripts`]). Default `None`: every turn is a one-message
    /// conversation and `resume_id` is ignored.
    pub transcripts: Option<Transcripts>,
}

impl Default for HttpOptions {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(10),
            max_frame_bytes: 1024 * 1024,
            max_retry_after: Duration::from_secs(60),
            extra_headers: Vec::new(),
            transcripts: None,
        }
    }
}

impl fmt::Debug for HttpOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.extra_headers.iter().map(|(n, _)| n.as_str()).collect();
        f.debug_struct("HttpOptions")
            .field("connect_timeout", &self.connect_timeout)
            .field("max_frame_bytes", &self.max_frame_bytes)
            .field("max_retry_after", &self.max_retry_after)
            .field("extra_headers", &names)
            .field("transcripts", &self.transcripts)
            .finish()
    }
}

impl HttpOptions {
    /// Sets [`connect_timeout`](Self::connect_timeout).
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Sets [`max_frame_bytes`](Self::max_frame_bytes).
    pub fn with_max_frame_bytes(mut self, bytes: usize) -> Self {
        self.max_frame_bytes = bytes;
        self
    }

    /// Sets [`max_retry_after`](Self::max_retry_after).
    pub fn with_max_retry_after(mut self, cap: Duration) -> Self {
        self.max_retry_after = cap;
        self
    }

    /// Adds one of the [`extra_headers`](Self::extra_headers).
    pub fn with_header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.extra_headers.push((name.into(), value.into()));
        self
    }

    /// Sets [`transcripts`](Self::transcripts): keep conversations there.
    pub fn with_transcripts(mut self, transcripts: Transcripts) -> Self {
        self.transcripts = Some(transcripts);
        self
    }
}

/// Why a source could not be built from its options.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// The base URL is not an absolute `http` or `https` URL with a host
    /// and a non-zero port (see [`validate_base_url`]). **Fatal.**
    #[error("invalid base URL: {reason}")]
    InvalidBaseUrl {
        /// What is wrong.
        reason: String,
    },
    /// A header name or value cannot be sent (the value is never shown).
    #[error("invalid header {name:?}: {reason}")]
    InvalidHeader {
        /// The header's name.
        name: String,
        /// What is wrong.
        reason: String,
    },
    /// The HTTP client could not be created (e.g. the TLS backend).
    #[error("could not create the HTTP client: {message}")]
    Client {
        /// What the client library said.
        message: String,
    },
}

/// Checks that `base_url` can be sent to: an absolute `http` or `https` URL
/// with a host as written (`http:///v1` is refused, although URL parsing
/// would take `v1` for its host) and a port other than 0. An empty string is
/// refused too: it is never a request for the provider's default endpoint.
///
/// The sources' constructors call it; a command line can call it before
/// doing anything else.
///
/// ```
/// assert!(warden_llm::validate_base_url("http://127.0.0.1:8080/proxy").is_ok());
/// for bad in ["", "http://", "http:///v1/messages", "http://h:0", "ftp://h"] {
///     assert!(warden_llm::validate_base_url(bad).is_err(), "{bad:?}");
/// }
/// ```
pub fn validate_base_url(base_url: &str) -> Result<(), BuildError> {
    let invalid = |reason: &str| {
        Err(BuildError::InvalidBaseUrl {
            reason: reason.to_owned(),
        })
    };
    let raw = base_url.trim();
    if raw.is_empty() {
        return invalid("the URL is empty");
    }
    let url = reqwest::Url::parse(raw).map_err(|e| BuildError::InvalidBaseUrl {
        reason: e.to_string(),
    })?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(BuildError::InvalidBaseUrl {
            reason: format!("scheme {:?} is not http or https", url.scheme()),
        });
    }
    // The host as written: the parser skips extra slashes in `http:///v1`
    // and would connect to a host named `v1`.
    let Some((_, rest)) = raw.split_once("://") else {
        return invalid("expected scheme://host");
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let host = authority.rsplit('@').next().unwrap_or_default();
    if host.is_empty() || host.starts_with(':') || url.host_str().is_none_or(str::is_empty) {
        return invalid("the URL has no host");
    }
    if url.port() == Some(0) {
        return invalid("port 0 cannot be connected to");
    }
    Ok(())
}

/// How a turn begins; see [`Endpoint::begin`].
pub(crate) enum Begin {
    /// Send the request, continuing this conversation if there is one.
    Send(Option<Conversation>),
    /// Already answered: this stream replays the stored reply.
    Replayed(EventStream),
}

/// One streaming endpoint: URL, headers, client, limits.
pub(crate) struct Endpoint {
    provider: &'static str,
    protocol: Protocol,
    client: reqwest::Client,
    url: reqwest::Url,
    headers: HeaderMap,
    max_frame_bytes: usize,
    max_retry_after: Duration,
    transcripts: Option<Transcripts>,
}

impl fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The headers hold the API key: names only.
        let names: Vec<&str> = self.headers.keys().map(HeaderName::as_str).collect();
        f.debug_struct("Endpoint")
            .field("provider", &self.provider)
            .field("url", &self.url.as_str())
            .field("headers", &names)
            .field("max_frame_bytes", &self.max_frame_bytes)
            .field("max_retry_after", &self.max_retry_after)
            .field("transcripts", &self.transcripts)
            .finish_non_exhaustive()
    }
}

impl Endpoint {
    /// `headers` are the provider's own, the key included; an empty value
    /// is left out (no key for a local server).
    pub(crate) fn new(
        provider: &'static str,
        protocol: Protocol,
        base_url: &str,
        path: &str,
        headers: &[(&str, String)],
        http: &HttpOptions,
    ) -> Result<Self, BuildError> {
        validate_base_url(base_url)?;
        let url = format!("{}{path}", base_url.trim().trim_end_matches('/'));
        let url = reqwest::Url::parse(&url).map_err(|e| BuildError::InvalidBaseUrl {
            reason: e.to_string(),
        })?;

        let mut map = HeaderMap::new();
        map.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        map.insert(ACCEPT, HeaderValue::from_static("text/event-stream"));
        // Nothing here decompresses: ask for the body as is.
        map.insert(ACCEPT_ENCODING, HeaderValue::from_static("identity"));
        let extra = http.extra_headers.iter().map(|(n, v)| (n.as_str(), v));
        for (name, value) in headers.iter().map(|(n, v)| (*n, v)).chain(extra) {
            if value.is_empty() {
                continue;
            }
            let header =
                HeaderName::from_bytes(name.as_bytes()).map_err(|_| BuildError::InvalidHeader {
                    name: name.to_owned(),
                    reason: "not a valid header name".to_owned(),
                })?;
            let mut value =
                HeaderValue::from_str(value).map_err(|_| BuildError::InvalidHeader {
                    name: name.to_owned(),
                    reason: "the value has characters a header cannot carry".to_owned(),
                })?;
            value.set_sensitive(true);
            map.insert(header, value);
        }

        let client = reqwest::Client::builder()
            .connect_timeout(http.connect_timeout)
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("warden-llm/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| BuildError::Client {
                message: error_chain(&e),
            })?;

        Ok(Self {
            provider,
            protocol,
            client,
            url,
            headers: map,
            max_frame_bytes: http.max_frame_bytes,
            max_retry_after: http.max_retry_after,
            transcripts: http.transcripts.clone(),
        })
    }

    /// The conversation `request` continues, when transcripts are kept.
    async fn conversation(
        &self,
        request: &TurnRequest,
    ) -> Result<Option<Conversation>, StreamError> {
        let Some(transcripts) = &self.transcripts else {
            return Ok(None);
        };
        transcripts.begin(request).await.map(Some)
    }

    /// How `request` begins: with its conversation (when transcripts are
    /// kept) to send, or, for a re-delivered message the conversation
    /// already answered, with the stored reply as the stream: no request is
    /// sent, so the message is not answered twice (see the transcript
    /// module, "Crashes").
    pub(crate) async fn begin(
        &self,
        request: &TurnRequest,
        model: &str,
    ) -> Result<Begin, StreamError> {
        Ok(match self.conversation(request).await? {
            Some(c) => match self.replay(request, &c) {
                Some(replayed) => {
                    Begin::Replayed(c.record(replayed, request.message.clone(), model.to_owned()))
                }
                None => Begin::Send(Some(c)),
            },
            None => Begin::Send(None),
        })
    }

    /// The stored reply of a re-delivered message that `conversation`
    /// already answered, as a stream.
    fn replay(&self, request: &TurnRequest, conversation: &Conversation) -> Option<EventStream> {
        let reply = conversation.replay()?;
        tracing::info!(
            event = "llm.replay",
            provider = self.provider,
            session.key = %request.session_key,
            turn = request.turn_id,
            reply_bytes = reply.len(),
            "turn already answered in the transcript; replaying it without a request"
        );
        Some(replay_stream(reply.to_owned()))
    }

    /// Sends `body` and, on a 2xx answer, returns the decoded stream, which
    /// owns the response body.
    pub(crate) async fn open(
        &self,
        body: Vec<u8>,
        request: &TurnRequest,
        model: &str,
    ) -> Result<EventStream, StreamError> {
        tracing::debug!(
            event = "llm.request",
            provider = self.provider,
            model,
            session.key = %request.session_key,
            turn = request.turn_id,
            attempt = request.attempt,
            request_bytes = body.len(),
            "opening stream"
        );
        let response = self
            .client
            .post(self.url.clone())
            .headers(self.headers.clone())
            .body(body)
            .send()
            .await
            .map_err(|e| {
                let error = connection_error(e);
                tracing::warn!(
                    event = "llm.connect_failed",
                    provider = self.provider,
                    error = %error,
                    "request failed"
                );
                error
            })?;

        let status = response.status();
        if !status.is_success() {
            let headers = response.headers().clone();
            let body = read_limited(response, MAX_ERROR_BODY).await;
            let error = classify_response(status, &headers, &body, self.max_retry_after);
            tracing::warn!(
                event = "llm.http_error",
                provider = self.provider,
                status = status.as_u16(),
                code = error.code(),
                retryable = error.is_retryable(),
                retry_after_ms = error.retry_after().map(|d| d.as_millis() as u64),
                "error response"
            );
            return Err(error);
        }
        if let Some(error) = not_an_event_stream(status, response.headers()) {
            tracing::warn!(
                event = "llm.not_an_event_stream",
                provider = self.provider,
                status = status.as_u16(),
                code = error.code(),
                "the answer is not an event stream"
            );
            return Err(error);
        }
        tracing::debug!(
            event = "llm.response",
            provider = self.provider,
            status = status.as_u16(),
            "streaming"
        );
        let bytes = refuse_gzip_magic(response.bytes_stream().map_err(connection_error));
        Ok(decode_frames(self.protocol, bytes, self.max_frame_bytes))
    }
}

/// The `kind` of the fatal [`StreamError::Api`] for a 2xx answer that is
/// not an event stream (another content type, or a compressed body).
pub const NOT_AN_EVENT_STREAM: &str = "not_an_event_stream";

/// A fatal error when a 2xx answer cannot be an event stream: a
/// `content-encoding` other than `identity` (warden asks for none), or a
/// `content-type` other than `text/event-stream` (an HTML page or a JSON
/// document: the wrong endpoint). A missing `content-type` is accepted.
fn not_an_event_stream(status: StatusCode, headers: &HeaderMap) -> Option<StreamError> {
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
fn refuse_gzip_magic<S, B>(bytes: S) -> impl Stream<Item = Result<B, StreamError>> + Send + 'static
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

/// Reads at most `limit` bytes of an error body; a failure keeps what was
/// read.
async fn read_limited(mut response: reqwest::Response, limit: usize) -> Vec<u8> {
    let mut body = Vec::new();
    while body.len() < limit {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                let take = chunk.len().min(limit - body.len());
                body.extend_from_slice(&chunk[..take]);
            }
            Ok(None) | Err(_) => break,
        }
    }
    body
}

/// A transport failure: connecting, sending, or reading the body.
fn connection_error(e: reqwest::Error) -> StreamError {
    StreamError::Connection {
        message: error_chain(&e.without_url()),
    }
}

/// An error and its sources, `: `-joined.
fn error_chain(e: &dyn std::error::Error) -> String {
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

/// An error event inside a 200 stream (Anthropic `event: error`, an OpenAI
/// `{"error": ...}` chunk). Always [`StreamError::Api`] without a status;
/// retryable for overload, server, rate-limit and timeout kinds.
pub(crate) fn stream_error_event(error: ErrorBody) -> StreamError {
    let kind = error.kind().unwrap_or_else(|| "error".to_owned());
    let retryable = matches!(
        kind.as_str(),
        "overloaded_error"
            | "api_error"
            | "rate_limit_error"
            | "timeout_error"
            | "server_error"
            | "rate_limit_exceeded"
    );
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
pub(crate) fn classify_response(
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
    fn urls_without_a_usable_host_are_refused_before_any_connection() {
        for bad in [
            "",
            "  ",
            "http://",
            "https://",
            "http:///v1/messages",
            "http://:8080/v1",
            "http://user@/v1",
            "http://127.0.0.1:0",
            "http://localhost:0/v1",
            "ftp://example.com",
            "127.0.0.1:8080",
        ] {
            let built =
                crate::AnthropicSource::new(crate::AnthropicOptions::default().with_base_url(bad));
            assert!(
                matches!(built, Err(BuildError::InvalidBaseUrl { .. })),
                "{bad:?} was accepted"
            );
        }
        for good in [
            "http://127.0.0.1:8080",
            "http://localhost/",
            "https://api.anthropic.com",
            "http://[::1]:9000/prefix/",
            "http://user:pw@host:1/x",
        ] {
            assert_eq!(validate_base_url(good), Ok(()), "{good:?}");
        }
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
