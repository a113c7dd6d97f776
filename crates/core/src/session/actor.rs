//! The session actor: its mailbox and its lifecycle (start, idle reap,
//! stop). It owns the record (the only writer while it runs), the queue,
//! the running stream and the timers ([`super::state`]); running a turn is
//! in [`super::run`] and [`super::end`], the rules in [`super::turn`], the
//! telemetry in [`crate::transition`].

use std::collections::VecDeque;
use std::time::Duration;

use ractor::{Actor, ActorCell, ActorProcessingErr, ActorRef};
use rand::SeedableRng;
use rand::rngs::SmallRng;
use tokio::time::Instant;

use crate::error::{ActorError, TurnError};
use crate::spans::TraceAnchor;
use crate::store::{Durability, RecordStatus, StoreError};
use crate::stream::{StreamHandle, StreamReport};
use crate::transition::{At, Incarnation, Parent, Transition};

use super::end::{cancel, cancel_turn, deadline, recover};
use super::escalation::{Handoff, StopReason};
use super::handle::{SessionHandle, SessionMsg, SessionStatus, TurnEvent, TurnSender};
use super::run::{on_admitted, on_ended, on_event, start_attempt, start_next_turn};
use super::state::{Next, Queued, SessionArgs, SessionState};
use super::turn::{Phase, StartMode, reap_due};

/// One agent conversation; see the module docs of [`crate::session`].
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct SessionActor;

/// Why a session could not start.
#[derive(Debug)]
pub(crate) enum StartError {
    /// Its record could not be written (corrupt, I/O, or a cluster store's
    /// fence: another node owns it).
    Store(StoreError),
    /// The actor could not be spawned.
    Actor(ActorError),
}

impl From<StartError> for ActorError {
    fn from(e: StartError) -> Self {
        match e {
            StartError::Actor(a) => a,
            StartError::Store(s) => ActorError::Spawn {
                what: "session",
                message: s.to_string(),
            },
        }
    }
}

impl std::fmt::Display for StartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Store(e) => e.fmt(f),
            Self::Actor(e) => e.fmt(f),
        }
    }
}

impl SessionActor {
    /// Spawns a session, linked to `supervisor` when given, that first runs
    /// `handoff` (turns re-delivered from a failed session).
    pub(crate) async fn spawn(
        args: SessionArgs,
        handoff: Vec<Handoff>,
        supervisor: Option<ActorCell>,
    ) -> Result<(SessionHandle, tokio::task::JoinHandle<()>), StartError> {
        let key = args.key.clone();
        let (tx, mut rx) = tokio::sync::oneshot::channel();
        let spawned = match supervisor {
            Some(s) => Actor::spawn_linked(None, SessionActor, (args, handoff, tx), s).await,
            None => Actor::spawn(None, SessionActor, (args, handoff, tx)).await,
        };
        let (actor, join) = spawned.map_err(|e| {
            if let ractor::SpawnErr::StartupFailed(inner) = &e
                && let Some(store) = inner.downcast_ref::<StoreError>()
            {
                return StartError::Store(store.clone());
            }
            StartError::Actor(ActorError::Spawn {
                what: "session",
                message: e.to_string(),
            })
        })?;
        let anchor = rx.try_recv().unwrap_or_default();
        Ok((SessionHandle::new(actor, key, anchor), join))
    }
}

