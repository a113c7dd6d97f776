//! The supervisor actor: the session map, spawning, and the shutdown order.
//! A session's exit (restart or give up, its `SessionStopped`) is in
//! [`super::exit`], resume failures in [`super::fallback`].

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use ractor::{
    Actor, ActorId, ActorProcessingErr, ActorRef, ActorStatus, RpcReplyPort, SupervisionEvent,
};
use tokio::time::Instant;

use crate::admission::Admission;
use crate::lifecycle::EventBus;
use crate::notify::Notifier;
use crate::policy::{Restart, RestartIntensity, RestartTracker};
use crate::session::{
    Escalation, SessionActor, SessionArgs, SessionHandle, StartError, StartMode, StopReason,
};
use crate::source::{SessionKey, SessionSpec, SourceFactory};
use crate::spans::TraceAnchor;
use crate::store::{Durability, RecordStatus, SessionRecord, SessionStore, StoreError};
use crate::transition::{At, Parent, Transition};
use crate::watchdog::{WatchdogActor, WatchdogHandle};

use super::exit::stop_sessions;
use super::{SupervisorConfig, SupervisorError};

/// Message of the supervisor actor; use [`Supervisor`](super::Supervisor).
#[allow(clippy::large_enum_variant)] // escalations are rare
pub(crate) enum SupervisorMsg {
    Session(
        SessionKey,
        Option<PathBuf>,
        Option<SessionSpec>,
        RpcReplyPort<Result<SessionHandle, SupervisorError>>,
    ),
    List(RpcReplyPort<Vec<SessionKey>>),
    /// The running sessions' handles.
    Handles(RpcReplyPort<Vec<SessionHandle>>),
    Reset(SessionKey, RpcReplyPort<Result<(), SupervisorError>>),
    Escalated(Escalation),
    /// A restart that waited its [`RestartIntensity::delay`] is due.
    Restart {
        key: SessionKey,
        n: u32,
        cause: String,
        anchor: TraceAnchor,
    },
}

/// How many of the least recently used sessions are asked whether they are
/// idle before a session past [`SupervisorConfig::max_sessions`] is
/// refused.
const EVICTION_CANDIDATES: usize = 64;

/// Spawns and supervises sessions; see the module docs.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct WorkspaceSupervisor;

/// Arguments of the [`WorkspaceSupervisor`].
pub(crate) struct SupervisorArgs {
    pub(crate) config: SupervisorConfig,
    pub(crate) factory: Arc<dyn SourceFactory>,
    pub(crate) store: Arc<dyn SessionStore>,
    pub(crate) notifier: Arc<dyn Notifier>,
    pub(crate) bus: EventBus,
    /// Whether to close `bus` once shut down (it is the supervisor's own).
    pub(crate) close_bus: bool,
    pub(crate) admission: Admission,
    pub(crate) recovered: Option<tokio::sync::mpsc::UnboundedSender<crate::RecoveredTurn>>,
    pub(crate) watchdog_tx: tokio::sync::oneshot::Sender<WatchdogHandle>,
}

/// State of the [`WorkspaceSupervisor`].
pub(crate) struct SupervisorState {
    pub(super) config: SupervisorConfig,
    pub(super) factory: Arc<dyn SourceFactory>,
    pub(super) store: Arc<dyn SessionStore>,
    pub(super) notifier: Arc<dyn Notifier>,
    pub(super) bus: EventBus,
    pub(super) close_bus: bool,
    pub(super) watchdog: WatchdogHandle,
    pub(super) admission: Admission,
    /// Cancelled when the sessions are being stopped (the shutdown, a
    /// failed watchdog): no attempt of theirs opens a stream after that.
    pub(super) closing: tokio_util::sync::CancellationToken,
    /// Where sessions hand their recovered turns, if anyone asked.
    pub(super) recovered: Option<tokio::sync::mpsc::UnboundedSender<crate::RecoveredTurn>>,
    pub(super) sessions: HashMap<SessionKey, SessionHandle>,
    pub(super) by_id: HashMap<ActorId, SessionKey>,
    /// Sessions let go of (replaced, evicted, failed) that have not
    /// exited yet: their exit publishes `SessionStopped`, nothing else.
    /// Why each was let go of: its `SessionStopped` reason should the
    /// shutdown come before its exit.
    pub(super) stopping: HashMap<ActorId, (SessionKey, SessionHandle, StopReason)>,
    pub(super) trackers: HashMap<SessionKey, RestartTracker>,
    /// Each session's restart kind and intensity (its spec's, else the
    /// supervisor's), as of its last spawn.
    pub(super) policies: HashMap<SessionKey, (Restart, RestartIntensity)>,
    /// Specs given with a send ([`Supervisor::send_with_spec`](super::Supervisor::send_with_spec)):
    /// used instead of the factory's for every later incarnation.
    pub(super) specs: HashMap<SessionKey, SessionSpec>,
    /// Sessions given up, with the cause, until [`Supervisor::reset`](super::Supervisor::reset).
    pub(super) given_up: HashMap<SessionKey, String>,
    /// When each live session was last asked for: the least recently used
    /// idle one makes room past [`SupervisorConfig::max_sessions`].
    pub(super) last_used: HashMap<SessionKey, Instant>,
}

