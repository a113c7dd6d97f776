//! `gemini --output-format stream-json` lines → [`Frame`]s, and how a
//! Gemini turn fails.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;
use warden_core::{AgentEvent, Frame, ResumeCause, StreamError, retryable_status};

use super::session_file;
use crate::cli::{ExitInfo, Step, TurnParser, is_uuid};
use crate::lines::{clip, stderr_summary};

/// stderr of a resume that found no usable session (exit 42).
const RESUME_FAILURES: [&str; 3] = [
    "Invalid session identifier",
    "No previous sessions found",
    "Error resuming session",
];

/// The exit code of a failed resume.
const EXIT_RESUME_FAILED: i32 = 42;
/// The exit code of an auth method the CLI cannot use.
const EXIT_AUTH: i32 = 41;

/// Maps one `gemini` process's stdout (one turn).
#[derive(Debug)]
pub struct GeminiParser {
    resume_id: Option<String>,
    model: Option<String>,
    gemini_dir: Option<PathBuf>,
    /// The id `init` announced.
    announced: Option<String>,
    /// The id the next turn may resume: the resumed one, or a fresh one
    /// once its turn succeeded (Gemini keeps no session of a failed first
    /// turn).
    resumable: Option<String>,
    /// The last `error` line's message, for a `result` error without one.
    last_error: Option<String>,
}

impl GeminiParser {
    /// A parser for a process resuming `resume_id` (if any), whose session
    /// files are under `gemini_dir` (`…/.gemini`).
    pub fn new(
        resume_id: Option<String>,
        model: Option<String>,
        gemini_dir: Option<PathBuf>,
    ) -> Self {
        Self {
            resume_id,
            model,
            gemini_dir,
            announced: None,
            resumable: None,
            last_error: None,
        }
    }

    fn started(&self, id: &str) -> Frame {
        Frame::Event(AgentEvent::SessionStarted {
            session_id: id.to_owned(),
            model: self.model.clone(),
        })
    }

    fn init(&mut self, v: &Value) -> Step {
        if let Some(model) = v.get("model").and_then(Value::as_str) {
            self.model = Some(model.to_owned());
        }
        let Some(id) = v.get("session_id").and_then(Value::as_str) else {
            return Step::Frames(Vec::new());
        };
        self.announced = Some(id.to_owned());
        match self.resume_id.as_deref() {
            Some(asked) if asked != id => Step::Fail(StreamError::UnknownSession {
                session_id: asked.to_owned(),
                message: format!("gemini started session {id} instead of resuming {asked}"),
            }),
            Some(_) => {
                self.resumable = Some(id.to_owned());
                Step::Frames(vec![self.started(id)])
            }
            // A fresh id is announced when the turn succeeds.
            None => Step::Frames(Vec::new()),
        }
    }

    fn message(v: &Value) -> Vec<Frame> {
        if v.get("role").and_then(Value::as_str) != Some("assistant") {
            return Vec::new();
        }
        match v.get("content").and_then(Value::as_str) {
            Some(text) if !text.is_empty() => {
                vec![Frame::Event(AgentEvent::TextDelta(text.to_owned()))]
            }
            _ => Vec::new(),
        }
    }

    fn tool(v: &Value, started: bool) -> Vec<Frame> {
        let Some(id) = v.get("tool_id").and_then(Value::as_str) else {
            return Vec::new();
        };
        let event = if started {
            let name = v.get("tool_name").and_then(Value::as_str).unwrap_or("tool");
            AgentEvent::ToolUseStarted {
                id: id.to_owned(),
                name: name.to_owned(),
            }
        } else {
            AgentEvent::ToolUseFinished { id: id.to_owned() }
        };
        vec![Frame::Event(event)]
    }

