//! The [`WorkspaceSupervisor`]: spawns sessions on demand, restarts them
//! per policy, recovers them from failed resumes, owns the watchdog, and
//! shuts the tree down in order.
//!
//! ```text
//! WorkspaceSupervisor
//!  ├─ WatchdogActor            (one; every stream registers here)
//!  └─ SessionActor  (per key)
//!      └─ StreamActor (per attempt)
//! ```
//!
//! **Restarts** follow [`Restart`] and [`RestartIntensity`], counted per
//! session. When a session fails more often than the intensity allows, the
//! supervisor *escalates*: it stops restarting that session, keeps the
//! original cause (returned by [`Supervisor::session`] for that key until
//! [`Supervisor::reset`]), logs it and publishes
//! [`LifecycleEvent::SupervisorEscalated`]. Other sessions are unaffected.
//! A failure of the watchdog is fatal to the supervisor: warden never runs
//! streams without a watchdog.
//!
//! **Resume failures** (unknown id, prompt too long, blocking limit) arrive
//! as an [`Escalation`] from the session with every unanswered turn. The
//! supervisor logs the diagnostics, clears the stored id durably (keeping it
//! among the past ids), starts the session fresh with those turns, and
//! tells the user through the [`Notifier`]. If the fresh start fails too,
//! the record is marked failed with both causes and the user is told; there
//! is no loop.
//!
//! **Workspaces**: every path entry point ([`Supervisor::workspace`],
//! [`Supervisor::send_to_workspace`], [`Supervisor::bind`]) normalizes the
//! path first, so two spellings of one directory reach one session.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use ractor::{
    Actor, ActorId, ActorProcessingErr, ActorRef, ActorStatus, RpcReplyPort, SupervisionEvent,
};
use tokio::sync::broadcast;
use tokio::time::Instant;

use crate::error::ActorError;
use crate::lifecycle::{EventBus, LifecycleEvent};
use crate::notify::{LogNotifier, Notice, Notifier};
use crate::policy::{Restart, RestartDecision, RestartIntensity, RestartTracker};
use crate::session::{
    ESCALATED, Escalation, Handoff, REAPED, ResumeFailure, SessionActor, SessionArgs,
    SessionConfig, SessionHandle, StartMode, SubmitError, TurnEvent, TurnHandle,
};
use crate::source::{SessionKey, SourceFactory};
use crate::spans::TraceAnchor;
use crate::store::{
    Durability, MemoryStore, RecordStatus, SessionRecord, SessionStore, StoreError,
};
use crate::util::call;
use crate::watchdog::{WatchdogActor, WatchdogConfig, WatchdogHandle};
use crate::workspace::normalize_workspace;

/// Configuration of a [`WorkspaceSupervisor`].
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct SupervisorConfig {
    /// Which session exits are restarted. Default [`Restart::Transient`].
    pub restart: Restart,
    /// Restart limit per session. Default 3 within 60 s.
    pub intensity: RestartIntensity,
    /// Configuration of every session (retries, idle reap, context).
    pub session: SessionConfig,
    /// Configuration of the watchdog. Default 45 s.
    pub watchdog: WatchdogConfig,
}

impl SupervisorConfig {
    /// The defaults with `WARDEN_STREAM_TIMEOUT` applied.
    pub fn from_env() -> Result<Self, crate::ConfigError> {
        Ok(Self {
            watchdog: WatchdogConfig::from_env()?,
            ..Self::default()
        })
    }

    /// Sets the restart kind.
    pub fn with_restart(mut self, restart: Restart) -> Self {
        self.restart = restart;
        self
    }

    /// Sets the restart intensity.
    pub fn with_intensity(mut self, intensity: RestartIntensity) -> Self {
        self.intensity = intensity;
        self
    }

    /// Sets the session configuration.
    pub fn with_session(mut self, session: SessionConfig) -> Self {
        self.session = session;
        self
    }

    /// Sets the watchdog configuration.
    pub fn with_watchdog(mut self, watchdog: WatchdogConfig) -> Self {
        self.watchdog = watchdog;
        self
    }
}