impl Actor for SessionActor {
    type Msg = SessionMsg;
    type State = SessionState;
    type Arguments = (
        SessionArgs,
        Vec<Handoff>,
        tokio::sync::oneshot::Sender<TraceAnchor>,
    );

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        (args, handoff, anchor_tx): Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        let mut record = args.record.clone();
        record.status = RecordStatus::Active;
        // Messages handed over first, then those recovered from the record
        // that the handoff does not already carry.
        let mut queue: VecDeque<Queued> = handoff
            .into_iter()
            .map(|h| {
                // The callers' cancellers follow their turns here.
                if let Some(r) = &h.reply {
                    r.moved_to(&myself);
                }
                Queued {
                    message: h.message,
                    reply: h.reply,
                    continue_from: None,
                    recovered: false,
                }
            })
            .collect();
        for m in &record.pending {
            if !queue.iter().any(|q| q.message.id == m.id) {
                queue.push_back(Queued {
                    message: m.clone(),
                    reply: None,
                    continue_from: None,
                    recovered: true,
                });
            }
        }
        args.store.save(&record, Durability::Buffered).await?;
        // The record is ours (saved): hand the recovered turns to whoever
        // relays them, if anyone asked.
        if let Some(tx) = &args.recovered {
            for q in queue.iter_mut().filter(|q| q.reply.is_none()) {
                let (reply, handle) = TurnSender::channel(q.message.id, myself.clone());
                // Only a source that continues broken replies can take an
                // offer of the text the callers have.
                let (offer_tx, offer_rx) = match args.source.continues() {
                    true => {
                        let (tx, rx) = tokio::sync::oneshot::channel();
                        (Some(tx), Some(rx))
                    }
                    false => (None, None),
                };
                let turn = crate::RecoveredTurn {
                    key: args.key.clone(),
                    message_id: q.message.id,
                    idempotency_key: q.message.idempotency_key.clone(),
                    handle,
                    continue_from: crate::ContinueFrom::new(offer_tx),
                };
                if tx.send(turn).is_ok() {
                    q.reply = Some(reply);
                    q.continue_from = offer_rx;
                }
            }
        }
        let incarnation = match (&args.mode, &record.agent_session_id) {
            (StartMode::FreshFallback { .. }, _) => Incarnation::FreshFallback,
            (StartMode::Resume, Some(_)) => Incarnation::Resume,
            (StartMode::Resume, None) => Incarnation::Spawn,
        };
        let span = Transition::Incarnated {
            incarnation,
            workspace: record.workspace.as_deref(),
            restart_count: record.restart_count,
            model: record.model.as_deref(),
            previous: args.previous.as_ref(),
            recovered: queue.iter().filter(|q| q.reply.is_none()).count(),
        }
        .record(At {
            key: &args.key,
            conversation: record.agent_session_id.as_deref(),
            parent: Parent::Root,
            bus: Some(&args.bus),
        });
        let anchor = TraceAnchor::of(&span);
        let _ = anchor_tx.send(anchor.clone());
        Ok(SessionState {
            anchor,
            last_turn: None,
            record,
            queue,
            turn: None,
            turns_finished: 0,
            rng: SmallRng::from_rng(&mut rand::rng()),
            activity: 0,
            last_active: Instant::now(),
            idle_timer: None,
            escalated: false,
            args,
        })
    }

    async fn post_start(
        &self,
        myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        start_next_turn(&myself, state).await
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let handled = handle_msg(myself, msg, state).await;
        if handled.is_err() {
            // The session fails, and ractor runs no `post_stop` for a
            // failing actor: release the running stream (socket, child)
            // here, or it would go on reading — for a write the store's
            // fence refused, streaming a session another node now runs —
            // until the watchdog's timeout.
            release_stream(state).await;
        }
        handled
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        // The running stream goes first: its source (socket, child) is
        // released before the session is reported stopped.
        release_stream(state).await;
        // An escalated session's record belongs to the supervisor now (it
        // clears the failed id): writing this copy would undo that.
        //
        // Otherwise a stopped session is not active any more (a shutdown,
        // or a stop asked by the supervisor); after a crash or a kill the
        // record keeps saying Active, which is how a restart can tell.
        if !state.escalated && state.record.status == RecordStatus::Active {
            state.record.status = RecordStatus::Idle;
            if let Err(error) = state
                .args
                .store
                .save(&state.record, Durability::Flushed)
                .await
            {
                Transition::StoreFailed { error: &error }
                    .record(state.at(Parent::Anchor(&state.anchor)));
            }
        }
        // Unanswered messages stay pending in the record: the next start of
        // this session re-delivers them. Callers are told now.
        let turns = state.turn.take().map(|t| t.queued);
        for q in turns.into_iter().chain(state.queue.drain(..)) {
            if let Some(r) = q.reply {
                r.send(TurnEvent::Finished(Err(TurnError::SessionStopped {
                    reason: "session stopped".to_owned(),
                })));
            }
        }
        Ok(())
    }
}

async fn reap(
    myself: &ActorRef<SessionMsg>,
    state: &mut SessionState,
) -> Result<(), ActorProcessingErr> {
    state.record.status = RecordStatus::Idle;
    state
        .args
        .store
        .save(&state.record, Durability::Buffered)
        .await?;
    let _span = Transition::Reaped {
        idle_for: state.last_active.elapsed(),
        context_tokens: state.record.usage.map(|u| u.context_tokens()),
        workspace: state.record.workspace.as_deref(),
    }
    .record(state.at(Parent::Anchor(&state.anchor)));
    myself.stop(Some(StopReason::Reaped.as_str().into()));
    Ok(())
}

/// The stream-stop wait used when a session has no configuration of its own.
pub(crate) const DEFAULT_STREAM_STOP_TIMEOUT: Duration = Duration::from_secs(5);

/// One message of a [`SessionActor`]; an error fails the session.
async fn handle_msg(
    myself: ActorRef<SessionMsg>,
    msg: SessionMsg,
    state: &mut SessionState,
) -> Result<(), ActorProcessingErr> {
    if state.escalated {
        return Ok(()); // stopping; the supervisor owns everything now
    }
    let next = handle_one(&myself, msg, state).await?;
    carry_on(&myself, state, next).await
}

