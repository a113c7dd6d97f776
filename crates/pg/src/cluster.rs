//! A node of a warden cluster, as a library: what `warden serve --store
//! postgres://…` runs, for a binary of your own.
//!
//! A [`Node`] wraps the node's store
//! ([`NodeStore`]: leases with fencing
//! epochs over PostgreSQL) and owns its background work
//! once it has [joined](Node::join): lease renewal, membership heartbeats,
//! expiry of old turn event logs, stopping a session here the moment its
//! lease is lost, and taking over the sessions of dead nodes. It hands
//! `warden serve` (or your own front end) its [`Placement`]
//! ([`Node::placement`], run a session here only while holding its lease)
//! and its turn store ([`Node::turns`]). What it does is reported through
//! `tracing` and as typed [`NodeEvent`]s ([`Node::events`]).
//!
//! The order matters, because the supervisor needs the store and the turn
//! relay before it starts, and the node's work needs the supervisor:
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use std::time::Duration;
//! use warden_core::{EventSource, SessionKey, Supervisor};
//! use warden_pg::cluster::Node;
//! # fn my_source() -> Arc<dyn EventSource> { unimplemented!() }
//!
//! let mut node = Node::connect("postgres://warden@db:5432/warden", "node-a", Duration::from_secs(10))
//!     .await?
//!     .with_advertise("http://10.0.0.5:8080");
//! let mut events = node.events();
//! tokio::spawn(async move {
//!     while let Ok(event) = events.recv().await {
//!         eprintln!("cluster: {event}");
//!     }
//! });
//! let source = my_source();
//! let supervisor = Supervisor::builder(Arc::new(move |_: &SessionKey| source.clone()))
//!     .store(Arc::new(node.store().clone()))
//!     .start()
//!     .await?;
//! node.join(&supervisor).await?;
//! node.take_over(&supervisor).await; // the orphans waiting now
//! // … serve requests, placing sessions with `node.placement()` …
//! supervisor.shutdown().await;
//! node.leave().await; // hands this node's sessions to the others now
//! # Ok(()) }
//! ```
//!
//! `examples/cluster_node.rs` runs a whole node.

use std::sync::Arc;
use std::time::Duration;

use std::sync::atomic::{AtomicU64, Ordering};

use derive_setters::Setters;
use tokio::sync::broadcast;
use tokio_util::task::AbortOnDropHandle;

use warden_core::cluster::{NodeStats, Placement};
use warden_core::{SessionKey, StoreError, Supervisor};

use crate::{NodeStore, NodeTurns, PgConversations, PgError, PgStore};

mod balance;
mod event;
mod failover;
mod placement;
mod takeover;
use takeover::take_over;

pub use crate::node::{NodeInfo, NodeState, TakeOver};
pub use balance::{Balance, Spread, handover_order, plan};
pub use event::NodeEvent;
use event::report;

use placement::LeasePlacement;

/// How long a finished turn's event log is kept by default (as `warden
/// serve` keeps a finished turn's events): 10 minutes.
pub const DEFAULT_KEEP_TURNS: Duration = Duration::from_secs(600);

/// How often old turn event logs (and long-dead nodes) are expired.
const EXPIRE_EVERY: Duration = Duration::from_secs(60);

/// How long a node that stopped beating stays in the membership (and in
/// `warden cluster status`, marked dead) before the live nodes remove it:
/// one hour. `warden cluster forget NODE` removes a dead one at once.
pub const DEAD_NODE_RETENTION: Duration = Duration::from_secs(3600);

/// How long every move of a session between nodes is kept
/// (`warden_moves`, for `GET /v1/cluster`'s last hour): an hour.
pub const MOVES_KEPT: Duration = Duration::from_secs(3600);

/// What a node counts for `/metrics`, shared by its background work and
/// its placement.
#[derive(Debug, Default)]
struct Counters {
    leases_lost: AtomicU64,
    takeovers: AtomicU64,
    /// Sessions this node took back after it gave them up itself (a
    /// database outage) or held them last (a restart under its id): not
    /// moves, not takeovers.
    returns: AtomicU64,
    /// The members as last read, and when: shown, their ages growing,
    /// while the database cannot be read.
    members: parking_lot::Mutex<Option<(tokio::time::Instant, Vec<NodeStats>)>>,
    database_errors: AtomicU64,
    /// This node's latest database outage, as its heartbeats saw it.
    outage: parking_lot::Mutex<Outage>,
    /// How long the failovers to this node took.
    failovers: failover::Failovers,
}

