//! How the proxy behaves: [`ProxyConfig`] and its defaults.

use std::sync::Arc;
use std::time::Duration;

use derive_setters::Setters;
use warden_core::{ConfigError, RetryPolicy, WatchdogConfig};
use warden_http::Limits;

use crate::access::{AccessLog, AccessRecord, RecoveryEvent, RecoveryLog};
use crate::circuit::CircuitConfig;

/// Where the proxy sends Anthropic requests by default.
pub const ANTHROPIC_API: &str = "https://api.anthropic.com";
/// Where the proxy sends OpenAI requests by default.
pub const OPENAI_API: &str = "https://api.openai.com";
/// Where the proxy sends Gemini requests by default.
pub const GEMINI_API: &str = "https://generativelanguage.googleapis.com";
/// Largest request body of a watched route: 32 MiB (Claude Code's requests
/// are ~100 KB; the API's own limit is 32 MB).
pub const DEFAULT_MAX_BODY_BYTES: usize = 32 * 1024 * 1024;
/// Largest single SSE event accepted from an upstream: 16 MiB.
pub const DEFAULT_MAX_FRAME_BYTES: usize = 16 * 1024 * 1024;
/// Largest assembled answer: 16 MiB (as `warden serve --max-reply-bytes`;
/// real replies are well under 1 MiB).
pub const DEFAULT_MAX_REPLY_BYTES: usize = 16 * 1024 * 1024;

/// The `503` body past the connection cap: the Anthropic error shape,
/// which the OpenAI SDKs read as well (`error.message`); both retry a 503.
const BUSY_BODY: &str = r#"{"type":"error","error":{"type":"overloaded_error","message":"warden proxy: too many connections open; retry shortly"}}"#;

/// The `408` body for a request whose body stalled past the header timeout
/// (`--header-timeout`): the Anthropic error shape, which the OpenAI SDKs
/// read as well (`error.message`); both retry a 408.
const STALLED_BODY: &str = r#"{"type":"error","error":{"type":"timeout_error","message":"warden proxy: the request body sent nothing for the header timeout (--header-timeout); send it again"}}"#;

