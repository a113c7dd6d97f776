//! How a [`MockServer`](crate::MockServer) behaves: [`MockConfig`].
//!
//! Defaults are fast (tens of milliseconds) so a test suite that plays every
//! scenario still runs in seconds. Raise the durations for demos against a
//! real client, e.g. a 60 s [`thinking_pause`](MockConfig::thinking_pause)
//! with 20 s pings to mimic the real API.

use std::time::Duration;

use derive_setters::Setters;

use crate::Scenario;

/// Default pause between two frames: 10 ms.
pub const DEFAULT_FRAME_INTERVAL: Duration = Duration::from_millis(10);
/// Default content-free pause of `thinking-pings`: 200 ms.
pub const DEFAULT_THINKING_PAUSE: Duration = Duration::from_millis(200);
/// Default ping cadence during the `thinking-pings` pause: 50 ms.
pub const DEFAULT_PING_INTERVAL: Duration = Duration::from_millis(50);
/// Default number of frames sent before a mid-stream fault: 4.
pub const DEFAULT_FAULT_AFTER_FRAMES: usize = 4;
/// Default size of the `oversized` frame: 4 MiB.
pub const DEFAULT_OVERSIZED_BYTES: usize = 4 * 1024 * 1024;
/// Default wait advertised by `rate-limited`: 100 ms.
pub const DEFAULT_RETRY_AFTER: Duration = Duration::from_millis(100);

/// Configuration of a [`MockServer`](crate::MockServer).
///
/// Build it from [`MockConfig::default()`] with the `with_*` methods:
///
/// ```
/// use std::time::Duration;
/// use warden_mock::{MockConfig, Scenario};
///
/// let config = MockConfig::default()
///     .with_sequence([Scenario::Stall, Scenario::Normal])
///     .with_frame_interval(Duration::from_millis(5));
/// assert_eq!(config.sequence, vec![Scenario::Stall, Scenario::Normal]);
/// ```
#[derive(Debug, Clone, PartialEq, Setters)]
#[setters(prefix = "with_", strip_option)]
#[non_exhaustive]
pub struct MockConfig {
    /// Port to bind on 127.0.0.1. Default `None`: a free port chosen by the
    /// OS (read it back with [`MockServer::addr`](crate::MockServer::addr)).
    pub port: Option<u16>,
    /// Scenario of a request that selects none and is past the end of
    /// [`sequence`](Self::sequence) (or when the sequence is empty).
    /// Default [`Scenario::Normal`].
    pub default_scenario: Scenario,
    /// Script of scenarios for the API requests that select none
    /// themselves: the first such request plays `sequence[0]`, the second
    /// `sequence[1]`, and every request after the end plays the *last*
    /// entry. Default empty (every such request plays
    /// [`default_scenario`](Self::default_scenario)).
    #[setters(skip)]
    pub sequence: Vec<Scenario>,
    /// Scripts per session, as [`sequence`](Self::sequence) is for all:
    /// the requests of session `KEY` — those under a `/session/KEY/` path
    /// prefix (give each session its own base URL,
    /// `{base_url}/session/KEY`) — play `scripts[KEY]` in order, then its
    /// last entry. So one worker's first attempt stalls, whichever request
    /// comes first. A `/session/` request with no script here, or a
    /// request that selects a scenario itself (header, model, `/scenario/`
    /// prefix), plays as if it had no `/session/` prefix. Default empty.
    #[setters(skip)]
    pub scripts: std::collections::HashMap<String, Vec<Scenario>>,
    /// Pause between two consecutive frames of a stream. Default 10 ms
    /// ([`DEFAULT_FRAME_INTERVAL`]); zero sends frames back to back.
    pub frame_interval: Duration,
    /// Length of the content-free pause of `thinking-pings`, and the delay
    /// before a non-streaming `thinking-pings` answer. Default 200 ms
    /// ([`DEFAULT_THINKING_PAUSE`]).
    pub thinking_pause: Duration,
    /// Ping cadence during the `thinking-pings` pause. Default 50 ms
    /// ([`DEFAULT_PING_INTERVAL`]); zero means no pings at all.
    pub ping_interval: Duration,
    /// Frames sent before the fault of `stall`, `abrupt-close`,
    /// `midstream-error` and `malformed`. Capped so that the terminal frame
    /// is never sent by `stall` and `abrupt-close`. Default 4
    /// ([`DEFAULT_FAULT_AFTER_FRAMES`]): on the Anthropic endpoint that is
    /// `message_start`, `content_block_start`, `ping` and the first text
    /// delta.
    pub fault_after_frames: usize,
    /// Approximate size in bytes of the one huge frame of `oversized`.
    /// Default 4 MiB ([`DEFAULT_OVERSIZED_BYTES`]).
    pub oversized_bytes: usize,
    /// Wait advertised by `rate-limited` in `retry-after-ms`, and rounded
    /// up to whole seconds in `retry-after`. Default 100 ms
    /// ([`DEFAULT_RETRY_AFTER`]), i.e. `retry-after: 1`.
    pub retry_after: Duration,
    /// Fixed reply text. Default `None`: a deterministic sentence that
    /// states the length of the last user message (never its content).
    #[setters(into)]
    pub reply: Option<String>,
    /// Token usage reported in replies. Default [`TokenUsage::default`]:
    /// input tokens estimated from the request size, no cache tokens.
    pub usage: TokenUsage,
}

