//! Aider's plain-text stdout (`--no-pretty`) → [`Frame`]s, and how a turn
//! fails.
//!
//! What Aider 0.86.2 prints for one `--message` run (measured against
//! `warden mock`):
//!
//! ```text
//! Analytics have been permanently disabled.      ← before the banner, any lines
//!
//! Aider v0.86.2                                  ← the banner …
//! Model: openai/mock-model with whole edit format
//! Git repo: none
//! Repo-map: disabled                             ← … always ends with Repo-map:
//! Restored previous conversation history.        ← when resuming
//!
//! Hello from warden-mock. …                      ← the reply, written as it streams
//! Tokens: 593 sent, 15 received.                 ← the end of a reply
//! ```
//!
//! A model request that fails prints `litellm.<Kind>Error: …` (after the
//! partial text, on the same line when it was cut mid-line), then
//! `Retrying in 0.2 seconds...` and the whole reply again. Everything
//! exits 0, so the lines are all there is.

use warden_core::{AgentEvent, Frame, ResumeCause, StreamError, Usage};

use crate::cli::{ExitInfo, Step, TurnParser};
use crate::lines::{clip, stderr_summary};

/// The banner's last line; the reply follows it.
const BANNER_END: &str = "Repo-map:";

/// What Aider prints after the banner when it restored the history file.
const RESTORED: &str = "Restored previous conversation history.";

/// Where a failed model request's error starts (litellm's exception).
const LITELLM_ERROR: &str = "litellm.";

/// Aider's own retry of a failed model request, after its error.
const RETRYING: &str = "Retrying in ";

/// What a context overflow says (the provider's words, or Aider's own).
const OVERFLOW: [&str; 5] = [
    "ContextWindowExceededError",
    "prompt is too long",
    "maximum context length",
    "context_length_exceeded",
    "To reduce input tokens",
];

/// Errors a new attempt will not cure.
const FATAL: [&str; 4] = [
    "BadRequestError",
    "NotFoundError",
    "UnprocessableEntityError",
    "UnsupportedParamsError",
];

/// Errors of the key.
const UNAUTHORIZED: [&str; 2] = ["AuthenticationError", "PermissionDeniedError"];

/// Where one run is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Before the banner's `Repo-map:` line.
    Banner,
    /// After it, nothing of the reply yet.
    Waiting,
    /// Inside the reply.
    Reply,
}

/// Maps one `aider --message` process's stdout: one turn.
#[derive(Debug)]
pub struct AiderParser {
    /// The conversation (its chat-history file) this run continues or
    /// starts.
    id: Option<String>,
    model: Option<String>,
    announced: bool,
    phase: Phase,
    /// Blank reply lines not yet passed on (a reply's trailing ones are
    /// not its text).
    blank: usize,
    /// The last error line seen.
    error: Option<String>,
}

impl AiderParser {
    /// A parser for a run of conversation `id` with `model`.
    pub fn new(id: Option<String>, model: Option<String>) -> Self {
        Self {
            id,
            model,
            announced: false,
            phase: Phase::Banner,
            blank: 0,
            error: None,
        }
    }

    fn reply(&mut self, line: &str) -> Step {
        if line.trim().is_empty() {
            if self.phase == Phase::Reply {
                self.blank += 1;
            }
            return Step::Frames(Vec::new());
        }
        if self.phase == Phase::Waiting && line.trim() == RESTORED {
            return Step::Frames(Vec::new());
        }
        if let Some(sent) = tokens_sent(line) {
            return Step::Complete(vec![
                Frame::Event(AgentEvent::Usage(Usage {
                    input_tokens: sent,
                    ..Usage::default()
                })),
                Frame::Event(AgentEvent::TurnComplete {
                    context_window: None,
                    duration: None,
                }),
            ]);
        }
        let mut text = "\n".repeat(self.blank);
        if self.phase == Phase::Reply {
            text.insert(0, '\n');
        }
        self.blank = 0;
        self.phase = Phase::Reply;
        text.push_str(line);
        Step::Frames(vec![Frame::Event(AgentEvent::TextDelta(text))])
    }
}

