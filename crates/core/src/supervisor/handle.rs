//! The [`Supervisor`] handle and its builder.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::RwLock;
use ractor::{Actor, ActorCell, ActorRef};
use tokio::sync::broadcast;

use crate::SendOptions;
use crate::admission::Admission;
use crate::error::ActorError;
use crate::lifecycle::{EventBus, LifecycleEvent};
use crate::notify::{LogNotifier, Notifier};
use crate::session::{SessionHandle, SessionStatus, StopReason, SubmitError, TurnHandle, Unstick};
use crate::source::{SessionKey, SessionSpec, SourceFactory};
use crate::store::{MemoryStore, SessionRecord, SessionStore, StoreError};
use crate::util::call;
use crate::watchdog::WatchdogHandle;

use super::actor;
use super::state::SupervisorMsg;
use super::{SupervisorConfig, SupervisorError};

/// Builds a [`Supervisor`] with a store, a notifier and a bus of your
/// choice.
pub struct SupervisorBuilder {
    config: SupervisorConfig,
    factory: Arc<dyn SourceFactory>,
    store: Arc<dyn SessionStore>,
    notifier: Arc<dyn Notifier>,
    bus: EventBus,
    /// Whether the bus is the supervisor's own (closed at its shutdown).
    own_bus: bool,
    admission: Admission,
    recovered: Option<tokio::sync::mpsc::UnboundedSender<crate::RecoveredTurn>>,
}

impl SupervisorBuilder {
    /// Hands every message a session re-delivers at its start (accepted
    /// before a restart or, in a cluster, by a node that died) to `tx` as
    /// a [`RecoveredTurn`](crate::RecoveredTurn), so its events reach
    /// whoever relays them instead of only the notifier's final
    /// `RecoveredReply`. Default: none (the notifier answers them). If
    /// `tx`'s receiver is gone, the notifier answers them again.
    pub fn recovered_turns(
        mut self,
        tx: tokio::sync::mpsc::UnboundedSender<crate::RecoveredTurn>,
    ) -> Self {
        self.recovered = Some(tx);
        self
    }

    /// Admits its sessions' streams through `admission` (default: no
    /// limits, shared backoff on). Give several supervisors one admission
    /// (a clone) to share its limits and holds.
    pub fn admission(mut self, admission: Admission) -> Self {
        self.admission = admission;
        self
    }

    /// Sets the configuration (default: [`SupervisorConfig::default`]).
    pub fn config(mut self, config: SupervisorConfig) -> Self {
        self.config = config;
        self
    }

    /// Sets the store (default: a [`MemoryStore`]; use `warden-store`'s
    /// sled store to survive restarts).
    pub fn store(mut self, store: Arc<dyn SessionStore>) -> Self {
        self.store = store;
        self
    }

    /// Sets the notifier (default: [`LogNotifier`]).
    pub fn notifier(mut self, notifier: Arc<dyn Notifier>) -> Self {
        self.notifier = notifier;
        self
    }

    /// Publishes lifecycle events on `bus` (default: a new bus, closed when
    /// the supervisor has shut down). A bus given here may be shared, so it
    /// stays open: [`EventBus::close`] it when you are done.
    pub fn bus(mut self, bus: EventBus) -> Self {
        self.bus = bus;
        self.own_bus = false;
        self
    }

    /// Starts the supervisor and its watchdog.
    pub async fn start(self) -> Result<Supervisor, ActorError> {
        let (tx, mut rx) = tokio::sync::oneshot::channel();
        let shutdown = self.config.shutdown.tree;
        let args = actor::SupervisorArgs {
            config: self.config,
            factory: self.factory,
            store: self.store.clone(),
            notifier: self.notifier,
            bus: self.bus.clone(),
            close_bus: self.own_bus,
            admission: self.admission.clone(),
            recovered: self.recovered,
            watchdog_tx: tx,
        };
        let (actor, _) = Actor::spawn(None, actor::WorkspaceSupervisor, args)
            .await
            .map_err(|e| ActorError::Spawn {
                what: "supervisor",
                message: e.to_string(),
            })?;
        let watchdog = rx
            .try_recv()
            .map_err(|_| ActorError::NotRunning { what: "watchdog" })?;
        Ok(Supervisor {
            actor,
            watchdog,
            admission: self.admission,
            bus: self.bus,
            store: self.store,
            bindings: Arc::default(),
            shutdown,
        })
    }
}

/// A handle to a running supervisor tree.
#[derive(Clone)]
pub struct Supervisor {
    actor: ActorRef<SupervisorMsg>,
    watchdog: WatchdogHandle,
    admission: Admission,
    pub(super) bus: EventBus,
    store: Arc<dyn SessionStore>,
    pub(super) bindings: Arc<RwLock<HashMap<String, PathBuf>>>,
    shutdown: Duration,
}

