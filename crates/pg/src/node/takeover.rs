//! The orphan scan: a node takes over the sessions whose owner died (their
//! leases ran out) and checks that it runs every waiting session whose
//! lease it holds.

use std::collections::HashSet;
use std::time::Duration;

use warden_core::{SessionKey, SessionStore as _, Supervisor, SupervisorError};

use super::NodeStore;
use crate::Lease;

/// What one [`Node::take_over`](crate::cluster::Node::take_over) did.
#[derive(Debug, Default, Clone, PartialEq)]
#[non_exhaustive]
pub struct TakeOver {
    /// Sessions of other nodes taken and started here, with their new
    /// epoch.
    pub taken: Vec<(SessionKey, u64)>,
    /// Sessions this node took back and started, with their new epoch: it
    /// gave them up itself in a database outage, or held them last before
    /// it restarted under its id. Nothing moved; they are not in
    /// [`taken`](Self::taken).
    pub returned: Vec<(SessionKey, u64)>,
    /// Sessions taken that could not start here, with why; their leases
    /// were given back at once for another node.
    pub released: Vec<(SessionKey, String)>,
    /// Sessions with waiting messages whose lease this node held while
    /// nothing ran them here, started now (with the epoch held): their
    /// messages are sent again. (Such a lease is one taken for a turn the
    /// request then refused before it started the session.)
    pub resumed: Vec<(SessionKey, u64)>,
    /// Turns of sessions this node gave up lately whose message was
    /// answered but whose end was never stored, ended now with
    /// [`TURN_END_LOST`](crate::TURN_END_LOST) (see
    /// [`PgStore::end_stranded_turns`](crate::PgStore::end_stranded_turns)).
    pub ended_lost: Vec<String>,
    /// When to run the next take-over: the [scan
    /// interval](crate::cluster::Node::scan_interval), or sooner when another node's
    /// lease on a session with waiting messages can be taken before then
    /// (so a dead node's sessions are taken as soon as the database allows,
    /// not up to a scan interval later). Never less than 10 ms (unless the
    /// scan interval is).
    pub next_scan: Duration,
}

/// One orphan's outcome: taken (under that epoch), or released (why).
pub(super) type Taken = Result<(SessionKey, u64), (SessionKey, String)>;

/// Orphans' sessions a node starts at once (each a round trip or two: its
/// record's first write).
const TAKEOVER_CONCURRENCY: usize = 16;

/// Orphans whose leases one statement takes: small enough that survivors
/// taking a dead node's sessions in their own random orders split them
/// (a batch is started before the next is taken), large enough that a
/// node holding thousands is taken in a few round trips.
const TAKEOVER_BATCH: usize = 64;

/// How long after giving a session's lease up a node's scans look for its
/// turns whose end was lost: a minute. (Every node also looks at every
/// session's once a minute, for the sessions of nodes that died.)
const LOST_END_WATCH: Duration = Duration::from_secs(60);

impl NodeStore {
    /// How often to scan for orphans: a quarter of the
    /// lease TTL, at most 500 ms, so a dead node's sessions are taken over
    /// within the TTL plus half a second of its last renewal.
    pub fn scan_interval(&self) -> Duration {
        (self.ttl / 4).min(Duration::from_millis(500))
    }

