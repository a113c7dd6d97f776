//! The [`WatchdogActor`]: one actor watching the liveness of many streams.
//!
//! # Design
//!
//! A stream's hot path must cost nanoseconds, so frames do **not** send
//! messages. Each watched stream shares a tiny [`Heartbeat`] cell with the
//! watchdog; [`Heartbeat::beat`] stamps the current time into an atomic
//! (one clock read, one relaxed store). The watchdog keeps one deadline per
//! stream in a min-heap and sleeps until the *earliest* deadline (no fixed
//! tick). When a deadline comes due it re-reads the stamp: if a frame
//! arrived meanwhile, the deadline moves forward (re-queued), otherwise the
//! stream has been silent for its whole timeout and is killed through the
//! callback given at registration.
//!
//! Guarantees (details in `docs/runtime-semantics.md`):
//! - **No early kill**: a stream is killed only after the watchdog has
//!   *observed* `now >= last_frame + timeout`.
//! - **Bounded late kill**: the kill happens at the deadline plus the timer's
//!   1 ms granularity plus the watchdog's mailbox backlog.
//! - **One entry per stream**: any number of frames leaves one deadline.
//! - Registration happens before a request is sent, and the stamp starts at
//!   registration, so time-to-first-byte is covered.

mod table;
mod watched;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use ractor::{Actor, ActorCell, ActorProcessingErr, ActorRef, RpcReplyPort};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::config::{DEFAULT_STREAM_TIMEOUT, validate_timeout};
use crate::error::{ActorError, ConfigError};
use crate::util::call;
use table::{Cell, WatchTable};
use tokio_util::task::AbortOnDropHandle;
pub use watched::{Stopped, Stopper, Until, Watch, WatchError, WatchOptions, Watched};

/// Identifies one watched stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WatchId(u64);

impl WatchId {
    /// The raw number.
    pub fn get(self) -> u64 {
        self.0
    }
}

impl std::fmt::Display for WatchId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "w{}", self.0)
    }
}

/// What the watchdog tells a killed stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expiry {
    /// The stream.
    pub id: WatchId,
    /// Silence observed when killing (≥ `timeout`).
    pub silent_for: Duration,
    /// The allowance in force.
    pub timeout: Duration,
}

impl From<Expiry> for crate::StreamError {
    /// The error a killed stream ends with: `ESTREAM_TIMEOUT`.
    fn from(expiry: Expiry) -> Self {
        crate::StreamError::InactivityTimeout {
            silent_for: expiry.silent_for,
            timeout: expiry.timeout,
        }
    }
}

/// The callback run (once, on the watchdog's task) when a stream expires.
/// It must not block: typically it casts a message to the stream's actor.
pub(crate) type OnExpire = Box<dyn FnOnce(Expiry) + Send + 'static>;

/// Configuration of a [`WatchdogActor`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct WatchdogConfig {
    /// Silence allowance for streams registered without their own.
    /// Default 45 s, or `WARDEN_STREAM_TIMEOUT` via
    /// [`WatchdogConfig::from_env`].
    pub default_timeout: Duration,
}

impl Default for WatchdogConfig {
    fn default() -> Self {
        Self {
            default_timeout: DEFAULT_STREAM_TIMEOUT,
        }
    }
}

impl WatchdogConfig {
    /// The default configuration with `WARDEN_STREAM_TIMEOUT` applied.
    pub fn from_env() -> Result<Self, ConfigError> {
        Ok(Self {
            default_timeout: crate::config::stream_timeout_from_env()?,
        })
    }

    /// Sets the default timeout (validated: `1 ms ..= 24 h`).
    pub fn with_default_timeout(mut self, timeout: Duration) -> Result<Self, ConfigError> {
        self.default_timeout = validate_timeout("watchdog default timeout", timeout)?;
        Ok(self)
    }
}

/// Counters of a running watchdog.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct WatchdogStats {
    /// Streams currently watched.
    pub watched: usize,
    /// Deadlines queued (≥ `watched`; stale ones are dropped lazily).
    pub queued: usize,
    /// Streams killed since start.
    pub kills: u64,
}

/// Message of the [`WatchdogActor`]; build it through [`WatchdogHandle`].
pub struct WatchdogMsg(Inner);

enum Inner {
    Watch(Arc<Cell>, OnExpire),
    Unwatch(Arc<Cell>),
    Rearm(Arc<Cell>),
    Tick,
    Stats(RpcReplyPort<WatchdogStats>),
    IsWatching(WatchId, RpcReplyPort<bool>),
}

/// The liveness cell a stream's reader stamps on every frame.
///
/// Cloning is cheap; clones stamp the same cell. Dropping a `Heartbeat` does
/// not unwatch: the [`WatchGuard`] does.
#[derive(Clone)]
pub struct Heartbeat {
    id: WatchId,
    live: Arc<Cell>,
    epoch: Instant,
    watchdog: ActorRef<WatchdogMsg>,
}

