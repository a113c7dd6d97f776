//! Where a node's sessions run: here only while it holds their leases.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures_util::future::BoxFuture;
use warden_core::cluster::{
    Arrival, ClusterStats, Elsewhere, MoveCount, NodeStats, Placement, SessionMove, SessionPlace,
};
use warden_core::{SessionKey, StoreError};

use super::Counters;
use crate::{LeaseInfo, NodeStore};

/// Runs a session here only while this node holds its lease.
pub(super) struct LeasePlacement {
    pub(super) node: NodeStore,
    pub(super) counters: Arc<Counters>,
}

impl LeasePlacement {
    /// A session held under `info` by another node: that node, where it is
    /// reached, and the time left on its lease.
    async fn held_by(&self, info: LeaseInfo) -> Elsewhere {
        let advertise = match &info.owner {
            Some(owner) => self.advertise_of(owner).await,
            None => None,
        };
        let left = info.remaining_secs.unwrap_or(1.0).max(0.0);
        Elsewhere::new(info.owner, advertise, Duration::from_secs_f64(left))
    }
}

impl Placement for LeasePlacement {
    fn place<'a>(&'a self, key: &'a SessionKey) -> BoxFuture<'a, Result<(), Elsewhere>> {
        Box::pin(async move {
            // A busy session moving at its next turn boundary: its new
            // turn waits for the move, then goes to the new owner.
            self.node.wait_while_moving(key).await;
            if self.node.lease_of(key).is_some() {
                return Ok(()); // ours (the fence still guards every write)
            }
            // The driver's text is for the node's log, not the client.
            let unknown = |e: StoreError| {
                Counters::add(&self.counters.database_errors, 1);
                tracing::debug!(session = %key, error = %e, "cannot place the session: the cluster's database cannot be reached");
                Elsewhere::store_unreachable(
                    "the cluster's database cannot be reached",
                    Duration::from_secs(1),
                )
            };
            // A session bound to a directory this node lacks is not taken
            // here: asked while its owner lives, the request is forwarded;
            // once the owner is gone, the client is told why it waits.
            if let Some(ws) = self.node.missing_workspace(key).await {
                let info = self.node.pg().lease_info(key).await.map_err(unknown)?;
                if info.remaining_secs.unwrap_or(0.0) <= 0.0 {
                    return Err(Elsewhere::workspace_missing(
                        info.owner,
                        ws,
                        self.node.scan_interval().max(Duration::from_secs(1)),
                    ));
                }
                return Err(self.held_by(info).await);
            }
            match self.node.claim(key).await {
                Ok(Some(_)) => {
                    // Taken from another node whose lease had run out (a
                    // dead node's idle session, taken by its next turn
                    // rather than by the scan): a takeover too.
                    let moved = self.node.pg().arrival_of(key, self.node.node()).await;
                    if matches!(moved, Ok(Some((kind, _))) if kind == "failover") {
                        Counters::add(&self.counters.takeovers, 1);
                    }
                    Ok(())
                }
                Ok(None) => {
                    let info = self.node.pg().lease_info(key).await.map_err(unknown)?;
                    // Given up here a moment ago (its copy and its turn
                    // relays stopping) and held by no one else: ask again
                    // once this node may take it, or another node has.
                    // (It could not renew the lease in time: the
                    // database out of reach, not another owner.)
                    if let Some(left) = self.node.cooling_down(key)
                        && info.owner.as_deref().is_none_or(|o| o == self.node.node())
                    {
                        return Err(Elsewhere::store_unreachable(
                            "this node gave the session up a moment ago, its lease not renewed in time; it takes it back shortly",
                            left,
                        ));
                    }
                    Err(self.held_by(info).await)
                }
                Err(e) => Err(unknown(e)),
            }
        })
    }

    fn node(&self) -> Option<&str> {
        Some(self.node.node())
    }

    fn advertise_of<'a>(&'a self, node: &'a str) -> BoxFuture<'a, Option<String>> {
        Box::pin(async move {
            let nodes = self.node.pg().nodes().await.ok()?;
            nodes
                .into_iter()
                .find(|n| n.node_id == node)
                .map(|n| n.advertise)
                // A headless node (no HTTP front end) is reached by no one.
                .filter(|a| !a.is_empty())
        })
    }

