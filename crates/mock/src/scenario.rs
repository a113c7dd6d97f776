//! What the mock does with one request: the [`Scenario`] catalogue.
//!
//! Every scenario has a kebab-case name (its [`Display`](std::fmt::Display)
//! and [`FromStr`] form) and a one-line [`description`](Scenario::description),
//! so a CLI can list them with [`Scenario::all`].
//!
//! | name | HTTP | what the client sees |
//! |---|---|---|
//! | `normal` | 200 | a short streamed reply with usage |
//! | `thinking-pings` | 200 | `message_start`, then only pings for [`thinking_pause`], then the reply |
//! | `stall` | 200 | [`fault_after_frames`] frames, then silence with the socket held open |
//! | `abrupt-close` | 200 | [`fault_after_frames`] frames, then the TCP connection is closed |
//! | `early-end` | 200 | [`fault_after_frames`] frames, then the body ends cleanly, without the terminal frame |
//! | `server-error` | 500 | `api_error` JSON body |
//! | `overloaded` | 529 | `overloaded_error` JSON body |
//! | `unavailable` | 503 | `api_error` JSON body (OpenAI `server_error`, Gemini `UNAVAILABLE`) |
//! | `rate-limited` | 429 | `rate_limit_error` plus `retry-after` and `retry-after-ms` |
//! | `midstream-error` | 200 | [`fault_after_frames`] frames, then an `overloaded_error` event |
//! | `malformed` | 200 | one frame whose data is not JSON, then the rest of the reply |
//! | `oversized` | 200 | one text frame of about [`oversized_bytes`] bytes, then the rest |
//! | `prompt-too-long` | 400 | `invalid_request_error`: prompt is too long |
//! | `stall-streamed` | 200 | a streamed request: the stream's start (none of the reply), then silence; a non-streaming one: the whole reply |
//!
//! [`thinking_pause`]: crate::MockConfig::thinking_pause
//! [`fault_after_frames`]: crate::MockConfig::fault_after_frames
//! [`oversized_bytes`]: crate::MockConfig::oversized_bytes

use std::fmt;
use std::str::FromStr;

/// One fault (or non-fault) the mock can play on a request.
///
/// How a request picks its scenario is described in the
/// [crate docs](crate#choosing-a-scenario).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Scenario {
    /// A short reply, streamed in full, with usage. Use it as the "retry
    /// succeeds" half of a script.
    Normal,
    /// A long silence on the content, kept alive by pings (SSE `: keep-alive`
    /// comments on the OpenAI endpoint), then the reply. A watchdog that
    /// counts pings must not kill it.
    ThinkingPings,
    /// A few frames, then nothing: the socket stays open, no FIN, no
    /// terminal frame. Only a client-side watchdog ends it.
    Stall,
    /// A few frames, then the server closes the TCP connection without the
    /// terminal frame (nor the final chunk of the chunked body).
    AbruptClose,
    /// A few frames, then the body ends cleanly (the final chunk of the
    /// chunked body is sent) without the stream's terminal frame: a proxy
    /// or load balancer that ends a stream early. The Gemini CLI retries
    /// this by itself (see `docs/agents.md`).
    EarlyEnd,
    /// HTTP 500 with an `api_error` body.
    ServerError,
    /// HTTP 529 with an `overloaded_error` body.
    Overloaded,
    /// HTTP 503 with an `api_error` body (OpenAI: `server_error`; Gemini:
    /// `UNAVAILABLE`): a provider or gateway that is down for a while.
    /// Script a run of them (`with_sequence`) for a 503 storm.
    Unavailable,
    /// HTTP 429 with a `rate_limit_error` body and `retry-after` /
    /// `retry-after-ms` headers.
    RateLimited,
    /// The stream starts, then carries an `overloaded_error` error event and
    /// ends without the normal terminal frame.
    MidstreamError,
    /// One frame whose `data:` is not valid JSON, then the rest of the reply.
    Malformed,
    /// One single, very large data frame, then the rest of the reply.
    Oversized,
    /// HTTP 400 `invalid_request_error`: "prompt is too long: 210000 tokens >
    /// 200000 maximum".
    PromptTooLong,
    /// A stall inside a thinking block (Anthropic endpoint: a few
    /// `thinking_delta`s, no signature, then silence with the socket open;
    /// Gemini endpoint: a few `thought: true` parts, no text, then silence;
    /// Responses endpoint: a reasoning item whose summary streams, then
    /// silence before the item's end;
    /// elsewhere like [`Stall`](Self::Stall)).
    StallInThinking,
    /// A stall inside a tool call's input (Anthropic endpoint: some text, a
    /// `tool_use` block and part of its `input_json_delta`, then silence;
    /// elsewhere like [`Stall`](Self::Stall)).
    StallInToolInput,
    /// Only streamed requests stall: a middlebox that buffers or kills
    /// SSE, an upstream whose streaming path is broken. A streamed request
    /// gets its stream's start — the frames before the reply's first
    /// content (Anthropic: `message_start`; chat completions and
    /// Responses: the first chunk or event; Gemini: nothing but the
    /// head) — then silence with the socket open; a non-streaming request
    /// (`"stream": false`, Gemini's `:generateContent`) gets the whole
    /// reply as [`Normal`](Self::Normal) does.
    StallStreamed,
}