impl std::fmt::Debug for Supervisor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Supervisor").finish_non_exhaustive()
    }
}

impl Supervisor {
    /// A builder for a supervisor whose sessions get their streams from
    /// `factory`.
    pub fn builder(factory: Arc<dyn SourceFactory>) -> SupervisorBuilder {
        SupervisorBuilder {
            config: SupervisorConfig::default(),
            factory,
            store: Arc::new(MemoryStore::new()),
            notifier: Arc::new(LogNotifier),
            bus: EventBus::default(),
            own_bus: true,
            admission: Admission::default(),
            recovered: None,
        }
    }

    /// Starts a supervisor with an in-memory store and the log notifier.
    pub async fn start(
        config: SupervisorConfig,
        factory: Arc<dyn SourceFactory>,
    ) -> Result<Self, ActorError> {
        Self::builder(factory).config(config).start().await
    }

    /// The session for `key`, spawned (and resumed from the store) if it is
    /// not running.
    pub async fn session(
        &self,
        key: impl Into<SessionKey>,
    ) -> Result<SessionHandle, SupervisorError> {
        self.session_inner(key.into(), None, None).await
    }

    pub(super) async fn session_inner(
        &self,
        key: SessionKey,
        workspace: Option<PathBuf>,
        spec: Option<SessionSpec>,
    ) -> Result<SessionHandle, SupervisorError> {
        call(&self.actor, "supervisor", |r| {
            SupervisorMsg::Session(key, workspace, spec, r)
        })
        .await?
    }

    /// Sends `message` to the session for `key` (spawning it if needed).
    /// Returns once the message is durably accepted.
    pub async fn send(
        &self,
        key: impl Into<SessionKey>,
        message: impl Into<String>,
    ) -> Result<TurnHandle, SupervisorError> {
        self.send_with(key, message, SendOptions::default()).await
    }

    /// [`send`](Self::send) with per-turn [`SendOptions`] (the model).
    pub async fn send_with(
        &self,
        key: impl Into<SessionKey>,
        message: impl Into<String>,
        options: SendOptions,
    ) -> Result<TurnHandle, SupervisorError> {
        let key = key.into();
        self.send_inner(key, None, None, message.into(), options)
            .await
    }

    /// [`send_with`](Self::send_with) to a session made from `spec`
    /// instead of the factory's: the role is picked per call (a planner, a
    /// worker), not by matching key strings in a `specs` factory. The spec
    /// is kept for the key from now on: every later incarnation of the
    /// session (a restart after a crash, a resume after a reap, a fresh
    /// fallback) is made from it. While the session runs, the same spec
    /// again is fine and another is refused
    /// ([`SupervisorError::SpecConflict`]: it would not apply until the
    /// next start); once it stopped, a send may give another. An agent
    /// that runs in a workspace needs one: the key's
    /// ([`SessionKey::for_workspace`]) or the spec's
    /// ([`SessionSpec::with_workspace`]); else
    /// [`SupervisorError::NoWorkspace`]. Kept in memory: after the
    /// orchestrator restarts, the first send gives it again (or the
    /// factory's is used).
    pub async fn send_with_spec(
        &self,
        key: impl Into<SessionKey>,
        spec: SessionSpec,
        message: impl Into<String>,
        options: SendOptions,
    ) -> Result<TurnHandle, SupervisorError> {
        self.send_inner(key.into(), None, Some(spec), message.into(), options)
            .await
    }

    pub(super) async fn send_inner(
        &self,
        key: SessionKey,
        workspace: Option<PathBuf>,
        spec: Option<SessionSpec>,
        message: String,
        options: SendOptions,
    ) -> Result<TurnHandle, SupervisorError> {
        // A session may stop between lookup and submit (reaped, restarting
        // after a resume failure): look it up again once.
        let mut last = None;
        for _ in 0..3 {
            let session = self
                .session_inner(key.clone(), workspace.clone(), spec.clone())
                .await?;
            match session.submit_with(message.clone(), options.clone()).await {
                Ok(t) => return Ok(t),
                Err(SubmitError::Actor(e)) => {
                    last = Some(e);
                    tokio::task::yield_now().await;
                }
                Err(e) => return Err(e.into()),
            }
        }
        Err(SupervisorError::Actor(
            last.unwrap_or(ActorError::NotRunning { what: "session" }),
        ))
    }

    /// Keys of the running sessions.
    pub async fn sessions(&self) -> Result<Vec<SessionKey>, ActorError> {
        call(&self.actor, "supervisor", SupervisorMsg::List).await
    }

    /// A snapshot of every running session, asked concurrently (a session
    /// that stops meanwhile is left out).
    pub async fn statuses(&self) -> Result<Vec<SessionStatus>, ActorError> {
        let handles = call(&self.actor, "supervisor", SupervisorMsg::Handles).await?;
        let statuses = futures_util::future::join_all(handles.iter().map(|h| h.status())).await;
        Ok(statuses.into_iter().filter_map(Result::ok).collect())
    }