    fn ready(&self) -> BoxFuture<'_, Result<(), String>> {
        Box::pin(async move {
            let ping = self.node.pg().ping();
            match tokio::time::timeout(Duration::from_secs(2), ping).await {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(format!("the cluster's database cannot be reached: {e}")),
                Err(_) => Err("the cluster's database did not answer within 2 s".to_owned()),
            }
        })
    }

    fn in_outage(&self) -> BoxFuture<'_, bool> {
        Box::pin(async move {
            // An outage's aftermath lasts until its sessions are home:
            // the return grace, and a TTL for the leases it expired.
            let after = self.node.return_grace() + self.node.ttl();
            self.counters.outage_within(after)
                || self.node.unreachable_within(after)
                || self.ready().await.is_err()
        })
    }

    fn stats(&self) -> BoxFuture<'_, Option<ClusterStats>> {
        Box::pin(async move {
            let counters = &self.counters;
            let mut stats = ClusterStats::default();
            stats.leases_held = self.node.held().len() as u64;
            stats.leases_lost = counters.leases_lost.load(Ordering::Relaxed);
            stats.takeovers = counters.takeovers.load(Ordering::Relaxed);
            stats.database_errors = counters.database_errors.load(Ordering::Relaxed);
            stats.failovers = counters.failovers.timings();
            (stats.database_outages, stats.database_outage) = counters.outages();
            let started = tokio::time::Instant::now();
            let ping = tokio::time::timeout(Duration::from_secs(2), self.node.pg().ping()).await;
            stats.database_round_trip = matches!(ping, Ok(Ok(()))).then(|| started.elapsed());
            stats.returns = counters.returns.load(Ordering::Relaxed);
            stats.lease_ttl = Some(self.node.ttl());
            let nodes = tokio::time::timeout(Duration::from_secs(2), self.node.pg().nodes());
            let read = nodes.await;
            let mut members = counters.members.lock();
            match read {
                Ok(Ok(nodes)) => {
                    stats.nodes = nodes
                        .into_iter()
                        .map(|n| {
                            NodeStats::new(n.node_id, n.heartbeat_age_secs, n.sessions)
                                .with_state(n.state.as_str())
                        })
                        .collect();
                    *members = Some((tokio::time::Instant::now(), stats.nodes.clone()));
                }
                // The database cannot be read: the members as last read,
                // each heartbeat older by the time since (no series gaps
                // on a dashboard; the age says how stale).
                _ => {
                    if let Some((read, nodes)) = members.as_ref() {
                        let since = read.elapsed().as_secs_f64();
                        stats.nodes = nodes
                            .iter()
                            .map(|n| {
                                let mut n = n.clone();
                                n.heartbeat_age_secs += since;
                                n
                            })
                            .collect();
                    }
                }
            }
            Some(stats)
        })
    }

    fn arrival<'a>(&'a self, key: &'a SessionKey) -> BoxFuture<'a, Option<Arrival>> {
        Box::pin(async move {
            let moved = self
                .node
                .pg()
                .arrival_of(key, self.node.node())
                .await
                .ok()?;
            // A few TTLs: the outage's takeovers come within a scan or two
            // of the database's return.
            let outage = self.counters.outage_within(self.node.ttl() * 3);
            Some(match moved {
                Some((kind, _)) if kind == "handover" => Arrival::Handover,
                // Its node lived on (it beats within its TTL), or this
                // node itself could not reach the database just now: the
                // lease was given up for the database, not for a death.
                Some((_, lived)) if lived || outage => Arrival::StoreUnreachable,
                Some(_) => Arrival::NodeLost,
                // Taken back by the node that had it, after an outage.
                None if outage || self.node.came_home(key) => Arrival::StoreUnreachable,
                None => return None,
            })
        })
    }

    fn moves(&self, limit: usize) -> BoxFuture<'_, Option<Result<Vec<SessionMove>, String>>> {
        Box::pin(async move { Some(self.node.pg().moves(limit).await.map_err(|e| e.to_string())) })
    }

    fn move_counts(
        &self,
        within: Duration,
    ) -> BoxFuture<'_, Option<Result<Vec<MoveCount>, String>>> {
        Box::pin(async move {
            Some(
                move_counts(&self.node, within)
                    .await
                    .map_err(|e| e.to_string()),
            )
        })
    }

    fn sessions(&self) -> BoxFuture<'_, Option<Result<Vec<SessionPlace>, String>>> {
        Box::pin(async move {
            let pg = self.node.pg();
            let all = async {
                let leases = pg.leases().await.map_err(|e| e.to_string())?;
                let nodes = pg.nodes().await.map_err(|e| e.to_string())?;
                Ok(leases
                    .into_iter()
                    .map(|(key, info)| {
                        let advertise = info.owner.as_ref().and_then(|o| {
                            nodes
                                .iter()
                                .find(|n| n.node_id == *o)
                                .map(|n| n.advertise.clone())
                                .filter(|a| !a.is_empty())
                        });
                        SessionPlace::new(
                            key,
                            info.owner,
                            advertise,
                            info.epoch,
                            info.remaining_secs,
                        )
                    })
                    .collect())
            };
            Some(all.await)
        })
    }
}

/// The moves of sessions between nodes within `within`, cluster wide, by
/// kind and by the nodes they moved between: every move (a session that
/// moved twice counts twice), as `warden_moves` keeps them.
async fn move_counts(node: &NodeStore, within: Duration) -> Result<Vec<MoveCount>, StoreError> {
    let client = node.pg().client().await?;
    let rows = client
        .query(
            "SELECT moved_from, moved_to, kind = 'failover', count(*) \
             FROM warden_moves \
             WHERE at >= now() - make_interval(secs => $1) \
             GROUP BY moved_from, moved_to, kind \
             ORDER BY count(*) DESC, moved_from, moved_to",
            &[&within.as_secs_f64()],
        )
        .await
        .map_err(crate::backend)?;
    Ok(rows
        .into_iter()
        .map(|r| {
            let n: i64 = r.get(3);
            MoveCount::new(
                r.get::<_, String>(0),
                r.get::<_, String>(1),
                r.get(2),
                crate::from_db(n),
            )
        })
        .collect())
}
