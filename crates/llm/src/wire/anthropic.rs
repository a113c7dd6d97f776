//! The Anthropic Messages API on the wire: the request body, the headers,
//! and `message_start` ... `message_stop` events → frames.

use std::collections::{HashMap, VecDeque};

use serde::{Deserialize, Serialize};
use warden_core::{AgentEvent, Frame, StreamError, Usage};

use super::{EventMapper, Flow, Message, Turn};
use crate::classify::{ErrorBody, stream_error_event};
use crate::json::parse_json;
use crate::sse::SseEvent as Event;

/// The `anthropic-version` header sent by default.
pub const ANTHROPIC_VERSION: &str = "2023-06-01";

/// `x-api-key` (left out when empty) and `anthropic-version`.
pub(super) fn headers(api_key: &str) -> Vec<(&'static str, String)> {
    vec![
        ("x-api-key", api_key.to_owned()),
        ("anthropic-version", ANTHROPIC_VERSION.to_owned()),
    ]
}

/// The body of a streaming Messages request.
pub(super) fn request<'a>(turn: &'a Turn<'a>) -> MessagesRequest<'a> {
    MessagesRequest {
        model: turn.model,
        max_tokens: turn.max_tokens,
        stream: true,
        system: turn.system,
        messages: &turn.messages,
    }
}

#[derive(Serialize)]
pub(super) struct MessagesRequest<'a> {
    model: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_tokens: Option<u32>,
    stream: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    system: Option<&'a str>,
    messages: &'a [Message<'a>],
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum WireEvent {
    MessageStart {
        message: WireMessage,
    },
    ContentBlockStart {
        index: u64,
        content_block: WireBlock,
    },
    ContentBlockDelta {
        index: u64,
        delta: WireDelta,
    },
    ContentBlockStop {
        index: u64,
    },
    MessageDelta {
        #[serde(default)]
        delta: WireMessageDelta,
        #[serde(default)]
        usage: Option<WireUsage>,
    },
    MessageStop,
    Ping,
    Error {
        error: ErrorBody,
    },
    #[serde(other)]
    Other,
}

#[derive(Deserialize)]
struct WireMessage {
    #[serde(default)]
    usage: Option<WireUsage>,
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum WireBlock {
    Text {
        #[serde(default)]
        text: String,
    },
    Thinking {
        #[serde(default)]
        thinking: String,
    },
    ToolUse {
        id: String,
        name: String,
    },
    ServerToolUse {
        id: String,
        name: String,
    },
    McpToolUse {
        id: String,
        name: String,
    },
    #[serde(other)]
    Other,
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum WireDelta {
    TextDelta {
        text: String,
    },
    ThinkingDelta {
        thinking: String,
    },
    InputJsonDelta {
        partial_json: String,
    },
    #[serde(other)]
    Other,
}

#[derive(Deserialize, Default)]
struct WireMessageDelta {
    #[serde(default)]
    stop_reason: Option<String>,
}

#[derive(Deserialize)]
struct WireUsage {
    #[serde(default)]
    input_tokens: Option<u64>,
    #[serde(default)]
    cache_creation_input_tokens: Option<u64>,
    #[serde(default)]
    cache_read_input_tokens: Option<u64>,
    #[serde(default)]
    output_tokens: Option<u64>,
}

impl WireUsage {
    /// Overwrites the fields this report carries; the others keep their
    /// earlier value (`message_delta` usually reports only output tokens).
    fn merge_into(&self, usage: &mut Usage) {
        let fields = [
            (self.input_tokens, &mut usage.input_tokens),
            (
                self.cache_creation_input_tokens,
                &mut usage.cache_creation_input_tokens,
            ),
            (
                self.cache_read_input_tokens,
                &mut usage.cache_read_input_tokens,
            ),
            (self.output_tokens, &mut usage.output_tokens),
        ];
        for (reported, field) in fields {
            if let Some(v) = reported {
                *field = v;
            }
        }
    }
}

/// Anthropic events → frames. Tracks which content blocks are tool calls
/// (by index) and the usage reported so far.
#[derive(Debug, Default)]
pub(super) struct AnthropicMapper {
    /// Open tool-use blocks: index → tool-use id.
    tools: HashMap<u64, String>,
    usage: Usage,
}

impl EventMapper for AnthropicMapper {
    fn map(&mut self, event: &Event, out: &mut VecDeque<Frame>) -> Result<Flow, StreamError> {
        if event.event == "ping" {
            return Ok(Flow::Continue);
        }
        let mut push = |e: AgentEvent| out.push_back(Frame::Event(e));
        match parse_json::<WireEvent>(&event.data)? {
            WireEvent::MessageStart { message } => {
                if let Some(usage) = message.usage {
                    self.usage = Usage::default();
                    usage.merge_into(&mut self.usage);
                    push(AgentEvent::Usage(self.usage));
                }
            }
            WireEvent::ContentBlockStart {
                index,
                content_block,
            } => match content_block {
                WireBlock::ToolUse { id, name }
                | WireBlock::ServerToolUse { id, name }
                | WireBlock::McpToolUse { id, name } => {
                    self.tools.insert(index, id.clone());
                    push(AgentEvent::ToolUseStarted { id, name });
                }
                WireBlock::Text { text } if !text.is_empty() => push(AgentEvent::TextDelta(text)),
                WireBlock::Thinking { thinking } if !thinking.is_empty() => {
                    push(AgentEvent::ThinkingDelta(thinking));
                }
                WireBlock::Text { .. } | WireBlock::Thinking { .. } | WireBlock::Other => {}
            },
            WireEvent::ContentBlockDelta { index, delta } => match delta {
                WireDelta::TextDelta { text } if !text.is_empty() => {
                    push(AgentEvent::TextDelta(text));
                }
                WireDelta::ThinkingDelta { thinking } if !thinking.is_empty() => {
                    push(AgentEvent::ThinkingDelta(thinking));
                }
                WireDelta::InputJsonDelta { partial_json } if !partial_json.is_empty() => {
                    let id = self
                        .tools
                        .get(&index)
                        .cloned()
                        .unwrap_or_else(|| index.to_string());
                    push(AgentEvent::ToolInputDelta { id, partial_json });
                }
                _ => {}
            },
            WireEvent::ContentBlockStop { index } => {
                if let Some(id) = self.tools.remove(&index) {
                    push(AgentEvent::ToolUseFinished { id });
                }
            }
            WireEvent::MessageDelta { delta, usage } => {
                if let Some(usage) = usage {
                    usage.merge_into(&mut self.usage);
                    push(AgentEvent::Usage(self.usage));
                }
                if let Some(reason) = delta.stop_reason {
                    push(AgentEvent::Stop { reason });
                }
            }
            WireEvent::MessageStop => {
                push(AgentEvent::TurnComplete {
                    context_window: None,
                    duration: None,
                });
                return Ok(Flow::Done);
            }
            WireEvent::Error { error } => return Err(stream_error_event(error)),
            WireEvent::Ping | WireEvent::Other => {}
        }
        Ok(Flow::Continue)
    }

    fn terminal(&self) -> &'static str {
        "message_stop"
    }
}
