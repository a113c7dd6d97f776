//! How long failovers take, as the node that takes a session over sees
//! them: from the dead owner's last heartbeat to the session's first
//! lifecycle event here (`warden_cluster_failover_seconds`).
//!
//! The dead node cannot say when it died; its last heartbeat, kept in the
//! database, is the last sign of life (it died within a heartbeat interval,
//! a third of its TTL, after it). The time is taken in two parts so that
//! no two clocks are compared: the owner's silence when the lease was
//! taken, by the database's clock (`moved_at - heartbeat_at`), then, by
//! this node's clock, from the take to the session's first event here
//! other than its actor's start (in practice its re-delivered turn's
//! `turn_started`). A session taken while its old owner beats again (after
//! a database outage, the return grace passed) is not a failover of a
//! dead node and is not timed; the outage has its own figures.

use std::collections::HashMap;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;
use warden_core::cluster::Timings;
use warden_core::{LifecycleEvent, SessionKey};

use crate::NodeStore;

/// The histogram's upper bounds, seconds: a TTL of a few seconds fails
/// over in a few seconds; a long one, or a slow start, in minutes.
pub(super) const BOUNDS: &[f64] = &[
    0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 60.0, 120.0, 300.0,
];

/// A session taken over waits this long at most for its first event; then
/// it is not timed.
const WAIT_AT_MOST: Duration = Duration::from_secs(600);

/// The failovers timed so far, and those waiting for their first event.
#[derive(Debug)]
pub(super) struct Failovers {
    timings: Mutex<Timings>,
    watch: Mutex<Watch>,
}

impl Default for Failovers {
    fn default() -> Self {
        Self {
            timings: Mutex::new(Timings::new(BOUNDS)),
            watch: Mutex::default(),
        }
    }
}

#[derive(Debug, Default)]
struct Watch {
    /// Takeover scans running: meanwhile the first event of every session
    /// is noted (the sessions a scan takes start before it says which).
    scanning: u32,
    /// First events seen during the scan.
    during: HashMap<String, Instant>,
    /// Sessions taken over, still without an event: when their failover
    /// began by this node's clock.
    waiting: HashMap<String, Instant>,
}

impl Failovers {
    /// The histogram now.
    pub(super) fn timings(&self) -> Timings {
        self.timings.lock().clone()
    }

    /// A takeover scan begins.
    pub(super) fn scan_begins(&self) {
        let mut watch = self.watch.lock();
        if watch.scanning == 0 {
            watch.during.clear();
        }
        watch.scanning += 1;
    }

    /// The scan is over; `began` holds each session it took from a dead
    /// node with when its failover began (its old owner's last heartbeat,
    /// on this node's clock).
    fn scan_ends(&self, began: Vec<(String, Instant)>) {
        let mut watch = self.watch.lock();
        let now = Instant::now();
        for (key, at) in began {
            match watch.during.get(&key) {
                Some(first) => self
                    .timings
                    .lock()
                    .observe(first.saturating_duration_since(at)),
                None => {
                    watch.waiting.insert(key, at);
                }
            }
        }
        watch.scanning = watch.scanning.saturating_sub(1);
        if watch.scanning == 0 {
            watch.during.clear();
        }
        watch
            .waiting
            .retain(|_, at| now.saturating_duration_since(*at) < WAIT_AT_MOST);
    }

    /// A lifecycle event of this node's supervisor.
    pub(super) fn on_event(&self, event: &LifecycleEvent) {
        if matches!(event, LifecycleEvent::SessionSpawned { .. }) {
            return;
        }
        let Some(key) = event.key() else {
            return;
        };
        let now = Instant::now();
        let mut watch = self.watch.lock();
        if let Some(at) = watch.waiting.remove(key.as_str()) {
            self.timings
                .lock()
                .observe(now.saturating_duration_since(at));
        } else if watch.scanning > 0 {
            watch.during.entry(key.as_str().to_owned()).or_insert(now);
        }
    }
}

/// Ends the scan that took `taken` (with their new epochs): asks the
/// database how long each one's old owner had been silent when it was
/// taken, if it was taken from a dead node.
pub(super) async fn scan_ends(
    store: &NodeStore,
    failovers: &Failovers,
    taken: &[(SessionKey, u64)],
) {
    let began = match taken.is_empty() {
        true => Vec::new(),
        false => began(store, taken).await.unwrap_or_default(),
    };
    failovers.scan_ends(began);
}

/// For each of `taken` moved here from another node's expired lease
/// whose node was silent then: when its failover began, on this node's
/// clock.
async fn began(
    store: &NodeStore,
    taken: &[(SessionKey, u64)],
) -> Result<Vec<(String, Instant)>, warden_core::StoreError> {
    let keys: Vec<&str> = taken.iter().map(|(k, _)| k.as_str()).collect();
    let epochs: Vec<i64> = taken
        .iter()
        .map(|(_, e)| i64::try_from(*e).unwrap_or(i64::MAX))
        .collect();
    let client = store.pg().client().await?;
    let rows = client
        .query(
            "SELECT s.key, EXTRACT(EPOCH FROM now() - s.moved_at)::float8, \
               EXTRACT(EPOCH FROM s.moved_at - n.heartbeat_at)::float8 \
             FROM unnest($1::text[], $2::int8[]) AS t(key, epoch) \
             JOIN warden_sessions s ON s.key = t.key AND s.moved_epoch = t.epoch \
             JOIN warden_nodes n ON n.node_id = s.moved_from \
             WHERE s.owner = $3 AND s.moved_kind = 'failover' AND n.heartbeat_at <= s.moved_at",
            &[&keys, &epochs, &store.node()],
        )
        .await
        .map_err(crate::backend)?;
    let now = Instant::now();
    Ok(rows
        .into_iter()
        .map(|r| {
            let since_taken = Duration::from_secs_f64(r.get::<_, f64>(1).max(0.0));
            let silent = Duration::from_secs_f64(r.get::<_, f64>(2).max(0.0));
            let at = now.checked_sub(since_taken + silent).unwrap_or(now);
            (r.get(0), at)
        })
        .collect())
}
