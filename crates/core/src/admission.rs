//! Admission control: how many streams may run at once, globally and per
//! source, and the shared backoff of a source that asked to slow down.
//!
//! A session asks for admission **before** its stream is registered with
//! the watchdog, so a turn that waits for a free slot is *queued*, not
//! silent: its wait is never counted against the silence allowance and never
//! burns an attempt. Waiting turns are admitted first come, first served
//! (FIFO within a source; a source at its own limit does not hold back the
//! turns of another source).
//!
//! **Shared backoff.** When one stream of a source fails with a server
//! `retry-after` (a 429 or 529), the whole source is *held* until that time
//! passes: no session starts a new attempt on it, instead of each session
//! retrying on its own and hammering a rate-limited API. When the hold ends
//! the waiting turns are released spread over a random delay of up to
//! [`AdmissionConfig::release_jitter`], not all in the same instant.
//!
//! The "source" of a session is a *pool* name: by default its
//! [`EventSource::provider`](crate::EventSource::provider), or the name set
//! with [`SessionSpec::with_pool`](crate::SessionSpec::with_pool) (use one
//! pool per API key when several keys have their own rate limits).
//!
//! One [`Admission`] can be shared by several supervisors (clone it): they
//! then share its limits and holds.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use derive_setters::Setters;
use parking_lot::Mutex;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tokio::sync::oneshot;
use tokio::time::Instant;

/// Default [`AdmissionConfig::release_jitter`].
pub const DEFAULT_RELEASE_JITTER: Duration = Duration::from_millis(500);

/// Limits and backoff of an [`Admission`].
#[derive(Debug, Clone, PartialEq, Eq, Setters)]
#[setters(prefix = "with_", strip_option)]
#[non_exhaustive]
pub struct AdmissionConfig {
    /// Streams running at once over every pool; `None` (default): no limit.
    #[setters(skip)]
    pub max_streams: Option<usize>,
    /// Streams running at once per pool, for the pools named here.
    #[setters(skip)]
    pub pool_limits: HashMap<String, usize>,
    /// Whether a server `retry-after` holds the whole pool (default `true`).
    /// Off, every session honours its own `retry-after` independently.
    pub shared_backoff: bool,
    /// The waiting turns of a held pool are released at random within this
    /// time after the hold ends (default [`DEFAULT_RELEASE_JITTER`]).
    pub release_jitter: Duration,
}

impl Default for AdmissionConfig {
    fn default() -> Self {
        Self {
            max_streams: None,
            pool_limits: HashMap::new(),
            shared_backoff: true,
            release_jitter: DEFAULT_RELEASE_JITTER,
        }
    }
}

impl AdmissionConfig {
    /// At most `n` streams at once over every pool (0 is taken as 1: a
    /// limit of none would queue every turn forever).
    pub fn with_max_streams(mut self, n: usize) -> Self {
        self.max_streams = Some(n.max(1));
        self
    }

    /// At most `n` streams at once in pool `pool` (0 is taken as 1).
    pub fn with_pool_limit(mut self, pool: impl Into<String>, n: usize) -> Self {
        self.pool_limits.insert(pool.into(), n.max(1));
        self
    }

    fn pool_limit(&self, pool: &str) -> Option<usize> {
        self.pool_limits.get(pool).copied()
    }
}

/// Counts of an [`Admission`] at one instant.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct AdmissionStats {
    /// Streams admitted and not yet finished.
    pub running: usize,
    /// Turns waiting for admission.
    pub queued: usize,
    /// Pools held by a shared backoff now.
    pub held_pools: usize,
}

/// Admits streams under a global and per-pool limit, FIFO, with shared
/// backoff. Cheap to clone; clones share everything.
///
/// A session asks for admission **before** its stream is registered with
/// the watchdog, so a turn that waits for a free slot is *queued*, not
/// silent: its wait never counts against the silence allowance and never
/// burns an attempt. Waiting turns are admitted first come, first served
/// (within a pool; a pool at its own limit does not hold back another).
///
/// **Shared backoff**: when a stream fails with a server `retry-after` (a
/// 429 or 529), its whole pool is held until that time passes, instead of
/// each session retrying on its own; the waiting turns are then released
/// spread over up to [`AdmissionConfig::release_jitter`].
///
/// A session's pool is its source's
/// [`provider`](crate::EventSource::provider), or the name set with
/// [`SessionSpec::with_pool`](crate::SessionSpec::with_pool) (one pool per
/// API key). Give one admission (clones) to several supervisors to share
/// its limits and holds.
#[derive(Clone, Default)]
pub struct Admission {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Admission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admission")
            .field("config", &self.inner.config)
            .field("stats", &self.stats())
            .finish()
    }
}

