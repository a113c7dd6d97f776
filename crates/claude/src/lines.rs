//! stdout bytes → JSON objects for a [`TurnParser`], with the garbage-line
//! rule every CLI shares; and [`clip`] for agent text copied into errors.

use serde_json::Value;
use warden_core::{AgentEvent, Frame, StreamError};

use crate::cli::{ExitInfo, Step, TurnParser};

/// Longest piece of agent text (an error message, a stderr line) copied
/// into an error.
pub(crate) const MAX_MESSAGE_CHARS: usize = 500;

/// Cuts agent text to 500 characters (trimmed, `…` when
/// cut), for error messages.
pub fn clip(text: &str) -> String {
    let text = text.trim();
    match text.char_indices().nth(MAX_MESSAGE_CHARS) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_owned(),
    }
}

/// The last few stderr lines, joined and clipped, for an error message.
pub fn stderr_summary(stderr: &[String]) -> String {
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

/// One process's stdout lines: blank lines and lines that are not JSON
/// objects are liveness (up to `max_garbage` in a row), the rest go to the
/// adapter's parser.
#[derive(Debug)]
pub(crate) struct LineParser<P> {
    inner: P,
    name: String,
    max_garbage: u32,
    garbage_run: u32,
    /// Whether a JSON line (or a line a plain-text parser took) was read
    /// in this turn.
    saw_json: bool,
}

impl<P: TurnParser> LineParser<P> {
    /// Wraps `inner`; `name` (the CLI's) goes into logs.
    pub(crate) fn new(inner: P, name: impl Into<String>, max_garbage: u32) -> Self {
        Self {
            inner,
            name: name.into(),
            max_garbage,
            garbage_run: 0,
            saw_json: false,
        }
    }

    /// Resets the per-turn state before a new user message.
    pub(crate) fn begin_turn(&mut self) {
        self.garbage_run = 0;
        self.saw_json = false;
        self.inner.begin_turn();
    }

    /// The newest session id announced by this process, if it has the
    /// form of one ([`TurnParser::is_session_id`]).
    pub(crate) fn session_id(&self) -> Option<&str> {
        self.inner.session_id().filter(|id| P::is_session_id(id))
    }

    /// The error of a process whose stdout ended before the turn did.
    pub(crate) fn ended_early(&mut self, exit: ExitInfo, stderr: &[String]) -> StreamError {
        let saw_json = self.saw_json;
        self.inner.ended_early(exit, stderr, saw_json)
    }

    /// Maps one line (without its newline).
    pub(crate) fn line(&mut self, line: &[u8]) -> Step {
        if let Some(step) = self.inner.text(&String::from_utf8_lossy(line)) {
            self.garbage_run = 0;
            self.saw_json = true;
            return self.mapped(step);
        }
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
        let step = self.inner.line(&value);
        self.mapped(step)
    }

    /// `step` with an empty list as a `KeepAlive` and its ids checked.
    fn mapped(&self, step: Step) -> Step {
        match step {
            Step::Frames(frames) if frames.is_empty() => Step::Frames(vec![Frame::KeepAlive]),
            Step::Frames(frames) => Step::Frames(self.checked(frames)),
            Step::Complete(frames) => Step::Complete(self.checked(frames)),
            step => step,
        }
    }

    /// `frames` without a `SessionStarted` whose id is not one: it is
    /// never stored, so the next turn starts a fresh conversation instead
    /// of resuming an id the CLI cannot be given (say, one with a NUL).
    fn checked(&self, frames: Vec<Frame>) -> Vec<Frame> {
        frames
            .into_iter()
            .map(|frame| match frame {
                Frame::Event(AgentEvent::SessionStarted { ref session_id, .. })
                    if !P::is_session_id(session_id) =>
                {
                    tracing::warn!(
                        agent = %self.name,
                        id = ?clip(session_id),
                        "the agent CLI announced a session id that is not one; not kept, the next turn starts a fresh conversation"
                    );
                    Frame::KeepAlive
                }
                frame => frame,
            })
            .collect()
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
            agent = %self.name,
            bytes = len,
            run = self.garbage_run,
            limit = self.max_garbage,
            reason = %why,
            "the agent CLI printed a stdout line that is not a JSON object; counted as liveness"
        );
        Step::Frames(vec![Frame::KeepAlive])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clip_cuts_long_text_at_a_character_boundary() {
        let long = "é".repeat(600);
        let c = clip(&long);
        assert_eq!(c.chars().count(), MAX_MESSAGE_CHARS + 1);
    }
}