/// When the heartbeats began to fail, and when they worked again.
#[derive(Debug, Default, Clone, Copy)]
struct Outage {
    since: Option<tokio::time::Instant>,
    ended: Option<tokio::time::Instant>,
    /// Outages since the node started, and their time before this one.
    count: u64,
    past: Duration,
}

impl Counters {
    fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    /// Whether this node cannot reach the database now, or could not
    /// within `window`: a session it takes over now was given up by its
    /// owner for the same outage, most likely (the takeover scan may run
    /// before the next heartbeat notices the database is back).
    fn outage_within(&self, window: Duration) -> bool {
        let outage = *self.outage.lock();
        outage.since.is_some() || outage.ended.is_some_and(|t| t.elapsed() <= window)
    }

    /// The outages so far and their time in all, the one now included.
    fn outages(&self) -> (u64, Duration) {
        let o = *self.outage.lock();
        (
            o.count,
            o.past + o.since.map_or(Duration::ZERO, |s| s.elapsed()),
        )
    }
}

/// One node of a cluster (see the [module](self) docs). Its `with_*`
/// that only set a field are derived: each field's doc below is its
/// setter's.
#[derive(Setters)]
#[setters(generate = false, prefix = "with_")]
pub struct Node {
    store: NodeStore,
    /// Where the other nodes reach this one (`http://host:port`): they
    /// forward requests for its sessions there.
    #[setters(generate, into)]
    advertise: String,
    /// How long a finished turn's event log is kept in the database before
    /// it is expired. Default [`DEFAULT_KEEP_TURNS`].
    #[setters(generate)]
    keep_turns: Duration,
    events: broadcast::Sender<NodeEvent>,
    counters: Arc<Counters>,
    /// How this node spreads the load with the others. Default
    /// [`Balance::default`].
    #[setters(generate)]
    balance: Balance,
    tasks: Vec<AbortOnDropHandle<()>>,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("node", &self.store.node())
            .field("advertise", &self.advertise)
            .field("keep_turns", &self.keep_turns)
            .field("joined", &!self.tasks.is_empty())
            .finish()
    }
}

impl Node {
    /// Connects to the cluster's database at `url` (see
    /// [`PgStore::connect`]: the schema created or migrated, TLS per
    /// `sslmode`) as the node `id`, whose session leases last `lease_ttl`
    /// unless renewed (a third of it apart while the node runs: 10 s is
    /// `warden serve`'s default). The node is
    /// [`headless`](Self::headless) until given an address
    /// ([`with_advertise`](Self::with_advertise)); it does nothing until it
    /// [joins](Self::join).
    pub async fn connect(
        url: &str,
        id: impl Into<String>,
        lease_ttl: Duration,
    ) -> Result<Self, PgError> {
        let pg = PgStore::connect(url).await?;
        Ok(Self::headless(NodeStore::new(pg, id, lease_ttl)))
    }

    /// How long after a database outage this node has the sessions it gave
    /// up for the outage to itself before the others may take them
    /// ([`DEFAULT_RETURN_GRACE`](crate::low_level::DEFAULT_RETURN_GRACE)
    /// unless set; `warden serve --return-grace`).
    pub fn with_return_grace(mut self, grace: Duration) -> Self {
        self.store = self.store.with_return_grace(grace);
        self
    }

    /// The HTTP agents' conversations in the cluster's database, so a
    /// session taken over resumes its conversation (for `warden serve`'s
    /// agents' `ConversationStore`).
    pub fn conversations(&self) -> PgConversations {
        self.store.pg().conversations()
    }

    /// The node over `store`, reached by the other nodes (which forward
    /// requests for its sessions) at `advertise` (`http://host:port`). It
    /// does nothing until it [joins](Self::join). A node with no HTTP
    /// front end is [`headless`](Self::headless).
    pub fn new(store: NodeStore, advertise: impl Into<String>) -> Self {
        let (events, _) = broadcast::channel(256);
        Self {
            store,
            advertise: advertise.into(),
            keep_turns: DEFAULT_KEEP_TURNS,
            events,
            counters: Arc::default(),
            balance: Balance::default(),
            tasks: Vec::new(),
        }
    }