/// How the proxy behaves.
#[derive(Clone, Setters)]
#[setters(prefix = "with_", strip_option)]
#[non_exhaustive]
pub struct ProxyConfig {
    /// Base URL of the Anthropic API. Default [`ANTHROPIC_API`].
    #[setters(into)]
    pub anthropic_upstream: String,
    /// Base URL of the OpenAI API. Default [`OPENAI_API`].
    #[setters(into)]
    pub openai_upstream: String,
    /// Base URL of Google's Gemini API (requests under `/v1beta/`).
    /// Default [`GEMINI_API`].
    #[setters(into)]
    pub gemini_upstream: String,
    /// Where requests for paths outside the APIs (`/v1/…`) go, unwatched.
    /// Default `None`: the proxy answers them itself (`200` for `HEAD /`,
    /// else `404`), so nothing reaches a host the user did not name for it.
    #[setters(into)]
    pub other_upstream: Option<String>,
    /// Silence allowed on an upstream stream (and before its first byte)
    /// before the attempt is killed. Default 45 s; [`ProxyConfig::from_env`]
    /// takes `WARDEN_STREAM_TIMEOUT` (milliseconds) instead when it is set.
    pub timeout: Duration,
    /// Content allowance: an attempt on which no content arrives for this
    /// long — only pings or comments — is killed (`ESTREAM_NO_PROGRESS`)
    /// and retried or continued like a silent one. Default
    /// [`DEFAULT_PROGRESS_TIMEOUT`] (180 s); `None` lets pings keep a
    /// stream alive for as long as the upstream sends them.
    pub progress_timeout: Option<Duration>,
    /// Wall-clock cap of one request, attempts and backoff included; past
    /// it the response ends with the provider's error (`ESTREAM_INTERRUPTED`).
    /// Default `None`.
    pub deadline: Option<Duration>,
    /// Attempts per request (the first included) and backoff between them.
    /// An overloaded answer (429, 503, 529) before any of the reply takes
    /// no more than the first: it goes back to the client at once, whose
    /// own retries take it up (the proxy's would multiply them). Default
    /// [`RetryPolicy::default`].
    pub retry: RetryPolicy,
    /// Largest request body of a watched route. Default
    /// [`DEFAULT_MAX_BODY_BYTES`].
    #[setters(skip)]
    pub max_body_bytes: usize,
    /// Largest SSE event accepted from an upstream. Default
    /// [`DEFAULT_MAX_FRAME_BYTES`].
    pub max_frame_bytes: usize,
    /// Size cap of a whole answer the proxy holds: one assembled for a
    /// client that asked for no stream (its text, thinking, signatures and
    /// tool input — chat: content, refusal and tool-call arguments — and
    /// the size of everything else it keeps), and any answer an upstream
    /// gives whole in place of a stream (an error answer, a JSON reply).
    /// Past it nothing more is read and the client gets a `502` in the
    /// provider's shape naming `EREPLY_TOO_LARGE`. Streams the client
    /// reads as they come are not held, and not capped. Default
    /// [`DEFAULT_MAX_REPLY_BYTES`].
    pub max_reply_bytes: usize,
    /// The downstream connections' limits: the header-read (and idle)
    /// timeout and the connection cap, past which a connection gets a
    /// `503` the SDKs retry. Default [`Limits::default`] (30 s, 4,096).
    #[setters(skip)]
    pub connections: Limits,
    /// Called once per request with its [`AccessRecord`]. Default none.
    #[setters(skip)]
    pub access_log: Option<AccessLog>,
    /// Called once per kill, retry, continuation, give-up and unreachable
    /// upstream ([`RecoveryEvent`]). Default none.
    #[setters(skip)]
    pub recovery_log: Option<RecoveryLog>,
    /// When an unreachable upstream's requests are answered at once
    /// ([`CircuitConfig`]); `None` never. Default: after 2 consecutive
    /// unreachable attempts, a probe every 5 s.
    #[setters(strip_option = false)]
    pub circuit: Option<CircuitConfig>,
    /// Hold thinking back from the client until it is whole: an Anthropic
    /// thinking block (its signature and stop arrived), a Responses
    /// reasoning item (its `output_item.done`), a Gemini reply's thought
    /// parts (until its text starts); so a stream that breaks
    /// inside it is retried from scratch unseen instead of ending with an
    /// error event. Costs the client the thinking's streaming (it gets the
    /// block at once when it ends); the text after it is not delayed.
    /// Default off.
    pub hold_thinking: bool,
    /// Whether the Gemini API's clients retry an overloaded answer (429,
    /// 503, 529) on their own, as the Gemini CLI does unless its
    /// `general.maxAttempts` is 1: then the proxy hands it back before any
    /// byte, as it does for the other APIs. When `false` (warden's wire
    /// layer, under a Gemini CLI whose retries warden turns off) the proxy
    /// retries it itself per the shared backoff. Default `true`.
    pub gemini_client_retries: bool,
    /// Whether the clients of OpenAI chat completions retry an overloaded
    /// answer (429, 503, 529) on their own, as the OpenAI SDKs do: then
    /// the proxy hands it back before any byte. When `false` (warden's
    /// wire layer, under OpenCode, Kilo Code, Qwen Code and Aider, whose
    /// own retries warden's adapters take for a broken turn, or which
    /// retry silently at a backoff of their own) the proxy retries it
    /// itself per the shared backoff, as for Gemini CLI. Default `true`.
    pub chat_client_retries: bool,
    /// The last resort of a request whose streamed attempts all went
    /// silent before any content (an upstream or a middlebox whose
    /// streaming path is broken): one request for the whole answer
    /// without a stream ([`WholeFallback`]). `None` never. Default
    /// [`WholeFallback::default`]: once the attempts of
    /// [`retry`](Self::retry) are spent.
    #[setters(strip_option = false)]
    pub whole_fallback: Option<WholeFallback>,
}

