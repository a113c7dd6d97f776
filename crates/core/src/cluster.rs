//! Where a session runs, for nodes that share their sessions (a cluster on
//! one database): the [`Placement`] port a node asks before each new turn,
//! and what it answers.
//!
//! `warden-serve` asks it and forwards requests for sessions that run
//! elsewhere; `warden-pg`'s lease placement implements it (see
//! `docs/cluster.md`).

use std::time::Duration;

use derive_setters::Setters;
use futures_util::future::BoxFuture;
use serde::Serialize;

use crate::source::SessionKey;

/// Where a session runs, for a node that shares its sessions with other
/// nodes (a cluster on one database): asked before each new turn.
///
/// A placement that names its node ([`node`](Self::node)) and its peers'
/// addresses ([`advertise_of`](Self::advertise_of)) makes the node forward
/// requests for sessions and turns that run elsewhere (see `docs/cluster.md`).
pub trait Placement: Send + Sync + 'static {
    /// `Ok` when this node may run `key` now (it holds the session's lease,
    /// or just took it); `Err` says where the session runs instead.
    fn place<'a>(&'a self, key: &'a SessionKey) -> BoxFuture<'a, Result<(), Elsewhere>>;

    /// This node's id among its peers. Turn ids then name it, so any node
    /// can find a turn's node. Default `None`: nothing is forwarded.
    fn node(&self) -> Option<&str> {
        None
    }

    /// Where the node `node` is reached, if it is a member. Default `None`.
    fn advertise_of<'a>(&'a self, node: &'a str) -> BoxFuture<'a, Option<String>> {
        let _ = node;
        Box::pin(async { None })
    }

    /// Every session of the cluster and where it runs, for
    /// `GET /v1/sessions`. Default `None`: the node lists its own.
    fn sessions(&self) -> BoxFuture<'_, Option<Result<Vec<SessionPlace>, String>>> {
        Box::pin(async { None })
    }

    /// Whether this node can place sessions now: `Err` (why) when what the
    /// placement needs — the cluster's database — cannot be reached, so a
    /// load balancer stops sending it turns (`GET /readyz`). Default `Ok`.
    fn ready(&self) -> BoxFuture<'_, Result<(), String>> {
        Box::pin(async { Ok(()) })
    }

    /// Whether this node cannot reach what placement needs (the cluster's
    /// database) now, or could not a moment ago (its sessions are not all
    /// home yet: `warden-pg` counts the return grace and a lease TTL):
    /// every request refused meanwhile is refused for the outage,
    /// whichever step failed first (`503 database_unreachable`). Default
    /// `false`.
    fn in_outage(&self) -> BoxFuture<'_, bool> {
        Box::pin(async { false })
    }

    /// This node's cluster figures for `GET /metrics`, read at scrape
    /// time. Default `None`: no cluster metrics.
    fn stats(&self) -> BoxFuture<'_, Option<ClusterStats>> {
        Box::pin(async { None })
    }

    /// The latest `limit` times a session changed nodes (each session's
    /// latest move), newest first, for the console's cluster view. Default
    /// `None`: not known.
    fn moves(&self, limit: usize) -> BoxFuture<'_, Option<Result<Vec<SessionMove>, String>>> {
        let _ = limit;
        Box::pin(async { None })
    }

    /// How many sessions changed nodes within the last `within`, cluster
    /// wide, by kind and by the nodes they moved between (each session's
    /// latest move), for `GET /v1/cluster`. Default `None`: not known.
    fn move_counts(
        &self,
        within: Duration,
    ) -> BoxFuture<'_, Option<Result<Vec<MoveCount>, String>>> {
        let _ = within;
        Box::pin(async { None })
    }

    /// Why session `key` came to this node, asked when the node
    /// re-delivers one of its turns: the code the turn's `continuing` or
    /// `retrying` marker carries ([`Arrival::code`]). Default `None`: not
    /// known (the marker says [`Arrival::NodeLost`]'s code).
    fn arrival<'a>(&'a self, key: &'a SessionKey) -> BoxFuture<'a, Option<Arrival>> {
        let _ = key;
        Box::pin(async { None })
    }
}

/// Why a session came to the node that re-delivers its turn: one cause,
/// one code, so a client (and an operator reading its events) knows what
/// interrupted the reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Arrival {
    /// Its node died, or was cut off alone: its lease ran out while the
    /// others could reach the database. `ENODE_LOST`.
    NodeLost,
    /// Its node stopped cleanly (SIGTERM, a drain) and gave the lease
    /// back. `ENODE_DRAINED`.
    Handover,
    /// The cluster's database could not be reached: its node gave the
    /// lease up rather than risk two owners, and the session was taken
    /// when the database answered again. `ESTORE_UNREACHABLE`.
    StoreUnreachable,
}

impl Arrival {
    /// The error code of a re-delivered turn's marker: `ENODE_LOST`,
    /// `ENODE_DRAINED` or `ESTORE_UNREACHABLE`.
    pub fn code(self) -> &'static str {
        match self {
            Self::NodeLost => "ENODE_LOST",
            Self::Handover => "ENODE_DRAINED",
            Self::StoreUnreachable => "ESTORE_UNREACHABLE",
        }
    }
}

