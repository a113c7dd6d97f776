//! Sessions go home after a database outage: a node remembers the
//! sessions it gave up because it could not reach the database and takes
//! them back first once it can, and the other nodes leave them to it for
//! the return grace.

use std::collections::HashSet;
use std::time::Duration;

use tokio::time::Instant;
use warden_core::{SessionKey, StoreError, Supervisor};

use super::NodeStore;
use super::takeover::{TakeOver, Taken};
use crate::Patience;

/// How long, by default, the other nodes leave a session to its last owner
/// once that owner is alive again after a database outage (and how long a
/// node that lived through one itself leaves the others' sessions alone
/// after it): 5 s. The owner takes its sessions back as soon as the
/// database answers and [`RETAKE_COOLDOWN`](crate::RETAKE_COOLDOWN) (3 s
/// from the moment it gave them up) has passed, on its next scan (at most
/// 0.5 s later); 5 s covers that with room for a loaded machine. The cost:
/// the sessions of a node that died *during* the outage are taken over
/// this much later.
pub const DEFAULT_RETURN_GRACE: Duration = Duration::from_secs(5);

/// This node's latest database outage, as its own round trips saw it.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Reach {
    /// Since when its round trips fail, if they do now.
    failing_since: Option<Instant>,
    /// When the latest outage began.
    began: Option<Instant>,
    /// When it ended (a round trip worked again).
    back_at: Option<Instant>,
}

impl NodeStore {
    /// The [return grace](Self::with_return_grace).
    pub fn return_grace(&self) -> Duration {
        self.return_grace
    }

    /// Records how a round trip to the database went: a backend error
    /// (unreachable) begins an outage, a success after one ends it. A
    /// refused fence is an answer, not an outage.
    pub(crate) fn reached<T>(&self, result: &Result<T, StoreError>) {
        let now = Instant::now();
        let mut reach = self.reach.lock();
        match result {
            Ok(_) | Err(StoreError::LeaseLost { .. }) => {
                if reach.failing_since.take().is_some() {
                    reach.back_at = Some(now);
                }
            }
            Err(_) if reach.failing_since.is_none() => {
                // A new outage within the last one's return grace continues
                // it: the leases the first one expired are still coming
                // home.
                if !self.returning(&reach) {
                    reach.began = Some(now);
                }
                reach.failing_since = Some(now);
            }
            Err(_) => {}
        }
    }

    /// Whether this node's round trips fail now, or failed within
    /// `window` (its last outage ended less than that ago).
    pub fn unreachable_within(&self, window: Duration) -> bool {
        let reach = *self.reach.lock();
        reach.failing_since.is_some() || reach.back_at.is_some_and(|b| b.elapsed() <= window)
    }

    /// Whether this node is in an outage, or back from one for less than
    /// the return grace.
    fn returning(&self, reach: &Reach) -> bool {
        reach.failing_since.is_some()
            || reach
                .back_at
                .is_some_and(|back| back.elapsed() < self.return_grace)
    }

    /// The patience of this node's takes now (see [`Patience`]).
    pub(crate) fn patience(&self) -> Patience {
        let reach = *self.reach.lock();
        let patience = Patience::new(self.return_grace);
        match reach.began {
            Some(began) if self.returning(&reach) => {
                patience.with_outage(began.elapsed() + self.ttl)
            }
            _ => patience,
        }
    }

    /// Remembers that this node gave `key` up because it could not renew
    /// its lease in time: it takes it back first when it can.
    pub(super) fn remember_home(&self, key: &str) {
        self.homes.lock().insert(key.to_owned());
    }

    /// Whether this node holds `key` under the lease it took back after a
    /// database outage (the session came home): a turn it re-delivers was
    /// interrupted by the outage.
    pub fn came_home(&self, key: &SessionKey) -> bool {
        let epoch = self.lease_of(key).map(|l| l.epoch);
        epoch.is_some() && self.came_home.lock().get(key.as_str()) == epoch.as_ref()
    }

    /// Takes back the sessions this node gave up in a database outage,
    /// and the orphans whose lease it held last (`own`: it gave them up,
    /// or it restarted under the same id), before the scan looks at any
    /// other: those not held here now, not still stopping here (`running`)
    /// and past [`RETAKE_COOLDOWN`](crate::RETAKE_COOLDOWN) (`done.next_scan`
    /// comes when the first is). The outcomes of the starts, and whether
    /// some are still to come back (cooling down, or still stopping here):
    /// the scan then takes no other orphan yet, so the sessions of this
    /// node come first.
    pub(super) async fn take_home(
        &self,
        supervisor: &Supervisor,
        own: Vec<SessionKey>,
        running: &HashSet<SessionKey>,
        done: &mut TakeOver,
    ) -> (Vec<Taken>, bool) {
        // Remembered only while the others leave them alone: afterwards a
        // session not yet back is an orphan like any other.
        let remembered: Vec<SessionKey> = {
            let mut homes = self.homes.lock();
            if !self.returning(&self.reach.lock()) {
                homes.clear();
            }
            homes.iter().map(SessionKey::new).collect()
        };
        let mut keys: Vec<SessionKey> = Vec::new();
        let mut later = false;
        for key in remembered.into_iter().chain(own) {
            if keys.contains(&key) || self.lease_of(&key).is_some() {
                continue;
            }
            if running.contains(&key) {
                later = true;
                continue;
            }
            if let Some(left) = self.cooling_down(&key) {
                done.next_scan = done.next_scan.min(left + Duration::from_millis(5));
                later = true;
                continue;
            }
            keys.push(key);
        }
        if keys.is_empty() {
            return (Vec::new(), later);
        }
        let taken = self.claim_many(&keys).await;
        self.reached(&taken);
        let mut outcomes = Vec::new();
        for lease in taken.unwrap_or_default() {
            self.homes.lock().remove(&lease.key);
            self.came_home.lock().insert(lease.key.clone(), lease.epoch);
            outcomes.push(self.start_taken(supervisor, lease).await);
        }
        (outcomes, later)
    }
}