    /// One scan for orphans, as [`Node::take_over`](crate::cluster::Node::take_over)
    /// describes (which reports what it did): the one way in to it.
    pub(crate) async fn scan_orphans(&self, supervisor: &Supervisor) -> TakeOver {
        use futures_util::StreamExt as _;
        use rand::seq::SliceRandom as _;
        let mut done = TakeOver {
            next_scan: self.scan_interval(),
            ..TakeOver::default()
        };
        // The turns of sessions given up here lately (an outage fenced
        // them) whose end was lost between the answer and the last batch.
        let given_up = self.given_up_within(LOST_END_WATCH);
        if !given_up.is_empty() {
            done.ended_lost = self
                .pg
                .end_stranded_turns(Some(&given_up))
                .await
                .unwrap_or_default();
        }
        let found = self.pg.orphans_with_workspaces(&self.node).await;
        self.reached(&found);
        let Ok(found) = found else {
            return done;
        };
        if let Some(next) = found.next_in {
            // A few ms past the moment, so the lease has expired by the
            // database's clock when the query arrives.
            done.next_scan = (next + Duration::from_millis(5))
                .max(Duration::from_millis(10))
                .min(done.next_scan);
        }
        if found.sessions.is_empty()
            && found.held_waiting.is_empty()
            && self.homes.lock().is_empty()
        {
            return done;
        }
        // What runs here now, copies still stopping included. A supervisor
        // that does not answer (it is shutting down) starts nothing.
        let Ok(running) = supervisor.sessions().await else {
            return done;
        };
        let running: HashSet<SessionKey> = running.into_iter().collect();
        for key in found.held_waiting {
            if running.contains(&key) {
                continue;
            }
            // Ours by this node's clock too (one given up is an orphan
            // for whoever takes it, this node included).
            let Some(lease) = self.lease_of(&key) else {
                continue;
            };
            if let Some(resumed) = self.resume_held(supervisor, lease).await {
                done.resumed.push(resumed);
            }
        }
        // First the sessions this node gave up in an outage: home.
        let (home, later) = self
            .take_home(supervisor, found.own, &running, &mut done)
            .await;
        for outcome in home {
            match outcome {
                Ok(returned) => done.returned.push(returned),
                Err(released) => done.released.push(released),
            }
        }
        let mut outcomes = Vec::new();
        let mut orphans: Vec<SessionKey> = found
            .sessions
            .into_iter()
            // Not before this node's own sessions are back.
            .filter(|_| !later)
            // Ours, expired while the database was away: the renewer
            // renews it at its epoch; taking it would only bump the epoch
            // under the running session.
            .filter(|(key, _)| self.lease_of(key).is_none())
            // Its copy here is still stopping: for a later scan.
            .filter(|(key, _)| !running.contains(key))
            // Bound to a workspace this node does not have: for a node
            // that has it.
            .filter(|(_, workspace)| workspace.as_ref().is_none_or(|w| w.is_dir()))
            .map(|(key, _)| key)
            .collect();
        // A node that died held many sessions: their leases are taken a
        // batch per statement, in an order of this node's own, so the
        // survivors split them rather than race for each; each batch's
        // sessions are started several at a time.
        orphans.shuffle(&mut rand::rng());
        let mut starting = futures_util::stream::FuturesUnordered::new();
        for batch in orphans.chunks(TAKEOVER_BATCH) {
            // The sessions already taken go on starting meanwhile.
            let claim = self.claim_many(batch);
            tokio::pin!(claim);
            let leases = loop {
                tokio::select! {
                    leases = &mut claim => break leases.unwrap_or_default(),
                    Some(outcome) = starting.next(), if !starting.is_empty() => {
                        outcomes.push(outcome);
                    }
                }
            };
            for lease in leases {
                while starting.len() >= TAKEOVER_CONCURRENCY {
                    outcomes.extend(starting.next().await);
                }
                starting.push(self.start_taken(supervisor, lease));
            }
        }
        while let Some(outcome) = starting.next().await {
            outcomes.push(outcome);
        }
        for outcome in outcomes {
            match outcome {
                Ok(taken) => done.taken.push(taken),
                Err(released) => done.released.push(released),
            }
        }
        done
    }

    /// Starts the session of an orphan whose lease this node just took; one
    /// that cannot run here is released for another node.
    pub(super) async fn start_taken(&self, supervisor: &Supervisor, lease: Lease) -> Taken {
        let key = SessionKey::new(&lease.key);
        match supervisor.session(key.clone()).await {
            Ok(_) => Ok((key, lease.epoch)),
            Err(e) => {
                // Not runnable here: let another node have it rather than
                // hold its lease with nothing running.
                let _ = self.release(&key).await;
                Err((key, e.to_string()))
            }
        }
    }

    /// Starts the session of `lease`, held here with waiting messages and
    /// nothing running it: the session and its epoch once started. One that
    /// cannot start here is released for another node, as an orphan taken
    /// would be — except one given up ([`SupervisorError::SessionFailed`]),
    /// which runs nowhere until it is reset: its lease stays, or every
    /// node's scan would take and release it in turn.
    async fn resume_held(
        &self,
        supervisor: &Supervisor,
        lease: Lease,
    ) -> Option<(SessionKey, u64)> {
        let key = SessionKey::new(&lease.key);
        match supervisor.session(key.clone()).await {
            Ok(_) => Some((key, lease.epoch)),
            Err(SupervisorError::SessionFailed { .. } | SupervisorError::Actor(_)) => None,
            Err(e) => {
                tracing::warn!(event = "pg.lease_released", session = %key, error = %e, "a held session cannot start here; its lease is released");
                let _ = self.release(&key).await;
                None
            }
        }
    }

    /// The workspace directory `key`'s session is bound to, if this node
    /// does not have it (the session cannot run here); `None` when it has
    /// no workspace or the directory exists here (or the record cannot be
    /// read: the claim and the session's start decide then).
    pub async fn missing_workspace(&self, key: &SessionKey) -> Option<std::path::PathBuf> {
        match self.pg.load(key).await {
            Ok(Some(record)) => record.workspace.filter(|w| !w.is_dir()),
            Ok(None) | Err(_) => None,
        }
    }
}
