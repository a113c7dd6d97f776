//! Handing idle sessions to another live node, for balance: the giver
//! moves the lease to the taker in one fenced statement that refuses a
//! session with a turn running or messages waiting, and the taker adopts
//! the leases handed to it on its next look (see
//! [`cluster::Balance`](crate::cluster::Balance)). A busy session is
//! handed over at its next turn boundary: [marked](NodeStore::mark_moving),
//! its new turns wait ([`NodeStore::wait_while_moving`]) while the turn in
//! flight (and any message already acknowledged) finishes here, then it is
//! idle and moves as any idle session does.

use std::time::Duration;

use warden_core::{SessionKey, StoreError};

use super::NodeStore;
use crate::{Lease, PgStore, backend, from_db, secs, to_db};

/// How long a busy session chosen for a handover may take to reach a turn
/// boundary (its turn in flight and the messages already acknowledged
/// done here) before the move is given up for that round: 3 s. The new
/// turns for it wait meanwhile, so this is also the longest a `POST` waits
/// for a move; under the 5 s a forwarding node waits for the owner's
/// answer.
pub const TURN_BOUNDARY_WAIT: Duration = Duration::from_secs(3);

impl NodeStore {
    /// Marks `key` (a busy session held here) to be handed to `to` at its
    /// next turn boundary: until [`unmark_moving`](Self::unmark_moving),
    /// new turns placed here for it wait
    /// ([`wait_while_moving`](Self::wait_while_moving)), so the turn in flight
    /// ends, no new one starts, and the session becomes idle for
    /// [`hand_over`](Self::hand_over).
    pub fn mark_moving(&self, key: &str, to: &str) {
        self.moving.lock().insert(key.to_owned(), to.to_owned());
    }

    /// Ends the marks of `keys` (handed over, or the move given up) and
    /// lets the turns waiting for them go on: to the new owner, or here.
    pub fn unmark_moving<'a>(&self, keys: impl IntoIterator<Item = &'a str>) {
        let mut moving = self.moving.lock();
        for key in keys {
            moving.remove(key);
        }
        drop(moving);
        self.moved.notify_waiters();
    }

    /// Waits while `key` is [marked](Self::mark_moving) to move at its
    /// next turn boundary (at most [`TURN_BOUNDARY_WAIT`] and a second):
    /// what placing a new turn here does first, so the turn goes to the
    /// node the session moved to rather than keeping it busy here.
    pub async fn wait_while_moving(&self, key: &SessionKey) {
        let until = tokio::time::Instant::now() + TURN_BOUNDARY_WAIT + Duration::from_secs(1);
        loop {
            let woken = self.moved.notified();
            if !self.moving.lock().contains_key(key.as_str()) {
                return;
            }
            if tokio::time::timeout_at(until, woken).await.is_err() {
                return;
            }
        }
    }

    /// Hands `leases` (held here) to live node `to`, in one statement: each
    /// session moves (epoch + 1, owner `to`, a lease of this node's TTL,
    /// recorded as a `handover`) only while this node still holds it at that
    /// epoch, no message of it waits for an answer and no turn of it is
    /// open (its end not stored yet) — so a running turn is never moved —
    /// and only while `to` is alive (not left, and beaten within half its
    /// TTL: it beats every third, so a node that stopped beating is not
    /// handed sessions it would never adopt). The
    /// leases handed; this node holds them no more (and does not take them
    /// back for [`RETAKE_COOLDOWN`](crate::RETAKE_COOLDOWN)); a write of
    /// theirs still in flight here is refused by the fence
    /// ([`StoreError::LeaseLost`]): it belonged to a message not yet
    /// acknowledged. Stop their copies here.
    pub async fn hand_over(&self, to: &str, leases: &[Lease]) -> Result<Vec<Lease>, StoreError> {
        let leases: Vec<Lease> = leases
            .iter()
            .filter(|l| self.holds(l) && l.node == self.node)
            .cloned()
            .collect();
        if leases.is_empty() || to == self.node {
            return Ok(Vec::new());
        }
        // A renewal racing the move must not report these as lost.
        self.handing
            .lock()
            .extend(leases.iter().map(|l| l.key.clone()));
        let handed = self
            .pg
            .hand_over_idle(&self.node, to, &leases, self.ttl)
            .await;
        self.reached(&handed);
        let mut given = Vec::new();
        for lease in leases {
            let moved = handed.as_ref().is_ok_and(|h| h.contains(&lease.key));
            if moved && self.remove(&lease).is_some() {
                given.push(lease.clone());
            }
            self.handing.lock().remove(&lease.key);
        }
        handed.map(|_| given)
    }

    /// Adopts the leases another node has handed to this one lately
    /// ([`hand_over`](Self::hand_over)) and this node does not hold yet:
    /// renews each at the epoch handed (so it is this node's from then
    /// on, as if it had taken it) and holds it. The session is not started:
    /// it is idle, and a turn placed here starts it. A lease this node gave
    /// up itself within [`RETAKE_COOLDOWN`](crate::RETAKE_COOLDOWN) is not
    /// adopted yet (its copy may still be stopping); one it gave up longer
    /// ago is (a session handed away and back, as the counts moved).
    /// Returns the leases adopted.
    pub async fn adopt_handed(&self) -> Result<Vec<Lease>, StoreError> {
        let found = self.pg.handed_to(&self.node, self.ttl * 2).await;
        self.reached(&found);
        let found = found?;
        let candidates: Vec<Lease> = {
            let leases = self.leases();
            found
                .into_iter()
                .filter(|l| !leases.contains_key(&l.key))
                .collect()
        };
        let candidates: Vec<Lease> = candidates
            .into_iter()
            .filter(|l| self.cooling_down(&SessionKey::new(&l.key)).is_none())
            .collect();
        if candidates.is_empty() {
            return Ok(Vec::new());
        }
        let sent = tokio::time::Instant::now();
        let renewed = self.pg.renew_many(&self.node, &candidates, self.ttl).await;
        self.reached(&renewed);
        let renewed = renewed?;
        let mut adopted = Vec::new();
        for lease in candidates {
            let key = SessionKey::new(&lease.key);
            if renewed.contains(&lease.key) && self.cooling_down(&key).is_none() {
                self.hold(&lease, sent);
                adopted.push(lease);
            }
        }
        Ok(adopted)
    }

    /// Whether `key` is being handed to another node right now (a renewal
    /// that finds it moved is not a lease lost).
    pub(super) fn handing(&self, key: &str) -> bool {
        self.handing.lock().contains(key)
    }
}

