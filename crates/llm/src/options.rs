//! Settings of the HTTP sources: [`SourceOptions`] per API (as
//! [`AnthropicOptions`] and [`OpenAiOptions`]) and the [`HttpOptions`] they
//! share. Plain data; nothing here connects.

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use crate::provider::{Anthropic, Api, OpenAi, OpenAiResponses};
use derive_setters::Setters;
use warden_core::store::ConversationStore;

use crate::transcript::Transcripts;

/// Settings of an [`AnthropicSource`](crate::AnthropicSource).
pub type AnthropicOptions = SourceOptions<Anthropic>;

/// Settings of an [`OpenAiSource`](crate::OpenAiSource).
pub type OpenAiOptions = SourceOptions<OpenAi>;

/// Options of an [`OpenAiResponsesSource`](crate::OpenAiResponsesSource).
pub type OpenAiResponsesOptions = SourceOptions<OpenAiResponses>;

/// Settings of an [`HttpSource`](crate::HttpSource) for the API `P`:
/// [`AnthropicOptions`] or [`OpenAiOptions`].
///
/// The defaults are the API's [`Provider`](crate::Provider) ones. `Debug`
/// redacts the API key.
#[derive(Clone, PartialEq, Eq, Setters)]
#[setters(prefix = "with_", strip_option)]
#[non_exhaustive]
pub struct SourceOptions<P: Api> {
    /// The API's base URL, without the endpoint
    /// ([`Provider::path`](crate::Provider::path): `/v1/messages`,
    /// `/v1/chat/completions`); a path prefix is kept. Default
    /// [`Provider::default_base_url`](crate::Provider::default_base_url):
    /// `https://api.anthropic.com`, `https://api.openai.com`.
    #[setters(into)]
    pub base_url: String,
    /// The API key, sent as `x-api-key` (Anthropic) or `Authorization: Bearer
    /// <key>` (OpenAI); left out when empty (local servers). Never logged.
    /// Default empty.
    #[setters(into)]
    pub api_key: String,
    /// The model. Default
    /// [`Provider::default_model`](crate::Provider::default_model):
    /// `claude-sonnet-4-5`, `gpt-4o-mini`.
    #[setters(into)]
    pub model: String,
    /// `max_tokens` of each request ([`Api::MaxTokens`]): for Anthropic a
    /// `u32`, default 8192; for OpenAI an `Option<u32>`, not sent when
    /// `None`, default `None`.
    #[setters(skip)]
    pub max_tokens: P::MaxTokens,
    /// Timeouts, limits, extra headers and transcripts. Default
    /// [`HttpOptions::default`].
    pub http: HttpOptions,
    #[setters(skip)]
    api: PhantomData<fn() -> P>,
}

impl<P: Api> Default for SourceOptions<P> {
    fn default() -> Self {
        let provider = P::PROTOCOL.provider();
        Self {
            base_url: provider.default_base_url.to_owned(),
            api_key: String::new(),
            model: provider.default_model.to_owned(),
            max_tokens: P::DEFAULT_MAX_TOKENS,
            http: HttpOptions::default(),
            api: PhantomData,
        }
    }
}

impl<P: Api> fmt::Debug for SourceOptions<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SourceOptions")
            .field("provider", &P::PROTOCOL.provider().name)
            .field("base_url", &self.base_url)
            .field("api_key", &"<redacted>")
            .field("model", &self.model)
            .field("max_tokens", &self.max_tokens)
            .field("http", &self.http)
            .finish()
    }
}

impl<P: Api> SourceOptions<P> {
    /// Sets [`max_tokens`](Self::max_tokens).
    pub fn with_max_tokens(mut self, max_tokens: u32) -> Self {
        self.max_tokens = P::MaxTokens::from(max_tokens);
        self
    }

    /// Sets [`HttpOptions::connect_timeout`].
    pub fn with_connect_timeout(self, timeout: Duration) -> Self {
        self.map_http(|h| h.with_connect_timeout(timeout))
    }

    /// Sets [`HttpOptions::max_frame_bytes`].
    pub fn with_max_frame_bytes(self, bytes: usize) -> Self {
        self.map_http(|h| h.with_max_frame_bytes(bytes))
    }

    /// Sets [`HttpOptions::max_retry_after`].
    pub fn with_max_retry_after(self, cap: Duration) -> Self {
        self.map_http(|h| h.with_max_retry_after(cap))
    }

    /// Adds one of [`HttpOptions::extra_headers`] (e.g. `anthropic-beta`,
    /// `OpenAI-Organization`).
    pub fn with_header(self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.map_http(|h| h.with_header(name, value))
    }

    fn map_http(mut self, f: impl FnOnce(HttpOptions) -> HttpOptions) -> Self {
        self.http = f(self.http);
        self
    }
}

/// HTTP settings shared by [`AnthropicOptions`] and [`OpenAiOptions`].
///
/// `Debug` prints the names of the extra headers, never their values.
#[derive(Clone, PartialEq, Eq, Setters)]
#[setters(prefix = "with_", strip_option)]
#[non_exhaustive]
pub struct HttpOptions {
    /// How long establishing the TCP (and TLS) connection may take. Default
    /// 10 s. There is deliberately no read or total timeout: silence on an
    /// open stream is the watchdog's business.
    pub connect_timeout: Duration,
    /// The largest SSE event accepted, in bytes (its non-comment lines, line
    /// ends included). Default 1 MiB. A larger event fails the stream with
    /// [`StreamError::FrameTooLarge`](warden_core::StreamError::FrameTooLarge) as soon as the limit is crossed.
    pub max_frame_bytes: usize,
    /// The longest server-requested wait (`retry-after-ms`, `retry-after`)
    /// reported in [`StreamError::Api::retry_after`](warden_core::StreamError::Api::retry_after); longer requests are
    /// capped to it. Default 60 s.
    pub max_retry_after: Duration,
    /// Headers added to every request, after the provider's own (a header of
    /// the same name replaces the default one, e.g. `anthropic-version`).
    /// Values are marked sensitive. Default none.
    #[setters(skip)]
    pub extra_headers: Vec<(String, String)>,
    /// Where conversations are kept, making the source resumable (see
    /// [`Transcripts`]). Default `None`: every turn is a one-message
    /// conversation and `resume_id` is ignored.
    pub transcripts: Option<Transcripts>,
    /// Where conversations are kept instead of [`transcripts`](Self::transcripts):
    /// any [`ConversationStore`], e.g. a database the nodes of a cluster
    /// share. Default `None`. Takes precedence over `transcripts`.
    #[setters(skip)]
    pub conversation_store: Option<SharedConversationStore>,
}

/// A [`ConversationStore`] shared by the sources that use it; equal when it
/// is the same store.
#[derive(Clone, Debug)]
pub struct SharedConversationStore(pub Arc<dyn ConversationStore>);

impl PartialEq for SharedConversationStore {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for SharedConversationStore {}

impl Default for HttpOptions {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(10),
            max_frame_bytes: 1024 * 1024,
            max_retry_after: Duration::from_secs(60),
            extra_headers: Vec::new(),
            transcripts: None,
            conversation_store: None,
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
            .field("conversation_store", &self.conversation_store)
            .finish()
    }
}

impl HttpOptions {
    /// Adds one of the [`extra_headers`](Self::extra_headers).
    pub fn with_header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.extra_headers.push((name.into(), value.into()));
        self
    }

    /// Sets [`conversation_store`](Self::conversation_store): keep
    /// conversations there.
    pub fn with_conversation_store(mut self, store: Arc<dyn ConversationStore>) -> Self {
        self.conversation_store = Some(SharedConversationStore(store));
        self
    }
}
