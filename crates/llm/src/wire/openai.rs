//! OpenAI-compatible chat completions on the wire: the request body, the
//! `authorization` header, and `data: {chunk}` ... `data: [DONE]` → frames.

use std::collections::{BTreeMap, VecDeque};

use serde::{Deserialize, Serialize};
use warden_core::{AgentEvent, Frame, StreamError, Usage};

use super::{EventMapper, Flow, Message, Turn};
use crate::classify::{ErrorBody, stream_error_event};
use crate::json::parse_json;
use crate::sse::SseEvent as Event;

/// `authorization: Bearer <key>`, left out without a key (local servers).
pub(super) fn headers(api_key: &str) -> Vec<(&'static str, String)> {
    let authorization = if api_key.is_empty() {
        String::new()
    } else {
        format!("Bearer {api_key}")
    };
    vec![("authorization", authorization)]
}

/// The body of a streaming chat-completions request: the system prompt as
/// the first message, then the conversation.
pub(super) fn request<'a>(turn: &'a Turn<'a>) -> ChatRequest<'a> {
    let system = turn.system.map(|content| Message {
        role: "system",
        content,
    });
    ChatRequest {
        model: turn.model,
        stream: true,
        stream_options: StreamOptions {
            include_usage: true,
        },
        max_tokens: turn.max_tokens,
        messages: system
            .into_iter()
            .chain(turn.messages.iter().copied())
            .collect(),
    }
}

#[derive(Serialize)]
pub(super) struct ChatRequest<'a> {
    model: &'a str,
    stream: bool,
    stream_options: StreamOptions,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_tokens: Option<u32>,
    messages: Vec<Message<'a>>,
}

#[derive(Serialize)]
struct StreamOptions {
    include_usage: bool,
}

#[derive(Deserialize)]
struct Chunk {
    #[serde(default)]
    choices: Option<Vec<Choice>>,
    #[serde(default)]
    usage: Option<WireUsage>,
    #[serde(default)]
    error: Option<ErrorBody>,
}

#[derive(Deserialize)]
struct Choice {
    #[serde(default)]
    delta: Option<Delta>,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct Delta {
    #[serde(default)]
    content: Option<String>,
    /// Reasoning text of compatible servers (DeepSeek, vLLM).
    #[serde(default)]
    reasoning_content: Option<String>,
    #[serde(default)]
    tool_calls: Option<Vec<ToolCallDelta>>,
}

#[derive(Deserialize)]
struct ToolCallDelta {
    #[serde(default)]
    index: Option<u64>,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    function: Option<FunctionDelta>,
}

#[derive(Deserialize)]
struct FunctionDelta {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    arguments: Option<String>,
}

#[derive(Deserialize)]
struct WireUsage {
    #[serde(default)]
    prompt_tokens: Option<u64>,
    #[serde(default)]
    completion_tokens: Option<u64>,
}

/// OpenAI chunks → frames. Tracks the tool calls in progress by index;
/// they are finished (`ToolUseFinished`) at the `finish_reason`, or at
/// `[DONE]` if none came.
#[derive(Debug, Default)]
pub(super) struct OpenAiMapper {
    /// Tool calls in progress: index → id.
    tools: BTreeMap<u64, String>,
}

impl OpenAiMapper {
    fn finish_tools(&mut self, out: &mut VecDeque<Frame>) {
        for (_, id) in std::mem::take(&mut self.tools) {
            out.push_back(Frame::Event(AgentEvent::ToolUseFinished { id }));
        }
    }

    fn tool_call(&mut self, call: ToolCallDelta, out: &mut VecDeque<Frame>) {
        let index = call.index.unwrap_or(0);
        let (name, arguments) = call
            .function
            .map_or((None, None), |f| (f.name, f.arguments));
        let id = match self.tools.get(&index) {
            Some(id) => id.clone(),
            None if call.id.is_some() || name.is_some() => {
                let id = call.id.unwrap_or_else(|| index.to_string());
                self.tools.insert(index, id.clone());
                out.push_back(Frame::Event(AgentEvent::ToolUseStarted {
                    id: id.clone(),
                    name: name.unwrap_or_default(),
                }));
                id
            }
            None => index.to_string(),
        };
        if let Some(partial_json) = arguments.filter(|a| !a.is_empty()) {
            out.push_back(Frame::Event(AgentEvent::ToolInputDelta {
                id,
                partial_json,
            }));
        }
    }
}

impl EventMapper for OpenAiMapper {
    fn map(&mut self, event: &Event, out: &mut VecDeque<Frame>) -> Result<Flow, StreamError> {
        if event.data.trim() == "[DONE]" {
            self.finish_tools(out);
            out.push_back(Frame::Event(AgentEvent::TurnComplete {
                context_window: None,
                duration: None,
            }));
            return Ok(Flow::Done);
        }
        let chunk = parse_json::<Chunk>(&event.data)?;
        if let Some(error) = chunk.error {
            return Err(stream_error_event(error));
        }
        for choice in chunk.choices.unwrap_or_default() {
            if let Some(delta) = choice.delta {
                if let Some(text) = delta.reasoning_content.filter(|t| !t.is_empty()) {
                    out.push_back(Frame::Event(AgentEvent::ThinkingDelta(text)));
                }
                if let Some(text) = delta.content.filter(|t| !t.is_empty()) {
                    out.push_back(Frame::Event(AgentEvent::TextDelta(text)));
                }
                for call in delta.tool_calls.unwrap_or_default() {
                    self.tool_call(call, out);
                }
            }
            if let Some(reason) = choice.finish_reason {
                self.finish_tools(out);
                out.push_back(Frame::Event(AgentEvent::Stop { reason }));
            }
        }
        if let Some(usage) = chunk.usage {
            out.push_back(Frame::Event(AgentEvent::Usage(Usage {
                input_tokens: usage.prompt_tokens.unwrap_or(0),
                output_tokens: usage.completion_tokens.unwrap_or(0),
                ..Usage::default()
            })));
        }
        Ok(Flow::Continue)
    }

    fn terminal(&self) -> &'static str {
        "data: [DONE]"
    }
}
