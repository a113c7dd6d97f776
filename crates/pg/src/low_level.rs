//! The parts a [`cluster::Node`](crate::cluster::Node) is made of, for
//! tests, tools and a node assembled differently.
//!
//! A cluster user does not need this module: [`Node::connect`] builds the
//! node's [`NodeStore`] over a [`PgStore`], and the node does the work these
//! parts leave to their caller — renewing leases at a third of their TTL,
//! membership heartbeats, stopping a session the moment its lease is lost,
//! taking over a dead node's sessions (one way:
//! [`Node::take_over`](crate::cluster::Node::take_over)), expiring old turn
//! logs. Code that holds a [`NodeStore`] without a joined node must do all
//! of that itself, or its sessions are fenced out once their leases lapse
//! and nobody takes over its orphans.
//!
//! - [`PgStore`]: the session records, the schema and its [`MIGRATIONS`],
//!   leases with fencing epochs ([`PgStore::acquire`], [`PgStore::renew`],
//!   [`PgStore::save_fenced`], [`PgStore::release`]), node membership
//!   ([`PgStore::nodes`], [`PgStore::forget_nodes`]: what `warden cluster`
//!   reads and changes), turn event logs and the orphans of dead nodes. On
//!   its own it is a [`SessionStore`](warden_core::SessionStore) for one
//!   process, without leases.
//! - [`NodeStore`]: one node's fenced store over a [`PgStore`] (a lease
//!   taken at a session's first write; every write through the fence; the
//!   leases it loses reported on [`NodeStore::lost`]).
//! - [`NodeTurns`]: the node's turn logs as core's
//!   [`TurnStore`](warden_core::store::TurnStore) (what
//!   [`Node::turns`](crate::cluster::Node::turns) hands out).
//!
//! [`Node::connect`]: crate::cluster::Node::connect

pub use crate::group::{GroupStats, TurnBatch};
pub use crate::lease::{Lease, LeaseInfo, Patience, TAKEOVER_GRACE};
pub use crate::migrate::MIGRATIONS;
pub use crate::node::{
    DEAD_AFTER_UNKNOWN_TTL, DEFAULT_RETURN_GRACE, NodeStore, RETAKE_COOLDOWN, TURN_BOUNDARY_WAIT,
};
pub use crate::node_turns::NodeTurns;
pub use crate::orphans::Orphans;
pub use crate::store::PgStore;
pub use crate::stranded::TURN_END_LOST;