impl Default for MockConfig {
    fn default() -> Self {
        Self {
            port: None,
            default_scenario: Scenario::Normal,
            sequence: Vec::new(),
            scripts: std::collections::HashMap::new(),
            frame_interval: DEFAULT_FRAME_INTERVAL,
            thinking_pause: DEFAULT_THINKING_PAUSE,
            ping_interval: DEFAULT_PING_INTERVAL,
            fault_after_frames: DEFAULT_FAULT_AFTER_FRAMES,
            oversized_bytes: DEFAULT_OVERSIZED_BYTES,
            retry_after: DEFAULT_RETRY_AFTER,
            reply: None,
            usage: TokenUsage::default(),
        }
    }
}

impl MockConfig {
    /// A configuration whose every request plays `scenario` unless it
    /// selects another one.
    pub fn scenario(scenario: Scenario) -> Self {
        Self::default().with_default_scenario(scenario)
    }

    /// Sets the [`sequence`](Self::sequence) script, e.g. `[Stall, Normal]`
    /// for "the first attempt stalls, every retry succeeds".
    pub fn with_sequence(mut self, sequence: impl IntoIterator<Item = Scenario>) -> Self {
        self.sequence = sequence.into_iter().collect();
        self
    }

    /// Sets session `key`'s script ([`scripts`](Self::scripts)), e.g.
    /// `("worker-1", [Stall, Normal])`: that worker's first attempt stalls.
    pub fn with_script(
        mut self,
        key: impl Into<String>,
        script: impl IntoIterator<Item = Scenario>,
    ) -> Self {
        self.scripts
            .insert(key.into(), script.into_iter().collect());
        self
    }
}

/// Token counts the mock reports in `message_start` / `message_delta`
/// (Anthropic) and the usage chunk (OpenAI).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct TokenUsage {
    /// Uncached input tokens. Default `None`: the request body size in
    /// bytes divided by 4 (at least 1).
    pub input_tokens: Option<u64>,
    /// `cache_creation_input_tokens`. Default 0.
    pub cache_creation_input_tokens: u64,
    /// `cache_read_input_tokens`. Default 0.
    pub cache_read_input_tokens: u64,
}

impl TokenUsage {
    /// Fixed counts: `input` uncached, `cache_creation` written and
    /// `cache_read` read from the prompt cache.
    pub fn new(input: u64, cache_creation: u64, cache_read: u64) -> Self {
        Self {
            input_tokens: Some(input),
            cache_creation_input_tokens: cache_creation,
            cache_read_input_tokens: cache_read,
        }
    }
}
