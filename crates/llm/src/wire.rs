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
use warden_core::{Frame, StreamError};

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
