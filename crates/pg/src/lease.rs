//! Leases with fencing epochs: who runs a session, and the fence every
//! write of its data goes through.

use std::time::Duration;

use derive_setters::Setters;
use warden_core::store::SCHEMA_VERSION;
use warden_core::{SessionKey, SessionRecord, StoreError};

use crate::{PgStore, backend, from_db, secs, to_db};

/// How long after a lease expires its last owner alone may still renew it,
/// before another node may take it: half a second. It is the owner's
/// margin to stop: a node whose renewals do not get through gives a lease
/// up and stops its session a TTL after the last renewal it sent that
/// succeeded ([`NodeStore::fence_expired`](crate::NodeStore::fence_expired)),
/// and the database expires it no sooner than that — so a partitioned
/// owner has stopped before anyone may take over. Fencing is unchanged
/// (writes match the epoch), and a dead node's sessions are taken within
/// TTL + this + one orphan scan.
pub const TAKEOVER_GRACE: Duration = Duration::from_millis(500);

/// A lease this node took: the session, the node and the epoch every write
/// must carry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The session key.
    pub key: String,
    /// The owner.
    pub node: String,
    /// The fencing epoch: grows by one at every take.
    pub epoch: u64,
}

/// How long a take leaves a session to a last owner that may be coming
/// back (it gave the lease up in a database outage): the return grace
/// (see [`NodeStore::with_return_grace`](crate::NodeStore::with_return_grace)).
/// A node never waits for itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Setters)]
#[setters(prefix = "with_", strip_option)]
#[non_exhaustive]
pub struct Patience {
    /// A lease whose owner has beaten since it expired (alive again, and
    /// not left) is taken by another node only once it has been expired
    /// this long.
    #[setters(skip)]
    pub grace: Duration,
    /// A lease of another live member that expired less than this long ago
    /// is not taken at all: the taking node has just lived through a
    /// database outage itself (this long ago it began, plus a TTL), and
    /// the owners of the leases that outage expired may not have beaten
    /// yet. Zero outside such an outage and its return grace.
    pub outage: Duration,
}

impl Patience {
    /// The patience of a take by a node that lived through no outage
    /// lately, with return grace `grace`.
    pub fn new(grace: Duration) -> Self {
        Self {
            grace,
            outage: Duration::ZERO,
        }
    }
}

/// SQL: whether another node than its owner may take session row `s`'s
/// lease now — expired past the takeover grace (`{grace}`, seconds), and
/// not left to an owner coming back ([`Patience`]: `{ret}` and `{outage}`,
/// seconds).
fn free_for_others(grace: &str, ret: &str, outage: &str) -> String {
    format!(
        "(s.lease_until < now() - make_interval(secs => {grace}) AND NOT EXISTS ( \
           SELECT 1 FROM warden_nodes n WHERE n.node_id = s.owner AND n.left_at IS NULL AND ( \
             (n.heartbeat_at > s.lease_until \
               AND s.lease_until > now() - make_interval(secs => {ret})) \
             OR s.lease_until > now() - make_interval(secs => {outage}))))"
    )
}

/// Who holds a session, as the database says now.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct LeaseInfo {
    /// The owner, if the session was ever taken.
    pub owner: Option<String>,
    /// The current epoch (0: never taken).
    pub epoch: u64,
    /// Time left on the lease by the database's clock; negative once
    /// expired, `None` when never taken.
    pub remaining_secs: Option<f64>,
}

/// The `SET` assignments that record a take of a session row `s` by
/// `new_owner` (an SQL expression) as a move when the owner changes — from
/// whom, when, under which epoch, and whether the old lease had expired (a
/// failover) or was given back (a handover) — for `moves` and the console.
fn record_move(new_owner: &str) -> String {
    let moved = format!("s.owner IS DISTINCT FROM {new_owner} AND s.owner IS NOT NULL");
    format!(
        "moved_from = CASE WHEN {moved} THEN s.owner ELSE s.moved_from END, \
         moved_at = CASE WHEN {moved} THEN now() ELSE s.moved_at END, \
         moved_kind = CASE WHEN {moved} \
           THEN (CASE WHEN s.lease_until IS NULL THEN 'handover' ELSE 'failover' END) \
           ELSE s.moved_kind END, \
         moved_epoch = CASE WHEN {moved} THEN s.epoch + 1 ELSE s.moved_epoch END"
    )
}

