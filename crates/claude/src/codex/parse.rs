//! `codex exec --json` lines → [`Frame`]s, and how a Codex turn fails.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;

use serde_json::Value;
use warden_core::{AgentEvent, Frame, ResumeCause, StreamError};

use super::rollout;
use crate::cli::{ExitInfo, Step, TurnParser, is_uuid};
use crate::lines::{clip, stderr_summary};

/// The message of Codex's context overflow (`error` and `turn.failed`).
const OUT_OF_ROOM: &str = "ran out of room in the model's context window";

/// stderr of a resume that found no usable session file (exit 1).
const RESUME_FAILURES: [&str; 4] = [
    "no rollout found for thread id",
    "is empty",
    "does not start with session metadata",
    "thread/resume failed",
];

/// Maps one `codex exec` process's stdout (one turn).
#[derive(Debug)]
pub struct CodexParser {
    resume_id: Option<String>,
    model: Option<String>,
    codex_home: Option<PathBuf>,
    thread_id: Option<String>,
    /// Text already sent per item id (items may repeat their text).
    sent: HashMap<String, usize>,
    /// Tool items started and not finished, and those finished.
    open_tools: HashSet<String>,
    closed_tools: HashSet<String>,
    /// The last `error` message, for `turn.failed` without one.
    last_error: Option<String>,
}

impl CodexParser {
    /// A parser for a process resuming `resume_id` (if any), whose session
    /// files are under `codex_home`.
    pub fn new(
        resume_id: Option<String>,
        model: Option<String>,
        codex_home: Option<PathBuf>,
    ) -> Self {
        Self {
            resume_id,
            model,
            codex_home,
            thread_id: None,
            sent: HashMap::new(),
            open_tools: HashSet::new(),
            closed_tools: HashSet::new(),
            last_error: None,
        }
    }

    fn thread_started(&mut self, v: &Value) -> Step {
        let Some(id) = v.get("thread_id").and_then(Value::as_str) else {
            return Step::Frames(Vec::new());
        };
        if let Some(asked) = self.resume_id.as_deref().filter(|asked| *asked != id) {
            // Codex started a new thread instead of resuming (exit 0).
            return Step::Fail(StreamError::UnknownSession {
                session_id: asked.to_owned(),
                message: format!("codex started thread {id} instead of resuming {asked}"),
            });
        }
        self.thread_id = Some(id.to_owned());
        Step::Frames(vec![Frame::Event(AgentEvent::SessionStarted {
            session_id: id.to_owned(),
            model: self.model.clone(),
        })])
    }

    fn item(&mut self, v: &Value, done: bool, started: bool) -> Vec<Frame> {
        let Some(item) = v.get("item") else {
            return Vec::new();
        };
        let id = item
            .get("id")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned();
        let kind = item.get("type").and_then(Value::as_str).unwrap_or("");
        match kind {
            "agent_message" => self.text(&id, item, AgentEvent::TextDelta),
            "reasoning" => self.text(&id, item, AgentEvent::ThinkingDelta),
            "command_execution" | "file_change" | "mcp_tool_call" | "web_search"
                if !id.is_empty() =>
            {
                let mut frames = Vec::new();
                if (started || done)
                    && !self.open_tools.contains(&id)
                    && !self.closed_tools.contains(&id)
                {
                    self.open_tools.insert(id.clone());
                    frames.push(Frame::Event(AgentEvent::ToolUseStarted {
                        id: id.clone(),
                        name: kind.to_owned(),
                    }));
                }
                if done && self.open_tools.remove(&id) {
                    self.closed_tools.insert(id.clone());
                    frames.push(Frame::Event(AgentEvent::ToolUseFinished { id }));
                }
                frames
            }
            _ => Vec::new(),
        }
    }

    /// The part of an item's text not sent yet.
    fn text(&mut self, id: &str, item: &Value, make: fn(String) -> AgentEvent) -> Vec<Frame> {
        let Some(text) = item.get("text").and_then(Value::as_str) else {
            return Vec::new();
        };
        let sent = self.sent.entry(id.to_owned()).or_insert(0);
        let new = text.get(*sent..).unwrap_or_default();
        if new.is_empty() {
            return Vec::new();
        }
        *sent = text.len();
        vec![Frame::Event(make(new.to_owned()))]
    }

