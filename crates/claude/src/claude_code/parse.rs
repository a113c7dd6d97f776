//! Claude Code's stream-json lines → [`Frame`]s, and how a turn ends.
//!
//! Pure functions over parsed JSON, tested on the line shapes of the real
//! CLI (`parse_tests.rs`); the errors of a failed turn are in
//! [`super::errors`].

use std::collections::HashMap;
use std::time::Duration;

use serde_json::Value;
use warden_core::{AgentEvent, Frame, StreamError, Usage};

use super::errors::{early_exit_error, result_error};
use crate::cli::{ExitInfo, Step, TurnParser, is_uuid};

/// Maps a `claude` process's stdout lines. Lives as long as the process
/// (the session id survives turns); [`begin_turn`](TurnParser::begin_turn)
/// resets the per-turn state.
#[derive(Debug)]
pub struct ClaudeParser {
    /// The id this process was asked to resume, for `UnknownSession`.
    resume_id: Option<String>,
    /// The newest id announced by a `system/init` line.
    session_id: Option<String>,
    /// The model announced by `system/init`.
    model: Option<String>,
    /// The id of the message last opened by a `stream_event`
    /// `message_start`: its `assistant` lines repeat what the deltas said.
    streamed_message: Option<String>,
    stream_usage: Usage,
    tool_by_index: HashMap<u64, String>,
}

impl ClaudeParser {
    /// A parser for a process started with `--resume resume_id` (if any).
    pub fn new(resume_id: Option<String>) -> Self {
        Self {
            resume_id,
            session_id: None,
            model: None,
            streamed_message: None,
            stream_usage: Usage::default(),
            tool_by_index: HashMap::new(),
        }
    }

    fn system(&mut self, v: &Value) -> Frame {
        match v.get("subtype").and_then(Value::as_str) {
            Some("init") => {
                let Some(id) = v.get("session_id").and_then(Value::as_str) else {
                    return Frame::KeepAlive;
                };
                let model = v.get("model").and_then(Value::as_str).map(str::to_owned);
                self.session_id = Some(id.to_owned());
                self.model.clone_from(&model);
                Frame::Event(AgentEvent::SessionStarted {
                    session_id: id.to_owned(),
                    model,
                })
            }
            Some("api_retry") => Frame::Event(AgentEvent::ProviderRetry {
                attempt: v
                    .get("attempt")
                    .and_then(Value::as_u64)
                    .and_then(|n| u32::try_from(n).ok())
                    .unwrap_or(0),
                status: v
                    .get("error_status")
                    .and_then(Value::as_u64)
                    .and_then(|n| u16::try_from(n).ok()),
            }),
            _ => Frame::KeepAlive,
        }
    }

    fn assistant(&mut self, v: &Value) -> Vec<Frame> {
        let Some(message) = v.get("message") else {
            return Vec::new();
        };
        let id = message.get("id").and_then(Value::as_str);
        if id.is_some() && id == self.streamed_message.as_deref() {
            // Partial messages are on: the deltas already said all of it.
            return Vec::new();
        }
        assistant_frames(message)
    }

