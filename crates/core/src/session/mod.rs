//! Sessions: one agent conversation, its turns and their retries.
//!
//! Messages are persisted (flushed) before they are acknowledged, then run
//! one turn at a time. Each attempt of a turn is a
//! [`StreamTask`](crate::stream::StreamTask) (a task the session cancels and waits
//! for when it stops). A failed attempt is retried from scratch when its
//! error is retryable and the [`RetryPolicy`] allows it; `ESTREAM_TIMEOUT` from the
//! watchdog is retryable. A user cancel wins over everything that has not
//! already ended the turn: it is never retried, and no event of the
//! cancelled attempt reaches the user after it. Events of attempts that are
//! no longer current are dropped.
//!
//! A stored conversation that cannot be resumed (unknown id, prompt too
//! long) is escalated to the supervisor with every unanswered turn, so the
//! supervisor can start the session fresh and re-deliver them. A session
//! idle for [`SessionConfig::idle_timeout`] stops itself ("reaped") and
//! keeps its record; the next message resumes it.
//!
//! | file | owns | may not |
//! | --- | --- | --- |
//! | `turn.rs` | the rules: retry, cancel, escalate, fresh-start verdict, reap | do I/O, read a clock, touch an actor |
//! | `state.rs` | the actor's state and what a handler asks the loop to do next (`Next`) | call a handler |
//! | `actor.rs` | the actor: mailbox, start, idle reap, stop; the loop that carries out `Next` | decide a rule itself |
//! | `run.rs` | starting turns and attempts, their events and ends | call back into `actor.rs` |
//! | `end.rs` | how a turn ends: carrying out a decision, cancel, deadline, the answer | start a turn or an attempt (it returns `Next`) |
//! | `handle.rs` | the public handles and turn events | hold state |
//! | `escalation.rs` | the contract with the supervisor (escalations, stop reasons) | — |
//!
//! The files form layers: `actor` → `run` → `end` → `state`, and none
//! calls a file above it (`crates/core/tests/it/modules_import_only_the_layers_below.rs`).

mod actor;
mod attempt;
mod end;
mod escalation;
mod handle;
mod ran_in;
mod recovered;
mod run;
mod state;
mod turn;
mod view;

use std::time::Duration;

use derive_setters::Setters;

use crate::context::ContextConfig;
use crate::policy::RetryPolicy;
use crate::stream::StreamOptions;

pub(crate) use actor::{SessionActor, StartError};
pub(crate) use escalation::{Escalation, Handoff, ResumeFailure, StopReason};
pub use handle::{
    SessionHandle, SessionStatus, SubmitError, TurnCanceller, TurnEvent, TurnHandle, TurnSummary,
    Unstick,
};
pub use ran_in::Redelivery;
pub use recovered::{ContinueFrom, RecoveredTurn};
pub(crate) use state::SessionArgs;
pub(crate) use turn::StartMode;

pub use view::{TextEdit, TurnText};

/// Configuration of a session.
#[derive(Debug, Clone, PartialEq, Setters)]
#[setters(prefix = "with_", strip_option)]
#[non_exhaustive]
pub struct SessionConfig {
    /// How failed attempts are retried. Default: [`RetryPolicy::default`].
    pub retry: RetryPolicy,
    /// Options of every stream. Default: [`StreamOptions::default`].
    pub stream: StreamOptions,
    /// Stop the session after this long without activity, keeping its
    /// record; `Duration::ZERO` disables. Default 15 min. Never while a turn
    /// runs or messages wait.
    pub idle_timeout: Duration,
    /// The context indicator. Default: [`ContextConfig::default`].
    pub context: ContextConfig,
    /// How long a stopping session waits for its running stream to release
    /// its source (socket, child process). Default 5 s.
    pub stream_stop_timeout: Duration,
    /// Wall-clock cap of one turn (queueing, every attempt and backoff
    /// included): past it the running attempt is stopped and the turn ends
    /// [`TurnError::DeadlineExceeded`](crate::TurnError), not retried.
    /// `None` (default) means no cap. Env: `WARDEN_TURN_DEADLINE` via
    /// [`SupervisorConfig::from_env`](crate::SupervisorConfig::from_env).
    pub turn_deadline: Option<Duration>,
    /// Size cap of one turn's reply: the bytes of text, thinking and tool
    /// input it streams, every attempt counted. Past it the running
    /// attempt is stopped and the turn ends
    /// [`TurnError::ReplyTooLarge`](crate::TurnError), not retried.
    /// `None` (default) means no cap; `warden serve` sets one.
    pub max_reply_bytes: Option<usize>,
}

impl Default for SessionConfig {
    fn default() -> Self {
        Self {
            retry: RetryPolicy::default(),
            stream: StreamOptions::default(),
            idle_timeout: Duration::from_secs(15 * 60),
            context: ContextConfig::default(),
            stream_stop_timeout: actor::DEFAULT_STREAM_STOP_TIMEOUT,
            turn_deadline: None,
            max_reply_bytes: None,
        }
    }
}

/// Options of one message's turn, stored with the message (a re-delivered
/// message keeps them).
#[derive(Debug, Clone, Default, PartialEq, Eq, Setters)]
#[setters(prefix = "with_", strip_option)]
#[non_exhaustive]
pub struct SendOptions {
    /// The model this turn asks for (`TurnRequest::model`); `None`: the
    /// source's own. A session's turns may each ask for another; the
    /// record keeps the last one the agent announced.
    #[setters(into)]
    pub model: Option<String>,
    /// A key the caller chose for this message, so that a retried send can
    /// be recognised: it is stored with the message and handed back with a
    /// re-delivered one ([`RecoveredTurn::idempotency_key`](crate::RecoveredTurn)).
    /// The session does not compare keys; whoever relays turns (`warden
    /// serve`) looks them up before sending.
    #[setters(into)]
    pub idempotency_key: Option<String>,
}
