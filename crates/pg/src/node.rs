//! One node of a cluster: its membership row, and the store its sessions
//! write through (leases taken on first write, renewed, fenced).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use futures_util::future::BoxFuture;
use tokio::sync::broadcast;
use tokio_util::task::AbortOnDropHandle;
use warden_core::{Durability, SessionKey, SessionRecord, SessionStore, StoreError, Supervisor};

use crate::{Lease, PgStore, backend};

/// How often a node retries renewing its leases while the database fails,
/// and how often it checks that each is still valid by its own clock.
const OUTAGE_RETRY: Duration = Duration::from_millis(100);

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

/// What one [`NodeStore::take_over`] did.
#[derive(Debug, Default, Clone, PartialEq)]
#[non_exhaustive]
pub struct TakeOver {
    /// Sessions taken and started here, with their new epoch.
    pub taken: Vec<(SessionKey, u64)>,
    /// Sessions taken that could not start here, with why; their leases
    /// were given back at once for another node.
    pub released: Vec<(SessionKey, String)>,
    /// When to run the next take-over: the [scan
    /// interval](NodeStore::scan_interval), or sooner when another node's
    /// lease on a session with waiting messages can be taken before then
    /// (so a dead node's sessions are taken as soon as the database allows,
    /// not up to a scan interval later). Never less than 10 ms (unless the
    /// scan interval is).
    pub next_scan: Duration,
}

/// The [`SessionStore`] of one node of a cluster. A session's first write
/// takes its lease (or fails with [`StoreError::LeaseLost`] while another
/// node holds it); every write goes through the fence with the epoch
/// taken; [`spawn_renewer`](Self::spawn_renewer) keeps the leases alive
/// and reports each one lost on [`lost`](Self::lost). Cheap to clone.
#[derive(Clone)]
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
    lost: broadcast::Sender<Lease>,
    /// Its turns' event batches, committed together (or, switched off,
    /// each in its own transaction).
    group: crate::group::GroupCommit,
    grouped: bool,
}

impl std::fmt::Debug for NodeStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeStore")
            .field("node", &self.node)
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

/// One orphan's outcome: taken (under that epoch), or released (why).
type Taken = Result<(SessionKey, u64), (SessionKey, String)>;

/// Orphans' sessions a node starts at once (each a round trip or two: its
/// record's first write).
const TAKEOVER_CONCURRENCY: usize = 16;

