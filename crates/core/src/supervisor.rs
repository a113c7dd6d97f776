//! The [`WorkspaceSupervisor`]: spawns sessions on demand, restarts them
//! per policy, owns the watchdog, and shuts the tree down in order.
//!
//! ```text
//! WorkspaceSupervisor
//!  ├─ WatchdogActor            (one; every stream registers here)
//!  └─ SessionActor  (per key)
//!      └─ StreamActor (per attempt)
//! ```
//!
//! Restarts follow [`Restart`] and [`RestartIntensity`], counted per
//! session. When a session fails more often than the intensity allows, the
//! supervisor *escalates*: it stops restarting that session, keeps the
//! original cause (returned by [`Supervisor::session`] for that key until
//! [`Supervisor::reset`]), logs it and publishes
//! [`LifecycleEvent::SupervisorEscalated`]. Other sessions are unaffected.
//! A failure of the watchdog is fatal to the supervisor: warden never runs
//! streams without a watchdog.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorId, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};
use tokio::sync::broadcast;
use tokio::time::Instant;

use crate::error::ActorError;
use crate::lifecycle::{EventBus, LifecycleEvent};
use crate::policy::{Restart, RestartDecision, RestartIntensity, RestartTracker};
use crate::session::{SessionActor, SessionArgs, SessionConfig, SessionHandle, TurnHandle};
use crate::source::{SessionKey, SourceFactory};
use crate::util::call;
use crate::watchdog::{WatchdogActor, WatchdogConfig, WatchdogHandle};