/// Errors of the supervisor API.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SupervisorError {
    /// The session was given up (restart intensity exceeded, or a fresh
    /// start after a resume failure failed too); `cause` says why. Fatal
    /// until [`Supervisor::reset`].
    #[error("session {key} failed and was given up: {cause}")]
    SessionFailed {
        /// The session.
        key: SessionKey,
        /// The original failure.
        cause: String,
    },
    /// The session's record could not be read or written (corrupt, newer
    /// schema, I/O). The record is left as it is.
    #[error("session {key}: {error}")]
    Store {
        /// The session.
        key: SessionKey,
        /// The store's error.
        error: StoreError,
    },
    /// The workspace path could not be normalized.
    #[error("workspace {path}: {message}")]
    Workspace {
        /// The path as given.
        path: PathBuf,
        /// What failed.
        message: String,
    },
    /// No workspace is bound to this name.
    #[error("nothing is bound to {0:?}")]
    Unbound(String),
    /// The message could not be accepted.
    #[error(transparent)]
    Submit(#[from] SubmitError),
    /// Actor plumbing failed (the supervisor is stopping or stopped).
    #[error(transparent)]
    Actor(#[from] ActorError),
}

/// Message of the [`WorkspaceSupervisor`]; use [`Supervisor`].
pub struct SupervisorMsg(Inner);

#[allow(clippy::large_enum_variant)] // escalations are rare
enum Inner {
    Session(
        SessionKey,
        Option<PathBuf>,
        RpcReplyPort<Result<SessionHandle, SupervisorError>>,
    ),
    List(RpcReplyPort<Vec<SessionKey>>),
    Reset(SessionKey, RpcReplyPort<Result<(), SupervisorError>>),
    Escalated(Escalation),
}

/// Builds a [`Supervisor`] with a store, a notifier and a bus of your
/// choice.
pub struct SupervisorBuilder {
    config: SupervisorConfig,
    factory: Arc<dyn SourceFactory>,
    store: Arc<dyn SessionStore>,
    notifier: Arc<dyn Notifier>,
    bus: EventBus,
}

impl SupervisorBuilder {
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

    /// Publishes lifecycle events on `bus` (default: a new bus).
    pub fn bus(mut self, bus: EventBus) -> Self {
        self.bus = bus;
        self
    }

    /// Starts the supervisor and its watchdog.
    pub async fn start(self) -> Result<Supervisor, ActorError> {
        let (tx, mut rx) = tokio::sync::oneshot::channel();
        let args = SupervisorArgs {
            config: self.config,
            factory: self.factory,
            store: self.store.clone(),
            notifier: self.notifier,
            bus: self.bus.clone(),
            watchdog_tx: tx,
        };
        let (actor, _) = Actor::spawn(None, WorkspaceSupervisor, args)
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
            bus: self.bus,
            store: self.store,
            bindings: Arc::default(),
        })
    }
}

