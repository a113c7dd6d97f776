//! stream-json lines → [`Frame`]s, and how a turn ends.
//!
//! Pure functions over parsed JSON, tested on the line shapes of the real
//! CLI; the process plumbing lives in [`crate::process`] and
//! [`crate::turn`].

use std::collections::HashMap;
use std::time::Duration;

use serde_json::Value;
use warden_core::{AgentEvent, Frame, ResumeCause, StreamError, Usage, retryable_status};

/// Longest piece of agent text (an error message, a stderr line) copied
/// into an error.
const MAX_MESSAGE_CHARS: usize = 500;

/// What one stdout line means for the turn.
#[derive(Debug, PartialEq)]
pub(crate) enum Step {
    /// Frames to yield; the turn goes on. Never empty.
    Frames(Vec<Frame>),
    /// The turn is complete: yield these frames (the last one is
    /// `TurnComplete`) and end the stream.
    Complete(Vec<Frame>),
    /// The turn failed.
    Fail(StreamError),
}

/// Maps a process's stdout lines. Lives as long as the process (the
/// session id survives turns); [`begin_turn`](Self::begin_turn) resets the
/// per-turn state.
#[derive(Debug)]
pub(crate) struct LineParser {
    /// The id this process was asked to resume, for `UnknownSession`.
    resume_id: Option<String>,
    /// The newest id announced by a `system/init` line.
    session_id: Option<String>,
    /// The model announced by `system/init`.
    model: Option<String>,
    max_garbage: u32,
    garbage_run: u32,
    /// Whether a JSON line was read in this turn.
    saw_json: bool,
    /// The id of the message last opened by a `stream_event`
    /// `message_start`: its `assistant` lines repeat what the deltas said.
    streamed_message: Option<String>,
    stream_usage: Usage,
    tool_by_index: HashMap<u64, String>,
}

impl LineParser {
    /// A parser for a process started with `--resume resume_id` (if any).
    pub(crate) fn new(resume_id: Option<String>, max_garbage: u32) -> Self {
        Self {
            resume_id,
            session_id: None,
            model: None,
            max_garbage,
            garbage_run: 0,
            saw_json: false,
            streamed_message: None,
            stream_usage: Usage::default(),
            tool_by_index: HashMap::new(),
        }
    }

    /// Resets the per-turn state before a new user message.
    pub(crate) fn begin_turn(&mut self) {
        self.garbage_run = 0;
        self.saw_json = false;
        self.streamed_message = None;
        self.stream_usage = Usage::default();
        self.tool_by_index.clear();
    }

    /// The newest session id announced by this process.
    pub(crate) fn session_id(&self) -> Option<&str> {
        self.session_id.as_deref()
    }

    /// The id the process was asked to resume.
    pub(crate) fn resume_id(&self) -> Option<&str> {
        self.resume_id.as_deref()
    }

    /// Whether a JSON line was read in this turn.
    pub(crate) fn saw_json(&self) -> bool {
        self.saw_json
    }

    /// Maps one line (without its newline).
    pub(crate) fn line(&mut self, line: &[u8]) -> Step {
        if line.iter().all(u8::is_ascii_whitespace) {
            return Step::Frames(vec![Frame::KeepAlive]);
        }
        let value = match serde_json::from_slice::<Value>(line) {
            Ok(v @ Value::Object(_)) => v,
            Ok(_) => return self.garbage(line.len(), "a JSON value that is not an object"),
            Err(e) => return self.garbage(line.len(), &e.to_string()),
        };
        self.garbage_run = 0;
        self.saw_json = true;
        let frames = match value.get("type").and_then(Value::as_str) {
            Some("system") => vec![self.system(&value)],
            Some("assistant") => self.assistant(&value),
            Some("user") => user(&value),
            Some("stream_event") => self.stream_event(&value),
            Some("result") => return self.result(&value),
            _ => Vec::new(),
        };
        Step::Frames(non_empty(frames))
    }

