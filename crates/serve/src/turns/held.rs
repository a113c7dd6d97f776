//! What a turn's relay had of a turn and could not store when its session
//! stopped here (a database outage made the node give its lease up): kept
//! in memory, so that when the session comes back to this node the
//! re-delivered turn stores it first and continues after it — or, if the
//! upstream had finished the reply, ends it without asking again — instead
//! of having the upstream generate that text a second time.
//!
//! Only this node can use it (another node taking the session has the
//! database's events only), and only while the stored log ends where it
//! began: events stored meanwhile by another node make it stale.

use std::collections::HashMap;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;
use warden_core::store::StoredEvent as ServeEvent;
use warden_core::{AgentEvent, TurnEvent, TurnHandle};

use super::encode::describe;

/// How long a stopped turn's events are kept for its session's return: a
/// session comes back when the database does, and an outage past this is
/// far beyond what a lease rides through.
const KEEP: Duration = Duration::from_secs(600);

/// How long a stopped relay waits for the rest of its turn's events (the
/// session is stopping: its last ones come at once).
const REST_WAIT: Duration = Duration::from_secs(10);

/// A stopped turn's events that were never stored.
#[derive(Debug)]
pub(super) struct Held {
    /// The number of the last event stored before them (0: none).
    pub(super) after: u64,
    /// The events, numbered on from `after`.
    pub(super) events: Vec<ServeEvent>,
    /// Whether the upstream had finished the reply: its stop came after
    /// the last text ([`Reply::complete`]).
    pub(super) complete: bool,
    kept_at: Instant,
}

/// Whether the running attempt's reply is whole, from the turn's events as
/// the relay reads them: the model's stop is not an event clients see, so
/// the relay notes it as it goes.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Reply {
    complete: bool,
}

impl Reply {
    /// Notes `event`: a stop makes the reply whole, anything the attempt
    /// adds after it (or a new attempt) not.
    pub(super) fn saw(&mut self, event: &TurnEvent) {
        match event {
            TurnEvent::Event(AgentEvent::Stop { .. }) => self.complete = true,
            TurnEvent::Event(
                AgentEvent::TextDelta(_)
                | AgentEvent::ThinkingDelta(_)
                | AgentEvent::ToolUseStarted { .. }
                | AgentEvent::ToolInputDelta { .. }
                | AgentEvent::ToolUseFinished { .. },
            )
            | TurnEvent::Started(_)
            | TurnEvent::Retrying { .. }
            | TurnEvent::Continuing { .. }
            | TurnEvent::Restarting { .. } => self.complete = false,
            _ => {}
        }
    }

    /// Whether the attempt's reply is whole (its stop came after the last
    /// of it).
    pub(super) fn complete(self) -> bool {
        self.complete
    }
}

/// The held turns of this node, by turn id.
#[derive(Debug, Default)]
pub(crate) struct HeldTurns {
    map: Mutex<HashMap<String, Held>>,
}

impl HeldTurns {
    /// Keeps turn `id`'s unstored events: `unstored` (numbered, after
    /// event `after`), then whatever its stopping session still sends on
    /// `turn`, up to its end (not included: the turn is not over).
    pub(super) async fn keep(
        &self,
        id: &str,
        after: u64,
        unstored: Vec<ServeEvent>,
        mut reply: Reply,
        mut turn: TurnHandle,
        prior_attempts: u64,
    ) {
        let mut events = unstored;
        let deadline = Instant::now() + REST_WAIT;
        while let Ok(Some(event)) = tokio::time::timeout_at(deadline, turn.recv()).await {
            if matches!(event, TurnEvent::Finished(_)) {
                break;
            }
            reply.saw(&event);
            if let Some(mut data) = describe(event) {
                data.number_on(prior_attempts);
                let next = events.last().map_or(after + 1, |e| e.id + 1);
                events.push(ServeEvent::new(next, data));
            }
        }
        if events.is_empty() && !reply.complete() {
            return;
        }
        let now = Instant::now();
        let mut map = self.map.lock();
        map.retain(|_, h| now.duration_since(h.kept_at) < KEEP);
        map.insert(
            id.to_owned(),
            Held {
                after,
                events,
                complete: reply.complete(),
                kept_at: now,
            },
        );
    }

    /// Turn `id`'s held events if they go on from event `stored_last`, the
    /// last one its stored log has; they are forgotten either way.
    pub(super) fn take(&self, id: &str, stored_last: u64) -> Option<Held> {
        let held = self.map.lock().remove(id)?;
        let fresh = held.kept_at.elapsed() < KEEP;
        let last = held.events.iter().any(|e| e.data.kind().is_last());
        (fresh && !last && held.after == stored_last).then_some(held)
    }
}
