//! The lifecycle events `GET /v1/events` serves, kept in a bounded window
//! so a client that lost its connection replays what it missed with
//! `Last-Event-ID` — or is told, with a `reset` event, that it missed more
//! than is kept (or that the server restarted), never left to guess.
//!
//! Event ids are numbers, increasing across restarts: this process starts
//! numbering at its start time in milliseconds × 1,000, so an id from an
//! earlier run is always older than every id kept now.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;
use serde::Serialize;
use serde_json::Value;
use tokio::sync::watch;
use warden_core::Supervisor;
use warden_core::lifecycle::wire::{Lagged, ResetReason};
use warden_core::store::turn_event::{EventTime, Timed};

use crate::turns::Turns;
use crate::views;

/// Lifecycle events kept for replay.
pub(crate) const KEPT: usize = 1024;

/// How long an event of a turn waits for the turn's id: the session
/// announces the turn as soon as its message is stored, and the relay
/// registers it a store write later. Past this (a store that does not
/// answer) the event goes out with `turn_id: null` rather than hold up the
/// events after it.
const NAMING_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// One kept event.
#[derive(Debug, Clone)]
pub(crate) struct Kept {
    pub(crate) id: u64,
    pub(crate) kind: &'static str,
    pub(crate) data: Value,
}

/// The window of recent lifecycle events.
#[derive(Debug)]
pub(crate) struct History {
    events: Mutex<VecDeque<Kept>>,
    /// The id of the newest event (the first id minus one before any).
    newest: watch::Sender<u64>,
    /// The id before this run's first.
    start: u64,
}

/// What a reader gets next.
pub(crate) enum Next {
    /// Events after the ones it had, in order.
    Events(Vec<Kept>),
    /// It missed events no longer kept, or its id is from another run of
    /// the server: a `reset` saying which, then every event kept.
    Reset {
        /// Missed (older than the window) or restarted.
        reason: ResetReason,
        /// The events kept, from the oldest.
        events: Vec<Kept>,
        /// Where the reader stands before these events: just before the
        /// oldest kept (this run's start when none is). A reader placed
        /// there is never reset again for the same miss: it reads on
        /// into the live events instead of looping.
        position: u64,
    },
}

impl History {
    /// A window whose ids start after this moment's number.
    fn new() -> Self {
        let ms = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| {
            u64::try_from(d.as_millis()).unwrap_or(u64::MAX / 1000)
        });
        let start = ms.saturating_mul(1000);
        let (newest, _) = watch::channel(start);
        Self {
            events: Mutex::new(VecDeque::with_capacity(KEPT)),
            newest,
            start,
        }
    }

    /// Keeps the supervisor's lifecycle events from now on (until it
    /// stops), each event of a turn with its id from `turns` (`turn_id`).
    pub(crate) fn record(supervisor: &Supervisor, turns: Arc<Turns>) -> Arc<Self> {
        let history = Arc::new(Self::new());
        let mut rx = supervisor.subscribe();
        let keep = Arc::clone(&history);
        tokio::spawn(async move {
            use tokio::sync::broadcast::error::RecvError;
            loop {
                match rx.recv().await {
                    Ok(e) => {
                        let (kind, mut data) = views::lifecycle(&e);
                        if let (Some(key), Some(turn)) = (e.key(), data.turn())
                            && let Some(id) = turns.id_within(key, turn, NAMING_WAIT).await
                        {
                            data.set_turn_id(id);
                        }
                        keep.push(kind, timed(&data));
                    }
                    // The window itself fell behind the bus: say so in it.
                    Err(RecvError::Lagged(missed)) => {
                        keep.push("lagged", timed(&Lagged::new(missed)))
                    }
                    Err(RecvError::Closed) => return,
                }
            }
        });
        history
    }

    fn push(&self, kind: &'static str, data: Value) {
        let mut events = self.events.lock();
        let id = *self.newest.borrow() + 1;
        if events.len() == KEPT {
            events.pop_front();
        }
        events.push_back(Kept { id, kind, data });
        // Under the lock: a reader placed at the newest kept event (see
        // `position`) is never ahead of `now`.
        self.newest.send_replace(id);
    }

    /// The newest id now: a reader starting here gets only later events.
    pub(crate) fn now(&self) -> u64 {
        *self.newest.borrow()
    }

    /// Where a reset reader is placed (see [`Next::Reset::position`]),
    /// `events` being the window, locked.
    fn position(&self, events: &VecDeque<Kept>) -> u64 {
        events.front().map_or(self.start, |e| e.id - 1)
    }

    /// What comes after `seen` (waiting for it if nothing has yet).
    pub(crate) async fn after(&self, seen: u64) -> Next {
        let mut changed = self.newest.subscribe();
        if seen < self.start || seen > self.now() {
            // An id of an earlier (or a later: a clock set back) run.
            let events = self.events.lock();
            return Next::Reset {
                reason: ResetReason::Restarted,
                position: self.position(&events),
                events: events.iter().cloned().collect(),
            };
        }
        loop {
            {
                let events = self.events.lock();
                let oldest = events.front().map(|e| e.id);
                match oldest {
                    // Missed some: the ones after `seen` are gone.
                    Some(oldest) if oldest > seen.saturating_add(1) => {
                        return Next::Reset {
                            reason: ResetReason::Missed,
                            position: self.position(&events),
                            events: events.iter().cloned().collect(),
                        };
                    }
                    _ => {
                        let from = events.partition_point(|e| e.id <= seen);
                        if from < events.len() {
                            return Next::Events(events.range(from..).cloned().collect());
                        }
                    }
                }
            }
            if changed.changed().await.is_err() {
                return Next::Events(Vec::new());
            }
        }
    }
}

