//! One node of a cluster: its membership row, and the store its sessions
//! write through (leases taken on first write, renewed, fenced).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use derive_setters::Setters;
use parking_lot::Mutex;

use futures_util::future::BoxFuture;
use tokio::sync::broadcast;
use warden_core::{Durability, SessionKey, SessionRecord, SessionStore, StoreError};

use crate::{Lease, PgStore};

mod handover;
mod home;
mod members;
mod renew;
mod takeover;
mod turn_logs;

pub use handover::TURN_BOUNDARY_WAIT;
pub use home::DEFAULT_RETURN_GRACE;
pub use members::{DEAD_AFTER_UNKNOWN_TTL, NodeInfo, NodeState};
pub use takeover::TakeOver;

/// How long after giving a session's lease up a node does not take it
/// again (other nodes may, once it expires): 3 s, longer than the longest
/// pause between two attempts of a turn relay to store a batch (`warden
/// serve` waits at most 2 s). A relay of the stopped copy may still be
/// retrying a batch of the turn; its next attempt must find no lease here
/// and be told the session moved. A lease taken again here sooner would
/// let that stale batch through under the new epoch (appends are fenced
/// by the lease this node holds on the session now), where it collides
/// with the re-delivered turn's own events.
pub const RETAKE_COOLDOWN: Duration = Duration::from_secs(3);

/// The [`SessionStore`] of one node of a cluster. A session's first write
/// takes its lease (or fails with [`StoreError::LeaseLost`] while another
/// node holds it); every write goes through the fence with the epoch
/// taken; [`spawn_renewer`](Self::spawn_renewer) keeps the leases alive
/// and reports each one lost on [`lost`](Self::lost). Cheap to clone.
///
/// Once this node has given a session's lease up (lost, fenced in an
/// outage, released), a write takes it back no more: the copy writing is
/// one stopping here, and its write fails with [`StoreError::LeaseLost`].
/// Only a [`claim`](Self::claim) takes it again — a turn placed here, or
/// the [orphan scan](crate::cluster::Node::take_over) — and each of those starts the
/// session; and not within [`RETAKE_COOLDOWN`], while the stopped copy's
/// turn relays may still try to store. So this node never holds the lease
/// of a session nothing here runs, and a session's waiting messages are
/// never stranded behind it.
#[derive(Clone, Setters)]
#[setters(generate = false, prefix = "with_")]
pub struct NodeStore {
    pg: PgStore,
    node: String,
    ttl: Duration,
    leases: Arc<Mutex<HashMap<String, Lease>>>,
    /// When the request that last took or renewed each lease was sent, by
    /// this node's clock: the database set its expiry at least a TTL after
    /// that.
    /// Keyed by session, with the lease's epoch.
    renewed: Arc<Mutex<HashMap<String, (u64, tokio::time::Instant)>>>,
    /// Records read by [`claim_many`](Self::claim_many) with their leases,
    /// handed to the session's first [`load`](SessionStore::load) instead
    /// of reading them again. Valid while this node holds the lease at that
    /// epoch (no one else can write the record then): removed by this
    /// node's own writes and when the lease goes.
    prefetched: Arc<Mutex<HashMap<String, (u64, SessionRecord)>>>,
    /// Sessions whose lease this node gave up (lost, fenced, released) and
    /// has not claimed since, with when and the epoch given up (a write
    /// refused then names it): a write does not take their lease, nor a
    /// claim within [`RETAKE_COOLDOWN`] (see the type's docs). One key per
    /// session that left this node.
    given_up: Arc<Mutex<HashMap<String, (tokio::time::Instant, u64)>>>,
    lost: broadcast::Sender<Lease>,
    /// Leases [`fence_expired`](Self::fence_expired) gave up and reported
    /// on `lost`, until [`Node`](crate::cluster::Node) asks
    /// ([`was_fenced`](Self::was_fenced)): given up here for an outage, not
    /// taken by another node.
    fenced: Arc<Mutex<std::collections::HashSet<(String, u64)>>>,
    /// Its turns' event batches, committed together (or, switched off,
    /// each in its own transaction).
    group: crate::group::GroupCommit,
    /// Commits each turn's event batch in its own transaction instead of
    /// together with the other turns' (the default, `true`): for
    /// comparison; every guarantee holds either way.
    #[setters(generate, rename = "with_group_commit")]
    grouped: bool,
    /// How long another node leaves a session to its last owner that is
    /// alive again after a database outage (it has beaten since its lease
    /// expired), and how long this node, after an outage of its own, leaves
    /// alone the sessions of other live nodes that the outage expired
    /// (their owners may not have beaten yet). Default
    /// [`DEFAULT_RETURN_GRACE`](home::DEFAULT_RETURN_GRACE). Keep it above
    /// [`RETAKE_COOLDOWN`](crate::RETAKE_COOLDOWN) plus a
    /// [scan](Self::scan_interval), or the owners lose the race for their
    /// own sessions.
    #[setters(generate)]
    return_grace: Duration,
    /// This node's latest database outage, as its round trips saw it.
    reach: Arc<Mutex<home::Reach>>,
    /// Sessions given up here because the database could not be reached,
    /// to take back first (see [`Node::take_over`](crate::cluster::Node::take_over)).
    homes: Arc<Mutex<std::collections::HashSet<String>>>,
    /// Sessions taken back after an outage, with the epoch taken.
    came_home: Arc<Mutex<HashMap<String, u64>>>,
    /// Sessions being handed to another node now (`hand_over`).
    handing: Arc<Mutex<std::collections::HashSet<String>>>,
    /// Busy sessions to hand over at their next turn boundary, with the
    /// taker (see [`mark_moving`](Self::mark_moving)), and what wakes the
    /// requests held for them.
    moving: Arc<Mutex<HashMap<String, String>>>,
    moved: Arc<tokio::sync::Notify>,
    /// Orphans this node's scans have seen, with when first.
    orphans_seen: Arc<Mutex<HashMap<String, tokio::time::Instant>>>,
}

