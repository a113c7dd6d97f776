//! Typed lifecycle events for programmatic users.
//!
//! Every transition that is logged with `tracing` is also published on an
//! [`EventBus`] as a [`LifecycleEvent`], so an orchestrator can drive a UI or
//! metrics without parsing logs. The bus is a `tokio::sync::broadcast`
//! channel: publishing never blocks the actors; a subscriber that falls more
//! than the capacity behind is told how many events it missed
//! (`RecvError::Lagged`, or [`Received::Lagged`] from a [`Subscription`])
//! and goes on from the oldest event kept. A supervisor's bus closes when
//! the supervisor has shut down, after every session's `SessionStopped`:
//! subscribers end there.
//! Turn results themselves are never on the bus; they travel on the
//! lossless per-turn channel ([`crate::TurnHandle`]).

mod view;
pub mod wire;

use std::sync::Arc;
use std::time::Duration;

use parking_lot::RwLock;
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
        /// The model's context window, in tokens.
        window: u64,
        /// `tokens` as a share of `window`, 0–100.
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
        /// What the store said (a corrupt record, I/O, a lost lease).
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
        /// Which attempt: its turn and its number within the turn (1 first).
        attempt: AttemptId,
        /// The admission pool it waits in.
        pool: String,
    },
    /// A queued attempt was admitted; its stream starts now.
    AttemptAdmitted {
        /// The session.
        key: SessionKey,
        /// Which attempt: its turn and its number within the turn (1 first).
        attempt: AttemptId,
        /// How long it waited.
        waited: Duration,
    },
    /// An attempt's stream was started (watchdog already armed).
    AttemptStarted {
        /// The session.
        key: SessionKey,
        /// Which attempt: its turn and its number within the turn (1 first).
        attempt: AttemptId,
        /// Its silence allowance.
        timeout: Duration,
    },
    /// The watchdog killed an attempt's silent stream (`ESTREAM_TIMEOUT`).
    StreamTimedOut {
        /// The session.
        key: SessionKey,
        /// Which attempt: its turn and its number within the turn (1 first).
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
    /// An attempt's stream ended (one per [`AttemptStarted`](Self::AttemptStarted)),
    /// so running streams can be counted from the bus.
    AttemptEnded {
        /// The session.
        key: SessionKey,
        /// Which attempt: its turn and its number within the turn (1 first).
        attempt: AttemptId,
        /// How it ended.
        outcome: AttemptOutcome,
        /// The error's code when it failed (`ESTREAM_TIMEOUT`, …).
        error_code: Option<&'static str>,
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

/// How an attempt's stream ended.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum AttemptOutcome {
    /// The stream ended with the reply.
    Completed,
    /// The stream failed (killed by the watchdog, cut, an API error, …).
    Failed,
    /// Warden stopped it: a cancel, a recover, the turn's deadline or size
    /// cap, or the session stopping.
    Cancelled,
}

impl AttemptOutcome {
    /// Its name on the wire (`completed`, `failed`, `cancelled`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
        }
    }
}

/// Publishes [`LifecycleEvent`]s to any number of subscribers.
///
/// Clones share one channel. [`close`](Self::close) ends it: each
/// subscriber receives what was published before, then the end.
#[derive(Debug, Clone)]
pub struct EventBus {
    tx: Arc<RwLock<Option<broadcast::Sender<LifecycleEvent>>>>,
    capacity: usize,
}

impl Default for EventBus {
    fn default() -> Self {
        Self::new(1024)
    }
}

impl EventBus {
    /// A bus keeping up to `capacity` events for slow subscribers.
    pub fn new(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        Self {
            tx: Arc::new(RwLock::new(Some(broadcast::channel(capacity).0))),
            capacity,
        }
    }

    /// A new subscriber, receiving events published from now on. On a
    /// closed bus it ends at once. A subscriber more than the capacity
    /// behind gets `RecvError::Lagged(missed)` and goes on from the oldest
    /// event kept; [`events`](Self::events) gives that as an item.
    pub fn subscribe(&self) -> broadcast::Receiver<LifecycleEvent> {
        match &*self.tx.read() {
            Some(tx) => tx.subscribe(),
            // A channel whose sender is gone: its receiver ends at once.
            None => broadcast::channel(1).1,
        }
    }

