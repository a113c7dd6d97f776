//! `opencode run --format json` lines (and Kilo Code's, the same) →
//! [`Frame`]s, and how a turn fails.

use serde_json::Value;
use warden_core::{AgentEvent, Frame, ResumeCause, StreamError, Usage, retryable_status};

use crate::cli::{ExitInfo, Step, TurnParser};
use crate::lines::{clip, stderr_summary};

/// stderr (exit 1) of a resume whose session the CLI does not have.
const SESSION_NOT_FOUND: &str = "Session not found";

/// The `step_finish` reasons of a model stream that ended without a
/// finish reason: OpenCode's `unknown` (it would ask the model to go on
/// from the partial reply, without limit); Kilo says `other` (and would
/// end the turn with the partial reply as the reply).
pub(crate) const CUT_STREAM: [&str; 1] = ["unknown"];
/// Kilo's, `other` too.
pub(crate) const KILO_CUT_STREAM: [&str; 2] = ["unknown", "other"];

/// The `step_finish` reasons after which the CLI runs another step (the
/// tools the model called, then the model again).
const NEXT_STEP: &str = "tool-calls";

/// Maps one `opencode run` (or `kilo run`) process's stdout: one turn.
#[derive(Debug)]
pub struct OpenCodeParser {
    name: &'static str,
    /// The `step_finish` reasons of a cut stream.
    cut: &'static [&'static str],
    resume_id: Option<String>,
    model: Option<String>,
    /// The id the lines carry.
    announced: Option<String>,
    /// `step_start` lines since the last `step_finish`: more than one is
    /// the CLI's own retry of the step's request.
    attempts: u32,
}

impl OpenCodeParser {
    /// A parser for a process of the CLI `name` resuming `resume_id` (if
    /// any) with `model`, whose `step_finish` reasons in `cut` mean the
    /// model stream ended without a finish reason.
    pub fn new(
        name: &'static str,
        cut: &'static [&'static str],
        resume_id: Option<String>,
        model: Option<String>,
    ) -> Self {
        Self {
            name,
            cut,
            resume_id,
            model,
            announced: None,
            attempts: 0,
        }
    }

    /// `SessionStarted` for the first line's id; a resume answered with
    /// another id is a silent resume failure.
    fn announce(&mut self, v: &Value) -> Result<Option<Frame>, StreamError> {
        if self.announced.is_some() {
            return Ok(None);
        }
        let Some(id) = v.get("sessionID").and_then(Value::as_str) else {
            return Ok(None);
        };
        if let Some(asked) = self.resume_id.as_deref()
            && asked != id
        {
            return Err(StreamError::UnknownSession {
                session_id: asked.to_owned(),
                message: format!("{} answered in session {id} instead of {asked}", self.name),
            });
        }
        self.announced = Some(id.to_owned());
        Ok(Some(Frame::Event(AgentEvent::SessionStarted {
            session_id: id.to_owned(),
            model: self.model.clone(),
        })))
    }

    fn step_start(&mut self) -> Vec<Frame> {
        self.attempts += 1;
        if self.attempts > 1 {
            vec![Frame::Event(AgentEvent::ProviderRetry {
                attempt: self.attempts - 1,
                status: None,
            })]
        } else {
            Vec::new()
        }
    }

    fn step_finish(&mut self, part: &Value) -> Step {
        self.attempts = 0;
        let mut frames: Vec<Frame> = usage(part)
            .map(AgentEvent::Usage)
            .map(Frame::Event)
            .into_iter()
            .collect();
        match part.get("reason").and_then(Value::as_str) {
            Some(NEXT_STEP) => Step::Frames(frames),
            Some(reason) if self.cut.contains(&reason) => Step::Fail(StreamError::Truncated {
                message: format!(
                    "{}'s model stream ended without a finish reason (step_finish reason {reason:?})",
                    self.name
                ),
            }),
            _ => {
                frames.push(Frame::Event(AgentEvent::TurnComplete {
                    context_window: None,
                    duration: None,
                }));
                Step::Complete(frames)
            }
        }
    }

    fn error(&self, v: &Value) -> StreamError {
        let error = v.get("error").unwrap_or(&Value::Null);
        let name = error.get("name").and_then(Value::as_str).unwrap_or("error");
        let data = error.get("data").unwrap_or(&Value::Null);
        let message = data
            .get("message")
            .and_then(Value::as_str)
            .map_or_else(|| format!("{} reported {name}", self.name), clip);
        if name == "ContextOverflowError" {
            return StreamError::ContextOverflow {
                reason: ResumeCause::PromptTooLong,
                message,
            };
        }
        let status = data
            .get("statusCode")
            .and_then(Value::as_u64)
            .and_then(|s| u16::try_from(s).ok());
        match status {
            Some(401 | 403) => StreamError::Unauthorized { message },
            Some(s) if (400..500).contains(&s) && !retryable_status(s) => StreamError::Api {
                status,
                kind: name.to_owned(),
                message,
                retryable: false,
                retry_after: None,
            },
            _ => StreamError::Api {
                status,
                kind: name.to_owned(),
                message,
                // A stall or cut the CLI gave up on, 5xx, 429: warden's
                // policy tries again; a parse failure of the stream too.
                retryable: data
                    .get("isRetryable")
                    .and_then(Value::as_bool)
                    .unwrap_or(true)
                    || status.is_none(),
                retry_after: None,
            },
        }
    }
}