impl std::fmt::Debug for NodeStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeStore")
            .field("node", &self.node)
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

impl NodeStore {
    /// The store of node `node`, whose leases last `ttl` (10 s is the
    /// cluster default; they are renewed at a third of it).
    pub fn new(pg: PgStore, node: impl Into<String>, ttl: Duration) -> Self {
        let (lost, _) = broadcast::channel(256);
        Self {
            group: crate::group::GroupCommit::new(pg.clone()),
            grouped: true,
            pg,
            node: node.into(),
            ttl,
            leases: Arc::default(),
            renewed: Arc::default(),
            prefetched: Arc::default(),
            given_up: Arc::default(),
            lost,
            fenced: Arc::default(),
            return_grace: DEFAULT_RETURN_GRACE,
            reach: Arc::default(),
            homes: Arc::default(),
            came_home: Arc::default(),
            handing: Arc::default(),
            moving: Arc::default(),
            moved: Arc::default(),
            orphans_seen: Arc::default(),
        }
    }

    /// This node's id.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// How long its leases last.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// The database underneath.
    pub fn pg(&self) -> &PgStore {
        &self.pg
    }

    fn leases(&self) -> parking_lot::MutexGuard<'_, HashMap<String, Lease>> {
        self.leases.lock()
    }

    /// The leases this node believes it holds.
    pub fn held(&self) -> Vec<Lease> {
        let mut v: Vec<Lease> = self.leases().values().cloned().collect();
        v.sort_by(|a, b| a.key.cmp(&b.key));
        v
    }

    /// Every lease this node loses from now on (a renewal or a fenced
    /// write refused): stop that session's copy here at once.
    pub fn lost(&self) -> broadcast::Receiver<Lease> {
        self.lost.subscribe()
    }

    /// Takes `key`'s lease now if it is free or expired: the lease, or
    /// `None` while another node holds it (or this node gave it up less
    /// than [`RETAKE_COOLDOWN`] ago: see [`cooling_down`](Self::cooling_down)).
    /// The caller runs the session here (a lease taken is a promise to run
    /// it): a turn placed here, or the orphan scan starting it.
    pub async fn claim(&self, key: &SessionKey) -> Result<Option<Lease>, StoreError> {
        if self.cooling_down(key).is_some() {
            return Ok(None);
        }
        let sent = tokio::time::Instant::now();
        let patience = self.patience();
        let lease = self
            .pg
            .acquire_patiently(key, &self.node, self.ttl, patience)
            .await;
        self.reached(&lease);
        let lease = lease?;
        if let Some(l) = &lease {
            self.hold(l, sent);
        }
        Ok(lease)
    }

    /// Records `lease` as held (taken by a request sent at `sent`), unless
    /// a later take of the same session (a higher epoch) landed first: two
    /// takes racing here (an orphan scan and a turn starting the session)
    /// must leave the newer one.
    fn hold(&self, lease: &Lease, sent: tokio::time::Instant) {
        self.given_up.lock().remove(&lease.key);
        let mut leases = self.leases();
        if leases
            .get(&lease.key)
            .is_some_and(|held| held.epoch > lease.epoch)
        {
            return;
        }
        leases.insert(lease.key.clone(), lease.clone());
        drop(leases);
        self.renewed
            .lock()
            .insert(lease.key.clone(), (lease.epoch, sent));
    }

    /// Takes the leases of those of `keys` that are free or expired, in
    /// one statement (see [`PgStore::acquire_many`]): the leases taken.
    /// Each session's record, read by the same statement, serves its
    /// first [`load`](SessionStore::load) here.
    pub async fn claim_many(&self, keys: &[SessionKey]) -> Result<Vec<Lease>, StoreError> {
        let keys: Vec<SessionKey> = keys
            .iter()
            .filter(|k| self.cooling_down(k).is_none())
            .cloned()
            .collect();
        let sent = tokio::time::Instant::now();
        let patience = self.patience();
        let taken = self
            .pg
            .acquire_many_patiently(&keys, &self.node, self.ttl, patience)
            .await;
        self.reached(&taken);
        let taken = taken?;
        let mut leases = Vec::with_capacity(taken.len());
        for (lease, record) in taken {
            self.hold(&lease, sent);
            if let Ok(Some(record)) = record {
                self.prefetched
                    .lock()
                    .insert(lease.key.clone(), (lease.epoch, record));
            }
            leases.push(lease);
        }
        Ok(leases)
    }

    /// How long until this node may take `key`'s lease again, if it gave
    /// it up less than [`RETAKE_COOLDOWN`] ago; `None` otherwise.
    pub fn cooling_down(&self, key: &SessionKey) -> Option<Duration> {
        let (since, _) = *self.given_up.lock().get(key.as_str())?;
        RETAKE_COOLDOWN
            .checked_sub(since.elapsed())
            .filter(|d| !d.is_zero())
    }

    /// The sessions whose lease this node gave up within the last
    /// `within` (and has not taken since).
    fn given_up_within(&self, within: Duration) -> Vec<SessionKey> {
        self.given_up
            .lock()
            .iter()
            .filter(|(_, (at, _))| at.elapsed() < within)
            .map(|(key, _)| SessionKey::new(key))
            .collect()
    }

    /// Records that this node gave `lease` up now.
    fn give_up(&self, lease: &Lease) {
        self.given_up.lock().insert(
            lease.key.clone(),
            (tokio::time::Instant::now(), lease.epoch),
        );
    }

    /// The epoch of `key`'s lease this node gave up last, if it has not
    /// taken it since (0 if it never held one): what a write refused now
    /// names.
    fn epoch_given_up(&self, key: &str) -> u64 {
        self.given_up.lock().get(key).map_or(0, |(_, epoch)| *epoch)
    }

    /// Gives `key`'s lease up (on a clean stop).
    pub async fn release(&self, key: &SessionKey) -> Result<(), StoreError> {
        self.prefetched.lock().remove(key.as_str());
        let lease = self.leases().remove(key.as_str());
        if let Some(l) = &lease {
            self.give_up(l);
        }
        match lease {
            Some(l) => self.pg.release(&l).await,
            None => Ok(()),
        }
    }

    /// Removes `lease` if this node still holds it at that epoch.
    fn remove(&self, lease: &Lease) -> Option<Lease> {
        let mut leases = self.leases();
        let removed = match leases.get(&lease.key) {
            Some(l) if l.epoch == lease.epoch => leases.remove(&lease.key),
            _ => None,
        };
        drop(leases);
        if removed.is_some() {
            self.give_up(lease);
            self.came_home.lock().remove(&lease.key);
            self.prefetched.lock().remove(&lease.key);
            let mut renewed = self.renewed.lock();
            if renewed
                .get(&lease.key)
                .is_some_and(|(e, _)| *e == lease.epoch)
            {
                renewed.remove(&lease.key);
            }
        }
        removed
    }

    fn forget(&self, lease: &Lease) {
        if self.handing(&lease.key) {
            return; // handed to another node: not lost
        }
        if let Some(l) = self.remove(lease) {
            tracing::warn!(
                event = "pg.lease_lost",
                session = %l.key,
                epoch = l.epoch,
                "lost a session's lease: another node owns it"
            );
            let _ = self.lost.send(l);
        }
    }

    /// Whether `lease`, reported on [`lost`](Self::lost), was given up by
    /// this node's fence (it could not renew it in time) rather than taken
    /// by another node; asked once per lease.
    pub(crate) fn was_fenced(&self, lease: &Lease) -> bool {
        self.fenced.lock().remove(&(lease.key.clone(), lease.epoch))
    }

    /// Whether this node still holds `lease` (same session, same epoch).
    fn holds(&self, lease: &Lease) -> bool {
        self.leases()
            .get(&lease.key)
            .is_some_and(|l| l.epoch == lease.epoch)
    }

    /// The lease this node holds on `key`, if it believes it holds one.
    pub fn lease_of(&self, key: &SessionKey) -> Option<Lease> {
        self.leases().get(key.as_str()).cloned()
    }

    /// Runs `op`, a write under `lease`, while this node holds it: a
    /// database that does not answer pauses the write (and the session)
    /// for up to [`WRITE_PATIENCE`](crate::WRITE_PATIENCE) — a restart, a
    /// blip; a fence refusal does not wait (another node owns the
    /// session), nor does a lease this node gave up meanwhile (fenced when
    /// its time ran out with the database still away): nothing of a
    /// stopping copy lands.
    async fn while_held<T, F, Fut>(&self, lease: &Lease, op: F) -> Result<T, StoreError>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<T, StoreError>>,
    {
        let done = crate::patiently(
            |e| matches!(e, StoreError::Backend { .. }),
            || async {
                if !self.holds(lease) {
                    return Err(StoreError::LeaseLost {
                        key: lease.key.clone(),
                        epoch: lease.epoch,
                    });
                }
                op().await
            },
        )
        .await;
        self.forget_if_lost(lease, &done);
        done
    }

    fn held_or_lost(&self, key: &SessionKey) -> Result<Lease, StoreError> {
        self.lease_of(key).ok_or_else(|| StoreError::LeaseLost {
            key: key.as_str().to_owned(),
            epoch: self.epoch_given_up(key.as_str()),
        })
    }

    fn forget_if_lost<T>(&self, lease: &Lease, result: &Result<T, StoreError>) {
        if matches!(result, Err(StoreError::LeaseLost { .. })) {
            self.forget(lease);
        }
    }
}

