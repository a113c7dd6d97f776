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
use warden_core::{LifecycleEvent, Supervisor};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Outcome {
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct State {
    state: &'static str,
}

/// The server's metrics.
pub(crate) struct Metrics {
    registry: Registry,
    sessions: Family<State, Gauge>,
    admission_queued: Gauge,
    admission_running: Gauge,
    kills: Counter,
    retries: Counter,
    continuations: Counter,
    fallbacks: Counter,
    turns: Family<Outcome, Counter>,
    turn_seconds: Histogram,
    started: Mutex<HashMap<(String, u64), Instant>>,
}

impl Metrics {
    pub(crate) fn new() -> Self {
        let mut registry = Registry::with_prefix("warden");
        let m = Self {
            sessions: Family::default(),
            admission_queued: Gauge::default(),
            admission_running: Gauge::default(),
            kills: Counter::default(),
            retries: Counter::default(),
            continuations: Counter::default(),
            fallbacks: Counter::default(),
            turns: Family::default(),
            // 0.1 s .. ~27 min.
            turn_seconds: Histogram::new(exponential_buckets(0.1, 2.0, 15)),
            started: Mutex::default(),
            registry: Registry::default(),
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
        registry.register(
            "stream_kills",
            "Streams the watchdog killed for silence",
            m.kills.clone(),
        );
        registry.register(
            "retries",
            "Attempts restarted from scratch",
            m.retries.clone(),
        );
        registry.register(
            "continuations",
            "Broken replies continued instead of replayed",
            m.continuations.clone(),
        );
        registry.register(
            "fresh_fallbacks",
            "Sessions restarted fresh after a resume failure",
            m.fallbacks.clone(),
        );
        registry.register("turns", "Turns finished, by outcome", m.turns.clone());
        registry.register(
            "turn_duration_seconds",
            "Wall time of a turn, queueing and retries included",
            m.turn_seconds.clone(),
        );
        Self { registry, ..m }
    }

    /// Counts `event`.
    pub(crate) fn observe(&self, event: &LifecycleEvent) {
        let mut started = self.started.lock();
        match event {
            LifecycleEvent::StreamTimedOut { .. } => {
                self.kills.inc();
            }
            LifecycleEvent::RetryScheduled { .. } => {
                self.retries.inc();
            }
            LifecycleEvent::ContinueScheduled { .. } => {
                self.continuations.inc();
            }
            LifecycleEvent::FreshFallback { .. } => {
                self.fallbacks.inc();
            }
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
    pub(crate) async fn render(&self, supervisor: &Supervisor) -> String {
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
