//! `/metrics`: counters fed by the lifecycle bus, gauges read at scrape
//! time, in the Prometheus text format (`prometheus-client`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use warden_core::cluster::{ClusterStats, Timings};
use warden_core::{LifecycleEvent, Supervisor, names};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Outcome {
    outcome: &'static str,
}

/// A transition's one name (`warden_core::names`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Named {
    transition: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct State {
    state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Member {
    node: String,
}

/// A member and what it is now (`alive`, `dead`, `left`; `unknown` when
/// the placement does not say).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MemberState {
    node: String,
    state: &'static str,
}

/// A histogram whose buckets are counted elsewhere (the placement's
/// [`Timings`]), set at each scrape.
#[derive(Debug, Clone)]
struct Counted(Arc<Mutex<Timings>>);

impl Default for Counted {
    fn default() -> Self {
        Self(Arc::new(Mutex::new(Timings::new(&[]))))
    }
}

impl prometheus_client::metrics::TypedMetric for Counted {
    const TYPE: prometheus_client::metrics::MetricType =
        prometheus_client::metrics::MetricType::Histogram;
}

impl prometheus_client::encoding::EncodeMetric for Counted {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::MetricEncoder,
    ) -> Result<(), std::fmt::Error> {
        let t = self.0.lock();
        encoder.encode_histogram::<prometheus_client::encoding::NoLabelSet>(
            t.sum_secs, t.count, &t.buckets, None,
        )
    }

    fn metric_type(&self) -> prometheus_client::metrics::MetricType {
        <Self as prometheus_client::metrics::TypedMetric>::TYPE
    }
}

/// A cluster node's metrics (`warden_cluster_*`).
struct Cluster {
    leases_held: Gauge,
    leases_lost: Counter,
    takeovers: Counter,
    returns: Counter,
    lease_ttl: Gauge<f64, std::sync::atomic::AtomicU64>,
    database_errors: Counter,
    database_outages: Counter,
    database_outage_seconds: Counter<f64, std::sync::atomic::AtomicU64>,
    failover_seconds: Counted,
    database_up: Gauge,
    database_round_trip: Gauge<f64, std::sync::atomic::AtomicU64>,
    forwarded: Family<Outcome, Counter>,
    heartbeat_age: Family<MemberState, Gauge<f64, std::sync::atomic::AtomicU64>>,
    node_sessions: Family<Member, Gauge>,
}

/// What the cluster side reports at a scrape: the placement's figures and
/// the forwarded requests by outcome (answered, unreachable).
pub(crate) struct ClusterView {
    /// The placement's figures, if it has any.
    pub(crate) stats: Option<ClusterStats>,
    /// Requests forwarded to another node and answered by it.
    pub(crate) forwarded_answered: u64,
    /// Requests whose owner could not be reached.
    pub(crate) forwarded_unreachable: u64,
}

/// Moves `counter` up to `total` (a total kept elsewhere).
fn catch_up(counter: &Counter, total: u64) {
    let now = counter.get();
    if total > now {
        counter.inc_by(total - now);
    }
}

/// The server's metrics.
pub(crate) struct Metrics {
    registry: Registry,
    sessions: Family<State, Gauge>,
    admission_queued: Gauge,
    admission_running: Gauge,
    transitions: Family<Named, Counter>,
    turns: Family<Outcome, Counter>,
    turn_seconds: Histogram,
    started: Mutex<HashMap<(String, u64), Instant>>,
    cluster: Option<Cluster>,
}

