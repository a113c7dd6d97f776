//! A per-upstream circuit: an upstream that cannot be reached is not asked
//! again and again for every request of every client.
//!
//! Only *unreachable* counts — a connection that fails before any answer
//! (refused, reset, DNS, TLS, connect timeout). An upstream that answers,
//! even 529 after 529, is reachable: its answers go back to the clients,
//! whose own retries take them up, and their `retry-after` is shared
//! (warden_core's `policy::hold`). After
//! [`CircuitConfig::after`] consecutive unreachable attempts (across
//! requests, within [`CircuitConfig::window`]) the circuit opens: the
//! request that saw the last one ends at once with the cause, and new
//! requests are answered at once, in the provider's error shape, naming
//! the cause — their clients' own retries then cost no more than against
//! the unreachable upstream itself. Once per
//! [`CircuitConfig::probe_every`] one request is let through as a probe;
//! any answer from the upstream closes the circuit. Any answer also starts
//! the count again while it is closed: only failures with no answer
//! between them are consecutive. A probe that ends with neither (its
//! client hung up, the watchdog killed it, its deadline passed) frees its
//! slot when its [`Probe`] is dropped: the next one goes an interval later.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

/// When a circuit opens and how often it probes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct CircuitConfig {
    /// Consecutive unreachable attempts that open the circuit. Default 2:
    /// one backoff (0.5 s) is spent finding out, not the whole policy.
    pub after: u32,
    /// The attempts must fall within this window. Default 30 s.
    pub window: Duration,
    /// How often a request is let through as a probe while open. Default
    /// 5 s.
    pub probe_every: Duration,
}

impl Default for CircuitConfig {
    fn default() -> Self {
        Self {
            after: 2,
            window: Duration::from_secs(30),
            probe_every: Duration::from_secs(5),
        }
    }
}

impl CircuitConfig {
    /// Opens after `attempts` consecutive unreachable attempts (at least 1).
    pub fn after(mut self, attempts: u32) -> Self {
        self.after = attempts.max(1);
        self
    }

    /// Lets a probe through this often while open.
    pub fn probe_every(mut self, every: Duration) -> Self {
        self.probe_every = every;
        self
    }
}

/// Whether a request may go upstream.
#[derive(Debug)]
pub(crate) enum Pass {
    /// Yes.
    Go,
    /// Yes, as the probe of an open circuit: held until the request ends.
    Probe(Probe),
    /// No: answered at once with why.
    Refuse {
        /// The last unreachable attempt's reason.
        cause: String,
        /// When the next probe may go.
        next_probe_in: Duration,
    },
}

#[derive(Debug)]
enum State {
    Closed {
        /// Consecutive unreachable attempts, and when the first was.
        failures: u32,
        since: Option<Instant>,
    },
    Open {
        cause: String,
        /// When the last probe went (or the circuit opened).
        probed: Instant,
        /// The probe out, by its number.
        probing: Option<u64>,
    },
}

/// A circuit's state and the number of its last probe.
#[derive(Debug)]
struct Shared {
    state: State,
    probes: u64,
}

/// One upstream's circuit.
#[derive(Debug)]
pub(crate) struct Circuit {
    config: Option<CircuitConfig>,
    shared: Arc<Mutex<Shared>>,
}

/// The probe of an open circuit, out. Dropped when its request ends,
/// however it ends: a probe that got neither an answer nor an unreachable
/// attempt (its client hung up, the watchdog killed it) frees its slot,
/// and the next probe goes one interval from then.
#[derive(Debug)]
pub(crate) struct Probe {
    shared: Arc<Mutex<Shared>>,
    number: u64,
}

impl Drop for Probe {
    fn drop(&mut self) {
        let mut shared = lock(&self.shared);
        if let State::Open {
            probed, probing, ..
        } = &mut shared.state
            && *probing == Some(self.number)
        {
            *probing = None;
            *probed = Instant::now();
        }
    }
}

fn lock(shared: &Mutex<Shared>) -> MutexGuard<'_, Shared> {
    // The state is whole after any panic (each change is one store).
    shared.lock().unwrap_or_else(|p| p.into_inner())
}

