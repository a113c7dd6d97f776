//! What each API is: its wire [`Protocol`], where it is and how a command
//! line configures it ([`Provider`]), and the same as a type ([`Api`],
//! implemented by [`Anthropic`] and [`OpenAi`]) for the generic
//! [`HttpSource`](crate::HttpSource). Depends on nothing else in the crate.

use std::fmt;

/// Which wire protocol a byte stream carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Protocol {
    /// Anthropic Messages streaming (`event: message_start` ... `message_stop`).
    Anthropic,
    /// OpenAI-compatible chat-completions streaming (`data: {chunk}` ...
    /// `data: [DONE]`).
    OpenAi,
    /// OpenAI's Responses API streaming (typed events numbered by
    /// `sequence_number`, `response.created` ... `response.completed`).
    OpenAiResponses,
}

impl Protocol {
    /// The API that speaks it.
    ///
    /// ```
    /// use warden_llm::decode::Protocol;
    /// assert_eq!(Protocol::OpenAi.provider().path, "/v1/chat/completions");
    /// ```
    pub const fn provider(self) -> &'static Provider {
        match self {
            Protocol::Anthropic => &Provider::ANTHROPIC,
            Protocol::OpenAi => &Provider::OPENAI,
            Protocol::OpenAiResponses => &Provider::OPENAI_RESPONSES,
        }
    }
}

/// Where an API is and what a command line reads to configure it: the one
/// place these names are written.
///
/// This crate reads no environment variable; `api_key_env` and
/// `base_url_env` are the names the official SDKs and agent CLIs use, for
/// callers that do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Provider {
    /// The name sources report as
    /// [`EventSource::provider`](warden_core::EventSource::provider) (the
    /// `gen_ai.provider.name` of telemetry) and in logs: `anthropic`,
    /// `openai`.
    pub name: &'static str,
    /// The streaming endpoint, appended to the base URL: `/v1/messages`,
    /// `/v1/chat/completions`.
    pub path: &'static str,
    /// The base URL used when none is given: `https://api.anthropic.com`,
    /// `https://api.openai.com`.
    pub default_base_url: &'static str,
    /// The model used when none is given: `claude-sonnet-4-5`,
    /// `gpt-4o-mini`.
    pub default_model: &'static str,
    /// The variable holding the API key: `ANTHROPIC_API_KEY`,
    /// `OPENAI_API_KEY`.
    pub api_key_env: &'static str,
    /// The variable holding a base URL that replaces the default:
    /// `ANTHROPIC_BASE_URL`, `OPENAI_BASE_URL`.
    pub base_url_env: &'static str,
}

impl Provider {
    /// The Anthropic Messages API.
    pub const ANTHROPIC: Provider = Provider {
        name: "anthropic",
        path: "/v1/messages",
        default_base_url: "https://api.anthropic.com",
        default_model: "claude-sonnet-4-5",
        api_key_env: "ANTHROPIC_API_KEY",
        base_url_env: "ANTHROPIC_BASE_URL",
    };

    /// OpenAI's Responses API (`/v1/responses`), the one OpenAI recommends;
    /// streams are requested in background so a dropped one can be
    /// re-attached.
    pub const OPENAI_RESPONSES: Provider = Provider {
        name: "openai",
        path: "/v1/responses",
        default_base_url: "https://api.openai.com",
        default_model: "gpt-5-mini",
        api_key_env: "OPENAI_API_KEY",
        base_url_env: "OPENAI_BASE_URL",
    };

    /// OpenAI's chat-completions API (and compatible servers).
    pub const OPENAI: Provider = Provider {
        name: "openai",
        path: "/v1/chat/completions",
        default_base_url: "https://api.openai.com",
        default_model: "gpt-4o-mini",
        api_key_env: "OPENAI_API_KEY",
        base_url_env: "OPENAI_BASE_URL",
    };
}

/// An HTTP API as a type: the parameter of [`HttpSource`](crate::HttpSource)
/// and [`SourceOptions`](crate::SourceOptions). Implemented by [`Anthropic`]
/// and [`OpenAi`] only (sealed).
pub trait Api: sealed::Sealed + Send + Sync + 'static {
    /// Its wire protocol, and through it its [`Provider`].
    const PROTOCOL: Protocol;
    /// The type of `max_tokens`: `u32` where the API requires it
    /// (Anthropic), `Option<u32>` where it may be left out (OpenAI).
    type MaxTokens: Copy + Eq + fmt::Debug + From<u32> + Into<Option<u32>> + Send + Sync;
    /// `max_tokens` by default: 8192 (Anthropic), `None` (OpenAI).
    const DEFAULT_MAX_TOKENS: Self::MaxTokens;
    /// Whether a reply broken mid-text is continued instead of replayed
    /// (Anthropic: prefill or a continuation turn; chat completions have no
    /// way).
    const CONTINUES: bool;
}

/// The Anthropic Messages API: `POST {base_url}/v1/messages` with `stream:
/// true`, headers `x-api-key`, `anthropic-version:`
/// [`ANTHROPIC_VERSION`](crate::ANTHROPIC_VERSION), `content-type:
/// application/json`. The turn's `append_system_prompt` is sent as `system`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Anthropic;

impl Api for Anthropic {
    const PROTOCOL: Protocol = Protocol::Anthropic;
    type MaxTokens = u32;
    const DEFAULT_MAX_TOKENS: u32 = 8192;
    const CONTINUES: bool = true;
}

/// OpenAI-compatible chat completions: `POST {base_url}/v1/chat/completions`
/// with `Authorization: Bearer <key>` (left out without a key, for local
/// servers), `stream: true` and `stream_options: {include_usage: true}`. The
/// turn's `append_system_prompt` is sent as the first, `system`, message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct OpenAi;

impl Api for OpenAi {
    const PROTOCOL: Protocol = Protocol::OpenAi;
    type MaxTokens = Option<u32>;
    const DEFAULT_MAX_TOKENS: Option<u32> = None;
    const CONTINUES: bool = false;
}

/// OpenAI's Responses API: `POST {base_url}/v1/responses` with
/// `Authorization: Bearer <key>`, `stream`, `background` and `store` set; the
/// turn's `append_system_prompt` is sent as `instructions`. A stream that
/// breaks is re-attached (`GET /v1/responses/{id}?stream=true&starting_after=N`):
/// nothing is generated twice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct OpenAiResponses;

impl Api for OpenAiResponses {
    const PROTOCOL: Protocol = Protocol::OpenAiResponses;
    type MaxTokens = Option<u32>;
    const DEFAULT_MAX_TOKENS: Option<u32> = None;
    const CONTINUES: bool = true;
}

mod sealed {
    /// Keeps [`Api`](super::Api) to the types of this module.
    #[allow(unreachable_pub)]
    pub trait Sealed {}
    impl Sealed for super::Anthropic {}
    impl Sealed for super::OpenAi {}
    impl Sealed for super::OpenAiResponses {}
}