impl Metrics {
    /// The metrics of a server; `cluster` adds the cluster family.
    pub(crate) fn new(cluster: bool) -> Self {
        let mut registry = Registry::with_prefix("warden");
        let m = Self {
            sessions: Family::default(),
            admission_queued: Gauge::default(),
            admission_running: Gauge::default(),
            transitions: Family::default(),
            turns: Family::default(),
            // 0.1 s .. ~27 min.
            turn_seconds: Histogram::new(exponential_buckets(0.1, 2.0, 15)),
            started: Mutex::default(),
            registry: Registry::default(),
            cluster: None,
        };
        registry.register("sessions", "Sessions by state", m.sessions.clone());
        registry.register(
            "admission_queued",
            "Attempts waiting for admission",
            m.admission_queued.clone(),
        );
        registry.register(
            "admission_running",
            "Streams admitted and running",
            m.admission_running.clone(),
        );
        // Every published transition from the first scrape, at 0, so a
        // rate() over one that never happened yet is 0, not absent.
        for t in names::TRANSITIONS.iter().filter(|t| t.published) {
            let _ = m.transitions.get_or_create(&Named { transition: t.name });
        }
        registry.register(
            "transitions",
            "Lifecycle transitions of sessions, by their one name (stream_timed_out, retry_scheduled, continue_scheduled, fresh_fallback, ...)",
            m.transitions.clone(),
        );
        registry.register("turns", "Turns finished, by outcome", m.turns.clone());
        registry.register(
            "turn_duration_seconds",
            "Wall time of a turn, queueing and retries included",
            m.turn_seconds.clone(),
        );
        let cluster = cluster.then(|| {
            let c = Cluster {
                leases_held: Gauge::default(),
                leases_lost: Counter::default(),
                takeovers: Counter::default(),
                returns: Counter::default(),
                lease_ttl: Gauge::default(),
                database_errors: Counter::default(),
                database_outages: Counter::default(),
                database_outage_seconds: Counter::default(),
                failover_seconds: Counted::default(),
                database_up: Gauge::default(),
                database_round_trip: Gauge::default(),
                forwarded: Family::default(),
                heartbeat_age: Family::default(),
                node_sessions: Family::default(),
            };
            let r = registry.sub_registry_with_prefix("cluster");
            r.register(
                "leases_held",
                "Session leases this node holds",
                c.leases_held.clone(),
            );
            r.register(
                "leases_lost",
                "Leases this node lost to another node (its copy stopped)",
                c.leases_lost.clone(),
            );
            r.register(
                "takeovers",
                "Sessions of other nodes this node took over (their leases expired: a node died or was cut off)",
                c.takeovers.clone(),
            );
            r.register(
                "returns",
                "Sessions this node took back after giving them up itself (a database outage) or holding them last (a restart): nothing moved",
                c.returns.clone(),
            );
            r.register(
                "lease_ttl_seconds",
                "This node's lease TTL: a failover takes about this plus a scan (0.5 s) by design",
                c.lease_ttl.clone(),
            );
            r.register(
                "database_errors",
                "Failed database round trips of the node's background work and placement",
                c.database_errors.clone(),
            );
            r.register(
                "database_outages",
                "Database outages this node lived through (its heartbeats failing), the one now included",
                c.database_outages.clone(),
            );
            r.register(
                "database_outage_seconds",
                "Seconds this node could not reach the database: each outage from its first failed heartbeat to the next that worked (or now)",
                c.database_outage_seconds.clone(),
            );
            r.register(
                "failover_seconds",
                "Sessions this node took over from a dead node, each from that node's last heartbeat to the session's first lifecycle event here",
                c.failover_seconds.clone(),
            );
            r.register(
                "database_up",
                "1 when the cluster's database answered at this scrape",
                c.database_up.clone(),
            );
            r.register(
                "database_round_trip_seconds",
                "One SELECT 1 to the cluster's database, measured at this scrape",
                c.database_round_trip.clone(),
            );
            r.register(
                "forwarded",
                "Requests forwarded to the node that runs the session, by outcome",
                c.forwarded.clone(),
            );
            r.register(
                "node_heartbeat_age_seconds",
                "Seconds since each member's last heartbeat, with its state (alive, dead, left)",
                c.heartbeat_age.clone(),
            );
            r.register(
                "node_sessions",
                "Sessions whose lease each member holds",
                c.node_sessions.clone(),
            );
            c
        });
        Self {
            registry,
            cluster,
            ..m
        }
    }

