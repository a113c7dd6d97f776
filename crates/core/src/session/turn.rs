//! The turn state machine: every rule about retries, cancel and escalation
//! in one place, with no actor, no clock and no I/O.
//!
//! The [`SessionActor`](super::actor) feeds it what happened (an attempt
//! ended, the user cancelled, a retry timer fired) and carries out the
//! [`Decision`] it returns: start an attempt after a delay, escalate to the
//! supervisor, or finish the turn. The rules are those of
//! `docs/runtime-semantics.md` ("Turns and retries", "Cancel versus kill",
//! "Resume failure → fresh session"); the unit tests below state each one.

use std::time::Duration;

use rand::Rng;

use crate::continuation::StreamPhase;
use crate::error::{ResumeCause, StreamError, TurnError};
use crate::event::AgentEvent;
use crate::policy::{Broken, GiveUp, Next, RetryPolicy, Shown, decide};
use crate::source::AttemptId;
use crate::stream::StreamOutcome;

/// Where a turn is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Created; no attempt started yet.
    Starting,
    /// An attempt waits for admission (a concurrency limit or a shared
    /// backoff); no stream exists yet, so nothing can go silent.
    Admitting,
    /// An attempt's stream runs.
    Streaming,
    /// Waiting to start the next attempt.
    BackingOff,
}

/// What the session does next with its turn.
#[derive(Debug, PartialEq)]
pub(crate) enum Decision {
    /// Start attempt `next` after `delay` (a retry from scratch); tell the
    /// caller `error` ended the failed attempt.
    Retry {
        /// The attempt to start.
        next: AttemptId,
        /// Backoff before it.
        delay: Duration,
        /// Why the previous attempt failed.
        error: StreamError,
    },
    /// Start attempt `next` after `delay` as a *continuation*: the consumer
    /// keeps the text it has, and the next attempt continues it (see
    /// [`crate::continuation`]).
    Continue {
        /// The attempt to start.
        next: AttemptId,
        /// Backoff before it.
        delay: Duration,
        /// Why the previous attempt failed.
        error: StreamError,
    },
    /// The stored conversation cannot be resumed: hand the turn (and every
    /// queued one) to the supervisor.
    Escalate {
        /// Why.
        cause: ResumeCause,
        /// The agent session id that failed to resume.
        failed_id: String,
        /// The attempt's error.
        error: StreamError,
    },
    /// The turn is over.
    Finish(Result<(), TurnError>),
}

/// What a cancel request does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OnCancel {
    /// Already cancelled: nothing more.
    AlreadyRequested,
    /// Ask the running stream to stop; its end finishes the turn.
    StopStream,
    /// Nothing runs (starting, waiting for admission or backing off):
    /// finish cancelled now.
    FinishNow,
}

/// What the machine needs to know about the session.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rules<'a> {
    /// How failed attempts are retried.
    pub(crate) retry: &'a RetryPolicy,
    /// Whether a supervisor takes resume failures (else they are fatal).
    pub(crate) can_escalate: bool,
    /// Whether the source continues a broken reply
    /// ([`EventSource::continues`](crate::EventSource::continues)).
    pub(crate) continues: bool,
    /// Whether a restart re-issues delivered tool calls
    /// ([`EventSource::restarts_repeat_tool_calls`](crate::EventSource::restarts_repeat_tool_calls)).
    pub(crate) restarts_repeat_tools: bool,
}

/// One turn's progress.
#[derive(Debug, Clone)]
pub(crate) struct TurnMachine {
    turn: u64,
    attempt: u32,
    phase: Phase,
    cancel_requested: bool,
    /// How a stopped turn ends: cancelled, or past its deadline.
    stopped_with: TurnError,
    /// The agent session id the current attempt resumes, if any.
    resume_id: Option<String>,
    /// Where the current attempt's stream is.
    stream_phase: StreamPhase,
    /// Whether the consumer keeps text of this turn (a continuation chain
    /// has begun); cleared by a restart from scratch.
    kept_text: bool,
    /// Whether the next attempt continues (else it starts from scratch).
    continuing: bool,
    /// A continuation failed to stitch: the turn restarts and does not try
    /// again.
    continuation_refused: bool,
    /// Continuations started.
    continuations: u32,
    /// Tool calls the current attempt delivered complete.
    completed_tools: u32,
}

impl TurnMachine {
    /// A new turn for pending message `turn`.
    pub(crate) fn new(turn: u64) -> Self {
        Self {
            turn,
            attempt: 0,
            phase: Phase::Starting,
            cancel_requested: false,
            stopped_with: TurnError::Cancelled,
            resume_id: None,
            stream_phase: StreamPhase::BeforeContent,
            kept_text: false,
            continuing: false,
            continuation_refused: false,
            continuations: 0,
            completed_tools: 0,
        }
    }

