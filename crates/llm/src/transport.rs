//! The transport of every HTTP source: the client, the request, the checks
//! on the answer, and how a turn begins (send, or replay from the
//! transcript). Protocol-neutral: what differs between APIs comes in as a
//! [`Protocol`] value and header pairs from the wire module.

use std::fmt;
use std::time::Duration;

use futures_util::TryStreamExt;
use reqwest::header::{ACCEPT, ACCEPT_ENCODING, CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};
use warden_core::{EventStream, StreamError, TurnRequest};

use crate::classify::{
    classify_response, connection_error, error_chain, not_an_event_stream, refuse_gzip_magic,
};
use crate::decode::{Mapper, decode_with, mapper_for};
use crate::options::HttpOptions;
use crate::provider::Protocol;
use warden_core::store::ConversationStore;

use crate::transcript::{Conversation, replay_stream};

/// Bytes of an error response body read for its message; the rest is
/// dropped.
const MAX_ERROR_BODY: usize = 64 * 1024;

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
    if !raw.contains("://") {
        return Err(BuildError::InvalidBaseUrl {
            reason: format!("no scheme: write http://{raw} or https://{raw}"),
        });
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
    /// Already answered, or whole: this stream replays the stored reply
    /// (or ends the turn with the text it has).
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
    conversations: Option<std::sync::Arc<dyn ConversationStore>>,
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
            .field("conversations", &self.conversations)
            .finish_non_exhaustive()
    }
}

impl Endpoint {
    /// The endpoint of `protocol`'s [`Provider`](crate::Provider) under
    /// `base_url`. `headers` are the provider's own, the key included; an
    /// empty value is left out (no key for a local server).
    pub(crate) fn new(
        protocol: Protocol,
        base_url: &str,
        headers: &[(&str, String)],
        http: &HttpOptions,
    ) -> Result<Self, BuildError> {
        validate_base_url(base_url)?;
        let provider = protocol.provider();
        let url = format!("{}{}", base_url.trim().trim_end_matches('/'), provider.path);
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
            provider: provider.name,
            protocol,
            client,
            url,
            headers: map,
            max_frame_bytes: http.max_frame_bytes,
            max_retry_after: http.max_retry_after,
            conversations: match (&http.conversation_store, &http.transcripts) {
                (Some(store), _) => Some(store.0.clone()),
                (None, Some(t)) => Some(std::sync::Arc::new(t.clone())),
                (None, None) => None,
            },
        })
    }

    /// The conversation `request` continues, when transcripts are kept.
    async fn conversation(
        &self,
        request: &TurnRequest,
    ) -> Result<Option<Conversation>, StreamError> {
        let Some(store) = &self.conversations else {
            return Ok(None);
        };
        crate::transcript::begin(store.clone(), request)
            .await
            .map(Some)
    }

    /// How `request` begins: with its conversation (when transcripts are
    /// kept) to send, or, for a re-delivered message the conversation
    /// already answered, with the stored reply as the stream: no request is
    /// sent, so the message is not answered twice (see the transcript
    /// module, "Crashes"); likewise for a re-delivered turn whose reply the
    /// upstream had finished ([`finished`](Self::finished)).
    pub(crate) async fn begin(
        &self,
        request: &TurnRequest,
        model: &str,
    ) -> Result<Begin, StreamError> {
        let conversation = self.conversation(request).await?;
        let replayed = match &conversation {
            Some(c) => self.replay(request, c),
            None => None,
        };
        // The text a continuation has: recorded before what is replayed.
        let partial = request
            .continuation
            .as_ref()
            .map(|c| c.partial_text.clone())
            .unwrap_or_default();
        Ok(
            match (replayed.or_else(|| self.finished(request)), conversation) {
                (Some(replayed), Some(c)) => Begin::Replayed(c.record(
                    replayed,
                    request.message.clone(),
                    model.to_owned(),
                    partial,
                )),
                (Some(replayed), None) => Begin::Replayed(replayed),
                (None, c) => Begin::Send(c),
            },
        )
    }

    /// The stored reply of a re-delivered message that `conversation`
    /// already answered, as a stream: what follows the text a
    /// continuation already has.
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
        let rest = request
            .continuation
            .as_ref()
            .and_then(|c| reply.strip_prefix(c.partial_text.as_str()))
            .unwrap_or(reply);
        Some(replay_stream(rest.to_owned()))
    }

    /// A re-delivered turn whose reply the upstream had finished before
    /// the turn's end was lost ([`Continuation::complete`](warden_core::Continuation::complete)):
    /// nothing is left to ask for, so no request is sent; the turn ends
    /// with the text it has.
    fn finished(&self, request: &TurnRequest) -> Option<EventStream> {
        let whole = request.continuation.as_ref().filter(|c| c.complete)?;
        tracing::info!(
            event = "llm.replay",
            provider = self.provider,
            session.key = %request.session_key,
            turn = request.turn_id,
            reply_bytes = whole.partial_text.len(),
            "the reply was whole when its turn was re-delivered; ending it without a request"
        );
        Some(replay_stream(String::new()))
    }

    /// Sends `body` and, on a 2xx answer, returns the decoded stream, which
    /// owns the response body.
    pub(crate) async fn open(
        &self,
        body: Vec<u8>,
        request: &TurnRequest,
        model: &str,
    ) -> Result<EventStream, StreamError> {
        self.open_mapped(body, request, model, mapper_for(self.protocol))
            .await
    }

    /// [`open`](Self::open) with `mapper` decoding the events.
    pub(crate) async fn open_mapped(
        &self,
        body: Vec<u8>,
        request: &TurnRequest,
        model: &str,
        mapper: Mapper,
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
        let sent = self
            .client
            .post(self.url.clone())
            .headers(self.headers.clone())
            .body(body)
            .send()
            .await;
        self.stream_of(sent, mapper).await
    }

    /// Re-attaches to Responses API response `id` after event `after`
    /// (`GET {url}/{id}?stream=true&starting_after=N`): only later events
    /// come, nothing is generated again.
    pub(crate) async fn reattach(
        &self,
        id: &str,
        after: u64,
        request: &TurnRequest,
        mapper: Mapper,
    ) -> Result<EventStream, StreamError> {
        let mut url = self.url.clone();
        url.path_segments_mut()
            .map_err(|()| StreamError::Internal {
                message: "the endpoint URL cannot take a path".into(),
            })?
            .push(id);
        url.query_pairs_mut()
            .append_pair("stream", "true")
            .append_pair("starting_after", &after.to_string());
        tracing::debug!(
            event = "llm.reattach",
            provider = self.provider,
            session.key = %request.session_key,
            turn = request.turn_id,
            attempt = request.attempt,
            after,
            "re-attaching to the response"
        );
        let mut headers = self.headers.clone();
        headers.remove(CONTENT_TYPE);
        let sent = self.client.get(url).headers(headers).send().await;
        self.stream_of(sent, mapper).await
    }

    /// The decoded stream of a sent request's answer, or its typed error.
    async fn stream_of(
        &self,
        sent: Result<reqwest::Response, reqwest::Error>,
        mapper: Mapper,
    ) -> Result<EventStream, StreamError> {
        let response = sent.map_err(|e| {
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
        Ok(decode_with(mapper, bytes, self.max_frame_bytes))
    }
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