/// Carries out what a handler asked for next: the one place a turn moves
/// on from (handlers never call the code that starts turns and attempts).
async fn carry_on(
    myself: &ActorRef<SessionMsg>,
    state: &mut SessionState,
    next: Next,
) -> Result<(), ActorProcessingErr> {
    match next {
        Next::Wait => Ok(()),
        Next::StartAttempt => start_attempt(myself, state),
        Next::StartNextTurn => start_next_turn(myself, state).await,
    }
}

/// Handles `msg`; what comes next.
async fn handle_one(
    myself: &ActorRef<SessionMsg>,
    msg: SessionMsg,
    state: &mut SessionState,
) -> Result<Next, ActorProcessingErr> {
    Ok(match msg {
        SessionMsg::Submit(text, options, reply) => {
            let id = state.record.accept_with(text, options);
            let message = state
                .record
                .pending
                .last()
                .cloned()
                .ok_or("accepted message missing")?;
            // Durable before acknowledged.
            if let Err(e) = state
                .args
                .store
                .save(&state.record, Durability::Flushed)
                .await
            {
                state.record.unaccept(id);
                Transition::StoreFailed { error: &e }
                    .record(state.at(Parent::Anchor(&state.anchor)));
                let _ = reply.send(Err(e));
                return Ok(Next::Wait);
            }
            let (tx, handle) = TurnSender::channel(id, myself.clone());
            let ahead = usize::from(state.turn.is_some()) + state.queue.len();
            if ahead > 0 {
                let _ = tx.send(TurnEvent::Waiting { behind: ahead });
            }
            let _ = reply.send(Ok(handle));
            state.touch();
            state.queue.push_back(Queued {
                message,
                reply: Some(tx),
                continue_from: None,
                recovered: false,
            });
            Next::StartNextTurn
        }
        SessionMsg::Cancel => cancel(myself, state).await?,
        SessionMsg::CancelTurn(id, reply) => {
            let (was_live, next) = cancel_turn(myself, state, id).await?;
            let _ = reply.send(was_live);
            next
        }
        SessionMsg::Report(StreamReport::Event {
            attempt,
            event,
            credit,
        }) => on_event(myself, state, attempt, event, credit).await?,
        SessionMsg::Report(StreamReport::Ended {
            attempt, outcome, ..
        }) => on_ended(myself, state, attempt, outcome).await?,
        SessionMsg::Retry(next) => {
            match state
                .turn
                .as_ref()
                .is_some_and(|t| t.machine.retry_due(next))
            {
                true => Next::StartAttempt,
                false => Next::Wait,
            }
        }
        SessionMsg::Admitted(attempt, permit) => {
            on_admitted(myself, state, attempt, permit)?;
            Next::Wait
        }
        SessionMsg::Deadline(turn) => deadline(myself, state, turn).await?,
        SessionMsg::Recover(how, reply) => {
            let (done, next) = recover(myself, state, how);
            let _ = reply.send(done);
            next
        }
        SessionMsg::IdleCheck(armed) => {
            if reap_due(
                armed,
                state.activity,
                state.turn.is_some(),
                state.queue.len(),
            ) {
                reap(myself, state).await?;
            }
            Next::Wait
        }
        SessionMsg::StopIfIdle(reply) => {
            let idle = state.turn.is_none() && state.queue.is_empty();
            if idle {
                reap(myself, state).await?;
            }
            let _ = reply.send(idle);
            Next::Wait
        }
        SessionMsg::Status(reply) => {
            let t = state.turn.as_ref();
            let _ = reply.send(SessionStatus {
                key: state.args.key.clone(),
                turn: t.map(|t| t.machine.id()),
                streaming: t.and_then(|t| t.stream.as_ref()).map(StreamHandle::attempt),
                backing_off: t.is_some_and(|t| t.machine.phase() == Phase::BackingOff),
                admitting: t.is_some_and(|t| t.machine.phase() == Phase::Admitting),
                turn_running_for: t.map(|t| t.started.elapsed()),
                queued: state.queue.len(),
                turns_finished: state.turns_finished,
                record: state.record.clone(),
            });
            Next::Wait
        }
        SessionMsg::Fail(reason) => return Err(reason.into()),
    })
}

/// Cancels the running stream, if any, and waits (bounded) until its
/// source is released.
async fn release_stream(state: &SessionState) {
    if let Some(stream) = state.turn.as_ref().and_then(|t| t.stream.as_ref()) {
        stream.cancel();
        let wait = state.args.config.stream_stop_timeout;
        let _ = tokio::time::timeout(wait, stream.finished()).await;
    }
}
