//! OpenAI-compatible chat-completions streaming: [`OpenAiSource`].

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use warden_core::{EventSource, EventStream, StreamError, TurnRequest};

use crate::http::{Begin, BuildError, Endpoint, HttpOptions};
use crate::provider::Protocol;
use crate::wire::{Message, Turn, auth_headers, request_body};

/// Settings of an [`OpenAiSource`].
///
/// `Debug` redacts the API key.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct OpenAiOptions {
    /// The API's base URL, without `/v1/chat/completions`; a path prefix is
    /// kept. Default `https://api.openai.com`.
    pub base_url: String,
    /// The API key, sent as `Authorization: Bearer <key>` (left out when
    /// empty, for local servers). Never logged. Default empty.
    pub api_key: String,
    /// The model. Default `gpt-4o-mini`.
    pub model: String,
    /// `max_tokens` of each request; not sent when `None`. Default `None`.
    pub max_tokens: Option<u32>,
    /// Timeouts, limits and extra headers. Default [`HttpOptions::default`].
    pub http: HttpOptions,
}

impl Default for OpenAiOptions {
    fn default() -> Self {
        Self {
            base_url: "https://api.openai.com".to_owned(),
            api_key: String::new(),
            model: "gpt-4o-mini".to_owned(),
            max_tokens: None,
            http: HttpOptions::default(),
        }
    }
}

impl fmt::Debug for OpenAiOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenAiOptions")
            .field("base_url", &self.base_url)
            .field("api_key", &"<redacted>")
            .field("model", &self.model)
            .field("max_tokens", &self.max_tokens)
            .field("http", &self.http)
            .finish()
    }
}

impl OpenAiOptions {
    /// Sets [`base_url`](Self::base_url).
    pub fn with_base_url(mut self, url: impl Into<String>) -> Self {
        self.base_url = url.into();
        self
    }

    /// Sets [`api_key`](Self::api_key).
    pub fn with_api_key(mut self, key: impl Into<String>) -> Self {
        self.api_key = key.into();
        self
    }

    /// Sets [`model`](Self::model).
    pub fn with_model(mut self, model: impl Into<String>) -> Self {
        self.model = model.into();
        self
    }

    /// Sets [`max_tokens`](Self::max_tokens).
    pub fn with_max_tokens(mut self, max_tokens: u32) -> Self {
        self.max_tokens = Some(max_tokens);
        self
    }

    /// Sets all of [`http`](Self::http).
    pub fn with_http(mut self, http: HttpOptions) -> Self {
        self.http = http;
        self
    }

    /// Sets [`HttpOptions::connect_timeout`].
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.http.connect_timeout = timeout;
        self
    }

    /// Sets [`HttpOptions::max_frame_bytes`].
    pub fn with_max_frame_bytes(mut self, bytes: usize) -> Self {
        self.http.max_frame_bytes = bytes;
        self
    }

    /// Sets [`HttpOptions::max_retry_after`].
    pub fn with_max_retry_after(mut self, cap: Duration) -> Self {
        self.http.max_retry_after = cap;
        self
    }

    /// Adds one of [`HttpOptions::extra_headers`] (e.g. `OpenAI-Organization`).
    pub fn with_header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.http.extra_headers.push((name.into(), value.into()));
        self
    }
}

/// Streams turns from an OpenAI-compatible chat-completions API
/// (`POST {base_url}/v1/chat/completions`, `stream: true`,
/// `stream_options: {include_usage: true}`).
///
/// Each attempt sends the turn's
/// [`append_system_prompt`](TurnRequest::append_system_prompt) as a
/// `system` message, then the turn's [`message`](TurnRequest::message) as
/// the `user` message. The API keeps no conversation: without
/// [`HttpOptions::transcripts`](crate::HttpOptions::transcripts)
/// `resume_id` is ignored; with them the stored history is sent between
/// the two (see [`Transcripts`](crate::Transcripts)). `workspace` is not
/// used. Cloning shares the HTTP client and its connection pool.
#[derive(Clone)]
pub struct OpenAiSource {
    inner: Arc<Inner>,
}

struct Inner {
    endpoint: Endpoint,
    model: String,
    max_tokens: Option<u32>,
}

impl fmt::Debug for OpenAiSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenAiSource")
            .field("endpoint", &self.inner.endpoint)
            .field("model", &self.inner.model)
            .field("max_tokens", &self.inner.max_tokens)
            .finish()
    }
}

impl OpenAiSource {
    /// A source with these options. Fails on a bad base URL or header.
    pub fn new(options: OpenAiOptions) -> Result<Self, BuildError> {
        let endpoint = Endpoint::new(
            "openai",
            Protocol::OpenAi,
            &options.base_url,
            "/v1/chat/completions",
            &auth_headers(Protocol::OpenAi, &options.api_key),
            &options.http,
        )?;
        Ok(Self {
            inner: Arc::new(Inner {
                endpoint,
                model: options.model,
                max_tokens: options.max_tokens,
            }),
        })
    }
}

impl OpenAiSource {
    /// Sends `body`, a complete request the caller wrote (it must ask for a
    /// stream), instead of one built from the turn, and decodes the answer
    /// like [`open`](EventSource::open) does. `request` only labels the
    /// logs; transcripts are not used.
    pub fn open_body(
        &self,
        body: Vec<u8>,
        request: TurnRequest,
    ) -> BoxFuture<'static, Result<EventStream, StreamError>> {
        let inner = Arc::clone(&self.inner);
        Box::pin(async move { inner.endpoint.open(body, &request, &inner.model).await })
    }
}

impl EventSource for OpenAiSource {
    fn open(&self, request: TurnRequest) -> BoxFuture<'static, Result<EventStream, StreamError>> {
        let inner = Arc::clone(&self.inner);
        Box::pin(async move {
            let conversation = match inner.endpoint.begin(&request, &inner.model).await? {
                Begin::Send(conversation) => conversation,
                Begin::Replayed(stream) => return Ok(stream),
            };
            let history = conversation.as_ref().map_or(&[][..], |c| c.history());
            let user = Message {
                role: "user",
                content: &request.message,
            };
            let turn = Turn {
                model: &inner.model,
                max_tokens: inner.max_tokens,
                system: request.append_system_prompt.as_deref(),
                messages: history
                    .iter()
                    .map(|e| Message {
                        role: e.role.as_str(),
                        content: &e.content,
                    })
                    .chain([user])
                    .collect(),
            };
            let body = request_body(Protocol::OpenAi, &turn)?;
            let stream = inner.endpoint.open(body, &request, &inner.model).await?;
            Ok(match conversation {
                Some(c) => c.record(stream, request.message, inner.model.clone()),
                None => stream,
            })
        })
    }

    fn provider(&self) -> &str {
        "openai"
    }
}