/// When and for how long a request whose streamed attempts went silent
/// after their head, before any of the reply's content, is asked once
/// more, for its whole
/// answer without a stream (`"stream": false`, Gemini's
/// `:generateContent`), the answer given to its client as it asked for it
/// (a stream: the whole message as the provider's events). Not for the
/// Responses API, whose non-streaming answer is not re-encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct WholeFallback {
    /// Streamed attempts gone silent after their head, before any content
    /// (all of the request's attempts so far), after which the whole
    /// answer is asked for. `None`: once every attempt of
    /// [`ProxyConfig::retry`] has (the last resort of the shared
    /// backoff). Default `None`.
    pub after: Option<u32>,
    /// How long the request for the whole answer may take, its answer
    /// read to the end (within the request's own
    /// [`deadline`](ProxyConfig::deadline)); past it the request ends with
    /// the provider's error. Default [`WHOLE_FALLBACK_DEADLINE`].
    pub deadline: Duration,
}

/// How long the request for a whole answer may take by default: 600 s,
/// the time Claude Code gives a request of its own (`API_TIMEOUT_MS`'s
/// default), its non-streaming fallback included.
pub const WHOLE_FALLBACK_DEADLINE: Duration = Duration::from_secs(600);

impl Default for WholeFallback {
    fn default() -> Self {
        Self {
            after: None,
            deadline: WHOLE_FALLBACK_DEADLINE,
        }
    }
}

impl WholeFallback {
    /// Sets [`after`](Self::after).
    pub fn after(mut self, silent_attempts: u32) -> Self {
        self.after = Some(silent_attempts);
        self
    }

    /// Sets [`deadline`](Self::deadline).
    pub fn within(mut self, deadline: Duration) -> Self {
        self.deadline = deadline;
        self
    }
}

/// The default progress allowance: 180 s without content. Claude Code
/// (2.1.332) counts pings as life: a stream that only pings keeps it
/// waiting for ever (its idle timeout, 300 s by default and shortened by
/// `CLAUDE_BYTE_STREAM_IDLE_TIMEOUT_MS` to 10 s at the least, counts only
/// silence); the SDKs wait forever. Killing at 180 s acts first and leaves
/// the retry two minutes to produce content, and no answer a real model
/// streams goes three minutes without a token of text, thinking or tool
/// input (`docs/proxy.md`).
pub const DEFAULT_PROGRESS_TIMEOUT: Duration = Duration::from_secs(180);

impl std::fmt::Debug for ProxyConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProxyConfig")
            .field("anthropic_upstream", &self.anthropic_upstream)
            .field("openai_upstream", &self.openai_upstream)
            .field("gemini_upstream", &self.gemini_upstream)
            .field("other_upstream", &self.other_upstream)
            .field("timeout", &self.timeout)
            .field("progress_timeout", &self.progress_timeout)
            .field("deadline", &self.deadline)
            .field("retry", &self.retry)
            .field("max_body_bytes", &self.max_body_bytes)
            .field("max_frame_bytes", &self.max_frame_bytes)
            .field("max_reply_bytes", &self.max_reply_bytes)
            .field("connections", &self.connections)
            .field("access_log", &self.access_log.is_some())
            .field("recovery_log", &self.recovery_log.is_some())
            .field("circuit", &self.circuit)
            .field("hold_thinking", &self.hold_thinking)
            .field("gemini_client_retries", &self.gemini_client_retries)
            .field("chat_client_retries", &self.chat_client_retries)
            .field("whole_fallback", &self.whole_fallback)
            .finish()
    }
}

