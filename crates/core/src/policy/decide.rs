//! What follows a broken attempt: one pure decision for a session's turn
//! and for `warden proxy`'s request alike (`docs/runtime-semantics.md`,
//! "What follows a broken attempt").
//!
//! The caller says what broke and what its consumer has been shown; the
//! [`Verdict`] says whether the source's shared pool is held (a server's
//! `retry-after`, on any error that carries one) and what comes next:
//! another attempt from scratch, a continuation of the text shown, a
//! resume failure for the supervisor, or the end with its reason. No
//! clock, no I/O, no state: the rules are the tests below.

use std::time::Duration;

use rand::Rng;

use super::RetryPolicy;
use crate::error::{ResumeCause, StreamError};

/// What the consumer of a broken attempt has of the reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shown {
    /// Nothing of the reply (at most its start): the same request again
    /// cannot be told from the first.
    Nothing,
    /// Text, and the attempt broke in it (or before adding to it): the
    /// reply can be continued where it broke.
    Text,
    /// Something that cannot be continued: the attempt broke in thinking
    /// or a tool call.
    Other,
}

/// A broken attempt, as the decision needs it.
#[derive(Debug, Clone, Copy)]
pub struct Broken<'a> {
    /// Why it broke.
    pub error: &'a StreamError,
    /// Attempts made so far, this one included.
    pub attempts: u32,
    /// What the consumer has.
    pub shown: Shown,
    /// Whether a reply broken in text can be continued (the source
    /// continues replies, and no continuation of this one was refused).
    pub can_continue: bool,
    /// Whether the consumer can be told to drop what it was shown, so the
    /// reply can start again (a session's caller can; a proxied client's
    /// stream cannot take it back).
    pub can_restart_shown: bool,
    /// Tool calls the attempt delivered complete.
    pub completed_tools: u32,
    /// Whether a restart would issue those tool calls again (an API that
    /// asks the caller to run them; not an agent CLI, which ran them).
    pub restarts_repeat_tools: bool,
    /// Whether the attempt resumed a stored conversation and a supervisor
    /// takes resume failures.
    pub resumed_and_escalates: bool,
}

/// Why a broken attempt ends its request or turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GiveUp {
    /// The error is final (a 400, a refused key).
    Fatal,
    /// Retryable, but the policy's attempts are spent.
    Exhausted,
    /// A restart would issue completed tool calls again, and the policy
    /// does not allow it.
    ToolCallsWouldRepeat {
        /// How many.
        completed: u32,
    },
    /// The consumer was shown what cannot be continued nor taken back.
    CannotRestart,
}

/// What comes after a broken attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// The same request from scratch, after `delay`.
    Retry {
        /// The backoff.
        delay: Duration,
    },
    /// A continuation of the text shown, after `delay`.
    Continue {
        /// The backoff.
        delay: Duration,
    },
    /// The stored conversation cannot be resumed: the supervisor's.
    Escalate(ResumeCause),
    /// The end.
    GiveUp(GiveUp),
}

/// The decision on a broken attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    /// Hold every new attempt on the source's pool this long: the server
    /// asked the whole source to wait (`retry-after`, capped at the
    /// policy's `max_retry_after`).
    pub hold: Option<Duration>,
    /// What comes next.
    pub next: Next,
}

/// Decides what follows `broken` under `policy`: the hold first (any
/// `retry-after`), then escalation of a resume failure, giving up when the
/// attempts are spent or the error is final, a continuation of text shown,
/// giving up on what cannot be taken back or on tool calls a restart would
/// repeat, else a retry (`docs/runtime-semantics.md`, "What follows a
/// broken attempt"). `rng` jitters the backoff.
pub fn decide(policy: &RetryPolicy, broken: &Broken<'_>, rng: &mut impl Rng) -> Verdict {
    let error = broken.error;
    let hold = hold(policy, error);
    let next = if let (Some(cause), true) =
        (error.resume_failure_cause(), broken.resumed_and_escalates)
    {
        // A conversation that cannot be resumed is never retried.
        Next::Escalate(cause)
    } else {
        match policy.next_delay(broken.attempts, error, rng) {
            None if policy.is_retryable(broken.attempts, error) => Next::GiveUp(GiveUp::Exhausted),
            None => Next::GiveUp(GiveUp::Fatal),
            Some(delay) => shape(policy, broken, delay),
        }
    };
    Verdict { hold, next }
}

/// How long `error` holds its source's pool: the server's `retry-after`
/// on any error that carries one (not only a 429), capped at the policy's
/// `max_retry_after`. [`decide`]'s [`Verdict::hold`].
pub fn hold(policy: &RetryPolicy, error: &StreamError) -> Option<Duration> {
    error.retry_after().map(|w| w.min(policy.max_retry_after))
}

/// How a retried attempt goes on from what the consumer has.
fn shape(policy: &RetryPolicy, broken: &Broken<'_>, delay: Duration) -> Next {
    if broken.shown == Shown::Text && broken.can_continue {
        return Next::Continue { delay };
    }
    if broken.shown != Shown::Nothing && !broken.can_restart_shown {
        return Next::GiveUp(GiveUp::CannotRestart);
    }
    if broken.completed_tools > 0 && broken.restarts_repeat_tools && !policy.repeat_tool_calls {
        // Never silently re-issue a tool call that may have run.
        return Next::GiveUp(GiveUp::ToolCallsWouldRepeat {
            completed: broken.completed_tools,
        });
    }
    Next::Retry { delay }
}

#[cfg(test)]
#[path = "decide_tests.rs"]
mod tests;
