//! A cluster's membership: each node's row in `warden_nodes`, its
//! heartbeat, and the nodes `warden cluster status` lists.

use std::time::Duration;

use warden_core::StoreError;

use crate::{PgStore, backend};

/// How long a node whose lease TTL is unknown (one of an older version,
/// or registered with [`PgStore::register_node`]) may be silent before it
/// is dead: 30 s.
pub const DEAD_AFTER_UNKNOWN_TTL: Duration = Duration::from_secs(30);

/// The SQL condition "node `n` is dead": not left, and its last heartbeat
/// older than `override_secs` (a nullable float8 parameter: an operator's
/// `--dead-after`), else its own lease TTL, else
/// [`DEAD_AFTER_UNKNOWN_TTL`]. By the database's clock.
fn dead_sql(override_secs: &str) -> String {
    format!(
        "(n.left_at IS NULL AND n.heartbeat_at < now() - COALESCE(\
         make_interval(secs => {override_secs}::float8), \
         n.lease_ttl_ms * interval '1 millisecond', \
         make_interval(secs => {})))",
        DEAD_AFTER_UNKNOWN_TTL.as_secs()
    )
}

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
    /// Its lease TTL, as it registered it (`None`: a node of an older
    /// version, which did not say).
    pub ttl: Option<Duration>,
    /// Alive, dead or left, by the database's clock.
    pub state: NodeState,
}

/// What a member is now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum NodeState {
    /// It beat within its lease TTL.
    Alive,
    /// Its last heartbeat is older than its lease TTL (killed, crashed,
    /// cut off): its sessions are, or are about to be, taken over.
    Dead,
    /// It left cleanly (a drain, SIGTERM) and gave its leases back.
    Left,
}

impl NodeState {
    /// `alive`, `dead` or `left`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Alive => "alive",
            Self::Dead => "dead",
            Self::Left => "left",
        }
    }
}

impl std::fmt::Display for NodeState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl PgStore {
    /// Registers `node` (or updates its address) and beats its heart, its
    /// lease TTL unknown: it is dead after [`DEAD_AFTER_UNKNOWN_TTL`].
    /// A joined [`Node`](crate::cluster::Node) registers with its TTL
    /// ([`register_node_with_ttl`](Self::register_node_with_ttl)).
    pub async fn register_node(&self, node: &str, advertise: &str) -> Result<(), StoreError> {
        self.register(node, advertise, None).await
    }

    /// Registers `node` (or updates its address; a node that had left is
    /// a member again) with its lease `ttl`, stored with its heartbeat:
    /// the node is dead once its heartbeat is older than that.
    pub async fn register_node_with_ttl(
        &self,
        node: &str,
        advertise: &str,
        ttl: Duration,
    ) -> Result<(), StoreError> {
        self.register(node, advertise, Some(ttl)).await
    }

    async fn register(
        &self,
        node: &str,
        advertise: &str,
        ttl: Option<Duration>,
    ) -> Result<(), StoreError> {
        let ttl_ms = ttl.map(|t| i64::try_from(t.as_millis()).unwrap_or(i64::MAX));
        let client = self.client().await?;
        client
            .execute(
                "INSERT INTO warden_nodes (node_id, advertise, lease_ttl_ms) VALUES ($1, $2, $3) \
                 ON CONFLICT (node_id) DO UPDATE SET advertise = EXCLUDED.advertise, \
                 lease_ttl_ms = EXCLUDED.lease_ttl_ms, left_at = NULL, \
                 started_at = now(), heartbeat_at = now()",
                &[&node, &advertise, &ttl_ms],
            )
            .await
            .map_err(backend)?;
        Ok(())
    }

    /// Marks `node` as left (a clean stop: its leases given back); it
    /// stays listed, `left`, until forgotten or after
    /// [`DEAD_NODE_RETENTION`](crate::cluster::DEAD_NODE_RETENTION).
    pub async fn mark_node_left(&self, node: &str) -> Result<(), StoreError> {
        let client = self.control_client().await?;
        client
            .execute(
                "UPDATE warden_nodes SET left_at = now() WHERE node_id = $1",
                &[&node],
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

    /// Removes `node` from the membership if it is dead or left (a live
    /// node is never removed: it would register again at once); whether
    /// it was removed. Dead means silent for longer than its own lease TTL,
    /// or than `dead_after` when given. Its sessions' leases are not
    /// touched: they expire, and another node takes the sessions over.
    pub async fn forget_node(
        &self,
        node: &str,
        dead_after: Option<Duration>,
    ) -> Result<bool, StoreError> {
        let client = self.client().await?;
        let n = client
            .execute(
                &format!(
                    "DELETE FROM warden_nodes n WHERE n.node_id = $1 \
                     AND (n.left_at IS NOT NULL OR {})",
                    dead_sql("$2")
                ),
                &[&node, &dead_after.map(crate::secs)],
            )
            .await
            .map_err(backend)?;
        Ok(n == 1)
    }

    /// Removes every dead node (with `dead`: silent for longer than its
    /// own lease TTL) and every left one (with `left`) in one statement;
    /// their ids.
    pub async fn forget_nodes(&self, dead: bool, left: bool) -> Result<Vec<String>, StoreError> {
        let client = self.client().await?;
        let none: Option<f64> = None;
        let rows = client
            .query(
                &format!(
                    "DELETE FROM warden_nodes n WHERE ($1 AND {}) \
                     OR ($2 AND n.left_at IS NOT NULL) RETURNING n.node_id",
                    dead_sql("$3")
                ),
                &[&dead, &left, &none],
            )
            .await
            .map_err(backend)?;
        Ok(rows.into_iter().map(|r| r.get(0)).collect())
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
                &format!(
                    "SELECT n.node_id, n.advertise, \
                     EXTRACT(EPOCH FROM (now() - n.heartbeat_at))::float8, \
                     (SELECT COUNT(*) FROM warden_sessions s \
                       WHERE s.owner = n.node_id AND s.lease_until >= now()), \
                     n.lease_ttl_ms, n.left_at IS NOT NULL, {} \
                     FROM warden_nodes n ORDER BY n.heartbeat_at DESC, n.node_id",
                    dead_sql("$1")
                ),
                &[&None::<f64>],
            )
            .await
            .map_err(backend)?;
        Ok(rows
            .into_iter()
            .map(|r| {
                let ttl_ms: Option<i64> = r.get(4);
                let state = match (r.get::<_, bool>(5), r.get::<_, bool>(6)) {
                    (true, _) => NodeState::Left,
                    (false, true) => NodeState::Dead,
                    (false, false) => NodeState::Alive,
                };
                NodeInfo {
                    node_id: r.get(0),
                    advertise: r.get(1),
                    heartbeat_age_secs: r.get(2),
                    sessions: crate::from_db(r.get(3)),
                    ttl: ttl_ms.map(|ms| Duration::from_millis(crate::from_db(ms))),
                    state,
                }
            })
            .collect())
    }
}