/// The `sent` count of Aider's `Tokens: 593 sent, 15 received.` line
/// (`1.2k` is 1200; cache counts and a `Cost:` may follow `sent`).
fn tokens_sent(line: &str) -> Option<u64> {
    let rest = line.strip_prefix("Tokens: ")?;
    if !rest.contains(" received.") {
        return None;
    }
    let count = rest.split(" sent").next()?.trim();
    Some(match count.strip_suffix('k') {
        Some(thousands) => (thousands.parse::<f64>().ok()? * 1000.0).round() as u64,
        None => count.replace(',', "").parse().ok()?,
    })
}

/// Where `line`'s `litellm.<Name>Error:` (or `Exception:`, `Timeout:`)
/// starts, if it has one.
fn error_at(line: &str) -> Option<usize> {
    line.match_indices(LITELLM_ERROR)
        .map(|(at, _)| at)
        .find(|&at| {
            let rest = &line[at + LITELLM_ERROR.len()..];
            let name = rest.split(':').next().unwrap_or_default();
            rest.len() > name.len()
                && !name.is_empty()
                && name.chars().all(|c| c.is_ascii_alphanumeric())
                && ["Error", "Exception", "Timeout"]
                    .iter()
                    .any(|end| name.ends_with(end))
        })
}

/// The error of a model request Aider reported in `line` (from its
/// `litellm.` on), by litellm's exception.
fn request_error(line: &str) -> StreamError {
    let message = clip(line);
    let kind = line
        .split(LITELLM_ERROR)
        .nth(1)
        .and_then(|rest| rest.split(':').next())
        .unwrap_or("Error")
        .to_owned();
    if OVERFLOW.iter().any(|m| line.contains(m)) {
        return StreamError::ContextOverflow {
            reason: ResumeCause::PromptTooLong,
            message,
        };
    }
    if UNAUTHORIZED.iter().any(|k| kind.contains(k)) {
        return StreamError::Unauthorized { message };
    }
    let retryable = !FATAL.iter().any(|k| kind.contains(k));
    StreamError::Api {
        status: None,
        kind,
        message,
        retryable,
        retry_after: None,
    }
}

impl TurnParser for AiderParser {
    fn line(&mut self, _line: &serde_json::Value) -> Step {
        // `text` takes every line.
        Step::Frames(Vec::new())
    }

    fn text(&mut self, line: &str) -> Option<Step> {
        let mut frames = Vec::new();
        if !self.announced {
            self.announced = true;
            if let Some(id) = &self.id {
                frames.push(Frame::Event(AgentEvent::SessionStarted {
                    session_id: id.clone(),
                    model: self.model.clone(),
                }));
            }
        }
        // Its own retry prints the partial text again: warden's retry,
        // which discards the text shown, answers instead.
        if let Some(at) = error_at(line) {
            self.error = Some(line[at..].to_owned());
            return Some(Step::Fail(request_error(&line[at..])));
        }
        if line.starts_with(RETRYING) {
            return Some(Step::Fail(StreamError::Truncated {
                message:
                    "aider retried its model request on its own; warden retries the turn instead"
                        .to_owned(),
            }));
        }
        let step = match self.phase {
            Phase::Banner => {
                if line.starts_with(BANNER_END) {
                    self.phase = Phase::Waiting;
                }
                Step::Frames(Vec::new())
            }
            Phase::Waiting | Phase::Reply => self.reply(line),
        };
        Some(match step {
            Step::Frames(more) => {
                frames.extend(more);
                Step::Frames(frames)
            }
            Step::Complete(more) => {
                frames.extend(more);
                Step::Complete(frames)
            }
            fail => fail,
        })
    }

    fn session_id(&self) -> Option<&str> {
        self.id.as_deref()
    }

    fn is_session_id(id: &str) -> bool {
        super::is_aider_id(id)
    }

    fn ended_early(&mut self, exit: ExitInfo, stderr: &[String], saw_text: bool) -> StreamError {
        if let Some(error) = &self.error {
            return request_error(error);
        }
        let message = format!(
            "aider ended without its Tokens line ({exit}; a reply it cut short or a request it gave up on); stderr: {}",
            stderr_summary(stderr)
        );
        if saw_text {
            StreamError::Truncated { message }
        } else {
            StreamError::Connection { message }
        }
    }
}

#[cfg(test)]
#[path = "parse_tests.rs"]
mod tests;