#[derive(Default)]
struct Inner {
    config: AdmissionConfig,
    state: Mutex<State>,
}

struct State {
    running: usize,
    pools: HashMap<Arc<str>, Pool>,
    queue: VecDeque<Waiter>,
    /// When the pending wake-up task runs, if one is pending.
    wake_at: Option<Instant>,
    rng: SmallRng,
}

impl Default for State {
    fn default() -> Self {
        Self {
            running: 0,
            pools: HashMap::new(),
            queue: VecDeque::new(),
            wake_at: None,
            rng: SmallRng::from_rng(&mut rand::rng()),
        }
    }
}

#[derive(Default)]
struct Pool {
    running: usize,
    hold_until: Option<Instant>,
}

struct Waiter {
    pool: Arc<str>,
    /// Its share of the release jitter after a hold.
    jitter: Duration,
    tx: oneshot::Sender<()>,
}

impl Admission {
    /// An admission with `config`.
    pub fn new(config: AdmissionConfig) -> Self {
        Self {
            inner: Arc::new(Inner {
                config,
                state: Mutex::default(),
            }),
        }
    }

    /// Its configuration.
    pub fn config(&self) -> &AdmissionConfig {
        &self.inner.config
    }

    /// Joins the queue of `pool` now (the place in line is taken by this
    /// call, not by the first poll). Await the ticket for the permit; drop
    /// it to leave the queue.
    pub fn enqueue(&self, pool: &str) -> Ticket {
        let (tx, rx) = oneshot::channel();
        let mut st = self.inner.state.lock();
        let max = self.inner.config.release_jitter;
        let jitter = if max.is_zero() {
            Duration::ZERO
        } else {
            st.rng.random_range(Duration::ZERO..=max)
        };
        let pool: Arc<str> = match st.pools.get_key_value(pool) {
            Some((k, _)) => k.clone(),
            None => Arc::from(pool),
        };
        st.queue.push_back(Waiter {
            pool: pool.clone(),
            jitter,
            tx,
        });
        self.inner.dispatch(&mut st);
        Ticket {
            rx,
            inner: self.inner.clone(),
            pool,
            taken: false,
        }
    }

    /// Waits for a permit to run one stream in `pool`.
    pub async fn admit(&self, pool: &str) -> AdmissionPermit {
        self.enqueue(pool).await
    }

    /// Holds `pool` for `wait` from now (extending a hold that ends
    /// sooner): no permit of the pool is granted until it passes. A no-op
    /// when shared backoff is off.
    pub fn hold(&self, pool: &str, wait: Duration) {
        if !self.inner.config.shared_backoff {
            return;
        }
        let until = Instant::now() + wait;
        let mut st = self.inner.state.lock();
        let entry = st.pools.entry(Arc::from(pool)).or_default();
        if entry.hold_until.is_none_or(|h| h < until) {
            entry.hold_until = Some(until);
        }
        self.inner.dispatch(&mut st);
    }

    /// When the hold of `pool` ends, if it is held now.
    pub fn held_until(&self, pool: &str) -> Option<Instant> {
        let st = self.inner.state.lock();
        st.pools
            .get(pool)
            .and_then(|p| p.hold_until)
            .filter(|h| *h > Instant::now())
    }

    /// Counts now.
    pub fn stats(&self) -> AdmissionStats {
        let st = self.inner.state.lock();
        let now = Instant::now();
        AdmissionStats {
            running: st.running,
            queued: st.queue.iter().filter(|w| !w.tx.is_closed()).count(),
            held_pools: st
                .pools
                .values()
                .filter(|p| p.hold_until.is_some_and(|h| h > now))
                .count(),
        }
    }
}