    fn garbage(&mut self, len: usize, why: &str) -> Step {
        self.garbage_run = self.garbage_run.saturating_add(1);
        if self.garbage_run > self.max_garbage {
            return Step::Fail(StreamError::Malformed {
                message: format!(
                    "{} stdout lines in a row were not JSON objects (last one: {len} bytes, {why})",
                    self.garbage_run
                ),
            });
        }
        tracing::warn!(
            bytes = len,
            run = self.garbage_run,
            limit = self.max_garbage,
            reason = %why,
            "claude printed a stdout line that is not a JSON object; counted as liveness"
        );
        Step::Frames(vec![Frame::KeepAlive])
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

fn non_empty(mut frames: Vec<Frame>) -> Vec<Frame> {
    if frames.is_empty() {
        frames.push(Frame::KeepAlive);
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
fn user(v: &Value) -> Vec<Frame> {
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

/// The text of an error result: its `errors`, else its `result`.
fn error_text(v: &Value) -> String {
    let errors: Vec<String> = v
        .get("errors")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .map(|e| match e {
                    Value::String(s) => s.clone(),
                    other => other
                        .get("message")
                        .and_then(Value::as_str)
                        .map_or_else(|| other.to_string(), str::to_owned),
                })
                .collect()
        })
        .unwrap_or_default();
    let text = if errors.is_empty() {
        v.get("result")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    } else {
        errors.join("; ")
    };
    clip(&text)
}

/// Cuts agent text to [`MAX_MESSAGE_CHARS`] characters.
pub(crate) fn clip(text: &str) -> String {
    let text = text.trim();
    match text.char_indices().nth(MAX_MESSAGE_CHARS) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_owned(),
    }
}

const NO_CONVERSATION: &str = "No conversation found with session ID";

/// The id after "session ID:" in Claude Code's message, if any.
fn id_in(text: &str) -> Option<String> {
    let at = text.find(NO_CONVERSATION)? + NO_CONVERSATION.len();
    let rest = text[at..].trim_start_matches(':').trim();
    let id: String = rest
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
        .collect();
    (!id.is_empty()).then_some(id)
}

fn unknown_session(text: &str, resume_id: Option<&str>) -> StreamError {
    StreamError::UnknownSession {
        session_id: resume_id
            .map(str::to_owned)
            .or_else(|| id_in(text))
            .unwrap_or_default(),
        message: clip(text),
    }
}

/// The typed error of a `result` line with `is_error: true` (or an
/// `error_*` subtype).
fn result_error(v: &Value, subtype: &str, resume_id: Option<&str>) -> StreamError {
    let text = error_text(v);
    let terminal = v.get("terminal_reason").and_then(Value::as_str);
    let status = v
        .get("api_error_status")
        .and_then(Value::as_u64)
        .and_then(|n| u16::try_from(n).ok());
    if text.contains(NO_CONVERSATION) {
        return unknown_session(&text, resume_id);
    }
    if let Some(reason) = terminal
        .and_then(ResumeCause::from_name)
        .filter(|c| *c != ResumeCause::UnknownSession)
    {
        return StreamError::ContextOverflow {
            reason,
            message: text,
        };
    }
    if text.to_ascii_lowercase().contains("prompt is too long") {
        return StreamError::ContextOverflow {
            reason: ResumeCause::PromptTooLong,
            message: text,
        };
    }
    if matches!(status, Some(401 | 403)) {
        return StreamError::Unauthorized { message: text };
    }
    if subtype.starts_with("error") {
        // error_max_turns, error_max_budget_usd, error_during_execution, ...:
        // the agent gave up; running the turn again would do the same.
        return StreamError::Api {
            status,
            kind: subtype.to_owned(),
            message: text,
            retryable: false,
            retry_after: None,
        };
    }
    // `success` with is_error: an API error after Claude Code's own retries.
    let retryable = status.is_some_and(retryable_status);
    StreamError::Api {
        status,
        kind: terminal.unwrap_or("api_error").to_owned(),
        message: text,
        retryable,
        retry_after: None,
    }
}

/// How a process that ended before the turn's `result` line exited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ExitInfo {
    /// Exited with this code.
    Code(i32),
    /// Killed by this signal.
    Signal(i32),
    /// Closed stdout but did not exit within the grace period.
    StillRunning,
    /// Unknown (the wait failed).
    Unknown,
}

impl std::fmt::Display for ExitInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Code(c) => write!(f, "exit status {c}"),
            Self::Signal(s) => write!(f, "signal {s}"),
            Self::StillRunning => f.write_str("stdout closed, process still running"),
            Self::Unknown => f.write_str("unknown exit status"),
        }
    }
}