impl SupervisorState {
    /// Where a transition of session `key` is recorded.
    pub(super) fn at<'a>(&'a self, key: &'a SessionKey, parent: Parent<'a>) -> At<'a> {
        At {
            key,
            conversation: None,
            parent,
            bus: Some(&self.bus),
        }
    }

    pub(super) fn session_args(
        &mut self,
        myself: &ActorRef<SupervisorMsg>,
        key: SessionKey,
        record: SessionRecord,
        mode: StartMode,
        previous: Option<TraceAnchor>,
    ) -> SessionArgs {
        let me = myself.clone();
        let spec = match self.specs.get(&key) {
            Some(spec) => spec.clone(),
            None => self.factory.spec_for(&key),
        };
        self.policies.insert(
            key.clone(),
            (
                spec.restart.unwrap_or(self.config.restart),
                spec.intensity.unwrap_or(self.config.intensity),
            ),
        );
        let pool = spec
            .pool
            .clone()
            .map_or_else(|| Arc::from(spec.source.provider()), Arc::from);
        SessionArgs {
            admission: self.admission.clone(),
            pool,
            source: spec.source,
            key,
            record,
            watchdog: self.watchdog.clone(),
            config: spec.config.unwrap_or_else(|| self.config.session.clone()),
            bus: self.bus.clone(),
            store: self.store.clone(),
            notifier: self.notifier.clone(),
            escalate: Some(Arc::new(move |e| {
                let _ = me.cast(SupervisorMsg::Escalated(e));
            })),
            recovered: self.recovered.clone(),
            mode,
            previous,
            closing: self.closing.clone(),
        }
    }

    /// Records an unusable record and makes it the caller's error.
    pub(super) fn store_failed(&self, key: &SessionKey, error: &StoreError) -> SupervisorError {
        Transition::StoreFailed { error }.record(self.at(key, Parent::Root));
        SupervisorError::Store {
            key: key.clone(),
            error: error.clone(),
        }
    }

    /// Loads (or creates) the record and spawns the session.
    pub(super) async fn spawn_session(
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
            record.workspace = match workspace {
                Some(dir) => Some(dir),
                None => self.workspace_of(&key)?,
            };
        }
        if restarted.is_some() {
            record.restart_count = record.restart_count.saturating_add(1);
        }
        let args = self.session_args(myself, key.clone(), record, StartMode::Resume, restarted);
        let (handle, _) = SessionActor::spawn(args, Vec::new(), Some(myself.get_cell()))
            .await
            .map_err(|e| match e {
                StartError::Store(e) => self.store_failed(&key, &e),
                StartError::Actor(e) => e.into(),
            })?;
        self.register(&key, &handle);
        Ok(handle)
    }

    /// The workspace of a session started with none named: its spec's,
    /// else its key's when the key is a workspace's
    /// ([`SessionKey::for_workspace`]: an absolute path); `None` when its
    /// agent needs none, and [`SupervisorError::NoWorkspace`] when it does.
    fn workspace_of(&self, key: &SessionKey) -> Result<Option<PathBuf>, SupervisorError> {
        let spec = match self.specs.get(key) {
            Some(spec) => spec.clone(),
            None => self.factory.spec_for(key),
        };
        if let Some(dir) = &spec.workspace {
            return crate::workspace::normalize_workspace(dir)
                .map(Some)
                .map_err(|e| SupervisorError::Workspace {
                    path: dir.clone(),
                    message: e.to_string(),
                });
        }
        if !spec.source.runs_in_workspace() {
            return Ok(None);
        }
        let path = PathBuf::from(key.as_str());
        if path.is_absolute() {
            return Ok(Some(path));
        }
        Err(SupervisorError::NoWorkspace { key: key.clone() })
    }

    pub(super) fn register(&mut self, key: &SessionKey, handle: &SessionHandle) {
        self.by_id.insert(handle.actor().get_id(), key.clone());
        self.sessions.insert(key.clone(), handle.clone());
    }

    /// Lets go of `key`'s running session, which stops for `why`.
    pub(super) fn forget(&mut self, key: &SessionKey, why: StopReason) {
        if let Some(h) = self.sessions.remove(key) {
            let id = h.actor().get_id();
            self.by_id.remove(&id);
            self.stopping.insert(id, (key.clone(), h, why));
        }
        self.last_used.remove(key);
    }

    /// Past [`SupervisorConfig::max_sessions`], stops the least recently
    /// used idle session to make room for `key`; `TooManySessions` when
    /// none of the oldest [`EVICTION_CANDIDATES`] is idle.
    async fn make_room(&mut self, key: &SessionKey) -> Result<(), SupervisorError> {
        let Some(limit) = self.config.max_sessions else {
            return Ok(());
        };
        let live = |h: &SessionHandle| h.actor().get_status() < ActorStatus::Draining;
        if self.sessions.values().filter(|h| live(h)).count() < limit {
            return Ok(());
        }
        let mut candidates: Vec<(Instant, SessionKey, SessionHandle)> = self
            .sessions
            .iter()
            .filter(|(_, h)| live(h))
            .map(|(k, h)| {
                let used = self.last_used.get(k).copied().unwrap_or_else(Instant::now);
                (used, k.clone(), h.clone())
            })
            .collect();
        candidates.sort_by_key(|(used, ..)| *used);
        for (_, old, handle) in candidates.into_iter().take(EVICTION_CANDIDATES) {
            if handle.stop_if_idle().await {
                // Stopping now (its record kept, status idle); it is not
                // counted from here on.
                self.forget(&old, StopReason::Reaped);
                return Ok(());
            }
        }
        Err(SupervisorError::TooManySessions {
            key: key.clone(),
            limit,
        })
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
            close_bus: args.close_bus,
            watchdog,
            admission: args.admission,
            closing: tokio_util::sync::CancellationToken::new(),
            recovered: args.recovered,
            sessions: HashMap::new(),
            by_id: HashMap::new(),
            stopping: HashMap::new(),
            trackers: HashMap::new(),
            policies: HashMap::new(),
            specs: HashMap::new(),
            given_up: HashMap::new(),
            last_used: HashMap::new(),
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            SupervisorMsg::Session(key, workspace, spec, reply) => {
                let running = state
                    .sessions
                    .get(&key)
                    .is_some_and(|h| h.actor().get_status() < ActorStatus::Draining);
                if let Some(spec) = spec {
                    // A running session keeps what it was started with:
                    // another spec for it is refused, not kept unseen.
                    if running && !state.specs.get(&key).is_some_and(|s| s.same_as(&spec)) {
                        let _ = reply.send(Err(SupervisorError::SpecConflict { key }));
                        return Ok(());
                    }
                    state.specs.insert(key.clone(), spec);
                }
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
                    state.last_used.insert(key, Instant::now());
                    Ok(h.clone())
                } else if let Err(e) = state.make_room(&key).await {
                    Err(e)
                } else {
                    state.last_used.insert(key.clone(), Instant::now());
                    state.spawn_session(&myself, key, workspace, None).await
                };
                let _ = reply.send(result);
            }
            SupervisorMsg::Handles(reply) => {
                let _ = reply.send(state.sessions.values().cloned().collect());
            }
            SupervisorMsg::List(reply) => {
                let mut keys: Vec<_> = state.sessions.keys().cloned().collect();
                keys.sort();
                let _ = reply.send(keys);
            }
            SupervisorMsg::Reset(key, reply) => {
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
            SupervisorMsg::Restart {
                key,
                n,
                cause,
                anchor,
            } => state.restart(&myself, key, n, cause, anchor).await,
            SupervisorMsg::Escalated(Escalation::ResumeFailed(f)) => {
                state.on_resume_failure(&myself, *f).await;
            }
            SupervisorMsg::Escalated(Escalation::FreshStartFailed {
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
                // A write refused by the store's fence: the session is
                // another node's now; it is not restarted here.
                let cause = match err.downcast_ref::<crate::StoreError>() {
                    Some(crate::StoreError::LeaseLost { .. }) => {
                        StopReason::Evicted.as_str().to_owned()
                    }
                    _ => err.to_string(),
                };
                state.on_exit(&myself, cell.get_id(), true, cause).await
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
            .stop_and_wait(
                Some(StopReason::Shutdown.as_str().into()),
                Some(state.config.shutdown.watchdog),
            )
            .await;
        if state.close_bus {
            state.bus.close();
        }
        Ok(())
    }
}