/// An event's fields with `at` (now), as the stream sends them.
pub(crate) fn timed<T: Serialize>(event: &T) -> Value {
    serde_json::to_value(Timed {
        event,
        at: Some(EventTime::now()),
    })
    .unwrap_or(Value::Null)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::json;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_reader_the_window_cannot_place_is_reset_once_then_waits_for_live_events() {
        let h = History::new();
        // Nothing kept yet (a fresh or just-restarted server): an id from
        // an earlier run, 0, or the largest id.
        for seen in [0, h.start - 1, u64::MAX] {
            let Next::Reset {
                reason,
                events,
                position,
            } = h.after(seen).await
            else {
                panic!("{seen} cannot be placed: a reset");
            };
            assert_eq!(reason, ResetReason::Restarted);
            assert!(events.is_empty());
            // From where the reset put it, the reader waits for what
            // comes next, instead of being reset again.
            let next = tokio::time::timeout(Duration::from_secs(60), h.after(position)).await;
            assert!(next.is_err(), "a placed reader is not reset again");
        }
        h.push("n", json!({"i": 1}));
        let Next::Reset { position, .. } = h.after(0).await else {
            panic!("still an id of another run");
        };
        match h.after(position).await {
            Next::Events(events) => assert_eq!(events.len(), 1),
            Next::Reset { .. } => panic!("placed before the oldest kept: no second reset"),
        }
    }

    #[tokio::test]
    async fn a_reader_past_the_window_is_reset_and_one_within_it_is_not() {
        let h = History::new();
        let first = h.now() + 1;
        for i in 0..KEPT + 10 {
            h.push("n", json!({"i": i}));
        }
        // The first 10 are gone: a reader that saw only the first missed them.
        match h.after(first).await {
            Next::Reset { reason, events, .. } => {
                assert_eq!(reason, ResetReason::Missed);
                assert_eq!(events.len(), KEPT);
                assert_eq!(events[0].id, first + 10);
            }
            Next::Events(_) => panic!("a reader that missed events must be reset"),
        }
        // One that saw the 10th (the event before the oldest kept) missed
        // nothing.
        match h.after(first + 9).await {
            Next::Events(events) => {
                assert_eq!(events.len(), KEPT);
                assert_eq!(events[0].id, first + 10);
            }
            Next::Reset { .. } => panic!("nothing was missed"),
        }
        // An id from before this run's start, or past its newest: restarted.
        for seen in [first - 2, h.now() + 1] {
            assert!(matches!(
                h.after(seen).await,
                Next::Reset {
                    reason: ResetReason::Restarted,
                    ..
                }
            ));
        }
    }
}