impl Default for ProxyConfig {
    /// The built-in defaults; the environment is not read (see
    /// [`ProxyConfig::from_env`]).
    fn default() -> Self {
        Self {
            anthropic_upstream: ANTHROPIC_API.to_owned(),
            openai_upstream: OPENAI_API.to_owned(),
            gemini_upstream: GEMINI_API.to_owned(),
            other_upstream: None,
            timeout: WatchdogConfig::default().default_timeout,
            progress_timeout: Some(DEFAULT_PROGRESS_TIMEOUT),
            deadline: None,
            retry: RetryPolicy::default(),
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            max_frame_bytes: DEFAULT_MAX_FRAME_BYTES,
            max_reply_bytes: DEFAULT_MAX_REPLY_BYTES,
            connections: Limits::default()
                .with_busy_body(BUSY_BODY)
                .with_stalled_body(STALLED_BODY),
            access_log: None,
            recovery_log: None,
            circuit: Some(CircuitConfig::default()),
            hold_thinking: false,
            gemini_client_retries: true,
            chat_client_retries: true,
            whole_fallback: Some(WholeFallback::default()),
        }
    }
}

impl ProxyConfig {
    /// The defaults with `WARDEN_STREAM_TIMEOUT` (milliseconds) applied to
    /// [`timeout`](Self::timeout) when it is set. A value that is not a
    /// whole number of milliseconds in `1..=86_400_000` is an error, as it
    /// is for the supervisor: a typo never silently becomes the default.
    pub fn from_env() -> Result<Self, ConfigError> {
        Ok(Self {
            timeout: WatchdogConfig::from_env()?.default_timeout,
            ..Self::default()
        })
    }

    /// Turns the progress allowance off: pings alone keep a stream alive.
    pub fn without_progress_timeout(mut self) -> Self {
        self.progress_timeout = None;
        self
    }

    /// Sets the header-read (and idle) timeout and the connection cap of
    /// [`connections`](Self::connections); its `503` body stays the
    /// proxy's.
    #[must_use]
    pub fn with_connection_limits(
        mut self,
        header_timeout: Duration,
        max_connections: usize,
    ) -> Self {
        self.connections = self
            .connections
            .with_header_timeout(header_timeout)
            .with_max_connections(max_connections);
        self
    }

    /// The engine as the wire layer under an agent CLI (Claude Code,
    /// Codex, Gemini CLI, and the chat-completions CLIs: OpenCode, Kilo
    /// Code, Qwen Code, Aider), whose process a session watches with
    /// `stream_timeout`: an
    /// upstream stream may be silent for half of it (at least 500 ms), so a
    /// stall is continued here well before the process watchdog would kill
    /// the CLI waiting on it; thinking is held back (no human watches these
    /// streams, and a stall inside it is then retried unseen); an
    /// overloaded chat-completions answer is retried here
    /// ([`chat_client_retries`](Self::chat_client_retries) off), since
    /// warden takes those CLIs' own retries for a broken turn; a request
    /// whose first streamed attempt went silent before any content is
    /// asked at once for its whole answer without a stream
    /// ([`WholeFallback::after`] 1): the process watchdog gives the CLI
    /// two such silences, so a second streamed attempt would end after it
    /// had killed the CLI, and where only streams stall no turn would be
    /// answered. The upstreams are the defaults until set.
    pub fn under_agent_cli(stream_timeout: Duration) -> Self {
        Self::default()
            .with_timeout((stream_timeout / 2).max(Duration::from_millis(500)))
            .with_hold_thinking(true)
            .with_chat_client_retries(false)
            .with_whole_fallback(Some(WholeFallback::default().after(1)))
    }

    /// Sets [`access_log`](Self::access_log).
    pub fn with_access_log(mut self, log: impl Fn(&AccessRecord) + Send + Sync + 'static) -> Self {
        self.access_log = Some(Arc::new(log));
        self
    }

    /// Sets [`recovery_log`](Self::recovery_log).
    pub fn with_recovery_log(
        mut self,
        log: impl Fn(&RecoveryEvent) + Send + Sync + 'static,
    ) -> Self {
        self.recovery_log = Some(Arc::new(log));
        self
    }
}
