//! The supervisor actor's state: the session map, spawning a session, and
//! making room for one. The handlers above it (`actor`, `exit`, `fallback`)
//! use it; it calls none of them.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use ractor::{ActorId, ActorRef, ActorStatus, RpcReplyPort};
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
use crate::store::{RecordStatus, SessionRecord, SessionStore, StoreError};
use crate::transition::{At, Parent, Transition};
use crate::watchdog::WatchdogHandle;

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

/// State of the [`WorkspaceSupervisor`](super::actor::WorkspaceSupervisor).
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
    pub(super) async fn make_room(&mut self, key: &SessionKey) -> Result<(), SupervisorError> {
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