/// Configuration of a [`WorkspaceSupervisor`].
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct SupervisorConfig {
    /// Which session exits are restarted. Default [`Restart::Transient`].
    pub restart: Restart,
    /// Restart limit per session. Default 3 within 60 s.
    pub intensity: RestartIntensity,
    /// Configuration of every session.
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
    /// The session exceeded its restart intensity; `cause` is the failure
    /// that started it. Fatal until [`Supervisor::reset`].
    #[error("session {key} failed and was given up: {cause}")]
    SessionFailed {
        /// The session.
        key: SessionKey,
        /// The original failure.
        cause: String,
    },
    /// Actor plumbing failed (the supervisor is stopping or stopped).
    #[error(transparent)]
    Actor(#[from] ActorError),
}

/// Message of the [`WorkspaceSupervisor`]; use [`Supervisor`].
pub struct SupervisorMsg(Inner);

enum Inner {
    Session(
        SessionKey,
        RpcReplyPort<Result<SessionHandle, SupervisorError>>,
    ),
    List(RpcReplyPort<Vec<SessionKey>>),
    Reset(SessionKey),
}

/// A handle to a running supervisor tree.
#[derive(Debug, Clone)]
pub struct Supervisor {
    actor: ActorRef<SupervisorMsg>,
    watchdog: WatchdogHandle,
    bus: EventBus,
}

impl Supervisor {
    /// Starts a supervisor (and its watchdog) whose sessions get their
    /// streams from `factory`.
    pub async fn start(
        config: SupervisorConfig,
        factory: Arc<dyn SourceFactory>,
    ) -> Result<Self, ActorError> {
        Self::start_with_bus(config, factory, EventBus::default()).await
    }

    /// Like [`start`](Self::start), publishing on an existing bus.
    pub async fn start_with_bus(
        config: SupervisorConfig,
        factory: Arc<dyn SourceFactory>,
        bus: EventBus,
    ) -> Result<Self, ActorError> {
        let (tx, mut rx) = tokio::sync::oneshot::channel();
        let args = SupervisorArgs {
            config,
            factory,
            bus: bus.clone(),
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
        Ok(Self {
            actor,
            watchdog,
            bus,
        })
    }

    /// The session for `key`, spawned if it is not running.
    pub async fn session(
        &self,
        key: impl Into<SessionKey>,
    ) -> Result<SessionHandle, SupervisorError> {
        let key = key.into();
        call(
            &self.actor,
            "supervisor",
            |r| SupervisorMsg(Inner::Session(key, r)),
            None,
        )
        .await?
    }

    /// Sends `message` to the session for `key` (spawning it if needed).
    pub async fn send(
        &self,
        key: impl Into<SessionKey>,
        message: impl Into<String>,
    ) -> Result<TurnHandle, SupervisorError> {
        Ok(self.session(key).await?.submit(message)?)
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

    /// Forgets that `key` was given up, so the next message spawns it again.
    pub fn reset(&self, key: impl Into<SessionKey>) {
        let _ = self.actor.cast(SupervisorMsg(Inner::Reset(key.into())));
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
    /// `SessionStopped`.
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
    bus: EventBus,
    watchdog_tx: tokio::sync::oneshot::Sender<WatchdogHandle>,
}

/// State of the [`WorkspaceSupervisor`].
pub struct SupervisorState {
    config: SupervisorConfig,
    factory: Arc<dyn SourceFactory>,
    bus: EventBus,
    watchdog: WatchdogHandle,
    sessions: HashMap<SessionKey, SessionHandle>,
    by_id: HashMap<ActorId, SessionKey>,
    trackers: HashMap<SessionKey, RestartTracker>,
    given_up: HashMap<SessionKey, String>,
}

impl SupervisorState {
    async fn spawn_session(
        &mut self,
        myself: &ActorRef<SupervisorMsg>,
        key: SessionKey,
    ) -> Result<SessionHandle, ActorError> {
        let args = SessionArgs {
            key: key.clone(),
            source: self.factory.source_for(&key),
            watchdog: self.watchdog.clone(),
            config: self.config.session.clone(),
            bus: self.bus.clone(),
        };
        let handle = SessionActor::spawn_linked(args, myself.get_cell()).await?;
        self.by_id.insert(handle.actor().get_id(), key.clone());
        self.sessions.insert(key, handle.clone());
        Ok(handle)
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
            return Ok(());
        };
        // Only forget the handle if it is still this actor (not a newer one).
        if self
            .sessions
            .get(&key)
            .is_some_and(|h| h.actor().get_id() == id)
        {
            self.sessions.remove(&key);
        }
        self.bus.publish(LifecycleEvent::SessionStopped {
            key: key.clone(),
            reason: Some(cause.clone()),
            abnormal,
        });
        if !self.config.restart.should_restart(abnormal) {
            return Ok(());
        }
        let decision = self
            .trackers
            .entry(key.clone())
            .or_default()
            .on_failure(self.config.intensity, Instant::now());
        match decision {
            RestartDecision::Restart(n) => {
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
                if let Err(e) = self.spawn_session(myself, key.clone()).await {
                    self.escalate(key, format!("{cause}; restart failed: {e}"));
                }
            }
            RestartDecision::Escalate => self.escalate(key, cause),
        }
        Ok(())
    }

    fn escalate(&mut self, key: SessionKey, cause: String) {
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
            Inner::Session(key, reply) => {
                let result = if let Some(cause) = state.given_up.get(&key) {
                    Err(SupervisorError::SessionFailed {
                        key,
                        cause: cause.clone(),
                    })
                } else if let Some(h) = state.sessions.get(&key) {
                    Ok(h.clone())
                } else {
                    state
                        .spawn_session(&myself, key)
                        .await
                        .map_err(SupervisorError::from)
                };
                let _ = reply.send(result);
            }
            Inner::List(reply) => {
                let mut keys: Vec<_> = state.sessions.keys().cloned().collect();
                keys.sort();
                let _ = reply.send(keys);
            }
            Inner::Reset(key) => {
                state.given_up.remove(&key);
                state.trackers.remove(&key);
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
                Err(format!("watchdog failed: {err}").into())
            }
            SupervisionEvent::ActorTerminated(cell, _, reason) if cell.get_id() == watchdog_id => {
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
        _myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        // Sessions first (each stops its streams, which unwatch), then the
        // watchdog last so no stream is ever unwatched while running.
        let sessions: Vec<_> = state.sessions.drain().map(|(_, h)| h).collect();
        for h in &sessions {
            h.actor().unlink(_myself.get_cell());
        }
        let stops = sessions.iter().map(|h| {
            h.actor()
                .stop_and_wait(Some("shutdown".into()), Some(Duration::from_secs(10)))
        });
        futures_util::future::join_all(stops).await;
        state.watchdog.actor().unlink(_myself.get_cell());
        let _ = state
            .watchdog
            .actor()
            .stop_and_wait(Some("shutdown".into()), Some(Duration::from_secs(5)))
            .await;
        Ok(())
    }
}