/// Orphans whose leases one statement takes: small enough that survivors
/// taking a dead node's sessions in their own random orders split them
/// (a batch is started before the next is taken), large enough that a
/// node holding thousands is taken in a few round trips.
const TAKEOVER_BATCH: usize = 64;

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
            lost,
        }
    }

    /// Commits each turn's event batch in its own transaction instead of
    /// together with the other turns' (the default, `true`): for
    /// comparison; every guarantee holds either way.
    pub fn with_group_commit(mut self, on: bool) -> Self {
        self.grouped = on;
        self
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
    /// `None` while another node holds it.
    pub async fn claim(&self, key: &SessionKey) -> Result<Option<Lease>, StoreError> {
        let sent = tokio::time::Instant::now();
        let lease = self.pg.acquire(key, &self.node, self.ttl).await?;
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
        let sent = tokio::time::Instant::now();
        let taken = self.pg.acquire_many(keys, &self.node, self.ttl).await?;
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

    /// Gives `key`'s lease up (on a clean stop).
    pub async fn release(&self, key: &SessionKey) -> Result<(), StoreError> {
        self.prefetched.lock().remove(key.as_str());
        let lease = self.leases().remove(key.as_str());
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

    /// Self-fencing: every lease whose last successful renewal was sent a
    /// TTL ago or more (the database cannot be reached, or answers too
    /// late) is given up here and reported on [`lost`](Self::lost), so
    /// its session stops on this node before the lease can be taken — the
    /// database lets another node take it only [`TAKEOVER_GRACE`] after it
    /// expires, and it expires no sooner than a TTL after that renewal was
    /// sent. The node cannot tell a partition from an outage, so in an
    /// outage longer than the TTL its sessions stop too (their messages
    /// stay pending; whichever node reaches the database first re-delivers
    /// them). Returns how many were given up.
    ///
    /// [`TAKEOVER_GRACE`]: crate::TAKEOVER_GRACE
    pub fn fence_expired(&self) -> usize {
        let now = tokio::time::Instant::now();
        // (Never both locks at once: `remove` takes them leases first.)
        let held = self.held();
        let due: Vec<Lease> = {
            let renewed = self.renewed.lock();
            held.into_iter()
                .filter(|l| match renewed.get(&l.key) {
                    Some((epoch, sent)) if *epoch == l.epoch => now >= *sent + self.ttl,
                    // Taken a moment ago, its time not written yet.
                    _ => false,
                })
                .collect()
        };
        let mut fenced = 0;
        for lease in due {
            if let Some(l) = self.remove(&lease) {
                fenced += 1;
                tracing::warn!(
                    event = "pg.lease_fenced",
                    session = %l.key,
                    epoch = l.epoch,
                    "cannot renew a session's lease in time; stopping it here before another node may take it"
                );
                let _ = self.lost.send(l);
            }
        }
        fenced
    }

    fn forget(&self, lease: &Lease) {
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

    /// The lease this node holds on `key`, if it believes it holds one.
    pub fn lease_of(&self, key: &SessionKey) -> Option<Lease> {
        self.leases().get(key.as_str()).cloned()
    }

    /// [`PgStore::open_turn`] under this node's lease of `key`:
    /// [`StoreError::LeaseLost`] (and the lease reported lost) when it holds
    /// none or it moved on.
    pub async fn open_turn(
        &self,
        key: &SessionKey,
        message_id: u64,
        id: &str,
    ) -> Result<warden_core::store::StoredTurn, StoreError> {
        let lease = self.held_or_lost(key)?;
        let opened = self.pg.open_turn(&lease, message_id, id).await;
        self.forget_if_lost(&lease, &opened);
        opened
    }

    /// Appends `events` to turn `id` under this node's lease of `key`, like
    /// [`open_turn`](Self::open_turn), in the node's next group commit
    /// (one transaction carries every turn's pending batch; see
    /// [`turn_commits`](Self::turn_commits)). Returns once that transaction
    /// has committed; [`StoreError::LeaseLost`] for this batch alone when
    /// the lease is no longer the session's.
    pub async fn append_turn(
        &self,
        key: &SessionKey,
        id: &str,
        events: &[warden_core::store::StoredEvent],
        ended: bool,
    ) -> Result<(), StoreError> {
        let lease = self.held_or_lost(key)?;
        let appended = if self.grouped {
            let batch = crate::group::TurnBatch {
                lease: lease.clone(),
                id: id.to_owned(),
                events: events.to_vec(),
                ended,
            };
            self.group.append(batch).await
        } else {
            self.pg.append_turn(&lease, id, events, ended).await
        };
        self.forget_if_lost(&lease, &appended);
        appended
    }

    /// What this node's group commit of turn events did: transactions and
    /// the batches they carried.
    pub fn turn_commits(&self) -> crate::group::GroupStats {
        self.group.stats()
    }

    fn held_or_lost(&self, key: &SessionKey) -> Result<Lease, StoreError> {
        self.lease_of(key).ok_or_else(|| StoreError::LeaseLost {
            key: key.as_str().to_owned(),
            epoch: 0,
        })
    }

    fn forget_if_lost<T>(&self, lease: &Lease, result: &Result<T, StoreError>) {
        if matches!(result, Err(StoreError::LeaseLost { .. })) {
            self.forget(lease);
        }
    }

    /// How often to run [`take_over`](Self::take_over): a quarter of the
    /// lease TTL, at most 500 ms, so a dead node's sessions are taken over
    /// within the TTL plus half a second of its last renewal.
    pub fn scan_interval(&self) -> Duration {
        (self.ttl / 4).min(Duration::from_millis(500))
    }

    /// Takes over every orphan it can (a session with acknowledged,
    /// unanswered messages whose lease ran out: its node died) and starts
    /// it in `supervisor`, which re-sends its pending messages. A session
    /// bound to a workspace directory (a Claude Code session lives where
    /// its workspace and transcript are) is taken only where that directory
    /// exists; elsewhere it stays with its lease expired until such a node
    /// takes it. Run it again after the [`next_scan`](TakeOver::next_scan)
    /// it returns (at most a [`scan_interval`](Self::scan_interval)).
    pub async fn take_over(&self, supervisor: &Supervisor) -> TakeOver {
        use futures_util::StreamExt as _;
        use rand::seq::SliceRandom as _;
        let mut done = TakeOver {
            next_scan: self.scan_interval(),
            ..TakeOver::default()
        };
        let Ok(orphans) = self.pg.orphans_with_workspaces(&self.node).await else {
            return done;
        };
        if let Some(next) = orphans.next_in {
            // A few ms past the moment, so the lease has expired by the
            // database's clock when the query arrives.
            done.next_scan = (next + Duration::from_millis(5))
                .max(Duration::from_millis(10))
                .min(done.next_scan);
        }
        let mut orphans: Vec<SessionKey> = orphans
            .sessions
            .into_iter()
            // Ours, expired while the database was away: the renewer
            // renews it at its epoch; taking it would only bump the epoch
            // under the running session.
            .filter(|(key, _)| self.lease_of(key).is_none())
            // Bound to a workspace this node does not have: for a node
            // that has it.
            .filter(|(_, workspace)| workspace.as_ref().is_none_or(|w| w.is_dir()))
            .map(|(key, _)| key)
            .collect();
        // A node that died held many sessions: their leases are taken a
        // batch per statement, in an order of this node's own, so the
        // survivors split them rather than race for each; each batch's
        // sessions are started several at a time.
        orphans.shuffle(&mut rand::rng());
        let mut outcomes = Vec::with_capacity(orphans.len());
        let mut starting = futures_util::stream::FuturesUnordered::new();
        for batch in orphans.chunks(TAKEOVER_BATCH) {
            // The sessions already taken go on starting meanwhile.
            let claim = self.claim_many(batch);
            tokio::pin!(claim);
            let leases = loop {
                tokio::select! {
                    leases = &mut claim => break leases.unwrap_or_default(),
                    Some(outcome) = starting.next(), if !starting.is_empty() => {
                        outcomes.push(outcome);
                    }
                }
            };
            for lease in leases {
                while starting.len() >= TAKEOVER_CONCURRENCY {
                    outcomes.extend(starting.next().await);
                }
                starting.push(self.start_taken(supervisor, lease));
            }
        }
        while let Some(outcome) = starting.next().await {
            outcomes.push(outcome);
        }
        for outcome in outcomes {
            match outcome {
                Ok(taken) => done.taken.push(taken),
                Err(released) => done.released.push(released),
            }
        }
        done
    }

    /// Starts the session of an orphan whose lease this node just took; one
    /// that cannot run here is released for another node.
    async fn start_taken(&self, supervisor: &Supervisor, lease: Lease) -> Taken {
        let key = SessionKey::new(&lease.key);
        match supervisor.session(key.clone()).await {
            Ok(_) => Ok((key, lease.epoch)),
            Err(e) => {
                // Not runnable here: let another node have it rather than
                // hold its lease with nothing running.
                let _ = self.release(&key).await;
                Err((key, e.to_string()))
            }
        }
    }

    /// The workspace directory `key`'s session is bound to, if this node
    /// does not have it (the session cannot run here); `None` when it has
    /// no workspace or the directory exists here (or the record cannot be
    /// read: the claim and the session's start decide then).
    pub async fn missing_workspace(&self, key: &SessionKey) -> Option<std::path::PathBuf> {
        match self.pg.load(key).await {
            Ok(Some(record)) => record.workspace.filter(|w| !w.is_dir()),
            Ok(None) | Err(_) => None,
        }
    }

    /// Renews every held lease once; the ones lost are forgotten and
    /// reported. Returns how many were lost.
    pub async fn renew_all(&self) -> Result<usize, StoreError> {
        let held = self.held();
        let sent = tokio::time::Instant::now();
        // Every lease in one statement. One that hangs (a partition drops
        // its packets) is given up after a TTL: the leases are past saving
        // by then.
        let renewed =
            tokio::time::timeout(self.ttl, self.pg.renew_many(&self.node, &held, self.ttl))
                .await
                .map_err(|_| StoreError::Backend {
                    message: format!(
                        "renewing {} leases got no answer within {:.1}s",
                        held.len(),
                        self.ttl.as_secs_f64()
                    ),
                })??;
        let mut lost = 0;
        for lease in held {
            if !renewed.contains(&lease.key) {
                self.forget(&lease);
                lost += 1;
                continue;
            }
            let still_held = self
                .leases()
                .get(&lease.key)
                .is_some_and(|l| l.epoch == lease.epoch);
            if still_held {
                self.renewed
                    .lock()
                    .insert(lease.key.clone(), (lease.epoch, sent));
            } else {
                // Fenced here while the renewal was on its way: give it
                // back, so another node need not wait for it to expire.
                let _ = self.pg.release(&lease).await;
            }
        }
        Ok(lost)
    }

    /// Renews the leases every third of the TTL until the returned handle
    /// is dropped or aborted. A renewal that fails on the database's side
    /// (unreachable) is retried at the next tick; the leases then expire on
    /// their own if it stays down, and the fence keeps writes safe.
    pub fn spawn_renewer(&self) -> AbortOnDropHandle<()> {
        let store = self.clone();
        let every = self.ttl / 3;
        let handle = tokio::spawn(async move {
            // One line when renewals start failing and one when they work
            // again: an outage is one warning, not one per tick. While they
            // fail, they are retried every 100 ms, so the leases are renewed
            // within the takeover grace once the database answers again.
            let mut failing_since: Option<tokio::time::Instant> = None;
            // Each lease's validity by this node's clock, checked apart
            // from the renewals (which may hang).
            let fencing = {
                let store = store.clone();
                AbortOnDropHandle::new(tokio::spawn(async move {
                    let mut tick = tokio::time::interval(OUTAGE_RETRY);
                    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                    loop {
                        tick.tick().await;
                        store.fence_expired();
                    }
                }))
            };
            let _fencing = fencing;
            loop {
                let wait = match failing_since {
                    Some(_) => OUTAGE_RETRY.min(every),
                    None => every,
                };
                tokio::time::sleep(wait).await;
                match (store.renew_all().await, failing_since) {
                    (Ok(_), Some(since)) => {
                        failing_since = None;
                        tracing::info!(
                            event = "pg.renew_recovered",
                            down_ms =
                                u64::try_from(since.elapsed().as_millis()).unwrap_or(u64::MAX),
                            "leases renew again"
                        );
                    }
                    (Ok(_), None) => {}
                    (Err(e), None) => {
                        failing_since = Some(tokio::time::Instant::now());
                        tracing::warn!(event = "pg.renew_failed", error = %e, "cannot renew leases; retrying every third of the TTL");
                    }
                    (Err(e), Some(_)) => {
                        tracing::debug!(event = "pg.renew_failed", error = %e, "still cannot renew leases");
                    }
                }
            }
        });
        AbortOnDropHandle::new(handle)
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
            let held = self.leases().get(&record.key).cloned();
            let lease = match held {
                Some(l) => l,
                None => {
                    let key = SessionKey::new(&record.key);
                    match self.claim(&key).await? {
                        Some(l) => l,
                        None => {
                            return Err(StoreError::LeaseLost {
                                key: record.key.clone(),
                                epoch: 0,
                            });
                        }
                    }
                }
            };
            // A database that does not answer pauses the write (and the
            // session) for up to WRITE_PATIENCE; a fence refusal does not
            // wait: another node owns the session.
            let saved = crate::patiently(
                |e| matches!(e, StoreError::Backend { .. }),
                || self.pg.save_fenced(&lease, record),
            )
            .await;
            self.forget_if_lost(&lease, &saved);
            saved
        })
    }

    fn list(&self) -> BoxFuture<'_, Result<Vec<Result<SessionRecord, StoreError>>, StoreError>> {
        self.pg.list()
    }
}
