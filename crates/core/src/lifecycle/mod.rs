//! Typed lifecycle events for programmatic users.
//!
//! Every transition that is logged with `tracing` is also published on an
//! [`EventBus`] as a [`LifecycleEvent`], so an orchestrator can drive a UI or
//! metrics without parsing logs. The bus is a `tokio::sync::broadcast`
//! channel: publishing never blocks the actors; a subscriber that falls more
//! than the capacity behind observes `RecvError::Lagged` and skips ahead.
//! Turn results themselves are never on the bus; they travel on the
//! lossless per-turn channel ([`crate::TurnHandle`]).

mod view;
pub mod wire;

use std::time::Duration;

use tokio::sync::broadcast;

use crate::error::ResumeCause;
use crate::source::AttemptId;
use crate::source::SessionKey;

/// One transition of the actor tree.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum LifecycleEvent {
    /// A session actor started.
    SessionSpawned {
        /// The session.
        key: SessionKey,
    },
    /// A session actor stopped.
    SessionStopped {
        /// The session.
        key: SessionKey,
        /// Why, when known.
        reason: Option<String>,
        /// Whether it crashed (panic or error) rather than stopped.
        abnormal: bool,
    },
    /// The supervisor restarted a session after a failure.
    SessionRestarted {
        /// The session.
        key: SessionKey,
        /// Restarts inside the current intensity window.
        restarts_in_window: u32,
        /// The failure that caused it.
        cause: String,
    },
    /// Restart intensity exceeded: the supervisor gave up on the session.
    SupervisorEscalated {
        /// The session.
        key: SessionKey,
        /// The original failure.
        cause: String,
    },
    /// The agent announced (or changed) its session id; stored durably.
    AgentSessionId {
        /// The session.
        key: SessionKey,
        /// The new id.
        session_id: String,
    },
    /// A stored conversation could not be resumed.
    ResumeFailed {
        /// The session.
        key: SessionKey,
        /// The id that failed.
        failed_id: String,
        /// Why the conversation could not be resumed.
        cause: ResumeCause,
    },
    /// The session restarted fresh after a resume failure, its unanswered
    /// messages re-delivered.
    FreshFallback {
        /// The session.
        key: SessionKey,
        /// The id that failed.
        failed_id: String,
        /// Messages re-delivered.
        redelivered: usize,
    },
    /// The session failed for good (the fresh start failed too).
    SessionFailed {
        /// The session.
        key: SessionKey,
        /// Both causes.
        reason: String,
    },
    /// A session idle for too long was stopped; its record stays.
    SessionReaped {
        /// The session.
        key: SessionKey,
        /// How long it had been idle.
        idle_for: Duration,
        /// Tokens in context when reaped, if known.
        context_tokens: Option<u64>,
    },
    /// Context usage at the end of a turn.
    ContextUsage {
        /// The session.
        key: SessionKey,
        /// Tokens in context.
        tokens: u64,
        /// The window.
        window: u64,
        /// Percent.
        percent: u32,
        /// The agent's own estimate, if the self-report track is on.
        self_reported: Option<u32>,
    },
    /// A workspace path was normalized to a different spelling.
    WorkspaceNormalized {
        /// As given.
        original: std::path::PathBuf,
        /// As used.
        normalized: std::path::PathBuf,
    },
    /// A session's record could not be read or written.
    StoreFailed {
        /// The session.
        key: SessionKey,
        /// The error.
        error: crate::store::StoreError,
    },
    /// A turn began.
    TurnStarted {
        /// The session.
        key: SessionKey,
        /// Turn number.
        turn: u64,
    },
    /// An attempt waits for admission (a concurrency limit or a shared
    /// backoff); its stream is not started and nothing is watched yet.
    AttemptQueued {
        /// The session.
        key: SessionKey,
        /// The attempt.
        attempt: AttemptId,
        /// The admission pool it waits in.
        pool: String,
    },
    /// A queued attempt was admitted; its stream starts now.
    AttemptAdmitted {
        /// The session.
        key: SessionKey,
        /// The attempt.
        attempt: AttemptId,
        /// How long it waited.
        waited: Duration,
    },
    /// An attempt's stream was started (watchdog already armed).
    AttemptStarted {
        /// The session.
        key: SessionKey,
        /// The attempt.
        attempt: AttemptId,
        /// Its silence allowance.
        timeout: Duration,
    },
    /// The watchdog killed an attempt's silent stream (`ESTREAM_TIMEOUT`).
    StreamTimedOut {
        /// The session.
        key: SessionKey,
        /// The attempt.
        attempt: AttemptId,
        /// Silence observed.
        silent_for: Duration,
    },
    /// A failed attempt will be retried after `delay`.
    RetryScheduled {
        /// The session.
        key: SessionKey,
        /// The attempt that failed.
        failed: AttemptId,
        /// Backoff before the next attempt.
        delay: Duration,
        /// Code of the error, e.g. `ESTREAM_TIMEOUT`.
        error_code: &'static str,
    },
    /// An attempt broke mid-text; the reply will be continued after
    /// `delay` (the consumer keeps `kept_bytes` of text).
    ContinueScheduled {
        /// The session.
        key: SessionKey,
        /// The attempt that broke.
        failed: AttemptId,
        /// Backoff before the continuation.
        delay: Duration,
        /// Code of the error, e.g. `ESTREAM_TIMEOUT`.
        error_code: &'static str,
        /// Bytes of reply text kept.
        kept_bytes: usize,
    },
    /// A turn ended.
    TurnFinished {
        /// The session.
        key: SessionKey,
        /// Turn number.
        turn: u64,
        /// Attempts used.
        attempts: u32,
        /// `None` on success, else the error code (`ECANCELLED`, ...).
        error_code: Option<&'static str>,
    },
}

/// Publishes [`LifecycleEvent`]s to any number of subscribers.
#[derive(Debug, Clone)]
pub struct EventBus {
    tx: broadcast::Sender<LifecycleEvent>,
}

impl Default for EventBus {
    fn default() -> Self {
        Self::new(1024)
    }
}

impl EventBus {
    /// A bus keeping up to `capacity` events for slow subscribers.
    pub fn new(capacity: usize) -> Self {
        Self {
            tx: broadcast::channel(capacity.max(1)).0,
        }
    }

    /// A new subscriber, receiving events published from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<LifecycleEvent> {
        self.tx.subscribe()
    }

    /// Publishes `event` (dropped when nobody listens).
    pub fn publish(&self, event: LifecycleEvent) {
        let _ = self.tx.send(event);
    }
}
