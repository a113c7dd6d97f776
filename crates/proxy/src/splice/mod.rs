//! Splicing a protocol's upstream attempts into one downstream stream: the
//! [`Splice`] strategy the driver (`run`) uses, and one implementation per
//! protocol below it. A strategy knows its wire format; it never sends a
//! request.

mod anthropic;
mod chat;
mod gemini;
mod responses;

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
    /// Whether the last event given to [`event`](Self::event) was content
    /// the model produced (text, thinking, a tool call or its input, or
    /// the reply's end): the progress rule of every watched stream
    /// (`docs/runtime-semantics.md`, "Progress"), as warden_core's
    /// sessions judge their events. Pings, a message's start and errors
    /// are not.
    fn was_content(&self) -> bool;
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

/// A fresh splice for a stream of `protocol`; `hold_thinking` holds an
/// Anthropic thinking block back until it is whole (`--hold-thinking`).
pub(crate) fn for_protocol(protocol: Protocol, hold_thinking: bool) -> Box<dyn Splice> {
    match protocol {
        Protocol::Messages => Box::new(anthropic::Anthropic::new(hold_thinking)),
        Protocol::ChatCompletions => Box::new(chat::Chat::default()),
        Protocol::Responses => Box::new(responses::Responses::default()),
        Protocol::Gemini => Box::new(gemini::Gemini::default()),
    }
}
