//! `qwen --output-format stream-json` lines → [`Frame`]s, and how a turn
//! fails.

use std::time::Duration;

use serde_json::Value;
use warden_core::{AgentEvent, Frame, ResumeCause, StreamError, retryable_status};

use crate::claude_code::parse::{assistant_frames, user};
use crate::cli::{ExitInfo, Step, TurnParser, is_uuid};
use crate::lines::{clip, stderr_summary};

/// stderr (exit 1) of a resume whose session the CLI does not have
/// (`… with title "<id>".` or `… with ID <id>. …`).
const NO_SAVED_SESSION: &str = "No saved session found";

/// A `result` error of a run without `OPENAI_API_KEY` (no request sent).
const MISSING_KEY: &str = "Missing API key";

/// A `result` error of a prompt over the model's window.
const CONTEXT_OVERFLOW: &str = "maximum context length";

/// Maps one `qwen` process's stdout: one turn.
#[derive(Debug)]
pub struct QwenParser {
    resume_id: Option<String>,
    model: Option<String>,
    /// The id of the `system/init` line.
    announced: Option<String>,
}

impl QwenParser {
    /// A parser for a process resuming `resume_id` (if any) with `model`.
    pub fn new(resume_id: Option<String>, model: Option<String>) -> Self {
        Self {
            resume_id,
            model,
            announced: None,
        }
    }

    fn system(&mut self, v: &Value) -> Step {
        match v.get("subtype").and_then(Value::as_str) {
            Some("init") => {
                let Some(id) = v.get("session_id").and_then(Value::as_str) else {
                    return Step::Frames(Vec::new());
                };
                if let Some(asked) = self.resume_id.as_deref()
                    && asked != id
                {
                    return Step::Fail(StreamError::UnknownSession {
                        session_id: asked.to_owned(),
                        message: format!("qwen-code answered in session {id} instead of {asked}"),
                    });
                }
                if !is_uuid(id) {
                    return Step::Frames(Vec::new());
                }
                self.announced = Some(id.to_owned());
                Step::Frames(vec![Frame::Event(AgentEvent::SessionStarted {
                    session_id: id.to_owned(),
                    model: self.model.clone(),
                })])
            }
            // Its own retry would print the partial text again: warden's
            // retry, which discards the text shown, answers instead.
            Some("retry") => Step::Fail(StreamError::Truncated {
                message: "qwen-code retried its model request on its own (a cut, stalled or refused stream); warden retries the turn instead".to_owned(),
            }),
            _ => Step::Frames(Vec::new()),
        }
    }

    fn result(&self, v: &Value) -> Step {
        let failed = v.get("is_error").and_then(Value::as_bool) == Some(true)
            || v.get("subtype").and_then(Value::as_str) != Some("success");
        if failed {
            return Step::Fail(result_error(v));
        }
        Step::Complete(vec![Frame::Event(AgentEvent::TurnComplete {
            context_window: None,
            duration: v
                .get("duration_ms")
                .and_then(Value::as_u64)
                .map(Duration::from_millis),
        })])
    }
}

/// The error of a failed `result` line, from its `error.message`
/// (`[API Error: 400 …]`).
fn result_error(v: &Value) -> StreamError {
    let kind = v
        .get("subtype")
        .and_then(Value::as_str)
        .unwrap_or("error")
        .to_owned();
    let message = v
        .pointer("/error/message")
        .and_then(Value::as_str)
        .map_or_else(|| format!("qwen-code ended the turn with {kind}"), clip);
    if message.contains(CONTEXT_OVERFLOW) {
        return StreamError::ContextOverflow {
            reason: ResumeCause::PromptTooLong,
            message,
        };
    }
    let status = message
        .split("API Error: ")
        .nth(1)
        .and_then(|rest| rest.get(..3))
        .and_then(|code| code.parse::<u16>().ok());
    if message.contains(MISSING_KEY) {
        return StreamError::Unauthorized { message };
    }
    match status {
        Some(401 | 403) => StreamError::Unauthorized { message },
        Some(s) if (400..500).contains(&s) && !retryable_status(s) => StreamError::Api {
            status,
            kind,
            message,
            retryable: false,
            retry_after: None,
        },
        // A cut, 5xx, 429, a stream it could not parse: warden's policy
        // tries again.
        _ => StreamError::Api {
            status,
            kind,
            message,
            retryable: true,
            retry_after: None,
        },
    }
}

impl TurnParser for QwenParser {
    fn line(&mut self, v: &Value) -> Step {
        match v.get("type").and_then(Value::as_str) {
            Some("system") => self.system(v),
            Some("assistant") => {
                Step::Frames(v.get("message").map(assistant_frames).unwrap_or_default())
            }
            Some("user") => Step::Frames(user(v)),
            Some("result") => self.result(v),
            _ => Step::Frames(Vec::new()),
        }
    }

    fn session_id(&self) -> Option<&str> {
        self.announced.as_deref()
    }

    fn is_session_id(id: &str) -> bool {
        is_uuid(id)
    }

    fn ended_early(&mut self, exit: ExitInfo, stderr: &[String], saw_json: bool) -> StreamError {
        if let Some(id) = self.resume_id.as_deref()
            && let Some(line) = stderr.iter().rev().find(|l| l.contains(NO_SAVED_SESSION))
        {
            return StreamError::UnknownSession {
                session_id: id.to_owned(),
                message: clip(line.trim()),
            };
        }
        let message = format!(
            "qwen-code ended before its result ({exit}); stderr: {}",
            stderr_summary(stderr)
        );
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
