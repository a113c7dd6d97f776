//! `GET /v1/cluster`: the members, the answering node's figures, the
//! cluster-wide moves.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A member of the cluster, as `GET /v1/cluster` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
pub struct ClusterNode {
    /// Its id.
    pub node: String,
    /// Where it is reached.
    pub advertise: Option<String>,
    /// Seconds since its last heartbeat.
    pub heartbeat_age_secs: f64,
    /// Sessions whose lease it holds.
    pub sessions: u64,
    /// Whether it is the node answering.
    pub here: bool,
    /// What it is now (`null` from a placement that does not say).
    pub state: Option<MemberState>,
}

/// What a cluster member is now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum MemberState {
    /// It beat within its lease TTL.
    Alive,
    /// Its last heartbeat is older than its lease TTL (killed, crashed, cut
    /// off): its sessions are, or are about to be, taken over.
    Dead,
    /// It left cleanly (a drain, SIGTERM) and gave its leases back.
    Left,
}

impl MemberState {
    /// The state a placement names (`alive`, `dead`, `left`).
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "alive" => Some(Self::Alive),
            "dead" => Some(Self::Dead),
            "left" => Some(Self::Left),
            _ => None,
        }
    }
}

/// Whether a session changed nodes because its owner's lease expired or
/// was given back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum MoveKind {
    /// The old lease had expired.
    Failover,
    /// It was given back (a graceful stop, an idle release).
    Handover,
}

/// A session that changed nodes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
pub struct SessionMove {
    /// The session.
    pub key: String,
    /// The node that had it.
    pub from: String,
    /// The node that took it.
    pub to: String,
    /// The epoch the new node holds it under.
    pub epoch: u64,
    /// Why it moved.
    pub kind: MoveKind,
    /// When, Unix milliseconds.
    pub at_ms: u64,
}

/// `GET /v1/cluster`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
pub struct ClusterView {
    /// The node answering.
    pub node: Option<String>,
    /// The members, freshest heartbeat first.
    pub nodes: Vec<ClusterNode>,
    /// Leases this node holds.
    pub leases_held: u64,
    /// Leases this node lost since it started.
    pub leases_lost: u64,
    /// Sessions of other nodes this node took over since it started
    /// (their leases expired: a node died or was cut off).
    pub takeovers: u64,
    /// Sessions this node took back since it started after giving them up
    /// itself (a database outage) or holding them last (a restart under
    /// its id): nothing moved, so they are not takeovers.
    pub returns: u64,
    /// This node's lease TTL, seconds (`null` from a placement that does
    /// not say): a failover takes about this plus a scan by design.
    pub lease_ttl_secs: Option<f64>,
    /// Database outages this node lived through since it started (its
    /// heartbeats failing), the one now included.
    pub database_outages: u64,
    /// Seconds this node could not reach the database in all: each outage
    /// from its first failed heartbeat to the next that worked (or now).
    pub database_outage_secs: f64,
    /// How long the failovers to this node took since it started.
    pub failover_seconds: FailoverTimings,
    /// Cluster wide, read from the database: failovers (sessions taken
    /// after their node's lease ran out) in the last hour, every one (a
    /// session that failed over twice counts twice).
    pub failovers_last_hour: u64,
    /// Cluster wide: handovers (sessions given back, then taken) in the
    /// last hour, every one.
    pub handovers_last_hour: u64,
    /// Cluster wide: the last hour's moves by the nodes they went between
    /// and why, most first (every move counted).
    pub moved_last_hour: Vec<MoveCount>,
    /// The database's round trip now, in milliseconds (`null`: no answer).
    pub database_round_trip_ms: Option<f64>,
    /// `true` while this node cannot reach the database: `nodes` (each
    /// heartbeat age grown since), the moves and the last hour's counts
    /// are what it last read, not the database's now; its own figures
    /// (leases, takeovers, returns, the outage counters, the failover
    /// timings) are current either way.
    pub stale: bool,
    /// The latest move of each session that changed nodes, newest first
    /// (at most 50).
    pub moves: Vec<SessionMove>,
}

/// Sessions that moved between two nodes for one reason (`GET
/// /v1/cluster`'s `moved_last_hour`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
pub struct MoveCount {
    /// The node that had them.
    pub from: String,
    /// The node that holds them now.
    pub to: String,
    /// Why they moved.
    pub kind: MoveKind,
    /// How many.
    pub sessions: u64,
}

/// The failovers to a node, each from its dead owner's last heartbeat to
/// the session's first lifecycle event on the node that took it (as
/// `warden_cluster_failover_seconds`); the quantiles are estimated from
/// that histogram's buckets as Prometheus's `histogram_quantile` does.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
pub struct FailoverTimings {
    /// How many were timed.
    pub count: u64,
    /// Their sum, seconds.
    pub sum_secs: f64,
    /// The median, seconds (`null`: none timed).
    pub p50_secs: Option<f64>,
    /// The 0.9 quantile, seconds (`null`: none timed).
    pub p90_secs: Option<f64>,
    /// The 0.99 quantile, seconds (`null`: none timed).
    pub p99_secs: Option<f64>,
}

impl FailoverTimings {
    /// Timings of `count` failovers summing `sum_secs`, with these
    /// quantiles.
    pub fn new(
        count: u64,
        sum_secs: f64,
        p50: Option<f64>,
        p90: Option<f64>,
        p99: Option<f64>,
    ) -> Self {
        Self {
            count,
            sum_secs,
            p50_secs: p50,
            p90_secs: p90,
            p99_secs: p99,
        }
    }
}