    fn result(&mut self, v: &Value) -> Step {
        if v.get("status").and_then(Value::as_str) != Some("success") {
            let message = v
                .pointer("/error/message")
                .and_then(Value::as_str)
                .map(clip)
                .or_else(|| self.last_error.clone())
                .unwrap_or_else(|| "gemini reported result.status error".to_owned());
            return Step::Fail(classify(message));
        }
        let mut frames = Vec::new();
        if self.resume_id.is_none()
            && let Some(id) = self.announced.clone()
        {
            frames.push(self.started(&id));
            self.resumable = Some(id);
        }
        let usage = match (&self.gemini_dir, &self.resumable) {
            (Some(dir), Some(id)) => {
                session_file::find(dir, id).and_then(|p| session_file::last_request(&p))
            }
            _ => None,
        };
        match usage {
            Some(usage) => frames.push(Frame::Event(AgentEvent::Usage(usage))),
            None => tracing::debug!(
                session = ?self.resumable,
                "no gemini session file with tokens: the turn reports no usage"
            ),
        }
        let duration = v
            .pointer("/stats/duration_ms")
            .and_then(Value::as_u64)
            .map(Duration::from_millis);
        frames.push(Frame::Event(AgentEvent::TurnComplete {
            context_window: None,
            duration,
        }));
        Step::Complete(frames)
    }
}

/// The HTTP status inside a message such as `[API Error: {"error":{"code":400,…}}]`.
fn status_in(message: &str) -> Option<u16> {
    let at = message.find("\"code\":")? + "\"code\":".len();
    let digits: String = message[at..]
        .trim_start()
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

/// The error of a `result` line with `status: "error"`.
pub(crate) fn classify(message: String) -> StreamError {
    let lower = message.to_ascii_lowercase();
    if lower.contains("input token count") && lower.contains("exceeds") {
        return StreamError::ContextOverflow {
            reason: ResumeCause::PromptTooLong,
            message,
        };
    }
    let status = status_in(&message);
    match status {
        Some(401 | 403) => StreamError::Unauthorized { message },
        Some(s) if (400..500).contains(&s) && !retryable_status(s) => StreamError::Api {
            status,
            kind: "api_error".to_owned(),
            message,
            retryable: false,
            retry_after: None,
        },
        // A cut or stalled stream, 5xx, 429: warden's policy tries again.
        _ => StreamError::Api {
            status,
            kind: "result_error".to_owned(),
            message,
            retryable: true,
            retry_after: None,
        },
    }
}

impl TurnParser for GeminiParser {
    fn line(&mut self, v: &Value) -> Step {
        match v.get("type").and_then(Value::as_str) {
            Some("init") => self.init(v),
            Some("message") => Step::Frames(Self::message(v)),
            Some("tool_use") => Step::Frames(Self::tool(v, true)),
            Some("tool_result") => Step::Frames(Self::tool(v, false)),
            Some("error") => {
                if let Some(m) = v.get("message").and_then(Value::as_str) {
                    self.last_error = Some(clip(m));
                }
                Step::Frames(Vec::new())
            }
            Some("result") => self.result(v),
            _ => Step::Frames(Vec::new()),
        }
    }

    fn session_id(&self) -> Option<&str> {
        self.resumable.as_deref()
    }

    fn is_session_id(id: &str) -> bool {
        is_uuid(id)
    }

    fn ended_early(&mut self, exit: ExitInfo, stderr: &[String], saw_json: bool) -> StreamError {
        let resume_line = stderr
            .iter()
            .rev()
            .find(|l| RESUME_FAILURES.iter().any(|f| l.contains(f)));
        if let Some(id) = self.resume_id.as_deref()
            && (resume_line.is_some() || exit == ExitInfo::Code(EXIT_RESUME_FAILED))
        {
            return StreamError::UnknownSession {
                session_id: id.to_owned(),
                message: resume_line
                    .map_or_else(|| format!("gemini could not resume ({exit})"), |l| clip(l)),
            };
        }
        let tail = stderr_summary(stderr);
        if exit == ExitInfo::Code(EXIT_AUTH) {
            return StreamError::Unauthorized {
                message: format!("gemini: auth method unusable ({exit}); stderr: {tail}"),
            };
        }
        let message = format!("gemini ended without a result line ({exit}); stderr: {tail}");
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