/// The typed error of a process that ended before the turn's `result`
/// line, from its stderr.
pub(crate) fn early_exit_error(
    exit: ExitInfo,
    stderr: &[String],
    resume_id: Option<&str>,
    saw_output: bool,
) -> StreamError {
    let find = |needle: &str| stderr.iter().rev().find(|l| l.contains(needle));
    if let Some(line) = find(NO_CONVERSATION) {
        return unknown_session(line, resume_id);
    }
    if let Some(line) = find("--resume requires a valid session ID") {
        return StreamError::UnknownSession {
            session_id: resume_id.unwrap_or_default().to_owned(),
            message: clip(line),
        };
    }
    if let Some(line) = stderr
        .iter()
        .rev()
        .find(|l| l.contains("Session ID") && l.contains("is already in use"))
    {
        // Another process holds the conversation: may clear up (it may be
        // the previous attempt's process still going down).
        return StreamError::Api {
            status: None,
            kind: "session_in_use".to_owned(),
            message: clip(line),
            retryable: true,
            retry_after: None,
        };
    }
    let tail = stderr_summary(stderr);
    let message = if tail.is_empty() {
        format!("claude ended before the turn's result line ({exit}); stderr was empty")
    } else {
        format!("claude ended before the turn's result line ({exit}); stderr: {tail}")
    };
    if saw_output {
        StreamError::Truncated { message }
    } else {
        StreamError::Connection { message }
    }
}