impl Circuit {
    /// A closed circuit; `None` never opens.
    pub(crate) fn new(config: Option<CircuitConfig>) -> Self {
        Self {
            config,
            shared: Arc::new(Mutex::new(Shared {
                state: State::Closed {
                    failures: 0,
                    since: None,
                },
                probes: 0,
            })),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Shared> {
        lock(&self.shared)
    }

    /// Whether a new request may go upstream now.
    pub(crate) fn pass(&self) -> Pass {
        let Some(config) = self.config else {
            return Pass::Go;
        };
        let mut shared = self.lock();
        let Shared { state, probes } = &mut *shared;
        match state {
            State::Closed { .. } => Pass::Go,
            State::Open {
                cause,
                probed,
                probing,
            } => {
                let due = probed.elapsed() >= config.probe_every;
                if due && probing.is_none() {
                    *probes += 1;
                    *probing = Some(*probes);
                    *probed = Instant::now();
                    Pass::Probe(Probe {
                        shared: Arc::clone(&self.shared),
                        number: *probes,
                    })
                } else {
                    Pass::Refuse {
                        cause: cause.clone(),
                        next_probe_in: config.probe_every.saturating_sub(probed.elapsed()),
                    }
                }
            }
        }
    }

    /// The upstream answered (any status): the circuit closes, and the
    /// count of consecutive unreachable attempts starts again.
    pub(crate) fn reached(&self) {
        if self.config.is_some() {
            self.lock().state = State::Closed {
                failures: 0,
                since: None,
            };
        }
    }

    /// An attempt could not reach the upstream: whether the circuit is open
    /// now (the request should end at once, with `cause`).
    pub(crate) fn unreachable(&self, cause: &str) -> bool {
        let Some(config) = self.config else {
            return false;
        };
        let mut shared = self.lock();
        let state = &mut shared.state;
        let now = Instant::now();
        match &mut *state {
            State::Closed { failures, since } => {
                let fresh = since.is_none_or(|t| now.duration_since(t) > config.window);
                if fresh {
                    *failures = 0;
                    *since = Some(now);
                }
                *failures += 1;
                if *failures >= config.after {
                    *state = State::Open {
                        cause: cause.to_owned(),
                        probed: now,
                        probing: None,
                    };
                    return true;
                }
                false
            }
            State::Open {
                cause: last,
                probed,
                probing,
            } => {
                // A failed probe (or an attempt sent before it opened):
                // still open, the next probe one interval from now.
                *last = cause.to_owned();
                if probing.take().is_some() {
                    *probed = now;
                }
                true
            }
        }
    }

    /// Whether it is open now.
    pub(crate) fn is_open(&self) -> bool {
        matches!(self.lock().state, State::Open { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn circuit() -> Circuit {
        Circuit::new(Some(
            CircuitConfig::default()
                .after(2)
                .probe_every(Duration::from_secs(5)),
        ))
    }

    #[tokio::test(start_paused = true)]
    async fn it_opens_after_consecutive_unreachable_attempts_and_an_answer_resets_the_count() {
        let c = circuit();
        assert!(!c.unreachable("connection refused"));
        c.reached();
        assert!(!c.unreachable("connection refused"), "the count restarted");
        assert!(c.unreachable("connection refused"));
        assert!(c.is_open());
        assert!(matches!(
            c.pass(),
            Pass::Refuse { cause, next_probe_in }
                if cause == "connection refused" && next_probe_in == Duration::from_secs(5)
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn failures_spread_wider_than_the_window_do_not_open_it() {
        let c = circuit();
        assert!(!c.unreachable("reset"));
        tokio::time::advance(Duration::from_secs(31)).await;
        assert!(!c.unreachable("reset"));
        assert!(matches!(c.pass(), Pass::Go));
    }

    #[tokio::test(start_paused = true)]
    async fn one_probe_per_interval_and_an_answer_closes_it() {
        let c = circuit();
        c.unreachable("refused");
        c.unreachable("refused");
        tokio::time::advance(Duration::from_secs(5)).await;
        let probe = c.pass();
        assert!(matches!(probe, Pass::Probe(_)));
        // Only one probe at a time.
        assert!(matches!(c.pass(), Pass::Refuse { .. }));
        // The probe fails: the next one an interval later.
        assert!(c.unreachable("refused again"));
        tokio::time::advance(Duration::from_secs(4)).await;
        assert!(matches!(c.pass(), Pass::Refuse { cause, .. } if cause == "refused again"));
        drop(probe);
        tokio::time::advance(Duration::from_secs(1)).await;
        let probe = c.pass();
        assert!(matches!(probe, Pass::Probe(_)));
        c.reached();
        drop(probe);
        assert!(matches!(c.pass(), Pass::Go));
        assert!(!c.is_open());
    }

    #[test]
    fn without_a_config_it_never_opens() {
        let c = Circuit::new(None);
        for _ in 0..10 {
            assert!(!c.unreachable("refused"));
        }
        assert!(matches!(c.pass(), Pass::Go));
    }

    #[tokio::test(start_paused = true)]
    async fn a_probe_that_ends_with_no_answer_frees_its_slot_for_the_next_interval() {
        let c = circuit();
        c.unreachable("refused");
        c.unreachable("refused");
        tokio::time::advance(Duration::from_secs(5)).await;
        let probe = c.pass();
        assert!(matches!(probe, Pass::Probe(_)));
        tokio::time::advance(Duration::from_secs(7)).await;
        assert!(matches!(c.pass(), Pass::Refuse { .. }), "the probe is out");
        // Its client hung up: neither an answer nor an unreachable attempt.
        drop(probe);
        assert!(
            matches!(c.pass(), Pass::Refuse { .. }),
            "an interval from now"
        );
        tokio::time::advance(Duration::from_secs(5)).await;
        assert!(matches!(c.pass(), Pass::Probe(_)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_probe_dropped_after_the_next_went_out_leaves_the_next_one_alone() {
        let c = circuit();
        c.unreachable("refused");
        c.unreachable("refused");
        tokio::time::advance(Duration::from_secs(5)).await;
        let first = c.pass();
        assert!(c.unreachable("refused again"));
        tokio::time::advance(Duration::from_secs(5)).await;
        let second = c.pass();
        assert!(matches!(second, Pass::Probe(_)));
        drop(first);
        tokio::time::advance(Duration::from_secs(5)).await;
        assert!(matches!(c.pass(), Pass::Refuse { .. }), "the second is out");
        drop(second);
    }
}
