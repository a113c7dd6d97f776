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

/// Which of `takeable` (the orphans this node can run, in the order it
/// would take them) node `me` takes in one scan, given every live member's
/// count of sessions held (`live`, `me` among them), every orphan the scan
/// saw (`all`), and those of them this node has seen wait for
/// [`orphan_overdue`] or longer (`overdue`). Its fair share: as many as
/// bring it up to the mean the live members would hold with the orphans
/// shared out (rounded up), none once it is there — so the survivors of a
/// dead node split its sessions whichever looks first and however often,
/// and a less loaded one takes more. Within the share, first the orphans
/// dealt to it (the orphans in key order dealt round the live members in
/// id order, every `k`-th to each of `k`), so survivors looking at the
/// same moment take disjoint ones. An overdue orphan is taken whatever the
/// share: the node it fell to did not take it (slow, or without its
/// workspace).
pub(crate) fn orphans_to_take(
    me: &str,
    live: &[(String, u64)],
    all: &[SessionKey],
    overdue: &HashSet<SessionKey>,
    takeable: Vec<SessionKey>,
) -> Vec<SessionKey> {
    let mut ids: Vec<&str> = live.iter().map(|(id, _)| id.as_str()).collect();
    ids.sort_unstable();
    let nodes = ids.len().max(1);
    let rank = ids.iter().position(|id| *id == me);
    let mut keys: Vec<&str> = all.iter().map(SessionKey::as_str).collect();
    keys.sort_unstable();
    let dealt_here = |k: &SessionKey| {
        rank.is_some_and(|r| {
            keys.binary_search(&k.as_str())
                .is_ok_and(|i| i % nodes == r)
        })
    };
    let (late, fresh): (Vec<SessionKey>, Vec<SessionKey>) =
        takeable.into_iter().partition(|k| overdue.contains(k));
    let (mut order, rest): (Vec<SessionKey>, Vec<SessionKey>) =
        fresh.into_iter().partition(dealt_here);
    order.extend(rest);
    let held: u64 = live.iter().map(|(_, c)| c).sum();
    let mine = live.iter().find(|(id, _)| id == me).map_or(0, |(_, c)| *c);
    let mean = (held + all.len() as u64).div_ceil(nodes as u64);
    let share = (mean.saturating_sub(mine) as usize).saturating_sub(late.len());
    order.truncate(share);
    let mut take = late;
    take.extend(order);
    take
}

/// How long an orphan may wait, seen by a node's scans, before that node
/// takes it whatever its share ([`orphans_to_take`]): two scan intervals,
/// time for the node it fell to to take it.
fn orphan_overdue(scan_interval: Duration) -> Duration {
    scan_interval * 2
}

impl NodeStore {
    /// Of `all` (the orphans a scan saw), those this node's scans have seen
    /// waiting for [`orphan_overdue`] or longer; the others are noted as
    /// seen now (and those no longer orphans forgotten).
    fn overdue_orphans(&self, all: &[SessionKey]) -> HashSet<SessionKey> {
        let now = tokio::time::Instant::now();
        let after = orphan_overdue(self.scan_interval());
        let mut seen = self.orphans_seen.lock();
        seen.retain(|k, _| all.iter().any(|a| a.as_str() == k));
        all.iter()
            .filter(|k| {
                let since = *seen.entry(k.as_str().to_owned()).or_insert(now);
                now.duration_since(since) >= after
            })
            .cloned()
            .collect()
    }

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
        let all: Vec<SessionKey> = found.sessions.iter().map(|(k, _)| k.clone()).collect();
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
        // Only this node's share of them this scan, so the survivors of a
        // dead node split its sessions instead of the first to look taking
        // them all; the rest are left to the others' scans.
        let overdue = self.overdue_orphans(&all);
        if !orphans.is_empty()
            && let Ok(nodes) = self.pg.nodes().await
        {
            // Beaten within half its TTL (it beats every third): a node
            // that died a moment ago is not alive yet by its TTL, but it
            // takes nothing.
            let beating = |n: &super::NodeInfo| {
                n.state == super::NodeState::Alive
                    && n.ttl
                        .is_none_or(|ttl| n.heartbeat_age_secs < ttl.as_secs_f64() / 2.0)
            };
            let live: Vec<(String, u64)> = nodes
                .into_iter()
                .filter(beating)
                .map(|n| (n.node_id, n.sessions))
                .collect();
            orphans = orphans_to_take(&self.node, &live, &all, &overdue, orphans);
        }
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
            // A turn placed here claimed it again while this start was on
            // its way (the scan's epoch is stale, not the node's): that
            // claim runs it. Releasing it would give a failover's turns
            // away as if handed over.
            Err(_) if let Some(newer) = self.lease_of(&key).filter(|l| l.epoch > lease.epoch) => {
                Ok((key, newer.epoch))
            }
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

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use warden_core::SessionKey;

    use super::orphans_to_take;

    fn live(counts: &[(&str, u64)]) -> Vec<(String, u64)> {
        counts.iter().map(|(id, c)| (id.to_string(), *c)).collect()
    }

    fn keys(n: usize) -> Vec<SessionKey> {
        (0..n)
            .map(|i| SessionKey::new(format!("s{i:02}")))
            .collect()
    }

    fn take(
        me: &str,
        counts: &[(&str, u64)],
        all: &[SessionKey],
        takeable: &[SessionKey],
    ) -> Vec<SessionKey> {
        orphans_to_take(me, &live(counts), all, &HashSet::new(), takeable.to_vec())
    }

    #[test]
    fn survivors_of_equal_load_looking_together_take_disjoint_halves() {
        let all = keys(10);
        let counts = [("a", 10), ("c", 10)];
        // Each in its own order, as the scan shuffles them.
        let mut reversed = all.clone();
        reversed.reverse();
        let a = take("a", &counts, &all, &all);
        let c = take("c", &counts, &all, &reversed);
        assert_eq!((a.len(), c.len()), (5, 5), "{a:?} {c:?}");
        assert!(a.iter().all(|k| !c.contains(k)), "{a:?} {c:?}");
    }

    #[test]
    fn the_first_to_look_takes_its_share_however_often_and_the_next_the_rest() {
        let all = keys(10);
        let a = take("a", &[("a", 10), ("c", 10)], &all, &all);
        assert_eq!(a.len(), 5);
        let left: Vec<SessionKey> = all.iter().filter(|k| !a.contains(k)).cloned().collect();
        let again = take("a", &[("a", 15), ("c", 10)], &left, &left);
        assert!(
            again.is_empty(),
            "at the mean, a looks again and takes none: {again:?}"
        );
        let c = take("c", &[("a", 15), ("c", 10)], &left, &left);
        assert_eq!(c.len(), 5, "c takes the rest: {c:?}");
    }

    #[test]
    fn a_less_loaded_survivor_takes_more_and_an_overdue_orphan_is_anyones() {
        let all = keys(10);
        assert_eq!(take("c", &[("a", 20), ("c", 0)], &all, &all).len(), 10);
        assert!(take("a", &[("a", 20), ("c", 0)], &all, &all).is_empty());
        let overdue: HashSet<SessionKey> = all[..2].iter().cloned().collect();
        let late = orphans_to_take(
            "a",
            &live(&[("a", 20), ("c", 0)]),
            &all,
            &overdue,
            all.clone(),
        );
        assert_eq!(late, all[..2].to_vec(), "the two c did not take");
        assert_eq!(
            take("a", &[("a", 0)], &all, &all[..2]).len(),
            2,
            "alone: all"
        );
        assert_eq!(take("a", &[], &all, &all).len(), 10, "no members read: all");
    }
}