    /// Counts `event`.
    pub(crate) fn observe(&self, event: &LifecycleEvent) {
        self.transitions
            .get_or_create(&Named {
                transition: event.name(),
            })
            .inc();
        let mut started = self.started.lock();
        match event {
            LifecycleEvent::TurnStarted { key, turn } => {
                started.insert((key.as_str().to_owned(), *turn), Instant::now());
            }
            LifecycleEvent::TurnFinished {
                key,
                turn,
                error_code,
                ..
            } => {
                let outcome = match error_code {
                    None => "answered",
                    Some("ECANCELLED") => "cancelled",
                    Some(_) => "failed",
                };
                self.turns.get_or_create(&Outcome { outcome }).inc();
                if let Some(t) = started.remove(&(key.as_str().to_owned(), *turn)) {
                    self.turn_seconds.observe(t.elapsed().as_secs_f64());
                }
            }
            _ => {}
        }
    }

    /// The exposition, with the gauges read now.
    pub(crate) async fn render(
        &self,
        supervisor: &Supervisor,
        view: Option<ClusterView>,
    ) -> String {
        let (mut running, mut streaming, mut queued_turns) = (0i64, 0i64, 0i64);
        for s in supervisor.statuses().await.unwrap_or_default() {
            running += 1;
            streaming += i64::from(s.streaming.is_some());
            queued_turns += i64::try_from(s.queued).unwrap_or(i64::MAX);
        }
        self.sessions
            .get_or_create(&State { state: "running" })
            .set(running);
        self.sessions
            .get_or_create(&State { state: "streaming" })
            .set(streaming);
        self.sessions
            .get_or_create(&State {
                state: "turns_queued",
            })
            .set(queued_turns);
        let a = supervisor.admission().stats();
        self.admission_queued
            .set(i64::try_from(a.queued).unwrap_or(i64::MAX));
        self.admission_running
            .set(i64::try_from(a.running).unwrap_or(i64::MAX));
        if let (Some(c), Some(view)) = (&self.cluster, view) {
            catch_up(
                &c.forwarded.get_or_create(&Outcome {
                    outcome: "answered",
                }),
                view.forwarded_answered,
            );
            catch_up(
                &c.forwarded.get_or_create(&Outcome {
                    outcome: "unreachable",
                }),
                view.forwarded_unreachable,
            );
            if let Some(stats) = view.stats {
                c.leases_held
                    .set(i64::try_from(stats.leases_held).unwrap_or(i64::MAX));
                catch_up(&c.leases_lost, stats.leases_lost);
                catch_up(&c.takeovers, stats.takeovers);
                catch_up(&c.returns, stats.returns);
                if let Some(ttl) = stats.lease_ttl {
                    c.lease_ttl.set(ttl.as_secs_f64());
                }
                catch_up(&c.database_errors, stats.database_errors);
                catch_up(&c.database_outages, stats.database_outages);
                let (outage, now) = (
                    stats.database_outage.as_secs_f64(),
                    c.database_outage_seconds.get(),
                );
                if outage > now {
                    c.database_outage_seconds.inc_by(outage - now);
                }
                *c.failover_seconds.0.lock() = stats.failovers;
                c.database_up
                    .set(i64::from(stats.database_round_trip.is_some()));
                c.database_round_trip.set(
                    stats
                        .database_round_trip
                        .map_or(f64::NAN, |d| d.as_secs_f64()),
                );
                c.heartbeat_age.clear();
                c.node_sessions.clear();
                for n in stats.nodes {
                    c.heartbeat_age
                        .get_or_create(&MemberState {
                            node: n.node.clone(),
                            state: n.state.unwrap_or("unknown"),
                        })
                        .set(n.heartbeat_age_secs);
                    let member = Member { node: n.node };
                    c.node_sessions
                        .get_or_create(&member)
                        .set(i64::try_from(n.sessions).unwrap_or(i64::MAX));
                }
            }
        }
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// Feeds `metrics` from the supervisor's lifecycle bus until it closes.
pub(crate) fn watch(supervisor: &Supervisor, metrics: Arc<Metrics>) {
    let mut rx = supervisor.subscribe();
    tokio::spawn(async move {
        use tokio::sync::broadcast::error::RecvError;
        loop {
            match rx.recv().await {
                Ok(e) => metrics.observe(&e),
                Err(RecvError::Lagged(_)) => continue,
                Err(RecvError::Closed) => return,
            }
        }
    });
}