/// The usage of one step's request (`part.tokens`): its prompt is the
/// context in use.
fn usage(part: &Value) -> Option<Usage> {
    let tokens = part.get("tokens")?;
    let n = |p: &str| tokens.pointer(p).and_then(Value::as_u64).unwrap_or(0);
    Some(Usage {
        input_tokens: n("/input"),
        cache_creation_input_tokens: n("/cache/write"),
        cache_read_input_tokens: n("/cache/read"),
        output_tokens: n("/output"),
    })
}

/// The frames of a `tool_use` line: the CLI prints a tool once it ran.
fn tool(part: &Value) -> Vec<Frame> {
    let Some(id) = part.get("callID").and_then(Value::as_str) else {
        return Vec::new();
    };
    let name = part.get("tool").and_then(Value::as_str).unwrap_or("tool");
    vec![
        Frame::Event(AgentEvent::ToolUseStarted {
            id: id.to_owned(),
            name: name.to_owned(),
        }),
        Frame::Event(AgentEvent::ToolUseFinished { id: id.to_owned() }),
    ]
}

/// The text of a `text` or `reasoning` part, if any.
fn text(part: &Value) -> Option<String> {
    part.get("text")
        .and_then(Value::as_str)
        .filter(|t| !t.is_empty())
        .map(str::to_owned)
}

impl TurnParser for OpenCodeParser {
    fn line(&mut self, v: &Value) -> Step {
        let mut frames = match self.announce(v) {
            Ok(frame) => frame.into_iter().collect::<Vec<_>>(),
            Err(e) => return Step::Fail(e),
        };
        let part = v.get("part").unwrap_or(&Value::Null);
        match v.get("type").and_then(Value::as_str) {
            Some("step_start") => frames.extend(self.step_start()),
            Some("text") => {
                frames.extend(text(part).map(|t| Frame::Event(AgentEvent::TextDelta(t))))
            }
            Some("reasoning") => {
                frames.extend(text(part).map(|t| Frame::Event(AgentEvent::ThinkingDelta(t))));
            }
            Some("tool_use") => frames.extend(tool(part)),
            Some("step_finish") => {
                return match self.step_finish(part) {
                    Step::Frames(more) => {
                        frames.extend(more);
                        Step::Frames(frames)
                    }
                    Step::Complete(more) => {
                        frames.extend(more);
                        Step::Complete(frames)
                    }
                    fail => fail,
                };
            }
            Some("error") => return Step::Fail(self.error(v)),
            _ => {}
        }
        Step::Frames(frames)
    }

    fn session_id(&self) -> Option<&str> {
        self.announced.as_deref()
    }

    fn is_session_id(id: &str) -> bool {
        is_session_id(id)
    }

    fn ended_early(&mut self, exit: ExitInfo, stderr: &[String], saw_json: bool) -> StreamError {
        if let Some(id) = self.resume_id.as_deref()
            && let Some(line) = stderr.iter().rev().find(|l| l.contains(SESSION_NOT_FOUND))
        {
            return StreamError::UnknownSession {
                session_id: id.to_owned(),
                message: clip(strip_ansi(line).trim()),
            };
        }
        // Its errors are ANSI-coloured even on a pipe.
        let stderr: Vec<String> = stderr.iter().map(|l| strip_ansi(l)).collect();
        let message = format!(
            "{} ended before its last step ({exit}); stderr: {}",
            self.name,
            stderr_summary(&stderr)
        );
        if saw_json {
            StreamError::Truncated { message }
        } else {
            StreamError::Connection { message }
        }
    }
}

/// Whether `id` has the form of an OpenCode session id: `ses_` and 1 to
/// 60 ASCII letters or digits (never an option, a path or `latest`).
pub(crate) fn is_session_id(id: &str) -> bool {
    id.strip_prefix("ses_").is_some_and(|rest| {
        (1..=60).contains(&rest.len()) && rest.bytes().all(|b| b.is_ascii_alphanumeric())
    })
}

/// `line` without ANSI colour sequences (`ESC [ … m`).
fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
#[path = "parse_tests.rs"]
mod tests;