    /// A node with no HTTP front end (a library user's own process that
    /// runs its sessions in-process): nothing can be forwarded to it, so
    /// its [`Elsewhere`](warden_core::cluster::Elsewhere) answers name its
    /// id with no address, and `warden cluster status` shows none. It takes
    /// part in placement, failover and takeover as any node does.
    pub fn headless(store: NodeStore) -> Self {
        Self::new(store, String::new())
    }

    /// The node's store (its [`SessionStore`](warden_core::SessionStore)).
    pub fn store(&self) -> &NodeStore {
        &self.store
    }

    /// Everything the node reports from now on. A subscriber that falls
    /// 256 events behind skips ahead (`RecvError::Lagged`).
    pub fn events(&self) -> broadcast::Receiver<NodeEvent> {
        self.events.subscribe()
    }

    /// Where sessions run: here only while this node holds the session's
    /// lease; elsewhere, the owner and how to reach it. For `warden
    /// serve`'s `ServeConfig::with_placement`.
    pub fn placement(&self) -> Arc<dyn Placement> {
        Arc::new(LeasePlacement {
            node: self.store.clone(),
            counters: self.counters.clone(),
        })
    }

    /// The node's turn event logs, for `warden serve`'s
    /// `ServeConfig::with_turn_store`.
    pub fn turns(&self) -> NodeTurns {
        self.store.turns()
    }