/// A session that changed nodes: taken over after its node's lease ran
/// out (`failover`), or taken after its node gave it back (`handover`).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct SessionMove {
    /// The session's key.
    pub key: String,
    /// The node that had it.
    pub from: String,
    /// The node that took it.
    pub to: String,
    /// The epoch the new node holds it under.
    pub epoch: u64,
    /// `failover` (the old lease had expired) or `handover` (it was given
    /// back: a graceful stop, an idle release).
    pub kind: &'static str,
    /// When, Unix milliseconds.
    pub at_ms: u64,
}

impl SessionMove {
    /// Session `key` moved `from` → `to` under `epoch` at `at_ms`; a
    /// `failover` when `expired`, else a `handover`.
    pub fn new(
        key: impl Into<String>,
        from: impl Into<String>,
        to: impl Into<String>,
        epoch: u64,
        expired: bool,
        at_ms: u64,
    ) -> Self {
        Self {
            key: key.into(),
            from: from.into(),
            to: to.into(),
            epoch,
            kind: if expired { "failover" } else { "handover" },
            at_ms,
        }
    }
}

/// How many sessions moved from one node to another in a while, and why
/// (an entry of [`Placement::move_counts`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct MoveCount {
    /// The node that had them.
    pub from: String,
    /// The node that took them.
    pub to: String,
    /// `failover` or `handover` (as [`SessionMove::kind`]).
    pub kind: &'static str,
    /// How many.
    pub sessions: u64,
}

impl MoveCount {
    /// `sessions` moved `from` → `to`; failovers when `expired`, else
    /// handovers.
    pub fn new(
        from: impl Into<String>,
        to: impl Into<String>,
        expired: bool,
        sessions: u64,
    ) -> Self {
        Self {
            from: from.into(),
            to: to.into(),
            kind: if expired { "failover" } else { "handover" },
            sessions,
        }
    }
}

/// Durations counted into buckets, as a Prometheus histogram exposes them.
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct Timings {
    /// Each bucket's upper bound in seconds with how many durations fell
    /// in it (above the bound before it; not cumulative); the last bound is
    /// `f64::MAX` (`+Inf`).
    pub buckets: Vec<(f64, u64)>,
    /// The sum of every duration, in seconds.
    pub sum_secs: f64,
    /// How many durations.
    pub count: u64,
}

impl Timings {
    /// Empty buckets with these upper bounds (seconds, ascending), and
    /// one for the rest.
    pub fn new(bounds: &[f64]) -> Self {
        let mut buckets: Vec<(f64, u64)> = bounds.iter().map(|b| (*b, 0)).collect();
        buckets.push((f64::MAX, 0));
        Self {
            buckets,
            sum_secs: 0.0,
            count: 0,
        }
    }

    /// The `q` quantile (0..=1) of the durations counted, in seconds, as
    /// Prometheus's `histogram_quantile` estimates it from the buckets: the
    /// bucket that holds it, interpolated linearly within (from 0 for the
    /// first); in the last (`+Inf`) bucket, the highest finite bound.
    /// `None` when nothing was counted.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        let total: u64 = self.buckets.iter().map(|(_, n)| n).sum();
        if total == 0 {
            return None;
        }
        let rank = q.clamp(0.0, 1.0) * total as f64;
        let (mut below, mut lower) = (0u64, 0.0);
        for (bound, n) in &self.buckets {
            if *bound == f64::MAX {
                return Some(lower);
            }
            if (below + n) as f64 >= rank && *n > 0 {
                let within = (rank - below as f64) / *n as f64;
                return Some(lower + (bound - lower) * within);
            }
            below += n;
            lower = *bound;
        }
        Some(lower)
    }

    /// Counts `d`.
    pub fn observe(&mut self, d: Duration) {
        let secs = d.as_secs_f64();
        if let Some(b) = self.buckets.iter_mut().find(|(bound, _)| secs <= *bound) {
            b.1 += 1;
        }
        self.sum_secs += secs;
        self.count += 1;
    }
}

/// A cluster node's figures, as `GET /metrics` exposes them
/// (`warden_cluster_*`; see `docs/cluster.md`).
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct ClusterStats {
    /// Leases this node holds now.
    pub leases_held: u64,
    /// Leases it lost since it started (another node took the session).
    pub leases_lost: u64,
    /// Sessions of other nodes it took over since it started (their
    /// leases expired: a node died or was cut off).
    pub takeovers: u64,
    /// Failed database round trips of its background work (heartbeats,
    /// expiry, placement) since it started.
    pub database_errors: u64,
    /// One database round trip measured now (`SELECT 1`); `None` when it
    /// failed.
    pub database_round_trip: Option<Duration>,
    /// Every member the database lists.
    pub nodes: Vec<NodeStats>,
    /// The sessions it took over from a dead node since it started, each
    /// timed from that node's last heartbeat to the session's first
    /// lifecycle event here (see `docs/cluster.md`).
    pub failovers: Timings,
    /// The database outages it lived through since it started (its
    /// heartbeats failing; the one in progress included).
    pub database_outages: u64,
    /// How long it could not reach the database in all, from each
    /// outage's first failed heartbeat to the next that worked (or now).
    pub database_outage: Duration,
    /// Sessions it took back after giving them up itself (a database
    /// outage) or holding them last (a restart under its id): they moved
    /// nowhere, so they are not [`takeovers`](Self::takeovers).
    pub returns: u64,
    /// Its lease TTL, if it has one: a failover takes about this plus a
    /// scan by design.
    pub lease_ttl: Option<Duration>,
}

