//! Splicing a protocol's upstream attempts into one downstream stream: the
//! [`Splice`] strategy the driver (`run`) uses, and one implementation per
//! protocol below it. A strategy knows its wire format; it never sends a
//! request.

mod anthropic;
mod chat;
mod gemini;
mod hold;
mod responses;

#[cfg(test)]
mod agree_tests;

use serde_json::Value;
use warden_core::StreamError;
use warden_llm::sse::SseEvent;

use crate::upstream::Protocol;

/// How a broken stream goes on, once the client has bytes of it.
pub(crate) enum Resume {
    /// The same request again (nothing of the reply has reached the client
    /// but the message's start; the new start is dropped).
    Again,
    /// This request instead: the reply so far, and a request to continue it.
    Continue(Value),
    /// Neither is possible: end the stream with the provider's error event.
    GiveUp,
}

/// A protocol's splicing of upstream attempts into one downstream stream.
pub(crate) trait Splice: Send + 'static {
    /// Appends to `out` what the client gets for one upstream event; an
    /// error breaks the attempt (a retryable error event, a frame that is
    /// not the protocol's JSON, a continuation that does not fit).
    fn event(&mut self, event: &SseEvent, out: &mut String) -> Result<(), StreamError>;
    /// The terminal event has been forwarded: the response is complete.
    fn done(&self) -> bool;
    /// After a broken attempt whose stream the client has part of.
    fn resume(&mut self, original: &Value) -> Resume;
    /// The provider's retryable error event, which ends the stream.
    fn error_event(&self, message: &str) -> String;
    /// Whether a client given [`error_event`](Self::error_event) now
    /// starts the request over on its own: Claude Code re-sends a Messages
    /// request whose stream ends with an error event before any content
    /// block closed (`docs/wire-formats.md`); the SDKs raise it.
    fn error_is_retried(&self) -> bool {
        false
    }
}

/// The progress rule for one upstream stream of `protocol`
/// (`docs/runtime-semantics.md`, "Progress"): llm's, the decoder a
/// session's stream is judged by, so the proxy's allowance and a
/// session's count the same events (`agree_tests.rs` holds them to it).
pub(crate) fn progress_of(protocol: Protocol) -> warden_llm::Progress {
    match protocol {
        Protocol::Messages => warden_llm::Progress::of(warden_llm::Protocol::Anthropic),
        Protocol::ChatCompletions => warden_llm::Progress::of(warden_llm::Protocol::OpenAi),
        Protocol::Responses => warden_llm::Progress::of(warden_llm::Protocol::OpenAiResponses),
        Protocol::Gemini => warden_llm::Progress::gemini(),
    }
}

/// A fresh splice for a stream of `protocol`; `hold_thinking` holds an
/// Anthropic thinking block or a Responses reasoning item back until it is
/// whole, and a Gemini reply's thought parts until its text starts
/// (`--hold-thinking`).
pub(crate) fn for_protocol(protocol: Protocol, hold_thinking: bool) -> Box<dyn Splice> {
    match protocol {
        Protocol::Messages => Box::new(anthropic::Anthropic::new(hold_thinking)),
        Protocol::ChatCompletions => Box::new(chat::Chat::default()),
        Protocol::Responses => Box::new(responses::Responses::new(hold_thinking)),
        Protocol::Gemini => Box::new(gemini::Gemini::new(hold_thinking)),
    }
}