impl PgStore {
    /// Takes the lease of `key` for `node` for `ttl` when it is free,
    /// expired or already `node`'s: `Some` with the new epoch (one more
    /// than any before), `None` while another node holds it. An owner
    /// alive again keeps it for [`DEFAULT_RETURN_GRACE`](crate::DEFAULT_RETURN_GRACE)
    /// (see [`acquire_patiently`](Self::acquire_patiently)).
    pub async fn acquire(
        &self,
        key: &SessionKey,
        node: &str,
        ttl: Duration,
    ) -> Result<Option<Lease>, StoreError> {
        let patience = Patience::new(crate::DEFAULT_RETURN_GRACE);
        self.acquire_patiently(key, node, ttl, patience).await
    }

    /// [`acquire`](Self::acquire), leaving an expired lease to an owner
    /// that may be coming back as `patience` says.
    pub async fn acquire_patiently(
        &self,
        key: &SessionKey,
        node: &str,
        ttl: Duration,
        patience: Patience,
    ) -> Result<Option<Lease>, StoreError> {
        let client = self.client().await?;
        let row = client
            .query_opt(
                &format!(
                    "INSERT INTO warden_sessions AS s (key, owner, epoch, lease_until) \
                     VALUES ($1, $2, 1, now() + make_interval(secs => $3)) \
                     ON CONFLICT (key) DO UPDATE SET owner = EXCLUDED.owner, epoch = s.epoch + 1, \
                     lease_until = EXCLUDED.lease_until, {} \
                     WHERE s.lease_until IS NULL OR s.owner = EXCLUDED.owner OR {} \
                     RETURNING epoch",
                    record_move("EXCLUDED.owner"),
                    free_for_others("$4", "$5", "$6"),
                ),
                &[
                    &key.as_str(),
                    &node,
                    &secs(ttl),
                    &secs(TAKEOVER_GRACE),
                    &secs(patience.grace),
                    &secs(patience.outage),
                ],
            )
            .await
            .map_err(backend)?;
        Ok(row.map(|r| Lease {
            key: key.as_str().to_owned(),
            node: node.to_owned(),
            epoch: from_db(r.get(0)),
        }))
    }

    /// Takes the leases of those of `keys` that are free or expired past
    /// [`TAKEOVER_GRACE`] (for sessions that exist) for `node` for `ttl`, in
    /// one statement: the leases taken, each with the session's record as
    /// it was when taken. Unlike [`acquire`](Self::acquire), a live lease
    /// of `node`'s own is not taken again: an orphan scan that raced the
    /// node's own start of the session must not bump the epoch under it. A row another node is taking
    /// at the same moment is skipped, not waited for (`SKIP LOCKED`), so
    /// survivors taking a dead node's sessions split them instead of
    /// queueing behind each other, and never deadlock. An expired lease of
    /// `node`'s own is taken back at once; one of an owner alive again is
    /// left to it for [`DEFAULT_RETURN_GRACE`](crate::DEFAULT_RETURN_GRACE)
    /// (see [`acquire_many_patiently`](Self::acquire_many_patiently)).
    pub async fn acquire_many(
        &self,
        keys: &[SessionKey],
        node: &str,
        ttl: Duration,
    ) -> Result<Vec<(Lease, Result<Option<SessionRecord>, StoreError>)>, StoreError> {
        let patience = Patience::new(crate::DEFAULT_RETURN_GRACE);
        self.acquire_many_patiently(keys, node, ttl, patience).await
    }

