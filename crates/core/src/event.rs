//! What a stream yields: raw liveness frames and parsed agent events.

use std::time::Duration;

/// One frame read from a stream.
///
/// Every frame proves the connection is alive and feeds the watchdog; only
/// [`Frame::Event`] reaches the session.
#[derive(Debug, Clone, PartialEq)]
pub enum Frame {
    /// A keep-alive: an SSE `ping` event, a `: comment` line, an ignored
    /// frame type. Liveness only.
    KeepAlive,
    /// A parsed event for the session.
    Event(AgentEvent),
}

/// Token usage as reported by the provider.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Uncached input tokens.
    pub input_tokens: u64,
    /// Tokens written to the prompt cache.
    pub cache_creation_input_tokens: u64,
    /// Tokens read from the prompt cache.
    pub cache_read_input_tokens: u64,
    /// Tokens the model generated (the reply, thinking and tool input).
    pub output_tokens: u64,
}

impl Usage {
    /// Tokens in the context window for this report:
    /// input + cache creation + cache read.
    pub fn context_tokens(&self) -> u64 {
        self.input_tokens
            .saturating_add(self.cache_creation_input_tokens)
            .saturating_add(self.cache_read_input_tokens)
    }
}

/// A parsed event from an agent stream.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum AgentEvent {
    /// The agent announced its session id (Claude Code `system/init`).
    SessionStarted {
        /// The agent's conversation id; after a resume it is a new (forked) id.
        session_id: String,
        /// The model, when announced.
        model: Option<String>,
    },
    /// Assistant text.
    TextDelta(String),
    /// Extended-thinking text.
    ThinkingDelta(String),
    /// The agent started a tool call. While a tool runs the stream may be
    /// silent for longer; see [`StreamOptions::tool_timeout`](crate::StreamOptions).
    ToolUseStarted {
        /// Tool-use id.
        id: String,
        /// Tool name.
        name: String,
    },
    /// A fragment of a tool call's JSON input.
    ToolInputDelta {
        /// Tool-use id or stream index.
        id: String,
        /// The fragment.
        partial_json: String,
    },
    /// A tool call is over: for agent CLIs its result arrived; for HTTP
    /// API sources (which do not run tools) its call block ended. Ends the
    /// longer tool silence allowance.
    ToolUseFinished {
        /// Tool-use id.
        id: String,
    },
    /// A usage report. The last one of a turn gives the context in use.
    Usage(Usage),
    /// The model stopped (`end_turn`, `max_tokens`, `tool_use`, ...).
    Stop {
        /// Provider stop reason.
        reason: String,
    },
    /// The provider is retrying on its own (Claude Code `api_retry`).
    ProviderRetry {
        /// Provider's attempt number.
        attempt: u32,
        /// HTTP status that caused it, if known.
        status: Option<u16>,
    },
    /// The turn is complete (`message_stop`, `[DONE]`, a `result` line).
    TurnComplete {
        /// Context window size reported by the agent, if any.
        context_window: Option<u64>,
        /// Wall time the agent reports for the turn, if any.
        duration: Option<Duration>,
    },
}

impl AgentEvent {
    /// Whether the event is progress: content the model produced — a text,
    /// thinking or tool-input delta with something in it, a tool call's
    /// start or end, the turn's end. Usage, stops, session ids are not,
    /// and neither is an empty delta (an upstream keeping a block open with
    /// nothing in it is as stuck as one sending only pings). The one rule
    /// behind the progress allowance; `warden proxy` applies it to the
    /// raw deltas it splices.
    pub fn is_progress(&self) -> bool {
        match self {
            Self::TextDelta(piece) | Self::ThinkingDelta(piece) => !piece.is_empty(),
            Self::ToolInputDelta { partial_json, .. } => !partial_json.is_empty(),
            Self::ToolUseStarted { .. }
            | Self::ToolUseFinished { .. }
            | Self::TurnComplete { .. } => true,
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_delta_is_no_progress() {
        assert!(AgentEvent::TextDelta("a".into()).is_progress());
        assert!(!AgentEvent::TextDelta(String::new()).is_progress());
        assert!(!AgentEvent::ThinkingDelta(String::new()).is_progress());
        let empty_input = AgentEvent::ToolInputDelta {
            id: "t".into(),
            partial_json: String::new(),
        };
        assert!(!empty_input.is_progress());
    }
}