    fn stream_event(&mut self, v: &Value) -> Vec<Frame> {
        let Some(event) = v.get("event") else {
            return Vec::new();
        };
        let index = event.get("index").and_then(Value::as_u64);
        match event.get("type").and_then(Value::as_str) {
            Some("message_start") => {
                let message = event.get("message");
                self.streamed_message = message
                    .and_then(|m| m.get("id"))
                    .and_then(Value::as_str)
                    .map(str::to_owned);
                self.tool_by_index.clear();
                match message.and_then(|m| m.get("usage")).and_then(usage_from) {
                    Some(usage) => {
                        self.stream_usage = usage;
                        vec![Frame::Event(AgentEvent::Usage(usage))]
                    }
                    None => Vec::new(),
                }
            }
            Some("content_block_start") => {
                let Some(block) = event.get("content_block") else {
                    return Vec::new();
                };
                let mut frames = Vec::new();
                match block.get("type").and_then(Value::as_str) {
                    Some("text") => push_text(&mut frames, block, "text", AgentEvent::TextDelta),
                    Some("thinking") => {
                        push_text(&mut frames, block, "thinking", AgentEvent::ThinkingDelta)
                    }
                    Some(kind) if is_tool_use(kind) => {
                        if let Some(event) = tool_started(block) {
                            if let (Some(i), AgentEvent::ToolUseStarted { id, .. }) =
                                (index, &event)
                            {
                                self.tool_by_index.insert(i, id.clone());
                            }
                            frames.push(Frame::Event(event));
                        }
                    }
                    _ => {}
                }
                frames
            }
            Some("content_block_delta") => {
                let Some(delta) = event.get("delta") else {
                    return Vec::new();
                };
                let mut frames = Vec::new();
                match delta.get("type").and_then(Value::as_str) {
                    Some("text_delta") => {
                        push_text(&mut frames, delta, "text", AgentEvent::TextDelta)
                    }
                    Some("thinking_delta") => {
                        push_text(&mut frames, delta, "thinking", AgentEvent::ThinkingDelta)
                    }
                    Some("input_json_delta") => {
                        if let Some(json) = delta.get("partial_json").and_then(Value::as_str) {
                            let id = index
                                .and_then(|i| self.tool_by_index.get(&i).cloned())
                                .or_else(|| index.map(|i| i.to_string()))
                                .unwrap_or_default();
                            frames.push(Frame::Event(AgentEvent::ToolInputDelta {
                                id,
                                partial_json: json.to_owned(),
                            }));
                        }
                    }
                    _ => {}
                }
                frames
            }
            Some("message_delta") => {
                let mut frames = Vec::new();
                if let Some(reason) = event
                    .get("delta")
                    .and_then(|d| d.get("stop_reason"))
                    .and_then(Value::as_str)
                {
                    frames.push(Frame::Event(AgentEvent::Stop {
                        reason: reason.to_owned(),
                    }));
                }
                if let Some(u) = event.get("usage").filter(|u| u.is_object()) {
                    // message_delta usually carries only output_tokens: keep
                    // message_start's input and cache counts.
                    let mut usage = self.stream_usage;
                    merge_usage(&mut usage, u);
                    self.stream_usage = usage;
                    frames.push(Frame::Event(AgentEvent::Usage(usage)));
                }
                frames
            }
            _ => Vec::new(),
        }
    }

    fn result(&mut self, v: &Value) -> Step {
        let subtype = v.get("subtype").and_then(Value::as_str).unwrap_or("");
        let is_error = v.get("is_error").and_then(Value::as_bool).unwrap_or(false);
        if !is_error && matches!(subtype, "compact" | "compaction") {
            // Mid-turn compaction: not the end of the turn.
            return Step::Frames(vec![Frame::KeepAlive]);
        }
        if is_error || subtype.starts_with("error") {
            return Step::Fail(result_error(v, subtype, self.resume_id.as_deref()));
        }
        let context_window = context_window(v, self.model.as_deref());
        let duration = v
            .get("duration_ms")
            .and_then(Value::as_u64)
            .map(Duration::from_millis);
        Step::Complete(vec![Frame::Event(AgentEvent::TurnComplete {
            context_window,
            duration,
        })])
    }
}

impl TurnParser for ClaudeParser {
    fn begin_turn(&mut self) {
        self.streamed_message = None;
        self.stream_usage = Usage::default();
        self.tool_by_index.clear();
    }

    fn line(&mut self, value: &Value) -> Step {
        let frames = match value.get("type").and_then(Value::as_str) {
            Some("system") => vec![self.system(value)],
            Some("assistant") => self.assistant(value),
            Some("user") => user(value),
            Some("stream_event") => self.stream_event(value),
            Some("result") => return self.result(value),
            _ => Vec::new(),
        };
        Step::Frames(frames)
    }

    fn session_id(&self) -> Option<&str> {
        self.session_id.as_deref()
    }

    fn is_session_id(id: &str) -> bool {
        is_uuid(id)
    }