/// One member of a cluster, as the database sees it.
#[derive(Debug, Clone, PartialEq, Setters)]
#[setters(prefix = "with_", strip_option)]
#[non_exhaustive]
pub struct NodeStats {
    /// Its id.
    #[setters(skip)]
    pub node: String,
    /// Seconds since its last heartbeat.
    #[setters(skip)]
    pub heartbeat_age_secs: f64,
    /// Sessions whose lease it holds now.
    #[setters(skip)]
    pub sessions: u64,
    /// What it is now, as the placement sees it (`alive`, `dead`, `left`);
    /// `None` when the placement does not say.
    pub state: Option<&'static str>,
}

impl NodeStats {
    /// Node `node`, last heard `heartbeat_age_secs` ago, holding `sessions`.
    pub fn new(node: impl Into<String>, heartbeat_age_secs: f64, sessions: u64) -> Self {
        Self {
            node: node.into(),
            heartbeat_age_secs,
            sessions,
            state: None,
        }
    }
}

/// Where one session of a cluster runs (an entry of `GET /v1/sessions` on
/// a cluster node).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct SessionPlace {
    /// The session's key.
    pub key: String,
    /// The node holding its lease, if any.
    pub owner: Option<String>,
    /// Where that node is reached, when known.
    pub advertise: Option<String>,
    /// The lease's epoch (how many times the session changed hands, plus one).
    pub epoch: u64,
    /// Seconds left on the lease (negative: it expired that long ago);
    /// `None` when none is held.
    pub lease_remaining_secs: Option<f64>,
}

impl SessionPlace {
    /// Session `key`, run by `owner` (reached at `advertise`) under lease
    /// `epoch` for `lease_remaining_secs` more.
    pub fn new(
        key: impl Into<String>,
        owner: Option<String>,
        advertise: Option<String>,
        epoch: u64,
        lease_remaining_secs: Option<f64>,
    ) -> Self {
        Self {
            key: key.into(),
            owner,
            advertise,
            epoch,
            lease_remaining_secs,
        }
    }
}

/// A session another node runs now.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Elsewhere {
    /// The owner node's id, when known.
    pub owner: Option<String>,
    /// Where that node is reached, when known.
    pub advertise: Option<String>,
    /// When to ask again: the time left on the owner's lease (if the owner
    /// died, the session can be taken over then).
    pub retry_after: Duration,
    /// The session's workspace directory, when it cannot run here because
    /// this node does not have that directory (and its owner is gone).
    pub missing_workspace: Option<std::path::PathBuf>,
    /// Why nobody knows where the session runs: the cluster's database
    /// cannot be reached from this node. `None` otherwise.
    pub store_unreachable: Option<String>,
}

impl Elsewhere {
    /// A session `owner` (reached at `advertise`) runs for `retry_after`
    /// more at least.
    pub fn new(owner: Option<String>, advertise: Option<String>, retry_after: Duration) -> Self {
        Self {
            owner,
            advertise,
            retry_after,
            missing_workspace: None,
            store_unreachable: None,
        }
    }

    /// Nobody can tell where the session runs: the cluster's database
    /// cannot be reached from this node (`why`); ask again after
    /// `retry_after`, or another node.
    pub fn store_unreachable(why: impl Into<String>, retry_after: Duration) -> Self {
        Self {
            store_unreachable: Some(why.into()),
            ..Self::new(None, None, retry_after)
        }
    }

    /// A session whose owner `owner` is gone but that is bound to
    /// `workspace`, a directory this node does not have: it runs again when
    /// a node that has it takes it over.
    pub fn workspace_missing(
        owner: Option<String>,
        workspace: std::path::PathBuf,
        retry_after: Duration,
    ) -> Self {
        Self {
            missing_workspace: Some(workspace),
            ..Self::new(owner, None, retry_after)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quantile_is_interpolated_within_its_bucket_as_prometheus_does() {
        let mut t = Timings::new(&[1.0, 2.0, 4.0]);
        assert_eq!(t.quantile(0.5), None, "nothing counted");
        for _ in 0..10 {
            t.observe(Duration::from_millis(1500));
        }
        // All ten in (1, 2]: the median halfway, the 0.9 quantile at 1.9.
        assert_eq!(t.quantile(0.5), Some(1.5));
        assert!((t.quantile(0.9).expect("a value") - 1.9).abs() < 1e-9);
        for _ in 0..10 {
            t.observe(Duration::from_secs(60));
        }
        // Half of them past the last bound: the highest finite bound.
        assert_eq!(t.quantile(0.99), Some(4.0));
        assert_eq!(t.quantile(0.25), Some(1.5));
    }
}
