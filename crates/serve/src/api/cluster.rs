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
    /// Sessions this node took over.
    pub takeovers: u64,
    /// Cluster wide, read from the database: sessions that failed over
    /// (taken after their node's lease ran out) in the last hour.
    pub failovers_last_hour: u64,
    /// Cluster wide: sessions handed over (given back, then taken) in the
    /// last hour.
    pub handovers_last_hour: u64,
    /// Cluster wide: the last hour's moves by the nodes they went between
    /// and why, most first (each session counted for its latest move).
    pub moved_last_hour: Vec<MoveCount>,
    /// The database's round trip now, in milliseconds (`null`: no answer).
    pub database_round_trip_ms: Option<f64>,
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