    fn ended_early(&mut self, exit: ExitInfo, stderr: &[String], saw_json: bool) -> StreamError {
        early_exit_error(exit, stderr, self.resume_id.as_deref(), saw_json)
    }
}

/// The frames of an `assistant` line's message (Claude Code's, and the
/// CLIs that print its lines: Qwen Code): its text, thinking and tool
/// calls in order, then its usage and stop reason.
pub(crate) fn assistant_frames(message: &Value) -> Vec<Frame> {
    let mut frames = Vec::new();
    for block in content_blocks(message) {
        match block.get("type").and_then(Value::as_str) {
            Some("text") => push_text(&mut frames, block, "text", AgentEvent::TextDelta),
            Some("thinking") => {
                push_text(&mut frames, block, "thinking", AgentEvent::ThinkingDelta)
            }
            Some(kind) if is_tool_use(kind) => {
                if let Some(event) = tool_started(block) {
                    frames.push(Frame::Event(event));
                }
            }
            _ => {}
        }
    }
    if let Some(usage) = message.get("usage").and_then(usage_from) {
        frames.push(Frame::Event(AgentEvent::Usage(usage)));
    }
    if let Some(reason) = message.get("stop_reason").and_then(Value::as_str) {
        frames.push(Frame::Event(AgentEvent::Stop {
            reason: reason.to_owned(),
        }));
    }
    frames
}

fn content_blocks(message: &Value) -> &[Value] {
    message
        .get("content")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[])
}

fn is_tool_use(kind: &str) -> bool {
    matches!(kind, "tool_use" | "server_tool_use" | "mcp_tool_use")
}

fn tool_started(block: &Value) -> Option<AgentEvent> {
    let id = block.get("id").and_then(Value::as_str)?;
    let name = block.get("name").and_then(Value::as_str).unwrap_or("");
    Some(AgentEvent::ToolUseStarted {
        id: id.to_owned(),
        name: name.to_owned(),
    })
}

fn push_text(frames: &mut Vec<Frame>, v: &Value, field: &str, make: fn(String) -> AgentEvent) {
    if let Some(text) = v.get(field).and_then(Value::as_str)
        && !text.is_empty()
    {
        frames.push(Frame::Event(make(text.to_owned())));
    }
}

/// `tool_result` blocks of a `user` line end their tool calls.
pub(crate) fn user(v: &Value) -> Vec<Frame> {
    let Some(message) = v.get("message") else {
        return Vec::new();
    };
    content_blocks(message)
        .iter()
        .filter(|b| b.get("type").and_then(Value::as_str) == Some("tool_result"))
        .filter_map(|b| b.get("tool_use_id").and_then(Value::as_str))
        .map(|id| Frame::Event(AgentEvent::ToolUseFinished { id: id.to_owned() }))
        .collect()
}

fn usage_from(v: &Value) -> Option<Usage> {
    if !v.is_object() {
        return None;
    }
    let mut usage = Usage::default();
    merge_usage(&mut usage, v);
    Some(usage)
}

fn merge_usage(usage: &mut Usage, v: &Value) {
    let get = |k: &str| v.get(k).and_then(Value::as_u64);
    if let Some(n) = get("input_tokens") {
        usage.input_tokens = n;
    }
    if let Some(n) = get("cache_creation_input_tokens") {
        usage.cache_creation_input_tokens = n;
    }
    if let Some(n) = get("cache_read_input_tokens") {
        usage.cache_read_input_tokens = n;
    }
    if let Some(n) = get("output_tokens") {
        usage.output_tokens = n;
    }
}

/// `modelUsage.<model>.contextWindow`: the session's model when listed,
/// else the only entry, else the largest window.
fn context_window(v: &Value, model: Option<&str>) -> Option<u64> {
    let models = v.get("modelUsage")?.as_object()?;
    let window = |m: &Value| m.get("contextWindow").and_then(Value::as_u64);
    if let Some(w) = model.and_then(|m| models.get(m)).and_then(window) {
        return Some(w);
    }
    models.values().filter_map(window).max()
}