impl Inner {
    /// Admits every waiter that may run now, in queue order; arms a wake-up
    /// for the first one a hold still keeps back.
    fn dispatch(self: &Arc<Self>, st: &mut State) {
        let now = Instant::now();
        let mut next_wake: Option<Instant> = None;
        let State {
            running,
            pools,
            queue,
            wake_at,
            ..
        } = st;
        let mut i = 0;
        while i < queue.len() {
            if self.config.max_streams.is_some_and(|m| *running >= m) {
                break;
            }
            let w = &queue[i];
            if w.tx.is_closed() {
                queue.remove(i); // the ticket was dropped while queued
                continue;
            }
            let pool = pools.entry(w.pool.clone()).or_default();
            if let Some(h) = pool.hold_until {
                let at = h + w.jitter;
                if at > now {
                    next_wake = Some(next_wake.map_or(at, |n| n.min(at)));
                    i += 1;
                    continue;
                }
            }
            if self
                .config
                .pool_limit(&w.pool)
                .is_some_and(|l| pool.running >= l)
            {
                i += 1;
                continue;
            }
            let Some(w) = queue.remove(i) else { break };
            if w.tx.send(()).is_ok() {
                pool.running += 1;
                *running += 1;
            }
        }
        // Forget holds that are over (their jitter included), and pools with
        // nothing in them.
        let jitter = self.config.release_jitter;
        pools.retain(|_, p| {
            if p.hold_until.is_some_and(|h| h + jitter <= now) {
                p.hold_until = None;
            }
            p.running > 0 || p.hold_until.is_some()
        });
        let Some(at) = next_wake else { return };
        if wake_at.is_some_and(|w| w <= at && w > now) {
            return; // an earlier wake-up is pending; it re-arms this one
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        *wake_at = Some(at);
        let weak: Weak<Self> = Arc::downgrade(self);
        rt.spawn(async move {
            tokio::time::sleep_until(at).await;
            if let Some(inner) = weak.upgrade() {
                let mut st = inner.state.lock();
                if st.wake_at == Some(at) {
                    st.wake_at = None;
                }
                inner.dispatch(&mut st);
            }
        });
    }

    fn release(self: &Arc<Self>, pool: &str) {
        let mut st = self.state.lock();
        st.running = st.running.saturating_sub(1);
        if let Some(p) = st.pools.get_mut(pool) {
            p.running = p.running.saturating_sub(1);
        }
        self.dispatch(&mut st);
    }
}

/// A place in an [`Admission`] queue: a future resolving to the permit.
/// Dropping it leaves the queue (or gives back a permit granted but not
/// yet taken).
#[must_use = "a ticket leaves the queue when dropped"]
pub struct Ticket {
    rx: oneshot::Receiver<()>,
    inner: Arc<Inner>,
    pool: Arc<str>,
    /// The permit was granted and handed out.
    taken: bool,
}

impl std::fmt::Debug for Ticket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ticket")
            .field("pool", &self.pool)
            .field("taken", &self.taken)
            .finish()
    }
}

impl Ticket {
    /// The permit, if it was granted already (without waiting).
    pub fn try_take(&mut self) -> Option<AdmissionPermit> {
        match self.rx.try_recv() {
            Ok(()) => Some(self.take()),
            Err(_) => None,
        }
    }

    fn take(&mut self) -> AdmissionPermit {
        self.taken = true;
        AdmissionPermit {
            inner: self.inner.clone(),
            pool: self.pool.clone(),
        }
    }
}

impl Future for Ticket {
    type Output = AdmissionPermit;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if self.taken {
            return Poll::Pending; // polled after completion
        }
        match Pin::new(&mut self.rx).poll(cx) {
            Poll::Ready(Ok(())) => Poll::Ready(self.take()),
            // The sender is dropped unsent only after the receiver closed,
            // which this ticket never does while alive; stay queued.
            Poll::Ready(Err(_)) | Poll::Pending => Poll::Pending,
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if self.taken {
            return; // the permit releases itself
        }
        self.rx.close();
        if self.rx.try_recv().is_ok() {
            // Granted but never taken: give the slot back.
            self.inner.release(&self.pool);
        }
    }
}

/// The right to run one stream; the slot is given back when dropped.
pub struct AdmissionPermit {
    inner: Arc<Inner>,
    pool: Arc<str>,
}

impl std::fmt::Debug for AdmissionPermit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdmissionPermit")
            .field("pool", &self.pool)
            .finish()
    }
}

impl AdmissionPermit {
    /// The pool it counts against.
    pub fn pool(&self) -> &str {
        &self.pool
    }
}

impl Drop for AdmissionPermit {
    fn drop(&mut self) {
        self.inner.release(&self.pool);
    }
}

#[cfg(test)]
#[path = "admission_tests.rs"]
mod tests;