    /// A new [`Subscription`]: the events published from now on, a gap as
    /// [`Received::Lagged`], and `None` once the bus is closed.
    pub fn events(&self) -> Subscription {
        Subscription {
            rx: self.subscribe(),
        }
    }

    /// Publishes `event` (dropped when nobody listens, or once closed).
    pub fn publish(&self, event: LifecycleEvent) {
        if let Some(tx) = &*self.tx.read() {
            let _ = tx.send(event);
        }
    }

    /// Ends the bus: every subscriber receives what was published before,
    /// then its end (`RecvError::Closed`, or `None` from a
    /// [`Subscription`]); later events are dropped. A supervisor closes the
    /// bus it made when it has shut down; one given to it with
    /// [`SupervisorBuilder::bus`](crate::SupervisorBuilder::bus) is the
    /// caller's to close.
    pub fn close(&self) {
        self.tx.write().take();
    }

    /// Whether [`close`](Self::close) was called.
    pub fn is_closed(&self) -> bool {
        self.tx.read().is_none()
    }

    /// How many events it keeps for a slow subscriber.
    pub fn capacity(&self) -> usize {
        self.capacity
    }
}

/// What a [`Subscription`] receives: an event, or how many events it
/// missed by falling more than the bus's capacity behind.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Received {
    /// The next event.
    Event(LifecycleEvent),
    /// This many events were skipped; the ones after them follow.
    Lagged(u64),
}

/// A subscriber of an [`EventBus`] that reports a gap and goes on, and
/// ends when the bus closes (a supervisor's, at its shutdown), so
/// `while let Some(r) = events.recv().await` ends on its own:
///
/// ```no_run
/// # async fn f(supervisor: warden_core::Supervisor) {
/// use warden_core::lifecycle::Received;
/// let mut events = supervisor.events();
/// while let Some(received) = events.recv().await {
///     match received {
///         Received::Event(e) => println!("{}", e.name()),
///         Received::Lagged(missed) => eprintln!("missed {missed} events"),
///         _ => {}
///     }
/// }
/// # }
/// ```
#[derive(Debug)]
pub struct Subscription {
    rx: broadcast::Receiver<LifecycleEvent>,
}

impl Subscription {
    /// The next event or gap; `None` once the bus is closed and everything
    /// published before was received.
    pub async fn recv(&mut self) -> Option<Received> {
        match self.rx.recv().await {
            Ok(e) => Some(Received::Event(e)),
            Err(broadcast::error::RecvError::Lagged(n)) => Some(Received::Lagged(n)),
            Err(broadcast::error::RecvError::Closed) => None,
        }
    }

    /// The same as a [`Stream`](futures_util::Stream) (boxed, so `Unpin`:
    /// `.next().await` works on it as it is).
    pub fn into_stream(self) -> futures_util::stream::BoxStream<'static, Received> {
        use futures_util::StreamExt as _;
        futures_util::stream::unfold(self, |mut s| async move {
            let next = s.recv().await?;
            Some((next, s))
        })
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    use futures_util::StreamExt as _;

    use super::*;

    fn stopped(n: usize) -> LifecycleEvent {
        LifecycleEvent::SessionStopped {
            key: SessionKey::new(format!("s{n}")),
            reason: None,
            abnormal: false,
        }
    }

    #[tokio::test]
    async fn a_subscriber_past_the_capacity_is_told_its_gap_and_goes_on_to_the_end() {
        let bus = EventBus::new(2);
        let mut events = bus.events();
        for n in 0..5 {
            bus.publish(stopped(n));
        }
        bus.close();
        bus.publish(stopped(99)); // after the end: dropped
        assert_eq!(events.recv().await, Some(Received::Lagged(3)));
        assert_eq!(events.recv().await, Some(Received::Event(stopped(3))));
        assert_eq!(events.recv().await, Some(Received::Event(stopped(4))));
        assert_eq!(events.recv().await, None);
        assert_eq!(events.recv().await, None, "it stays ended");
        assert!(bus.is_closed());
        assert!(bus.events().into_stream().next().await.is_none());
    }

    #[tokio::test]
    async fn as_a_stream_it_yields_the_same_items() {
        let bus = EventBus::new(8);
        let stream = bus.events().into_stream();
        bus.publish(stopped(1));
        bus.close();
        let items: Vec<Received> = stream.collect().await;
        assert_eq!(items, [Received::Event(stopped(1))]);
    }
}
