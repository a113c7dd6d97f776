//! The wire formats, one child module per [`Protocol`]: the request body and
//! authentication headers of a turn, and the mapping of parsed SSE events to
//! [`Frame`]s ([`EventMapper`]).
//!
//! Pure data: nothing here sends, reads or decodes bytes (that is
//! [`decode`](crate::decode) and the transport), and the functions below are
//! the only place that picks a protocol's module.

mod anthropic;
pub mod gemini;
mod openai;
pub(crate) mod responses;

use std::collections::VecDeque;

use serde::Serialize;
use warden_core::{AgentEvent, Frame, StreamError};

use crate::provider::Protocol;
use crate::sse::SseEvent;

pub use anthropic::ANTHROPIC_VERSION;

/// Whether the mapped event ended the turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Flow {
    /// Keep reading.
    Continue,
    /// The terminal event: stop reading, end the stream.
    Done,
}

/// Maps the parsed SSE events of one protocol to frames. One mapper serves
/// one stream: it keeps the state of the turn (open tool calls, usage so
/// far).
pub(crate) trait EventMapper: Send + 'static {
    /// Maps one parsed event, pushing its frames to `out` (pushing none is
    /// fine: the caller then yields a `KeepAlive`).
    fn map(&mut self, event: &SseEvent, out: &mut VecDeque<Frame>) -> Result<Flow, StreamError>;

    /// The terminal event, for the `Truncated` message.
    fn terminal(&self) -> &'static str;
}

/// A fresh mapper for one stream of `protocol`.
pub(crate) fn mapper(protocol: Protocol) -> Box<dyn EventMapper> {
    match protocol {
        Protocol::Anthropic => Box::<anthropic::AnthropicMapper>::default(),
        Protocol::OpenAi => Box::<openai::OpenAiMapper>::default(),
        Protocol::OpenAiResponses => Box::<responses::ResponsesMapper>::default(),
    }
}

/// The progress rule of a watched stream (`docs/runtime-semantics.md`,
/// "Progress") applied to one stream's raw SSE events: an event is
/// progress when what a session's decoder maps it to is
/// ([`AgentEvent::is_progress`]: text, thinking or tool input that is not
/// empty, a tool call's start or end, the reply's end). `warden proxy`
/// judges the streams it splices with it, so the proxy and the sessions
/// have one rule, decoded one way.
pub struct Progress {
    judge: Judge,
}

enum Judge {
    /// The protocol's mapper, as [`decode`](crate::decode) runs it.
    Mapped {
        mapper: Box<dyn EventMapper>,
        frames: VecDeque<Frame>,
    },
    /// Gemini's `streamGenerateContent` chunks ([`gemini::decode_chunk`]).
    Gemini,
}

impl Progress {
    /// For one stream of `protocol`.
    pub fn of(protocol: Protocol) -> Self {
        Self {
            judge: Judge::Mapped {
                mapper: mapper(protocol),
                frames: VecDeque::new(),
            },
        }
    }

    /// For one stream of the Gemini API (`:streamGenerateContent?alt=sse`).
    pub fn gemini() -> Self {
        Self {
            judge: Judge::Gemini,
        }
    }

    /// Whether `event`, the stream's next, is progress. One the decoder
    /// cannot read is not (whoever reads the stream reports it).
    pub fn judge(&mut self, event: &SseEvent) -> bool {
        match &mut self.judge {
            Judge::Mapped { mapper, frames } => {
                frames.clear();
                let _ = mapper.map(event, frames);
                frames
                    .iter()
                    .any(|f| matches!(f, Frame::Event(e) if e.is_progress()))
            }
            Judge::Gemini => gemini::decode_chunk(&event.data)
                .is_ok_and(|c| c.finished || c.events.iter().any(AgentEvent::is_progress)),
        }
    }
}

impl std::fmt::Debug for Progress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self.judge {
            Judge::Mapped { .. } => "mapped",
            Judge::Gemini => "gemini",
        };
        f.debug_struct("Progress").field("judge", &kind).finish()
    }
}

/// One message of a conversation, as every API takes it.
#[derive(Debug, Clone, Copy, Serialize)]
pub(crate) struct Message<'a> {
    /// `user`, `assistant` or `system`.
    pub(crate) role: &'a str,
    /// Its text.
    pub(crate) content: &'a str,
}

/// What one request asks for, whatever the protocol.
#[derive(Debug)]
pub(crate) struct Turn<'a> {
    /// The model.
    pub(crate) model: &'a str,
    /// `max_tokens`; left out when `None`.
    pub(crate) max_tokens: Option<u32>,
    /// The turn's `append_system_prompt`.
    pub(crate) system: Option<&'a str>,
    /// The conversation so far, ending with the new user message.
    pub(crate) messages: Vec<Message<'a>>,
}

/// The JSON body asking `protocol` to stream `turn`.
pub(crate) fn request_body(protocol: Protocol, turn: &Turn<'_>) -> Result<Vec<u8>, StreamError> {
    let encoded = match protocol {
        Protocol::Anthropic => serde_json::to_vec(&anthropic::request(turn)),
        Protocol::OpenAi => serde_json::to_vec(&openai::request(turn)),
        Protocol::OpenAiResponses => serde_json::to_vec(&responses::request(turn)),
    };
    encoded.map_err(|e| StreamError::Internal {
        message: format!("could not encode the request: {e}"),
    })
}

/// The headers carrying `api_key` (and the API version) for `protocol`. An
/// empty value means "leave the header out" (no key for a local server).
pub(crate) fn auth_headers(protocol: Protocol, api_key: &str) -> Vec<(&'static str, String)> {
    match protocol {
        Protocol::Anthropic => anthropic::headers(api_key),
        Protocol::OpenAi | Protocol::OpenAiResponses => openai::headers(api_key),
    }
}