/// The last few stderr lines, joined and clipped, for an error message.
pub(crate) fn stderr_summary(stderr: &[String]) -> String {
    let start = stderr.len().saturating_sub(5);
    clip(
        &stderr[start..]
            .iter()
            .map(|l| l.trim())
            .filter(|l| !l.is_empty())
            .collect::<Vec<_>>()
            .join(" | "),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parser() -> LineParser {
        LineParser::new(None, 3)
    }

    fn frames(p: &mut LineParser, line: &str) -> Vec<Frame> {
        match p.line(line.as_bytes()) {
            Step::Frames(f) => f,
            other => panic!("expected frames, got {other:?}"),
        }
    }

    fn ev(e: AgentEvent) -> Frame {
        Frame::Event(e)
    }

    #[test]
    fn init_line_starts_the_session_and_keeps_the_newest_id() {
        let mut p = parser();
        let f = frames(
            &mut p,
            r#"{"type":"system","subtype":"init","cwd":"/w","session_id":"9753c268-a","model":"claude-x","tools":["Bash"],"permissionMode":"default"}"#,
        );
        assert_eq!(
            f,
            [ev(AgentEvent::SessionStarted {
                session_id: "9753c268-a".into(),
                model: Some("claude-x".into())
            })]
        );
        frames(
            &mut p,
            r#"{"session_id":"b2","subtype":"init","type":"system"}"#,
        );
        assert_eq!(p.session_id(), Some("b2"));
    }

    #[test]
    fn assistant_blocks_map_to_text_thinking_tool_start_and_usage() {
        let mut p = parser();
        let f = frames(
            &mut p,
            r#"{"type":"assistant","message":{"id":"msg_1","content":[{"type":"thinking","thinking":"hm"},{"type":"text","text":"One file."},{"type":"tool_use","id":"tu_1","name":"Bash","input":{}}],"usage":{"input_tokens":3,"cache_read_input_tokens":14000,"cache_creation_input_tokens":200,"output_tokens":1}},"session_id":"9753"}"#,
        );
        assert_eq!(
            f,
            [
                ev(AgentEvent::ThinkingDelta("hm".into())),
                ev(AgentEvent::TextDelta("One file.".into())),
                ev(AgentEvent::ToolUseStarted {
                    id: "tu_1".into(),
                    name: "Bash".into()
                }),
                ev(AgentEvent::Usage(Usage {
                    input_tokens: 3,
                    cache_creation_input_tokens: 200,
                    cache_read_input_tokens: 14000,
                    output_tokens: 1
                })),
            ]
        );
    }

    #[test]
    fn tool_results_in_user_lines_finish_tool_calls() {
        let mut p = parser();
        let f = frames(
            &mut p,
            r#"{"type":"user","message":{"role":"user","content":[{"type":"tool_result","tool_use_id":"tu_1","content":"ok"}]}}"#,
        );
        assert_eq!(f, [ev(AgentEvent::ToolUseFinished { id: "tu_1".into() })]);
        // A plain user echo is liveness only.
        let f = frames(
            &mut p,
            r#"{"type":"user","message":{"role":"user","content":"hi"}}"#,
        );
        assert_eq!(f, [Frame::KeepAlive]);
    }

    #[test]
    fn api_retry_maps_to_provider_retry() {
        let mut p = parser();
        let f = frames(
            &mut p,
            r#"{"type":"system","subtype":"api_retry","attempt":2,"error_status":500}"#,
        );
        assert_eq!(
            f,
            [ev(AgentEvent::ProviderRetry {
                attempt: 2,
                status: Some(500)
            })]
        );
    }

    #[test]
    fn unknown_lines_are_liveness() {
        let mut p = parser();
        for line in [
            r#"{"type":"system","subtype":"hook_response"}"#,
            r#"{"type":"rate_limit_event"}"#,
            r#"{"no_type":1}"#,
            "   ",
        ] {
            assert_eq!(frames(&mut p, line), [Frame::KeepAlive], "{line}");
        }
    }

    #[test]
    fn success_result_completes_the_turn_with_the_reported_window() {
        let mut p = parser();
        frames(
            &mut p,
            r#"{"type":"system","subtype":"init","session_id":"s","model":"claude-x[1m]"}"#,
        );
        let step = p.line(
            br#"{"subtype":"success","is_error":false,"duration_ms":612,"num_turns":2,"result":"One file.","session_id":"s","total_cost_usd":0.0123,"usage":{"input_tokens":6},"modelUsage":{"claude-haiku":{"contextWindow":200000},"claude-x[1m]":{"contextWindow":1000000}},"type":"result"}"#,
        );
        assert_eq!(
            step,
            Step::Complete(vec![ev(AgentEvent::TurnComplete {
                context_window: Some(1_000_000),
                duration: Some(Duration::from_millis(612))
            })])
        );
        let step = p.line(br#"{"type":"result","subtype":"success","is_error":false}"#);
        assert_eq!(
            step,
            Step::Complete(vec![ev(AgentEvent::TurnComplete {
                context_window: None,
                duration: None
            })])
        );
    }

    #[test]
    fn a_compaction_result_is_not_the_end_of_the_turn() {
        let mut p = parser();
        for subtype in ["compact", "compaction"] {
            let line = format!(r#"{{"type":"result","subtype":"{subtype}","is_error":false}}"#);
            assert_eq!(frames(&mut p, &line), [Frame::KeepAlive]);
        }
    }

    fn fail(p: &mut LineParser, line: &str) -> StreamError {
        match p.line(line.as_bytes()) {
            Step::Fail(e) => e,
            other => panic!("expected a failure, got {other:?}"),
        }
    }

    #[test]
    fn unknown_session_result_is_unknown_session() {
        let mut p = LineParser::new(Some("abc-1".into()), 3);
        let e = fail(
            &mut p,
            r#"{"type":"result","subtype":"error_during_execution","is_error":true,"errors":["No conversation found with session ID: abc-1"]}"#,
        );
        assert_eq!(
            e,
            StreamError::UnknownSession {
                session_id: "abc-1".into(),
                message: "No conversation found with session ID: abc-1".into()
            }
        );
        // Without a resume id the id comes from the message.
        let e = fail(
            &mut parser(),
            r#"{"type":"result","subtype":"error_during_execution","is_error":true,"errors":["No conversation found with session ID: zz-9"]}"#,
        );
        assert_eq!(e.resume_failure_cause(), Some(ResumeCause::UnknownSession));
        assert!(
            matches!(e, StreamError::UnknownSession { session_id, .. } if session_id == "zz-9")
        );
    }

    #[test]
    fn prompt_too_long_with_subtype_success_is_context_overflow() {
        let e = fail(
            &mut parser(),
            r#"{"type":"result","subtype":"success","is_error":true,"terminal_reason":"prompt_too_long","api_error_status":400,"result":"Prompt is too long"}"#,
        );
        assert_eq!(
            e,
            StreamError::ContextOverflow {
                reason: ResumeCause::PromptTooLong,
                message: "Prompt is too long".into()
            }
        );
        let e = fail(
            &mut parser(),
            r#"{"type":"result","subtype":"success","is_error":true,"terminal_reason":"blocking_limit","result":"Context limit reached"}"#,
        );
        assert_eq!(e.resume_failure_cause(), Some(ResumeCause::BlockingLimit));
        let e = fail(
            &mut parser(),
            r#"{"type":"result","subtype":"success","is_error":true,"result":"Prompt is too long"}"#,
        );
        assert_eq!(e.resume_failure_cause(), Some(ResumeCause::PromptTooLong));
    }

    #[test]
    fn other_error_subtypes_are_fatal_api_errors() {
        for subtype in [
            "error_max_turns",
            "error_max_budget_usd",
            "error_during_execution",
        ] {
            let line = format!(
                r#"{{"type":"result","subtype":"{subtype}","is_error":true,"errors":["stopped"]}}"#
            );
            let e = fail(&mut parser(), &line);
            assert!(
                matches!(&e, StreamError::Api { kind, retryable: false, .. } if kind == subtype),
                "{e:?}"
            );
            assert_eq!(e.resume_failure_cause(), None);
        }
        // An error subtype without is_error is still an error.
        let e = fail(
            &mut parser(),
            r#"{"type":"result","subtype":"error_max_turns"}"#,
        );
        assert!(!e.is_retryable());
    }

    #[test]
    fn an_api_error_result_is_retryable_only_for_transient_statuses() {
        let e = fail(
            &mut parser(),
            r#"{"type":"result","subtype":"success","is_error":true,"api_error_status":529,"result":"API Error: Overloaded"}"#,
        );
        assert!(e.is_retryable(), "{e:?}");
        let e = fail(
            &mut parser(),
            r#"{"type":"result","subtype":"success","is_error":true,"api_error_status":400,"result":"API Error: bad"}"#,
        );
        assert!(!e.is_retryable(), "{e:?}");
        let e = fail(
            &mut parser(),
            r#"{"type":"result","subtype":"success","is_error":true,"api_error_status":401,"result":"Invalid API key"}"#,
        );
        assert!(matches!(e, StreamError::Unauthorized { .. }), "{e:?}");
    }

    #[test]
    fn garbage_lines_are_liveness_until_too_many_in_a_row() {
        let mut p = parser(); // at most 3 in a row
        for _ in 0..3 {
            assert_eq!(frames(&mut p, "npm WARN something"), [Frame::KeepAlive]);
        }
        // A JSON line resets the run.
        frames(&mut p, r#"{"type":"system","subtype":"x"}"#);
        for _ in 0..3 {
            assert_eq!(frames(&mut p, "[1, 2]"), [Frame::KeepAlive]);
        }
        let e = fail(&mut p, "not json");
        assert!(matches!(e, StreamError::Malformed { .. }), "{e:?}");
        assert!(
            !e.to_string().contains("not json"),
            "no line text in errors"
        );
    }

    #[test]
    fn stream_events_map_to_anthropic_deltas_and_the_repeat_is_skipped() {
        let mut p = parser();
        let lines = [
            r#"{"type":"stream_event","event":{"type":"message_start","message":{"id":"msg_1","usage":{"input_tokens":25,"cache_creation_input_tokens":0,"cache_read_input_tokens":100,"output_tokens":1}}}}"#,
            r#"{"type":"stream_event","event":{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}}"#,
            r#"{"type":"stream_event","event":{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hel"}}}"#,
            r#"{"type":"stream_event","event":{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"t"}}}"#,
            r#"{"type":"stream_event","event":{"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"tu_9","name":"Read","input":{}}}}"#,
            r#"{"type":"stream_event","event":{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"a\""}}}"#,
            r#"{"type":"stream_event","event":{"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":15}}}"#,
            r#"{"type":"stream_event","event":{"type":"ping"}}"#,
            r#"{"type":"assistant","message":{"id":"msg_1","content":[{"type":"text","text":"Hel"}],"usage":{"input_tokens":25}}}"#,
        ];
        let all: Vec<Frame> = lines.iter().flat_map(|l| frames(&mut p, l)).collect();
        let start = Usage {
            input_tokens: 25,
            cache_creation_input_tokens: 0,
            cache_read_input_tokens: 100,
            output_tokens: 1,
        };
        assert_eq!(
            all,
            [
                ev(AgentEvent::Usage(start)),
                Frame::KeepAlive,
                ev(AgentEvent::TextDelta("Hel".into())),
                ev(AgentEvent::ThinkingDelta("t".into())),
                ev(AgentEvent::ToolUseStarted {
                    id: "tu_9".into(),
                    name: "Read".into()
                }),
                ev(AgentEvent::ToolInputDelta {
                    id: "tu_9".into(),
                    partial_json: "{\"a\"".into()
                }),
                ev(AgentEvent::Stop {
                    reason: "tool_use".into()
                }),
                ev(AgentEvent::Usage(Usage {
                    output_tokens: 15,
                    ..start
                })),
                Frame::KeepAlive,
                Frame::KeepAlive,
            ]
        );
    }

    #[test]
    fn early_exits_are_classified_from_stderr() {
        let e = early_exit_error(
            ExitInfo::Code(1),
            &["No conversation found with session ID: abc".into()],
            Some("abc"),
            false,
        );
        assert!(
            matches!(e, StreamError::UnknownSession { ref session_id, .. } if session_id == "abc")
        );
        let e = early_exit_error(
            ExitInfo::Code(1),
            &["Error: --resume requires a valid session ID when used with --print".into()],
            Some("not-a-uuid"),
            false,
        );
        assert_eq!(e.resume_failure_cause(), Some(ResumeCause::UnknownSession));
        let e = early_exit_error(
            ExitInfo::Code(1),
            &["Error: Session ID abc is already in use.".into()],
            Some("abc"),
            false,
        );
        assert!(e.is_retryable());
        assert!(matches!(e, StreamError::Api { ref kind, .. } if kind == "session_in_use"));
        let e = early_exit_error(ExitInfo::Code(3), &["boom".into()], None, false);
        assert!(matches!(e, StreamError::Connection { .. }), "{e:?}");
        assert!(e.to_string().contains("exit status 3"));
        assert!(e.to_string().contains("boom"));
        let e = early_exit_error(ExitInfo::Signal(9), &[], None, true);
        assert!(matches!(e, StreamError::Truncated { .. }), "{e:?}");
        assert!(e.to_string().contains("signal 9"));
    }

    #[test]
    fn clip_cuts_long_text_at_a_character_boundary() {
        let long = "é".repeat(600);
        let c = clip(&long);
        assert_eq!(c.chars().count(), MAX_MESSAGE_CHARS + 1);
    }

    mod fuzz {
        use super::super::*;
        use proptest::prelude::*;

        /// Real line shapes (`docs/wire-formats.md`), cut anywhere by the property below.
        const SAMPLES: &[&str] = &[
            r#"{"type":"system","subtype":"init","cwd":"/w","session_id":"9753c268-aaaa","model":"claude-x","tools":["Bash"],"permissionMode":"default"}"#,
            r#"{"type":"assistant","message":{"id":"msg_1","content":[{"type":"text","text":"One file."},{"type":"tool_use","id":"tu_1","name":"Bash","input":{"command":"ls"}}],"usage":{"input_tokens":3,"cache_read_input_tokens":14000,"cache_creation_input_tokens":200,"output_tokens":1}},"session_id":"9753"}"#,
            r#"{"type":"user","message":{"role":"user","content":[{"type":"tool_result","tool_use_id":"tu_1","content":"a.txt"}]}}"#,
            r#"{"type":"result","subtype":"success","is_error":false,"num_turns":2,"result":"One file.","session_id":"9753","total_cost_usd":0.0123,"usage":{"input_tokens":6,"cache_creation_input_tokens":200,"cache_read_input_tokens":28000,"output_tokens":40},"modelUsage":{"claude-x":{"contextWindow":200000}}}"#,
            r#"{"type":"result","subtype":"success","is_error":true,"terminal_reason":"prompt_too_long","api_error_status":400,"result":"Prompt is too long"}"#,
            r#"{"type":"result","subtype":"error_during_execution","is_error":true,"errors":["No conversation found with session ID: abc"]}"#,
            r#"{"type":"stream_event","event":{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hel"}}}"#,
            r#"{"type":"system","subtype":"api_retry","attempt":1,"error_status":500}"#,
        ];

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(256))]

            #[test]
            fn random_lines_never_panic(
                lines in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..300), 0..40),
            ) {
                let mut p = LineParser::new(Some("abc".into()), 20);
                for l in &lines {
                    let _ = p.line(l);
                }
            }

            #[test]
            fn truncated_real_lines_never_panic(which in 0..SAMPLES.len(), cut in 0usize..600) {
                let line = SAMPLES[which].as_bytes();
                let mut p = LineParser::new(Some("abc".into()), 2);
                p.begin_turn();
                let _ = p.line(&line[..cut.min(line.len())]);
                let _ = p.line(line);
            }
        }

        /// The `fuzz_*` profile (`just fuzz`): `PROPTEST_CASES` sets the
        /// cases; failures are kept in `parse.proptest-regressions`.
        fn fuzz_config() -> ProptestConfig {
            ProptestConfig {
                failure_persistence: Some(Box::new(
                    proptest::test_runner::FileFailurePersistence::WithSource(
                        "proptest-regressions",
                    ),
                )),
                ..ProptestConfig::default()
            }
        }

        /// Bytes that are mostly JSON lines of the real shapes, cut and
        /// spliced, so the fuzzer gets past `serde_json`'s first error.
        fn line_ish() -> impl Strategy<Value = Vec<u8>> {
            prop_oneof![
                proptest::collection::vec(any::<u8>(), 0..400),
                (
                    0..SAMPLES.len(),
                    0usize..600,
                    proptest::collection::vec(any::<u8>(), 0..16)
                )
                    .prop_map(|(which, cut, noise)| {
                        let s = SAMPLES[which].as_bytes();
                        let cut = cut.min(s.len());
                        [&s[..cut], &noise[..], &s[cut..]].concat()
                    }),
            ]
        }

        proptest! {
            #![proptest_config(fuzz_config())]

            #[test]
            fn fuzz_any_lines_give_frames_a_completion_or_a_typed_failure(
                lines in proptest::collection::vec(line_ish(), 0..32),
                resume in proptest::option::of("[a-z0-9-]{1,12}"),
                max_garbage in 0u32..6,
            ) {
                let mut p = LineParser::new(resume, max_garbage);
                p.begin_turn();
                for l in &lines {
                    match p.line(l) {
                        Step::Frames(f) => prop_assert!(!f.is_empty(), "Frames is never empty"),
                        Step::Complete(f) => prop_assert!(
                            matches!(f.last(), Some(Frame::Event(AgentEvent::TurnComplete { .. }))),
                            "a completion ends with TurnComplete: {:?}", f
                        ),
                        Step::Fail(e) => prop_assert!(e.code() != "EINTERNAL", "{:?}", e),
                    }
                }
            }

            #[test]
            fn fuzz_assistant_text_blocks_round_trip(
                texts in proptest::collection::vec("\\PC{1,40}|[\\n\\r\"\\\\\u{0}-\u{1f}]{1,6}", 1..6),
            ) {
                let content: Vec<serde_json::Value> = texts
                    .iter()
                    .map(|t| serde_json::json!({"type": "text", "text": t}))
                    .collect();
                let line = serde_json::json!({
                    "type": "assistant",
                    "message": {"id": "msg_f", "content": content},
                    "session_id": "s",
                })
                .to_string();
                let mut p = LineParser::new(None, 3);
                p.begin_turn();
                match p.line(line.as_bytes()) {
                    Step::Frames(f) => {
                        let got: Vec<String> = f
                            .into_iter()
                            .filter_map(|fr| match fr {
                                Frame::Event(AgentEvent::TextDelta(t)) => Some(t),
                                _ => None,
                            })
                            .collect();
                        prop_assert_eq!(got, texts);
                    }
                    other => prop_assert!(false, "expected frames, got {:?}", other),
                }
            }
        }
    }
}