    fn error(&mut self, v: &Value) -> Step {
        let message = v.get("message").and_then(Value::as_str).unwrap_or("");
        if message.contains(OUT_OF_ROOM) {
            return Step::Fail(overflow(message));
        }
        if let Some(rest) = message.strip_prefix("Reconnecting...") {
            let attempt = rest
                .trim()
                .split('/')
                .next()
                .and_then(|n| n.trim().parse().ok())
                .unwrap_or(0);
            return Step::Frames(vec![Frame::Event(AgentEvent::ProviderRetry {
                attempt,
                status: None,
            })]);
        }
        self.last_error = Some(clip(message));
        Step::Frames(Vec::new())
    }

    fn turn_failed(&mut self, v: &Value) -> Step {
        let message = v
            .get("error")
            .and_then(|e| e.get("message"))
            .and_then(Value::as_str)
            .map(clip)
            .or_else(|| self.last_error.clone())
            .unwrap_or_else(|| "codex reported turn.failed".to_owned());
        if message.contains(OUT_OF_ROOM) {
            return Step::Fail(overflow(&message));
        }
        if message.contains("401") || message.contains("403") || message.contains("Unauthorized") {
            return Step::Fail(StreamError::Unauthorized { message });
        }
        // After Codex's own retries: warden's policy may try again.
        Step::Fail(StreamError::Api {
            status: None,
            kind: "turn_failed".to_owned(),
            message,
            retryable: true,
            retry_after: None,
        })
    }

    fn turn_completed(&mut self) -> Step {
        let last = match (&self.codex_home, &self.thread_id) {
            (Some(home), Some(id)) => {
                rollout::find(home, id).and_then(|path| rollout::last_request(&path))
            }
            _ => None,
        };
        if last.is_none() {
            tracing::debug!(
                thread = ?self.thread_id,
                "no codex session file with a token count: the turn reports no usage"
            );
        }
        let mut frames = Vec::new();
        if let Some(last) = last {
            frames.push(Frame::Event(AgentEvent::Usage(last.usage)));
        }
        frames.push(Frame::Event(AgentEvent::TurnComplete {
            context_window: last.and_then(|l| l.window),
            duration: None,
        }));
        Step::Complete(frames)
    }
}

fn overflow(message: &str) -> StreamError {
    StreamError::ContextOverflow {
        reason: ResumeCause::PromptTooLong,
        message: clip(message),
    }
}

impl TurnParser for CodexParser {
    fn line(&mut self, v: &Value) -> Step {
        match v.get("type").and_then(Value::as_str) {
            Some("thread.started") => self.thread_started(v),
            Some("item.started") => Step::Frames(self.item(v, false, true)),
            Some("item.updated") => Step::Frames(self.item(v, false, false)),
            Some("item.completed") => Step::Frames(self.item(v, true, false)),
            Some("error") => self.error(v),
            Some("turn.failed") => self.turn_failed(v),
            Some("turn.completed") => self.turn_completed(),
            _ => Step::Frames(Vec::new()),
        }
    }

    fn session_id(&self) -> Option<&str> {
        self.thread_id.as_deref()
    }

    fn is_session_id(id: &str) -> bool {
        is_uuid(id)
    }

    fn ended_early(&mut self, exit: ExitInfo, stderr: &[String], saw_json: bool) -> StreamError {
        if let Some(id) = self.resume_id.as_deref()
            && let Some(line) = stderr
                .iter()
                .rev()
                .find(|l| RESUME_FAILURES.iter().any(|f| l.contains(f)))
        {
            return StreamError::UnknownSession {
                session_id: id.to_owned(),
                message: clip(line),
            };
        }
        let tail = stderr_summary(stderr);
        let message = format!("codex ended before turn.completed ({exit}); stderr: {tail}");
        if saw_json {
            StreamError::Truncated { message }
        } else {
            StreamError::Connection { message }
        }
    }
}

#[cfg(test)]
#[path = "parse_tests.rs"]
mod tests;