impl Scenario {
    /// Every scenario, in catalogue order.
    pub fn all() -> &'static [Scenario] {
        &[
            Scenario::Normal,
            Scenario::ThinkingPings,
            Scenario::Stall,
            Scenario::AbruptClose,
            Scenario::EarlyEnd,
            Scenario::ServerError,
            Scenario::Overloaded,
            Scenario::Unavailable,
            Scenario::RateLimited,
            Scenario::MidstreamError,
            Scenario::Malformed,
            Scenario::Oversized,
            Scenario::PromptTooLong,
            Scenario::StallInThinking,
            Scenario::StallInToolInput,
            Scenario::StallStreamed,
        ]
    }

    /// The kebab-case name, e.g. `"abrupt-close"`.
    pub fn name(self) -> &'static str {
        match self {
            Scenario::Normal => "normal",
            Scenario::ThinkingPings => "thinking-pings",
            Scenario::Stall => "stall",
            Scenario::AbruptClose => "abrupt-close",
            Scenario::EarlyEnd => "early-end",
            Scenario::ServerError => "server-error",
            Scenario::Overloaded => "overloaded",
            Scenario::Unavailable => "unavailable",
            Scenario::RateLimited => "rate-limited",
            Scenario::MidstreamError => "midstream-error",
            Scenario::Malformed => "malformed",
            Scenario::Oversized => "oversized",
            Scenario::PromptTooLong => "prompt-too-long",
            Scenario::StallInThinking => "stall-in-thinking",
            Scenario::StallInToolInput => "stall-in-tool-input",
            Scenario::StallStreamed => "stall-streamed",
        }
    }

    /// A one-line description, for `--help` output.
    pub fn description(self) -> &'static str {
        match self {
            Scenario::Normal => "a short streamed reply with usage",
            Scenario::ThinkingPings => "a long pause filled with pings, then the reply",
            Scenario::Stall => "a few frames, then silence with the socket held open (no FIN)",
            Scenario::AbruptClose => "a few frames, then the TCP connection is closed mid-stream",
            Scenario::EarlyEnd => {
                "a few frames, then the body ends cleanly without its terminal frame"
            }
            Scenario::ServerError => "HTTP 500 api_error",
            Scenario::Overloaded => "HTTP 529 overloaded_error",
            Scenario::Unavailable => "HTTP 503 api_error (the service is unavailable)",
            Scenario::RateLimited => "HTTP 429 rate_limit_error with retry-after headers",
            Scenario::MidstreamError => "the stream starts, then an overloaded_error event",
            Scenario::Malformed => "one frame whose data is not valid JSON",
            Scenario::Oversized => "one huge data frame (size configurable)",
            Scenario::PromptTooLong => "HTTP 400 invalid_request_error: prompt is too long",
            Scenario::StallInThinking => "silence inside a thinking block (no signature yet)",
            Scenario::StallInToolInput => "silence inside a tool call's partial input JSON",
            Scenario::StallStreamed => {
                "streamed requests stall before any content; non-streaming ones are answered"
            }
        }
    }

    /// The HTTP status of the response: 200 for every streamed scenario.
    pub fn http_status(self) -> u16 {
        match self {
            Scenario::ServerError => 500,
            Scenario::Overloaded => 529,
            Scenario::Unavailable => 503,
            Scenario::RateLimited => 429,
            Scenario::PromptTooLong => 400,
            _ => 200,
        }
    }
}

impl fmt::Display for Scenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A scenario name that is not in the catalogue.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown scenario {name:?}; expected one of: {}", expected())]
pub struct ParseScenarioError {
    /// The name that was given.
    pub name: String,
}

fn expected() -> String {
    Scenario::all()
        .iter()
        .map(|s| s.name())
        .collect::<Vec<_>>()
        .join(", ")
}

impl FromStr for Scenario {
    type Err = ParseScenarioError;

    /// Parses a kebab-case name; case and `_` versus `-` are forgiven
    /// (`Abrupt_Close` is `abrupt-close`).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let wanted = s.trim().to_ascii_lowercase().replace('_', "-");
        Scenario::all()
            .iter()
            .copied()
            .find(|sc| sc.name() == wanted)
            .ok_or_else(|| ParseScenarioError { name: s.to_owned() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_round_trips() {
        for &s in Scenario::all() {
            assert_eq!(s.to_string().parse::<Scenario>(), Ok(s));
            assert!(!s.description().is_empty());
        }
        assert_eq!("Abrupt_Close".parse(), Ok(Scenario::AbruptClose));
    }

    #[test]
    fn unknown_name_lists_the_catalogue() {
        let err = "nope".parse::<Scenario>().expect_err("unknown");
        let msg = err.to_string();
        assert!(msg.contains("\"nope\""), "{msg}");
        assert!(msg.contains("thinking-pings"), "{msg}");
    }
}
