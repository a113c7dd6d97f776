//! A cluster's membership: each node's row in `warden_nodes`, its
//! heartbeat, and the nodes `warden cluster status` lists.

use std::time::Duration;

use warden_core::StoreError;

use crate::{PgStore, backend};

/// A node as the database sees it.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct NodeInfo {
    /// The node's id (`--node-id`).
    pub node_id: String,
    /// Where other nodes reach it (`--advertise`).
    pub advertise: String,
    /// Seconds since its last heartbeat, by the database's clock.
    pub heartbeat_age_secs: f64,
    /// Sessions whose lease it holds now (unexpired).
    pub sessions: u64,
}

impl PgStore {
    /// Registers `node` (or updates its address) and beats its heart.
    pub async fn register_node(&self, node: &str, advertise: &str) -> Result<(), StoreError> {
        let client = self.client().await?;
        client
            .execute(
                "INSERT INTO warden_nodes (node_id, advertise) VALUES ($1, $2) \
                 ON CONFLICT (node_id) DO UPDATE SET advertise = EXCLUDED.advertise, \
                 started_at = now(), heartbeat_at = now()",
                &[&node, &advertise],
            )
            .await
            .map_err(backend)?;
        Ok(())
    }

    /// Beats `node`'s heart; `false` if it is not registered.
    pub async fn heartbeat(&self, node: &str) -> Result<bool, StoreError> {
        let client = self.control_client().await?;
        let n = client
            .execute(
                "UPDATE warden_nodes SET heartbeat_at = now() WHERE node_id = $1",
                &[&node],
            )
            .await
            .map_err(backend)?;
        Ok(n == 1)
    }

    /// Removes `node` from the membership if its last heartbeat is older
    /// than `silent_for` (a live node is never removed: it would register
    /// again at once); whether it was removed. Its sessions' leases are not
    /// touched: they expire, and another node takes the sessions over.
    pub async fn forget_node(&self, node: &str, silent_for: Duration) -> Result<bool, StoreError> {
        let client = self.client().await?;
        let n = client
            .execute(
                "DELETE FROM warden_nodes WHERE node_id = $1 \
                 AND heartbeat_at < now() - make_interval(secs => $2)",
                &[&node, &crate::secs(silent_for)],
            )
            .await
            .map_err(backend)?;
        Ok(n == 1)
    }

    /// Removes every node whose last heartbeat is older than `silent_for`;
    /// how many. A joined [`Node`](crate::cluster::Node) runs it with
    /// [`DEAD_NODE_RETENTION`](crate::cluster::DEAD_NODE_RETENTION).
    pub async fn forget_dead_nodes(&self, silent_for: Duration) -> Result<u64, StoreError> {
        let client = self.client().await?;
        client
            .execute(
                "DELETE FROM warden_nodes WHERE heartbeat_at < now() - make_interval(secs => $1)",
                &[&crate::secs(silent_for)],
            )
            .await
            .map_err(backend)
    }

    /// Every registered node with its heartbeat age and live sessions,
    /// freshest first.
    pub async fn nodes(&self) -> Result<Vec<NodeInfo>, StoreError> {
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT n.node_id, n.advertise, \
                 EXTRACT(EPOCH FROM (now() - n.heartbeat_at))::float8, \
                 (SELECT COUNT(*) FROM warden_sessions s \
                   WHERE s.owner = n.node_id AND s.lease_until >= now()) \
                 FROM warden_nodes n ORDER BY n.heartbeat_at DESC, n.node_id",
                &[],
            )
            .await
            .map_err(backend)?;
        Ok(rows
            .into_iter()
            .map(|r| NodeInfo {
                node_id: r.get(0),
                advertise: r.get(1),
                heartbeat_age_secs: r.get(2),
                sessions: crate::from_db(r.get(3)),
            })
            .collect())
    }
}