impl std::fmt::Debug for Heartbeat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Heartbeat").field("id", &self.id).finish()
    }
}

impl Heartbeat {
    /// Proves the stream is alive now. Call on every raw frame (pings and
    /// keep-alive comments included). Costs one clock read and one atomic
    /// store; sends no message.
    #[inline]
    pub fn beat(&self) {
        self.live.stamp(nanos_since(self.epoch));
    }

    /// The stream this heartbeat belongs to.
    pub fn id(&self) -> WatchId {
        self.id
    }

    /// The silence allowance in force.
    pub fn timeout(&self) -> Duration {
        self.live.timeout()
    }

    /// Changes the silence allowance, e.g. while a tool runs. Takes effect
    /// from the last frame: the stream is killed once it has been silent
    /// for `timeout` since its last beat. Invalid values are rejected.
    pub fn set_timeout(&self, timeout: Duration) -> Result<(), ConfigError> {
        let timeout = validate_timeout("stream timeout", timeout)?;
        let old = self.live.set_timeout(timeout);
        if timeout < old {
            // The deadline moved earlier than the queued one: requeue it.
            let _ = self
                .watchdog
                .cast(WatchdogMsg(Inner::Rearm(self.live.clone())));
        }
        Ok(())
    }
}

/// Keeps a stream watched; unwatches it when dropped.
///
/// Hold it in the state of whatever owns the stream: every exit of that
/// owner (completion, error, cancel, kill, panic) drops it.
#[derive(Debug)]
pub struct WatchGuard {
    heartbeat: Heartbeat,
}

impl WatchGuard {
    /// A heartbeat for the reader of this stream.
    pub fn heartbeat(&self) -> Heartbeat {
        self.heartbeat.clone()
    }

    /// The watched stream.
    pub fn id(&self) -> WatchId {
        self.heartbeat.id
    }
}

impl Drop for WatchGuard {
    fn drop(&mut self) {
        let _ = self
            .heartbeat
            .watchdog
            .cast(WatchdogMsg(Inner::Unwatch(self.heartbeat.live.clone())));
    }
}

/// A cloneable handle to a running [`WatchdogActor`].
#[derive(Clone)]
pub struct WatchdogHandle {
    actor: ActorRef<WatchdogMsg>,
    epoch: Instant,
    default_timeout: Duration,
    next_id: Arc<AtomicU64>,
}

impl std::fmt::Debug for WatchdogHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WatchdogHandle")
            .field("default_timeout", &self.default_timeout)
            .finish()
    }
}

impl WatchdogHandle {
    /// Starts watching a new stream, from now. `timeout` overrides the
    /// watchdog's default for this stream. `on_expire` runs once if the
    /// stream stays silent past its timeout; the entry is then gone.
    ///
    /// Call this *before* sending the request so the time to first byte is
    /// covered.
    pub fn watch(
        &self,
        timeout: Option<Duration>,
        on_expire: impl FnOnce(Expiry) + Send + 'static,
    ) -> Result<WatchGuard, ActorError> {
        let timeout = match timeout {
            Some(t) => validate_timeout("stream timeout", t)?,
            None => self.default_timeout,
        };
        let id = WatchId(self.next_id.fetch_add(1, Ordering::Relaxed));
        let live = Arc::new(Cell::new(id, nanos_since(self.epoch), timeout));
        self.actor
            .cast(WatchdogMsg(Inner::Watch(live.clone(), Box::new(on_expire))))
            .map_err(|_| ActorError::NotRunning { what: "watchdog" })?;
        Ok(WatchGuard {
            heartbeat: Heartbeat {
                id,
                live,
                epoch: self.epoch,
                watchdog: self.actor.clone(),
            },
        })
    }

    /// The default silence allowance.
    pub fn default_timeout(&self) -> Duration {
        self.default_timeout
    }

    /// Current counters.
    pub async fn stats(&self) -> Result<WatchdogStats, ActorError> {
        call(&self.actor, "watchdog", |r| WatchdogMsg(Inner::Stats(r))).await
    }

    /// Whether `id` is still watched. Scans every queued deadline: meant
    /// for diagnostics and tests, not hot paths.
    pub async fn is_watching(&self, id: WatchId) -> Result<bool, ActorError> {
        call(&self.actor, "watchdog", |r| {
            WatchdogMsg(Inner::IsWatching(id, r))
        })
        .await
    }

    /// The underlying actor, for linking and shutdown.
    pub fn actor(&self) -> &ActorRef<WatchdogMsg> {
        &self.actor
    }
}