    /// A turn for pending message `turn` whose reply attempt
    /// `broken_attempt` began elsewhere (a node that died): its first
    /// attempt continues the text the consumer has.
    pub(crate) fn continuing_from(turn: u64, broken_attempt: u32) -> Self {
        Self {
            attempt: broken_attempt,
            kept_text: true,
            continuing: true,
            continuations: 1,
            ..Self::new(turn)
        }
    }

    /// The turn number (the pending message id).
    pub(crate) fn id(&self) -> u64 {
        self.turn
    }

    /// Attempts started so far.
    pub(crate) fn attempts(&self) -> u32 {
        self.attempt
    }

    /// Where the turn is.
    pub(crate) fn phase(&self) -> Phase {
        self.phase
    }

    /// Begins the next attempt, which resumes `resume_id` if given: it
    /// waits for admission until [`admitted`](Self::admitted).
    pub(crate) fn begin_attempt(&mut self, resume_id: Option<String>) -> AttemptId {
        self.attempt += 1;
        self.stream_phase = StreamPhase::BeforeContent;
        self.completed_tools = 0;
        self.phase = Phase::Admitting;
        self.resume_id = resume_id;
        AttemptId {
            turn: self.turn,
            attempt: self.attempt,
        }
    }

    /// The current attempt's stream delivered `event` (to the consumer).
    pub(crate) fn saw(&mut self, event: &AgentEvent) {
        self.stream_phase = self.stream_phase.after(event);
        if matches!(event, AgentEvent::ToolUseFinished { .. }) {
            self.completed_tools += 1;
        }
        if matches!(event, AgentEvent::TextDelta(t) if !t.is_empty()) {
            self.kept_text = true;
        }
    }

    /// Where the current (or last) attempt's stream is.
    pub(crate) fn stream_phase(&self) -> StreamPhase {
        self.stream_phase
    }

    /// Whether the current attempt continues the text the consumer has
    /// (else it starts the reply from scratch).
    pub(crate) fn continuing(&self) -> bool {
        self.continuing
    }

    /// Continuations started so far.
    pub(crate) fn continuations(&self) -> u32 {
        self.continuations
    }

    /// `attempt` was admitted: whether its stream starts now (`false` when
    /// it is stale or the turn was cancelled while it waited).
    pub(crate) fn admitted(&mut self, attempt: AttemptId) -> bool {
        let due = self.phase == Phase::Admitting
            && self.turn == attempt.turn
            && self.attempt == attempt.attempt
            && !self.cancel_requested;
        if due {
            self.phase = Phase::Streaming;
        }
        due
    }

    /// Whether `attempt` is the one streaming now (reports of any other are
    /// stale and dropped).
    pub(crate) fn is_current(&self, attempt: AttemptId) -> bool {
        self.turn == attempt.turn
            && self.attempt == attempt.attempt
            && self.phase == Phase::Streaming
    }

    /// Whether an event of `attempt` reaches the caller: only the current
    /// attempt's, and none after a cancel.
    pub(crate) fn forwards(&self, attempt: AttemptId) -> bool {
        self.is_current(attempt) && !self.cancel_requested
    }

    /// Whether the retry timer for `next` is still wanted.
    pub(crate) fn retry_due(&self, next: AttemptId) -> bool {
        self.phase == Phase::BackingOff
            && self.turn == next.turn
            && self.attempt + 1 == next.attempt
    }

    /// The user cancelled the turn (the session calls
    /// [`stop`](Self::stop) with `Cancelled`).
    #[cfg(test)]
    pub(crate) fn cancel(&mut self) -> OnCancel {
        self.stop(TurnError::Cancelled)
    }

    /// The turn is stopped and ends with `why` (a cancel, or its deadline):
    /// like a cancel, whatever the stream reports afterwards. The first
    /// stop wins.
    pub(crate) fn stop(&mut self, why: TurnError) -> OnCancel {
        if self.cancel_requested {
            return OnCancel::AlreadyRequested;
        }
        self.cancel_requested = true;
        self.stopped_with = why;
        match self.phase {
            Phase::Streaming => OnCancel::StopStream,
            Phase::Starting | Phase::Admitting | Phase::BackingOff => OnCancel::FinishNow,
        }
    }

