//! The supervisor actor: its mailbox, start and stop. The session map and
//! spawning are in [`super::state`], a session's exit (restart or give up,
//! its `SessionStopped`) and the shutdown order in [`super::exit`], resume
//! failures in [`super::fallback`]; none of them calls back into this
//! file.

use std::collections::HashMap;
use std::sync::Arc;

use ractor::{Actor, ActorProcessingErr, ActorRef, ActorStatus, SupervisionEvent};
use tokio::time::Instant;

use crate::admission::Admission;
use crate::lifecycle::EventBus;
use crate::notify::Notifier;
use crate::session::{Escalation, StopReason};
use crate::source::SourceFactory;
use crate::store::{Durability, RecordStatus, SessionStore};
use crate::watchdog::{WatchdogActor, WatchdogHandle};

use super::exit::stop_sessions;
use super::state::{SupervisorMsg, SupervisorState};
use super::{SupervisorConfig, SupervisorError};

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
