//! What a node reports: [`NodeEvent`], logged through `tracing` and sent
//! to the node's subscribers ([`Node::events`](super::Node::events)).

use std::time::Duration;

use tokio::sync::broadcast;
use warden_core::SessionKey;

/// What a node did that its operator may want to know. Each is also
/// logged through `tracing` (target `warden_pg::cluster`).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum NodeEvent {
    /// The node registered itself and started its background work.
    Joined {
        /// The node's id.
        node: String,
        /// Its lease TTL.
        ttl: Duration,
    },
    /// Another node took a session over (this node's lease of it was lost:
    /// a renewal or a fenced write refused); its copy here was stopped.
    SessionMoved {
        /// The session.
        key: SessionKey,
        /// The epoch this node had.
        epoch: u64,
    },
    /// This node gave a session's lease up because it could not renew it
    /// in time (the database cannot be reached: an outage, or this node cut
    /// off or paused); its copy here was stopped, its messages left pending for
    /// whichever node reaches the database first. Nothing moved yet.
    SessionFenced {
        /// The session.
        key: SessionKey,
        /// The epoch given up.
        epoch: u64,
    },
    /// This node took over a session whose node died, and re-sends its
    /// pending messages.
    TookOver {
        /// The session.
        key: SessionKey,
        /// The new epoch.
        epoch: u64,
    },
    /// This node took back a session it gave up itself (a database
    /// outage) or held last before it restarted under its id, and re-sends
    /// its pending messages. Nothing moved: not a takeover.
    CameHome {
        /// The session.
        key: SessionKey,
        /// The new epoch.
        epoch: u64,
    },
    /// A session with waiting messages whose lease this node held while
    /// nothing ran it here was started (its messages are sent again); see
    /// [`TakeOver::resumed`](crate::cluster::TakeOver::resumed).
    Resumed {
        /// The session.
        key: SessionKey,
        /// The epoch held.
        epoch: u64,
    },
    /// A session taken over could not start here; its lease was given
    /// back at once for another node.
    Released {
        /// The session.
        key: SessionKey,
        /// Why it cannot start here.
        reason: String,
    },
    /// A membership heartbeat could not be written (the database is
    /// unreachable); tried again every third of the TTL, and reported once
    /// per outage.
    HeartbeatFailed {
        /// The database's answer, as the driver words it.
        error: String,
    },
    /// Heartbeats work again after an outage.
    DatabaseBack {
        /// How long they failed.
        down_for: Duration,
    },
    /// Old turn event logs (or long-dead nodes) could not be expired;
    /// tried again later.
    ExpireFailed {
        /// The database's answer, as the driver words it.
        error: String,
    },
}

impl std::fmt::Display for NodeEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Joined { node, ttl } => write!(
                f,
                "node {node} joined the cluster (lease TTL {:.1}s)",
                ttl.as_secs_f64()
            ),
            Self::SessionMoved { key, epoch } => write!(
                f,
                "session {key} moved to another node (lease epoch {epoch} lost); stopped here"
            ),
            Self::SessionFenced { key, epoch } => write!(
                f,
                "session {key} stopped here: its lease (epoch {epoch}) could not be renewed in time (the database unreachable, or this node paused); the node that takes it next re-delivers its turns"
            ),
            Self::TookOver { key, epoch } => write!(
                f,
                "took over session {key} (epoch {epoch}); re-sending its pending messages"
            ),
            Self::CameHome { key, epoch } => write!(
                f,
                "took back session {key} (epoch {epoch}) after giving it up; re-sending its pending messages"
            ),
            Self::Resumed { key, epoch } => write!(
                f,
                "session {key} waited with nothing running it under this node's lease (epoch {epoch}); started it here"
            ),
            Self::Released { key, reason } => write!(
                f,
                "session {key} cannot start here ({reason}); its lease is released"
            ),
            Self::HeartbeatFailed { error } => write!(
                f,
                "cannot reach the cluster's database to beat the heartbeat: {error}"
            ),
            Self::DatabaseBack { down_for } => write!(
                f,
                "the cluster's database answers again (after {:.1}s)",
                down_for.as_secs_f64()
            ),
            Self::ExpireFailed { error } => write!(f, "cannot expire old turn logs: {error}"),
        }
    }
}

/// Logs `event` and sends it to the node's subscribers.
pub(super) fn report(events: &broadcast::Sender<NodeEvent>, event: NodeEvent) {
    match &event {
        NodeEvent::Joined { node, ttl } => {
            tracing::info!(target: "warden_pg::cluster", event = "cluster.joined", node = %node, ttl_ms = ttl.as_millis() as u64, "{event}");
        }
        NodeEvent::SessionMoved { key, epoch } => {
            tracing::warn!(target: "warden_pg::cluster", event = "cluster.session_moved", session.key = %key, epoch, "{event}");
        }
        // Expected in an outage: `pg.leases_fenced` says it once per pass.
        NodeEvent::SessionFenced { key, epoch } => {
            tracing::debug!(target: "warden_pg::cluster", event = "cluster.session_fenced", session.key = %key, epoch, "{event}");
        }
        NodeEvent::TookOver { key, epoch } => {
            tracing::info!(target: "warden_pg::cluster", event = "cluster.took_over", session.key = %key, epoch, "{event}");
        }
        // Part of an outage's end, which `cluster.database_back` says once.
        NodeEvent::CameHome { key, epoch } => {
            tracing::debug!(target: "warden_pg::cluster", event = "cluster.came_home", session.key = %key, epoch, "{event}");
        }
        NodeEvent::Resumed { key, epoch } => {
            tracing::warn!(target: "warden_pg::cluster", event = "cluster.resumed", session.key = %key, epoch, "{event}");
        }
        NodeEvent::Released { key, .. } => {
            tracing::warn!(target: "warden_pg::cluster", event = "cluster.released", session.key = %key, "{event}");
        }
        // The one warning of an outage (its end is the one `info`).
        NodeEvent::HeartbeatFailed { .. } => {
            tracing::warn!(target: "warden_pg::cluster", event = "cluster.database_unreachable", "{event}");
        }
        NodeEvent::ExpireFailed { .. } => {
            tracing::warn!(target: "warden_pg::cluster", event = "cluster.background_failed", "{event}");
        }
        NodeEvent::DatabaseBack { down_for } => {
            tracing::info!(
                target: "warden_pg::cluster",
                event = "cluster.database_back",
                down_ms = down_for.as_millis() as u64,
                "{event}"
            );
        }
    }
    let _ = events.send(event);
}