impl SessionStore for NodeStore {
    fn load(&self, key: &SessionKey) -> BoxFuture<'_, Result<Option<SessionRecord>, StoreError>> {
        let prefetched = self.prefetched.lock().remove(key.as_str());
        if let Some((epoch, record)) = prefetched
            && self.lease_of(key).is_some_and(|l| l.epoch == epoch)
        {
            return Box::pin(std::future::ready(Ok(Some(record))));
        }
        self.pg.load(key)
    }

    fn save<'a>(
        &'a self,
        record: &'a SessionRecord,
        _durability: Durability,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            self.prefetched.lock().remove(&record.key);
            let lost = |epoch| StoreError::LeaseLost {
                key: record.key.clone(),
                epoch,
            };
            let held = self.leases().get(&record.key).cloned();
            let lease = match held {
                Some(l) => l,
                // Given up here: the copy writing is stopping (its lease
                // lost or fenced); taking the lease for it would hold the
                // session with nothing running it.
                None if self.given_up.lock().contains_key(&record.key) => {
                    return Err(lost(self.epoch_given_up(&record.key)));
                }
                // A session's first write here.
                None => match self.claim(&SessionKey::new(&record.key)).await? {
                    Some(l) => l,
                    None => return Err(lost(0)),
                },
            };
            self.while_held(&lease, || self.pg.save_fenced(&lease, record))
                .await
        })
    }

    fn list(&self) -> BoxFuture<'_, Result<Vec<Result<SessionRecord, StoreError>>, StoreError>> {
        self.pg.list()
    }
}