fn nanos_since(epoch: Instant) -> u64 {
    u64::try_from(epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// The watchdog actor. Spawn it with [`WatchdogActor::spawn`] or
/// [`WatchdogActor::spawn_linked`] and talk to it through the returned
/// [`WatchdogHandle`].
#[derive(Debug, Default, Clone, Copy)]
pub struct WatchdogActor;

/// State of the [`WatchdogActor`].
pub struct WatchdogState {
    epoch: Instant,
    table: WatchTable,
    kills: u64,
    /// The next wake-up (ns since epoch), watched by the timer task.
    wake: watch::Sender<Option<u64>>,
    _timer: AbortOnDropHandle<()>,
}

impl WatchdogActor {
    /// Spawns an unsupervised watchdog.
    pub async fn spawn(
        config: WatchdogConfig,
    ) -> Result<(WatchdogHandle, tokio::task::JoinHandle<()>), ActorError> {
        Self::spawn_inner(config, None).await
    }

    /// Spawns a watchdog supervised by `supervisor`.
    pub async fn spawn_linked(
        config: WatchdogConfig,
        supervisor: ActorCell,
    ) -> Result<(WatchdogHandle, tokio::task::JoinHandle<()>), ActorError> {
        Self::spawn_inner(config, Some(supervisor)).await
    }

    async fn spawn_inner(
        config: WatchdogConfig,
        supervisor: Option<ActorCell>,
    ) -> Result<(WatchdogHandle, tokio::task::JoinHandle<()>), ActorError> {
        let default_timeout = validate_timeout("watchdog default timeout", config.default_timeout)?;
        let epoch = Instant::now();
        let spawned = match supervisor {
            Some(s) => Actor::spawn_linked(None, WatchdogActor, epoch, s).await,
            None => Actor::spawn(None, WatchdogActor, epoch).await,
        };
        let (actor, join) = spawned.map_err(|e| ActorError::Spawn {
            what: "watchdog",
            message: e.to_string(),
        })?;
        Ok((
            WatchdogHandle {
                actor,
                epoch,
                default_timeout,
                next_id: Arc::new(AtomicU64::new(1)),
            },
            join,
        ))
    }
}

impl Actor for WatchdogActor {
    type Msg = WatchdogMsg;
    type State = WatchdogState;
    type Arguments = Instant;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        epoch: Instant,
    ) -> Result<Self::State, ActorProcessingErr> {
        let (wake, rx) = watch::channel(None);
        let timer = tokio::spawn(timer_loop(rx, epoch, myself));
        Ok(WatchdogState {
            epoch,
            table: WatchTable::default(),
            kills: 0,
            wake,
            _timer: AbortOnDropHandle::new(timer),
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        WatchdogMsg(msg): Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            Inner::Watch(cell, on_expire) => state.table.insert(cell, on_expire),
            Inner::Unwatch(cell) => {
                state.table.remove(&cell);
            }
            Inner::Rearm(cell) => state.table.rearm(&cell),
            Inner::Tick => {
                let now = nanos_since(state.epoch);
                for (expiry, on_expire) in state.table.expire(now) {
                    state.kills += 1;
                    // The kill is recorded (span, log, lifecycle event) by
                    // the stream and its session, which know whose it was.
                    tracing::trace!(watch_id = expiry.id.get(), "expiry callback");
                    on_expire(expiry);
                }
                // Always re-arm the timer after a tick, changed or not.
                let next = state.table.next_deadline();
                state.wake.send_replace(next);
                return Ok(());
            }
            Inner::Stats(reply) => {
                let _ = reply.send(WatchdogStats {
                    watched: state.table.len(),
                    queued: state.table.queued(),
                    kills: state.kills,
                });
            }
            Inner::IsWatching(id, reply) => {
                let _ = reply.send(state.table.contains(id));
            }
        }
        schedule(&myself, state);
        Ok(())
    }
}

/// Points the timer task at the earliest live deadline, waking it only
/// when that deadline changed.
fn schedule(_myself: &ActorRef<WatchdogMsg>, state: &mut WatchdogState) {
    let next = state.table.next_deadline();
    state.wake.send_if_modified(|at| {
        let changed = *at != next;
        *at = next;
        changed
    });
}

/// One long-lived task per watchdog: sleeps until the next deadline, then
/// asks the actor to expire what is due. Re-armed through `wake`; ends when
/// the actor's state (the sender) is dropped.
async fn timer_loop(
    mut wake: watch::Receiver<Option<u64>>,
    epoch: Instant,
    actor: ActorRef<WatchdogMsg>,
) {
    loop {
        let next = *wake.borrow_and_update();
        match next {
            None => {
                if wake.changed().await.is_err() {
                    return;
                }
            }
            Some(at) => {
                tokio::select! {
                    () = tokio::time::sleep_until(epoch + Duration::from_nanos(at)) => {
                        if actor.cast(WatchdogMsg(Inner::Tick)).is_err() {
                            return;
                        }
                        // The actor answers every tick with a fresh value.
                        if wake.changed().await.is_err() {
                            return;
                        }
                    }
                    changed = wake.changed() => {
                        if changed.is_err() {
                            return;
                        }
                    }
                }
            }
        }
    }
}