    /// The running sessions whose turn has run longer than `longer_than`
    /// (queued for admission, streaming and backing off included; see
    /// [`SessionStatus::admitting`]), longest first: for operators, with
    /// [`recover`](Self::recover). A stream that keeps sending keep-alives
    /// but never finishes is alive to the watchdog; this finds it.
    pub async fn stuck(&self, longer_than: Duration) -> Result<Vec<SessionStatus>, ActorError> {
        let mut stuck: Vec<SessionStatus> = self
            .statuses()
            .await?
            .into_iter()
            .filter(|s| s.turn_running_for.is_some_and(|d| d > longer_than))
            .collect();
        stuck.sort_by_key(|s| std::cmp::Reverse(s.turn_running_for));
        Ok(stuck)
    }

    /// Unsticks session `key`'s running turn as `how` says (see
    /// [`Unstick`]); `false` when the session is not running or has
    /// nothing stuck to stop. Never starts a session.
    pub async fn recover(
        &self,
        key: impl Into<SessionKey>,
        how: Unstick,
    ) -> Result<bool, SupervisorError> {
        match self.running(key).await? {
            Some(h) => Ok(h.recover(how).await.unwrap_or(false)),
            None => Ok(false),
        }
    }

    /// Stops the running session `key` at once — its stream cancelled, its
    /// agent process stopped — and does not restart it: another node owns
    /// it now (a cluster node calls this when it loses the session's
    /// lease). Its stored record, pending messages included, is left as it
    /// is for the owner. Whether it was running.
    pub async fn evict(&self, key: impl Into<SessionKey>) -> Result<bool, ActorError> {
        match self.running(key).await? {
            Some(h) => {
                h.actor()
                    .stop(Some(crate::session::StopReason::Evicted.as_str().into()));
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// The running session `key`, if it runs (never starts one).
    pub async fn running(
        &self,
        key: impl Into<SessionKey>,
    ) -> Result<Option<SessionHandle>, ActorError> {
        let key = key.into();
        let handles = call(&self.actor, "supervisor", SupervisorMsg::Handles).await?;
        Ok(handles.into_iter().find(|h| *h.key() == key))
    }

    /// The stored record of `key`, running or not.
    pub async fn stored(&self, key: &SessionKey) -> Result<Option<SessionRecord>, StoreError> {
        self.store.load(key).await
    }

    /// Every stored record (running or not); a corrupt one is an `Err` in
    /// its slot.
    pub async fn stored_sessions(
        &self,
    ) -> Result<Vec<Result<SessionRecord, StoreError>>, StoreError> {
        self.store.list().await
    }

    /// Forgets that `key` was given up (in memory and in its record), so
    /// the next message spawns it again.
    pub async fn reset(&self, key: impl Into<SessionKey>) -> Result<(), SupervisorError> {
        let key = key.into();
        call(&self.actor, "supervisor", |r| SupervisorMsg::Reset(key, r)).await?
    }

    /// Lifecycle events from now on, as a `broadcast` receiver: it ends
    /// (`RecvError::Closed`) after the last event of
    /// [`shutdown`](Self::shutdown), and reports a gap as
    /// `RecvError::Lagged`. [`events`](Self::events) gives both as items.
    pub fn subscribe(&self) -> broadcast::Receiver<LifecycleEvent> {
        self.bus.subscribe()
    }

    /// Lifecycle events from now on: `while let Some(r) =
    /// events.recv().await` sees each event, each gap
    /// ([`Received::Lagged`](crate::lifecycle::Received::Lagged)), and ends
    /// after the last event of [`shutdown`](Self::shutdown) (every running
    /// session's `SessionStopped`).
    pub fn events(&self) -> crate::lifecycle::Subscription {
        self.bus.events()
    }

    /// The admission its sessions' streams go through (for its
    /// [`stats`](Admission::stats), or to hold a source by hand).
    pub fn admission(&self) -> &Admission {
        &self.admission
    }

    /// The watchdog of this tree.
    pub fn watchdog(&self) -> &WatchdogHandle {
        &self.watchdog
    }

    /// The supervisor's actor cell, for linking it under your own
    /// supervisor and for waiting on it.
    pub fn actor(&self) -> &ActorCell {
        &self.actor
    }

    /// Stops the tree in order: sessions (each stopping its streams first),
    /// then the watchdog, then the supervisor. Running turns end with
    /// `SessionStopped`; their messages stay pending in the store. Each
    /// session stopped publishes `SessionStopped` (reason `shutdown`), then
    /// the supervisor's own bus closes, ending its subscribers.
    pub async fn shutdown(&self) {
        let _ = self
            .actor
            .stop_and_wait(
                Some(StopReason::Shutdown.as_str().into()),
                Some(self.shutdown),
            )
            .await;
    }
}