    /// Registers the node (its id and advertise address) and starts its
    /// background work with `supervisor`: lease renewal at a third of the
    /// TTL, heartbeats as often, turn-log expiry every minute, stopping a
    /// session here whose lease is lost, and taking over orphans every
    /// [`scan_interval`](Self::scan_interval), or as soon as another
    /// node's lease on a session with waiting messages can be taken
    /// ([`TakeOver::next_scan`]). It stops when the node
    /// is dropped or [leaves](Self::leave). Joining twice restarts it.
    pub async fn join(&mut self, supervisor: &Supervisor) -> Result<(), StoreError> {
        let store = &self.store;
        store
            .pg()
            .register_node_with_ttl(store.node(), &self.advertise, store.ttl())
            .await?;
        let ttl = store.ttl();
        let mut tasks = vec![store.spawn_renewer()];

        let (beat, events, counters) = (store.clone(), self.events.clone(), self.counters.clone());
        tasks.push(AbortOnDropHandle::new(tokio::spawn(async move {
            let mut tick = tokio::time::interval(ttl / 3);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            // Reported once per outage, and its end once.
            let mut failing_since: Option<tokio::time::Instant> = None;
            loop {
                tick.tick().await;
                let beaten = beat.pg().heartbeat(beat.node()).await;
                beat.reached(&beaten);
                match (beaten, failing_since) {
                    (Ok(_), Some(since)) => {
                        failing_since = None;
                        let mut outage = counters.outage.lock();
                        (outage.since, outage.ended) = (None, Some(tokio::time::Instant::now()));
                        outage.past += since.elapsed();
                        drop(outage);
                        report(
                            &events,
                            NodeEvent::DatabaseBack {
                                down_for: since.elapsed(),
                            },
                        );
                    }
                    (Ok(_), None) => {}
                    (Err(_), Some(_)) => Counters::add(&counters.database_errors, 1),
                    (Err(e), None) => {
                        Counters::add(&counters.database_errors, 1);
                        failing_since = Some(tokio::time::Instant::now());
                        let mut outage = counters.outage.lock();
                        (outage.since, outage.count) = (failing_since, outage.count + 1);
                        drop(outage);
                        report(
                            &events,
                            NodeEvent::HeartbeatFailed {
                                error: e.to_string(),
                            },
                        );
                    }
                }
            }
        })));

        let (pg, events, keep, counters) = (
            store.pg().clone(),
            self.events.clone(),
            self.keep_turns,
            self.counters.clone(),
        );
        tasks.push(AbortOnDropHandle::new(tokio::spawn(async move {
            let mut tick = tokio::time::interval(EXPIRE_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let expired = match pg.expire_turns(keep).await {
                    Ok(_) => pg.forget_dead_nodes(DEAD_NODE_RETENTION).await.map(|_| ()),
                    Err(e) => Err(e),
                };
                let expired = match expired {
                    Ok(()) => pg.expire_moves(MOVES_KEPT).await.map(|_| ()),
                    Err(e) => Err(e),
                };
                // Turns whose end was lost with a node that died between
                // the answer and the turn's last batch (each node's scans
                // look at the sessions it gave up itself sooner).
                let expired = match expired {
                    Ok(()) => pg.end_stranded_turns(None).await.map(|_| ()),
                    Err(e) => Err(e),
                };
                if let Err(e) = expired {
                    Counters::add(&counters.database_errors, 1);
                    // A pass cut as an outage begins fails before the
                    // heartbeat says so: give the heartbeats a TTL (three
                    // beats) to judge before warning on its own.
                    if !counters.outage_within(Duration::ZERO) {
                        tokio::time::sleep(ttl).await;
                    }
                    if counters.outage_within(ttl * 2) {
                        // Part of the outage the heartbeat reported.
                        tracing::debug!(event = "cluster.background_failed", error = %e, "cannot expire old turn logs during the outage");
                        continue;
                    }
                    report(
                        &events,
                        NodeEvent::ExpireFailed {
                            error: e.to_string(),
                        },
                    );
                }
            }
        })));

        // A lease lost (a renewal or a write refused): stop the copy here
        // now, before it answers anyone again.
        let mut lost = store.lost();
        let (sup, events, counters, fences) = (
            supervisor.clone(),
            self.events.clone(),
            self.counters.clone(),
            store.clone(),
        );
        tasks.push(AbortOnDropHandle::new(tokio::spawn(async move {
            loop {
                match lost.recv().await {
                    Ok(lease) => {
                        let key = SessionKey::new(&lease.key);
                        let _ = sup.evict(key.clone()).await;
                        let epoch = lease.epoch;
                        // Given up here for an outage is not "moved".
                        let event = match fences.was_fenced(&lease) {
                            true => NodeEvent::SessionFenced { key, epoch },
                            false => {
                                Counters::add(&counters.leases_lost, 1);
                                NodeEvent::SessionMoved { key, epoch }
                            }
                        };
                        report(&events, event);
                    }
                    Err(broadcast::error::RecvError::Lagged(_)) => {}
                    Err(broadcast::error::RecvError::Closed) => return,
                }
            }
        })));

        // Each failover to this node ends at its session's first event.
        let (mut bus, counters) = (supervisor.subscribe(), self.counters.clone());
        tasks.push(AbortOnDropHandle::new(tokio::spawn(async move {
            loop {
                match bus.recv().await {
                    Ok(e) => counters.failovers.on_event(&e),
                    Err(broadcast::error::RecvError::Lagged(_)) => {}
                    Err(broadcast::error::RecvError::Closed) => return,
                }
            }
        })));

        // Orphans: sessions with pending messages whose owner's lease ran
        // out.
        let (scan, sup, events, counters) = (
            store.clone(),
            supervisor.clone(),
            self.events.clone(),
            self.counters.clone(),
        );
        tasks.push(AbortOnDropHandle::new(tokio::spawn(async move {
            loop {
                let done = take_over(&scan, &sup, &events, &counters).await;
                tokio::time::sleep(done.next_scan).await;
            }
        })));
        // Load spreads: idle sessions handed to the members below the mean.
        tasks.push(balance::spawn(
            store.clone(),
            supervisor.clone(),
            self.balance,
        ));
        self.tasks = tasks;
        report(
            &self.events,
            NodeEvent::Joined {
                node: store.node().to_owned(),
                ttl,
            },
        );
        Ok(())
    }

    /// Leaves the cluster cleanly: stops the background work and gives up
    /// every lease this node holds, so the other nodes take its sessions
    /// (their messages pending in the database) now rather than when the
    /// leases run out. Stop the supervisor first, so nothing runs here
    /// without a lease. The node is then `left` in the membership
    /// ([`NodeState::Left`](crate::NodeState)), not alive until it is
    /// dead.
    pub async fn leave(mut self) {
        self.tasks.clear();
        for lease in self.store.held() {
            if let Err(e) = self.store.release(&SessionKey::new(&lease.key)).await {
                tracing::warn!(event = "cluster.release_failed", session.key = %lease.key, error = %e, "cannot release a lease on leaving; it expires on its own");
            }
        }
        if let Err(e) = self.store.pg().mark_node_left(self.store.node()).await {
            tracing::warn!(event = "cluster.leave_unrecorded", error = %e, "cannot record that this node left; it shows as dead once silent for its lease TTL");
        }
    }
}