impl PgStore {
    /// Moves each of `leases` (all `from`'s) to node `to` under a lease of
    /// `ttl`, in one statement, if it is idle (no message waiting, no turn
    /// open), still `from`'s at that epoch, and `to` is alive: the keys
    /// moved. See [`NodeStore::hand_over`].
    pub async fn hand_over_idle(
        &self,
        from: &str,
        to: &str,
        leases: &[Lease],
        ttl: Duration,
    ) -> Result<Vec<String>, StoreError> {
        let held: Vec<serde_json::Value> = leases
            .iter()
            .map(|l| serde_json::json!({"key": l.key, "epoch": to_db(l.epoch)}))
            .collect();
        let client = self.client().await?;
        let rows = client
            .query(
                "UPDATE warden_sessions s SET owner = $3, epoch = s.epoch + 1, \
                   lease_until = now() + make_interval(secs => $4), \
                   moved_from = s.owner, moved_at = now(), moved_kind = 'handover', \
                   moved_epoch = s.epoch + 1 \
                 FROM jsonb_to_recordset($1::jsonb) AS l(key text, epoch bigint) \
                 WHERE s.key = l.key AND s.owner = $2 AND s.epoch = l.epoch \
                   AND s.lease_until >= now() AND NOT s.waiting \
                   AND NOT EXISTS (SELECT 1 FROM warden_turns t \
                     WHERE t.key = s.key AND NOT t.ended) \
                   AND EXISTS (SELECT 1 FROM warden_nodes n WHERE n.node_id = $3 \
                     AND n.left_at IS NULL AND n.heartbeat_at >= now() - 0.5 * \
                       COALESCE(n.lease_ttl_ms * interval '1 millisecond', \
                                make_interval(secs => $4))) \
                 RETURNING s.key",
                &[&serde_json::Value::Array(held), &from, &to, &secs(ttl)],
            )
            .await
            .map_err(backend)?;
        Ok(rows.into_iter().map(|r| r.get(0)).collect())
    }

    /// The leases handed to `node` within the last `within` that it holds
    /// now by the database (unexpired, at the epoch the handover gave).
    pub async fn handed_to(&self, node: &str, within: Duration) -> Result<Vec<Lease>, StoreError> {
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT key, epoch FROM warden_sessions \
                 WHERE moved_at >= now() - make_interval(secs => $2) \
                   AND owner = $1 AND moved_kind = 'handover' AND moved_from <> $1 \
                   AND moved_epoch = epoch AND lease_until >= now()",
                &[&node, &secs(within)],
            )
            .await
            .map_err(backend)?;
        Ok(rows
            .into_iter()
            .map(|r| Lease {
                key: r.get(0),
                node: node.to_owned(),
                epoch: from_db(r.get(1)),
            })
            .collect())
    }
}