/// A handle to a running supervisor tree.
#[derive(Clone)]
pub struct Supervisor {
    actor: ActorRef<SupervisorMsg>,
    watchdog: WatchdogHandle,
    bus: EventBus,
    store: Arc<dyn SessionStore>,
    bindings: Arc<RwLock<HashMap<String, PathBuf>>>,
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
        self.session_inner(key.into(), None).await
    }

    async fn session_inner(
        &self,
        key: SessionKey,
        workspace: Option<PathBuf>,
    ) -> Result<SessionHandle, SupervisorError> {
        call(
            &self.actor,
            "supervisor",
            |r| SupervisorMsg(Inner::Session(key, workspace, r)),
            None,
        )
        .await?
    }

    /// The session of workspace `path` (normalized; its key is the
    /// normalized path).
    pub async fn workspace(
        &self,
        path: impl AsRef<Path>,
    ) -> Result<SessionHandle, SupervisorError> {
        let path = self.normalize(path.as_ref())?;
        let key = SessionKey::new(path.to_string_lossy());
        self.session_inner(key, Some(path)).await
    }

    /// Sends `message` to the session for `key` (spawning it if needed).
    /// Returns once the message is durably accepted.
    pub async fn send(
        &self,
        key: impl Into<SessionKey>,
        message: impl Into<String>,
    ) -> Result<TurnHandle, SupervisorError> {
        let key = key.into();
        self.send_inner(key, None, message.into()).await
    }

    /// Sends `message` to the session of workspace `path` (normalized).
    pub async fn send_to_workspace(
        &self,
        path: impl AsRef<Path>,
        message: impl Into<String>,
    ) -> Result<TurnHandle, SupervisorError> {
        let path = self.normalize(path.as_ref())?;
        let key = SessionKey::new(path.to_string_lossy());
        self.send_inner(key, Some(path), message.into()).await
    }

    async fn send_inner(
        &self,
        key: SessionKey,
        workspace: Option<PathBuf>,
        message: String,
    ) -> Result<TurnHandle, SupervisorError> {
        // A session may stop between lookup and submit (reaped, restarting
        // after a resume failure): look it up again once.
        let mut last = None;
        for _ in 0..3 {
            let session = self.session_inner(key.clone(), workspace.clone()).await?;
            match session.submit(message.clone()).await {
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

    /// Binds a name (a chat channel, a user) to a workspace; the path is
    /// normalized here, once.
    pub fn bind(
        &self,
        name: impl Into<String>,
        path: impl AsRef<Path>,
    ) -> Result<PathBuf, SupervisorError> {
        let path = self.normalize(path.as_ref())?;
        if let Ok(mut b) = self.bindings.write() {
            b.insert(name.into(), path.clone());
        }
        Ok(path)
    }

    /// The workspace bound to `name`.
    pub fn bound(&self, name: &str) -> Option<PathBuf> {
        self.bindings.read().ok().and_then(|b| b.get(name).cloned())
    }

    /// Sends `message` to the workspace bound to `name`.
    pub async fn send_bound(
        &self,
        name: &str,
        message: impl Into<String>,
    ) -> Result<TurnHandle, SupervisorError> {
        let path = self
            .bound(name)
            .ok_or_else(|| SupervisorError::Unbound(name.to_owned()))?;
        let key = SessionKey::new(path.to_string_lossy());
        self.send_inner(key, Some(path), message.into()).await
    }

    fn normalize(&self, path: &Path) -> Result<PathBuf, SupervisorError> {
        let normalized = normalize_workspace(path).map_err(|e| SupervisorError::Workspace {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        if normalized.as_os_str() != path.as_os_str() {
            drop(tracing::debug_span!(
                "workspace.normalize",
                warden.session.key = normalized.to_string_lossy().as_ref(),
                warden.workspace.original = path.to_string_lossy().as_ref(),
                warden.workspace = normalized.to_string_lossy().as_ref(),
            ));
            self.bus.publish(LifecycleEvent::WorkspaceNormalized {
                original: path.to_path_buf(),
                normalized: normalized.clone(),
            });
        }
        Ok(normalized)
    }

    /// Keys of the running sessions.
    pub async fn sessions(&self) -> Result<Vec<SessionKey>, ActorError> {
        call(
            &self.actor,
            "supervisor",
            |r| SupervisorMsg(Inner::List(r)),
            None,
        )
        .await
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
        call(
            &self.actor,
            "supervisor",
            |r| SupervisorMsg(Inner::Reset(key, r)),
            None,
        )
        .await?
    }

    /// Lifecycle events from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<LifecycleEvent> {
        self.bus.subscribe()
    }

    /// The watchdog of this tree.
    pub fn watchdog(&self) -> &WatchdogHandle {
        &self.watchdog
    }

    /// The supervisor actor, for linking it under your own supervisor.
    pub fn actor(&self) -> &ActorRef<SupervisorMsg> {
        &self.actor
    }

    /// Stops the tree in order: sessions (each stopping its streams first),
    /// then the watchdog, then the supervisor. Running turns end with
    /// `SessionStopped`; their messages stay pending in the store.
    pub async fn shutdown(&self) {
        let _ = self
            .actor
            .stop_and_wait(Some("shutdown".into()), Some(Duration::from_secs(30)))
            .await;
    }
}

/// Spawns and supervises sessions; see the module docs.
#[derive(Debug, Default, Clone, Copy)]
pub struct WorkspaceSupervisor;

/// Arguments of the [`WorkspaceSupervisor`].
pub struct SupervisorArgs {
    config: SupervisorConfig,
    factory: Arc<dyn SourceFactory>,
    store: Arc<dyn SessionStore>,
    notifier: Arc<dyn Notifier>,
    bus: EventBus,
    watchdog_tx: tokio::sync::oneshot::Sender<WatchdogHandle>,
}

/// State of the [`WorkspaceSupervisor`].
pub struct SupervisorState {
    config: SupervisorConfig,
    factory: Arc<dyn SourceFactory>,
    store: Arc<dyn SessionStore>,
    notifier: Arc<dyn Notifier>,
    bus: EventBus,
    watchdog: WatchdogHandle,
    sessions: HashMap<SessionKey, SessionHandle>,
    by_id: HashMap<ActorId, SessionKey>,
    trackers: HashMap<SessionKey, RestartTracker>,
    given_up: HashMap<SessionKey, String>,
}

impl SupervisorState {
    fn session_args(
        &self,
        myself: &ActorRef<SupervisorMsg>,
        key: SessionKey,
        record: SessionRecord,
        mode: StartMode,
        previous: Option<TraceAnchor>,
    ) -> SessionArgs {
        let me = myself.clone();
        SessionArgs {
            source: self.factory.source_for(&key),
            key,
            record,
            watchdog: self.watchdog.clone(),
            config: self.config.session.clone(),
            bus: self.bus.clone(),
            store: self.store.clone(),
            notifier: self.notifier.clone(),
            escalate: Some(Arc::new(move |e| {
                let _ = me.cast(SupervisorMsg(Inner::Escalated(e)));
            })),
            mode,
            previous,
        }
    }

    fn store_failed(&self, key: &SessionKey, error: &StoreError) -> SupervisorError {
        tracing::error!(session.key = %key, error = %error, "session record unusable; left untouched");
        self.bus.publish(LifecycleEvent::StoreFailed {
            key: key.clone(),
            error: error.clone(),
        });
        SupervisorError::Store {
            key: key.clone(),
            error: error.clone(),
        }
    }

    /// Loads (or creates) the record and spawns the session.
    async fn spawn_session(
        &mut self,
        myself: &ActorRef<SupervisorMsg>,
        key: SessionKey,
        workspace: Option<PathBuf>,
        restarted: Option<TraceAnchor>,
    ) -> Result<SessionHandle, SupervisorError> {
        let mut record = match self.store.load(&key).await {
            Ok(Some(r)) => r,
            Ok(None) => SessionRecord::new(&key, workspace.clone()),
            Err(e) => return Err(self.store_failed(&key, &e)),
        };
        if let RecordStatus::Failed { reason } = &record.status {
            return Err(SupervisorError::SessionFailed {
                key,
                cause: reason.clone(),
            });
        }
        if record.workspace.is_none() {
            record.workspace = workspace;
        }
        if restarted.is_some() {
            record.restart_count = record.restart_count.saturating_add(1);
        }
        let args = self.session_args(myself, key.clone(), record, StartMode::Resume, restarted);
        let handle = SessionActor::spawn_linked(args, myself.get_cell()).await?;
        self.register(&key, &handle);
        Ok(handle)
    }

    fn register(&mut self, key: &SessionKey, handle: &SessionHandle) {
        self.by_id.insert(handle.actor().get_id(), key.clone());
        self.sessions.insert(key.clone(), handle.clone());
    }

    fn forget(&mut self, key: &SessionKey) {
        if let Some(h) = self.sessions.remove(key) {
            self.by_id.remove(&h.actor().get_id());
        }
    }

    /// A session exited; restart or escalate per policy.
    async fn on_exit(
        &mut self,
        myself: &ActorRef<SupervisorMsg>,
        id: ActorId,
        abnormal: bool,
        cause: String,
    ) -> Result<(), ActorProcessingErr> {
        let Some(key) = self.by_id.remove(&id) else {
            return Ok(()); // already handled (escalated) or a stale actor
        };
        let mut anchor = TraceAnchor::default();
        if self
            .sessions
            .get(&key)
            .is_some_and(|h| h.actor().get_id() == id)
            && let Some(h) = self.sessions.remove(&key)
        {
            anchor = h.anchor().clone();
        }
        self.bus.publish(LifecycleEvent::SessionStopped {
            key: key.clone(),
            reason: Some(cause.clone()),
            abnormal,
        });
        let deliberate = cause == REAPED || cause == ESCALATED;
        // A newer incarnation already serves the key: nothing to restart.
        let replaced = self.sessions.contains_key(&key);
        if deliberate || replaced || !self.config.restart.should_restart(abnormal) {
            return Ok(());
        }
        let decision = self
            .trackers
            .entry(key.clone())
            .or_default()
            .on_failure(self.config.intensity, Instant::now());
        match decision {
            RestartDecision::Restart(n) => {
                let span = tracing::warn_span!(
                    "supervisor.restart",
                    warden.session.key = key.as_str(),
                    warden.restarts_in_window = n,
                    error.r#type = "ESESSION_FAILED",
                );
                anchor.adopt(&span);
                let _entered = span.enter();
                tracing::warn!(
                    event = "supervisor.restart",
                    session.key = %key,
                    restarts_in_window = n,
                    cause = %cause,
                    "restarting session"
                );
                self.bus.publish(LifecycleEvent::SessionRestarted {
                    key: key.clone(),
                    restarts_in_window: n,
                    cause: cause.clone(),
                });
                drop(_entered);
                if let Err(e) = self
                    .spawn_session(myself, key.clone(), None, Some(anchor.clone()))
                    .await
                {
                    self.escalate(key, format!("{cause}; restart failed: {e}"), &anchor);
                }
            }
            RestartDecision::Escalate => self.escalate(key, cause, &anchor),
        }
        Ok(())
    }

    fn escalate(&mut self, key: SessionKey, cause: String, anchor: &TraceAnchor) {
        let span = tracing::error_span!(
            "supervisor.escalate",
            warden.session.key = key.as_str(),
            error.r#type = "EESCALATED",
            otel.status_code = "ERROR",
        );
        anchor.adopt(&span);
        let _entered = span.enter();
        tracing::error!(
            event = "supervisor.escalate",
            session.key = %key,
            cause = %cause,
            "restart intensity exceeded; giving up on session"
        );
        self.bus.publish(LifecycleEvent::SupervisorEscalated {
            key: key.clone(),
            cause: cause.clone(),
        });
        self.given_up.insert(key, cause);
    }

    async fn on_resume_failure(&mut self, myself: &ActorRef<SupervisorMsg>, f: ResumeFailure) {
        let ResumeFailure {
            key,
            failed_id,
            error,
            cwd,
            diagnostics,
            mut record,
            handoff,
            anchor,
            ..
        } = f;
        let Some(cause) = error.resume_failure_cause() else {
            // Sessions escalate only errors with a resume cause.
            fail_handoff(handoff, &format!("resume failed: {error}"));
            return;
        };
        let span = tracing::error_span!(
            "session.resume_failed",
            warden.session.key = key.as_str(),
            gen_ai.conversation.id = failed_id.as_str(),
            warden.cause = cause.as_str(),
            warden.workspace = cwd
                .as_ref()
                .map(|c| c.display().to_string())
                .unwrap_or_default(),
            warden.transcript_bytes = diagnostics.transcript_bytes.unwrap_or(0),
            error.r#type = error.code(),
            otel.status_code = "ERROR",
        );
        anchor.adopt(&span);
        let entered = span.enter();
        tracing::error!(
            event = "session.resume_failed",
            session.key = %key,
            gen_ai.conversation.id = %failed_id,
            error.r#type = error.code(),
            error = %error,
            cause = %cause,
            cwd = ?cwd,
            stderr_tail = ?diagnostics.stderr_tail,
            transcript = ?diagnostics.transcript_path,
            transcript_bytes = ?diagnostics.transcript_bytes,
            "resume failed; starting fresh"
        );
        drop(entered);
        drop(span);
        self.bus.publish(LifecycleEvent::ResumeFailed {
            key: key.clone(),
            failed_id: failed_id.clone(),
            cause,
        });
        self.forget(&key);
        record.clear_agent_session_id();
        record.restart_count = record.restart_count.saturating_add(1);
        record.status = RecordStatus::Active;
        if let Err(e) = self.store.save(&record, Durability::Flushed).await {
            let err = self.store_failed(&key, &e);
            fail_handoff(handoff, &format!("{error}; and {err}"));
            self.given_up
                .insert(key, format!("resume failed: {error}; {e}"));
            return;
        }
        let redelivered = handoff.len();
        let args = self.session_args(
            myself,
            key.clone(),
            record,
            StartMode::FreshFallback {
                cause: format!("{cause}: {error}"),
            },
            Some(anchor),
        );
        match SessionActor::spawn_with_handoff(args, handoff, myself.get_cell()).await {
            Ok(handle) => {
                self.register(&key, &handle);
                tracing::warn!(
                    event = "session.fresh_fallback",
                    session.key = %key,
                    failed_id = %failed_id,
                    cwd = ?cwd,
                    redelivered,
                    "session restarted fresh; messages re-delivered"
                );
                self.bus.publish(LifecycleEvent::FreshFallback {
                    key: key.clone(),
                    failed_id: failed_id.clone(),
                    redelivered,
                });
                self.notifier.notify(
                    &key,
                    Notice::FreshStart {
                        failed_session_id: failed_id,
                        message: Notice::fresh_start_message(cause),
                        cause,
                    },
                );
            }
            Err(e) => {
                // The handoff went with the failed spawn: its callers see the
                // channel close; the messages stay pending in the record.
                let reason = format!("resume failed: {error}; fresh start failed: {e}");
                self.mark_failed(key, reason).await;
            }
        }
    }

    async fn mark_failed(&mut self, key: SessionKey, reason: String) {
        self.forget(&key);
        tracing::error!(event = "session.failed", session.key = %key, reason = %reason, "session failed");
        if let Ok(Some(mut record)) = self.store.load(&key).await {
            record.status = RecordStatus::Failed {
                reason: reason.clone(),
            };
            if let Err(e) = self.store.save(&record, Durability::Flushed).await {
                self.store_failed(&key, &e);
            }
        }
        self.bus.publish(LifecycleEvent::SessionFailed {
            key: key.clone(),
            reason: reason.clone(),
        });
        self.notifier.notify(
            &key,
            Notice::SessionFailed {
                message: format!("This session could not be started and was stopped: {reason}"),
                reason: reason.clone(),
            },
        );
        self.given_up.insert(key, reason);
    }
}

fn fail_handoff(handoff: Vec<Handoff>, reason: &str) {
    for h in handoff {
        if let Some(r) = h.reply {
            let _ = r.send(TurnEvent::Finished(Err(crate::TurnError::SessionStopped {
                reason: reason.to_owned(),
            })));
        }
    }
}

impl Actor for WorkspaceSupervisor {
    type Msg = SupervisorMsg;
    type State = SupervisorState;
    type Arguments = SupervisorArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: SupervisorArgs,
    ) -> Result<Self::State, ActorProcessingErr> {
        let (watchdog, _) =
            WatchdogActor::spawn_linked(args.config.watchdog.clone(), myself.get_cell()).await?;
        let _ = args.watchdog_tx.send(watchdog.clone());
        Ok(SupervisorState {
            config: args.config,
            factory: args.factory,
            store: args.store,
            notifier: args.notifier,
            bus: args.bus,
            watchdog,
            sessions: HashMap::new(),
            by_id: HashMap::new(),
            trackers: HashMap::new(),
            given_up: HashMap::new(),
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        SupervisorMsg(msg): Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            Inner::Session(key, workspace, reply) => {
                let result = if let Some(cause) = state.given_up.get(&key) {
                    Err(SupervisorError::SessionFailed {
                        key,
                        cause: cause.clone(),
                    })
                } else if let Some(h) = state
                    .sessions
                    .get(&key)
                    // A session that is stopping (reaped, escalated) is
                    // replaced now rather than handed out to fail.
                    .filter(|h| h.actor().get_status() < ActorStatus::Draining)
                {
                    Ok(h.clone())
                } else {
                    state.spawn_session(&myself, key, workspace, None).await
                };
                let _ = reply.send(result);
            }
            Inner::List(reply) => {
                let mut keys: Vec<_> = state.sessions.keys().cloned().collect();
                keys.sort();
                let _ = reply.send(keys);
            }
            Inner::Reset(key, reply) => {
                state.given_up.remove(&key);
                state.trackers.remove(&key);
                let result = match state.store.load(&key).await {
                    Ok(Some(mut r)) if matches!(r.status, RecordStatus::Failed { .. }) => {
                        r.status = RecordStatus::Idle;
                        state
                            .store
                            .save(&r, Durability::Flushed)
                            .await
                            .map_err(|e| state.store_failed(&key, &e))
                    }
                    Ok(_) => Ok(()),
                    Err(e) => Err(state.store_failed(&key, &e)),
                };
                let _ = reply.send(result);
            }
            Inner::Escalated(Escalation::ResumeFailed(f)) => {
                state.on_resume_failure(&myself, *f).await;
            }
            Inner::Escalated(Escalation::FreshStartFailed {
                key,
                first_cause,
                error,
            }) => {
                let reason =
                    format!("resume failed ({first_cause}); fresh start failed too: {error}");
                state.mark_failed(key, reason).await;
            }
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<Self::Msg>,
        event: SupervisionEvent,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let watchdog_id = state.watchdog.actor().get_id();
        match event {
            SupervisionEvent::ActorFailed(cell, err) if cell.get_id() == watchdog_id => {
                // ractor runs no post_stop for a failing supervisor: stop
                // the sessions (and so their streams) now, or they would
                // go on reading with nothing watching them.
                stop_sessions(&myself, state).await;
                Err(format!("watchdog failed: {err}").into())
            }
            SupervisionEvent::ActorTerminated(cell, _, reason) if cell.get_id() == watchdog_id => {
                stop_sessions(&myself, state).await;
                Err(format!("watchdog stopped: {}", reason.unwrap_or_default()).into())
            }
            SupervisionEvent::ActorFailed(cell, err) => {
                state
                    .on_exit(&myself, cell.get_id(), true, err.to_string())
                    .await
            }
            SupervisionEvent::ActorTerminated(cell, _, reason) => {
                let cause = reason.unwrap_or_else(|| "stopped".into());
                state.on_exit(&myself, cell.get_id(), false, cause).await
            }
            _ => Ok(()),
        }
    }

    async fn post_stop(
        &self,
        myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        // Sessions first (each stops its streams, which unwatch), then the
        // watchdog last so no stream is ever unwatched while running.
        stop_sessions(&myself, state).await;
        state.watchdog.actor().unlink(myself.get_cell());
        let _ = state
            .watchdog
            .actor()
            .stop_and_wait(Some("shutdown".into()), Some(Duration::from_secs(5)))
            .await;
        Ok(())
    }
}

/// Stops every session and waits for each (its stream released first).
async fn stop_sessions(myself: &ActorRef<SupervisorMsg>, state: &mut SupervisorState) {
    let sessions: Vec<_> = state.sessions.drain().map(|(_, h)| h).collect();
    for h in &sessions {
        h.actor().unlink(myself.get_cell());
    }
    let stops = sessions.iter().map(|h| {
        h.actor()
            .stop_and_wait(Some("shutdown".into()), Some(Duration::from_secs(10)))
    });
    futures_util::future::join_all(stops).await;
}