    /// [`acquire_many`](Self::acquire_many), leaving expired leases to
    /// owners that may be coming back as `patience` says.
    pub async fn acquire_many_patiently(
        &self,
        keys: &[SessionKey],
        node: &str,
        ttl: Duration,
        patience: Patience,
    ) -> Result<Vec<(Lease, Result<Option<SessionRecord>, StoreError>)>, StoreError> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let keys: Vec<&str> = keys.iter().map(SessionKey::as_str).collect();
        let client = self.client().await?;
        let statement = client
            .prepare_cached(&format!(
                "WITH free AS ( \
                   SELECT s.key FROM warden_sessions s \
                   WHERE s.key = ANY($1) AND (s.lease_until IS NULL \
                     OR (s.owner = $2 AND s.lease_until < now()) OR {}) \
                   ORDER BY s.key FOR UPDATE OF s SKIP LOCKED) \
                 UPDATE warden_sessions s SET owner = $2, epoch = s.epoch + 1, \
                   lease_until = now() + make_interval(secs => $3), {} \
                 FROM free WHERE s.key = free.key \
                 RETURNING s.key, s.epoch, s.schema_version, s.record",
                free_for_others("$4", "$5", "$6"),
                record_move("$2")
            ))
            .await
            .map_err(backend)?;
        let rows = client
            .query(
                &statement,
                &[
                    &keys,
                    &node,
                    &secs(ttl),
                    &secs(TAKEOVER_GRACE),
                    &secs(patience.grace),
                    &secs(patience.outage),
                ],
            )
            .await
            .map_err(backend)?;
        Ok(rows
            .into_iter()
            .map(|r| {
                let key: String = r.get(0);
                let record = Self::decode(&key, r.get(2), r.get(3));
                let lease = Lease {
                    key,
                    node: node.to_owned(),
                    epoch: from_db(r.get(1)),
                };
                (lease, record)
            })
            .collect())
    }

    /// Extends `lease` by `ttl` from now; `false` when the session's epoch
    /// or owner moved on (the lease is lost). A lease that expired but
    /// that nobody took is extended: its epoch still fences every write.
    pub async fn renew(&self, lease: &Lease, ttl: Duration) -> Result<bool, StoreError> {
        let client = self.client().await?;
        let n = client
            .execute(
                "UPDATE warden_sessions SET lease_until = now() + make_interval(secs => $4) \
                 WHERE key = $1 AND owner = $2 AND epoch = $3",
                &[&lease.key, &lease.node, &to_db(lease.epoch), &secs(ttl)],
            )
            .await
            .map_err(backend)?;
        Ok(n == 1)
    }

    /// Extends every one of `leases` (all of one node) by `ttl` from now in
    /// one statement: the keys of those renewed; a lease missing from them
    /// is lost (its session's epoch or owner moved on). One round trip per
    /// renewal tick, however many sessions a node holds.
    pub async fn renew_many(
        &self,
        node: &str,
        leases: &[Lease],
        ttl: Duration,
    ) -> Result<std::collections::HashSet<String>, StoreError> {
        if leases.is_empty() {
            return Ok(std::collections::HashSet::new());
        }
        let held: Vec<serde_json::Value> = leases
            .iter()
            .map(|l| serde_json::json!({"key": l.key, "epoch": to_db(l.epoch)}))
            .collect();
        let client = self.control_client().await?;
        let statement = client
            .prepare_cached(
                "UPDATE warden_sessions s SET lease_until = now() + make_interval(secs => $3) \
                 FROM jsonb_to_recordset($1::jsonb) AS l(key text, epoch bigint) \
                 WHERE s.key = l.key AND s.owner = $2 AND s.epoch = l.epoch \
                 RETURNING s.key",
            )
            .await
            .map_err(backend)?;
        let rows = client
            .query(
                &statement,
                &[&serde_json::Value::Array(held), &node, &secs(ttl)],
            )
            .await
            .map_err(backend)?;
        Ok(rows.into_iter().map(|r| r.get(0)).collect())
    }

    /// Gives `lease` up at once (another node may take the session without
    /// waiting for it to expire). Nothing happens if it was lost already.
    pub async fn release(&self, lease: &Lease) -> Result<(), StoreError> {
        let client = self.client().await?;
        client
            .execute(
                "UPDATE warden_sessions SET lease_until = NULL \
                 WHERE key = $1 AND owner = $2 AND epoch = $3",
                &[&lease.key, &lease.node, &to_db(lease.epoch)],
            )
            .await
            .map_err(backend)?;
        Ok(())
    }

    /// Writes `record` through the fence: only while `lease` is still the
    /// session's (same owner, same epoch), in the same statement.
    /// [`StoreError::LeaseLost`] when it is not.
    pub async fn save_fenced(
        &self,
        lease: &Lease,
        record: &SessionRecord,
    ) -> Result<(), StoreError> {
        if record.key != lease.key {
            return Err(StoreError::Backend {
                message: format!(
                    "the lease of {:?} cannot write the record of {:?}",
                    lease.key, record.key
                ),
            });
        }
        let value = Self::encode(record)?;
        let client = self.client().await?;
        // Prepared once per connection: a session writes its record on
        // every step of a turn.
        let statement = client
            .prepare_cached(
                "UPDATE warden_sessions SET record = $2, schema_version = $3, updated_at = now() \
                 WHERE key = $1 AND owner = $4 AND epoch = $5",
            )
            .await
            .map_err(backend)?;
        let n = client
            .execute(
                &statement,
                &[
                    &record.key,
                    &value,
                    &(SCHEMA_VERSION as i16),
                    &lease.node,
                    &to_db(lease.epoch),
                ],
            )
            .await
            .map_err(backend)?;
        if n == 1 {
            Ok(())
        } else {
            Err(StoreError::LeaseLost {
                key: lease.key.clone(),
                epoch: lease.epoch,
            })
        }
    }

    /// Who holds `key` now.
    pub async fn lease_info(&self, key: &SessionKey) -> Result<LeaseInfo, StoreError> {
        let client = self.client().await?;
        let row = client
            .query_opt(
                "SELECT owner, epoch, EXTRACT(EPOCH FROM (lease_until - now()))::float8 \
                 FROM warden_sessions WHERE key = $1",
                &[&key.as_str()],
            )
            .await
            .map_err(backend)?;
        Ok(match row {
            None => LeaseInfo {
                owner: None,
                epoch: 0,
                remaining_secs: None,
            },
            Some(r) => LeaseInfo {
                owner: r.get(0),
                epoch: from_db(r.get(1)),
                remaining_secs: r.get(2),
            },
        })
    }

    /// Every session's lease, by key: what `warden cluster status` shows.
    pub async fn leases(&self) -> Result<Vec<(String, LeaseInfo)>, StoreError> {
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT key, owner, epoch, EXTRACT(EPOCH FROM (lease_until - now()))::float8 \
                 FROM warden_sessions ORDER BY key",
                &[],
            )
            .await
            .map_err(backend)?;
        Ok(rows
            .into_iter()
            .map(|r| {
                (
                    r.get(0),
                    LeaseInfo {
                        owner: r.get(1),
                        epoch: from_db(r.get(2)),
                        remaining_secs: r.get(3),
                    },
                )
            })
            .collect())
    }

    /// The latest `limit` moves of sessions between nodes (each session's
    /// latest), newest first.
    pub async fn moves(
        &self,
        limit: usize,
    ) -> Result<Vec<warden_core::cluster::SessionMove>, StoreError> {
        let client = self.client().await?;
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = client
            .query(
                "SELECT key, moved_from, owner, moved_epoch, moved_kind = 'failover', \
                 (EXTRACT(EPOCH FROM moved_at) * 1000)::float8 \
                 FROM warden_sessions WHERE moved_at IS NOT NULL AND owner IS NOT NULL \
                 ORDER BY moved_at DESC LIMIT $1",
                &[&limit],
            )
            .await
            .map_err(backend)?;
        Ok(rows
            .into_iter()
            .map(|r| {
                let at: f64 = r.get(5);
                warden_core::cluster::SessionMove::new(
                    r.get::<_, String>(0),
                    r.get::<_, String>(1),
                    r.get::<_, String>(2),
                    from_db(r.get(3)),
                    r.get(4),
                    at.max(0.0) as u64,
                )
            })
            .collect())
    }

    /// Deletes the moves (`warden_moves`, every move of a session
    /// between nodes) older than `keep`: how many.
    pub async fn expire_moves(&self, keep: Duration) -> Result<u64, StoreError> {
        let client = self.client().await?;
        client
            .execute(
                "DELETE FROM warden_moves WHERE at < now() - make_interval(secs => $1)",
                &[&secs(keep)],
            )
            .await
            .map_err(backend)
    }

    /// How `node` came to hold `key` under its current epoch, if that take
    /// moved it from another node: the move's kind (`failover` or
    /// `handover`) and whether the node it came from has beaten since
    /// (it lived: it lost the database, or was cut off, rather than died —
    /// a heartbeat merely younger than a TTL is not enough: a node killed
    /// just after a beat still has one when its sessions are taken). `None`: not `node`'s, or its last take was not a
    /// move (the same node took it again).
    pub async fn arrival_of(
        &self,
        key: &SessionKey,
        node: &str,
    ) -> Result<Option<(String, bool)>, StoreError> {
        let client = self.client().await?;
        let row = client
            .query_opt(
                "SELECT s.moved_kind, COALESCE((SELECT n.left_at IS NULL AND \
                   n.heartbeat_at > s.moved_at \
                   FROM warden_nodes n WHERE n.node_id = s.moved_from), false) \
                 FROM warden_sessions s WHERE s.key = $1 AND s.owner = $2 \
                   AND s.moved_kind IS NOT NULL AND s.moved_epoch = s.epoch",
                &[&key.as_str(), &node],
            )
            .await
            .map_err(backend)?;
        Ok(row.map(|r| (r.get(0), r.get(1))))
    }
}