    /// `attempt` ended with `outcome`. `None` when the attempt is stale.
    pub(crate) fn ended(
        &mut self,
        attempt: AttemptId,
        outcome: StreamOutcome,
        rules: Rules<'_>,
        rng: &mut impl Rng,
    ) -> Option<Decision> {
        if !self.is_current(attempt) {
            return None;
        }
        let error = match outcome {
            // After Escape the turn ends Cancelled whatever the stream
            // reports: a completion queued behind the cancel had its late
            // text suppressed, so it must not pass for a whole answer.
            _ if self.cancel_requested => {
                return Some(Decision::Finish(Err(self.stopped_with.clone())));
            }
            StreamOutcome::Completed => return Some(Decision::Finish(Ok(()))),
            StreamOutcome::Cancelled => return Some(Decision::Finish(Err(TurnError::Cancelled))),
            StreamOutcome::Failed(error) => error,
        };
        // What the consumer has: text it can keep if the attempt broke in
        // text (or a continuation broke before adding to it); thinking or
        // a tool call cannot be continued.
        let shown = match self.stream_phase {
            StreamPhase::Text | StreamPhase::BeforeContent if self.kept_text => Shown::Text,
            StreamPhase::BeforeContent => Shown::Nothing,
            _ => Shown::Other,
        };
        // A continuation that failed to stitch is not tried again.
        if matches!(error, StreamError::ContinuationFailed { .. }) {
            self.continuation_refused = true;
        }
        let verdict = decide(
            rules.retry,
            &Broken {
                error: &error,
                attempts: self.attempt,
                shown,
                can_continue: rules.continues && !self.continuation_refused,
                // The caller is told to drop what it was shown.
                can_restart_shown: true,
                completed_tools: self.completed_tools,
                restarts_repeat_tools: rules.restarts_repeat_tools,
                resumed_and_escalates: self.resume_id.is_some() && rules.can_escalate,
            },
            rng,
        );
        let next = AttemptId {
            turn: self.turn,
            attempt: self.attempt + 1,
        };
        Some(match verdict.next {
            Next::Escalate(cause) => Decision::Escalate {
                cause,
                failed_id: self.resume_id.clone().unwrap_or_default(),
                error,
            },
            Next::GiveUp(GiveUp::Exhausted) => Decision::Finish(Err(TurnError::RetriesExhausted {
                attempts: self.attempt,
                last: error,
            })),
            Next::GiveUp(GiveUp::ToolCallsWouldRepeat { completed }) => {
                Decision::Finish(Err(TurnError::ToolCallsWouldRepeat {
                    completed,
                    last: error,
                }))
            }
            // A session can always restart: `CannotRestart` is the proxy's.
            Next::GiveUp(GiveUp::Fatal | GiveUp::CannotRestart) => {
                Decision::Finish(Err(TurnError::Fatal(error)))
            }
            Next::Continue { delay } => {
                self.phase = Phase::BackingOff;
                self.continuing = true;
                self.continuations += 1;
                Decision::Continue { next, delay, error }
            }
            Next::Retry { delay } => {
                self.phase = Phase::BackingOff;
                self.continuing = false;
                self.kept_text = false;
                Decision::Retry { next, delay, error }
            }
        })
    }
}

/// How a session starts.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) enum StartMode {
    /// Resume the stored agent session id, if any.
    #[default]
    Resume,
    /// Started fresh after a resume failure; if its first finished turn
    /// fails too, the session is given up ([`FreshVerdict::GiveUp`]).
    FreshFallback {
        /// Why the stored conversation could not be resumed.
        cause: ResumeCause,
        /// The error that said so.
        error: String,
    },
}

/// What a finished turn means for a session started fresh.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum FreshVerdict {
    /// Nothing changes (not a fresh start, or the turn was cancelled).
    Unchanged,
    /// The fresh start worked: from now on the session resumes normally.
    Recovered,
    /// The fresh start failed too: give the session up, no loop.
    GiveUp {
        /// The resume failure that led to the fresh start.
        first_cause: String,
        /// Why the fresh start failed.
        error: TurnError,
    },
}

impl StartMode {
    /// The verdict on this start mode after a turn ended with `result`.
    pub(crate) fn after_turn(&self, result: &Result<(), TurnError>) -> FreshVerdict {
        match (self, result) {
            (Self::Resume, _) | (Self::FreshFallback { .. }, Err(TurnError::Cancelled)) => {
                FreshVerdict::Unchanged
            }
            (Self::FreshFallback { .. }, Ok(())) => FreshVerdict::Recovered,
            (Self::FreshFallback { cause, error }, Err(e)) => FreshVerdict::GiveUp {
                first_cause: format!("{cause}: {error}"),
                error: e.clone(),
            },
        }
    }
}

/// Whether an idle check armed at activity `armed` may reap the session:
/// nothing happened since, no turn runs and nothing waits.
pub(crate) fn reap_due(armed: u64, activity: u64, turn_running: bool, queued: usize) -> bool {
    armed == activity && !turn_running && queued == 0
}

#[cfg(test)]
#[path = "turn_tests.rs"]
mod tests;
