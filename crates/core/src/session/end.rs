//! How a turn ends: carrying out the turn machine's decision about an
//! ended attempt (retry, continue, restart fresh, escalate, finish),
//! cancellation and deadlines, recovery of a stuck turn, and finishing the
//! turn with its answer and context report.

use ractor::{ActorProcessingErr, ActorRef};
use tokio_util::task::AbortOnDropHandle;

use crate::context::{self, ContextConfig, ContextReport};
use crate::error::{ResumeCause, StreamError, TurnError};
use crate::notify::Notice;
use crate::source::{AttemptId, EventSource};
use crate::spans;
use crate::store::{Durability, SessionRecord, StoredUsage};
use crate::transition::{At, Parent, Transition};

use super::escalation::{Escalation, Handoff, ResumeFailure, StopReason};
use super::handle::{SessionMsg, TurnEvent, TurnSummary, Unstick};
use super::state::{Next, SessionState, Turn};
use super::turn::{Decision, FreshVerdict, OnCancel, Phase, StartMode};

/// Carries out what the turn machine decided about an ended attempt.
pub(super) async fn carry_out(
    myself: &ActorRef<SessionMsg>,
    state: &mut SessionState,
    attempt: AttemptId,
    decision: Decision,
) -> Result<Next, ActorProcessingErr> {
    let Some(turn) = state.turn.as_mut() else {
        return Ok(Next::Wait);
    };
    match decision {
        Decision::Retry { next, delay, error } | Decision::Continue { next, delay, error } => {
            // The machine has decided which: a continuation keeps the text.
            let continues = turn.machine.continuing();
            let at = At {
                key: &state.args.key,
                conversation: state.record.agent_session_id.as_deref(),
                parent: Parent::Span(&turn.span),
                bus: Some(&state.args.bus),
            };
            let (failed, error_code, retries) = (attempt, error.code(), turn.last_attempt.as_ref());
            let event = if continues {
                Transition::ContinueScheduled {
                    failed,
                    delay,
                    error_code,
                    kept_bytes: turn.text.len(),
                    retries,
                }
                .record(at);
                TurnEvent::Continuing {
                    failed,
                    delay,
                    error,
                }
            } else {
                Transition::RetryScheduled {
                    failed,
                    delay,
                    error_code,
                    retries,
                }
                .record(at);
                TurnEvent::Retrying {
                    failed,
                    delay,
                    error,
                }
            };
            turn.send(event);
            let timer = myself.send_after(delay, move || SessionMsg::Retry(next));
            turn.backoff = Some(AbortOnDropHandle::new(timer));
            Ok(Next::Wait)
        }
        Decision::Escalate {
            cause,
            failed_id,
            error,
        } => {
            escalate_resume_failure(myself, state, failed_id, cause, error);
            Ok(Next::Wait)
        }
        Decision::Finish(result) => finish_turn(myself, state, result).await,
    }
}

fn escalate_resume_failure(
    myself: &ActorRef<SessionMsg>,
    state: &mut SessionState,
    failed_id: String,
    cause: ResumeCause,
    error: StreamError,
) {
    let Some(escalate) = state.args.escalate.clone() else {
        return;
    };
    let mut handoff = Vec::new();
    if let Some(turn) = state.turn.take() {
        spans::fail(&turn.span, error.code());
        turn.send(TurnEvent::Restarting { cause });
        handoff.push(Handoff {
            message: turn.queued.message,
            reply: turn.queued.reply,
        });
    }
    handoff.extend(state.queue.drain(..).map(|q| Handoff {
        message: q.message,
        reply: q.reply,
    }));
    let diagnostics = state
        .args
        .source
        .diagnostics(&failed_id, state.record.workspace.as_deref());
    state.escalated = true;
    escalate(Escalation::ResumeFailed(Box::new(ResumeFailure {
        key: state.args.key.clone(),
        failed_id,
        cause,
        error,
        cwd: state.record.workspace.clone(),
        diagnostics,
        record: state.record.clone(),
        handoff,
        anchor: state.anchor.clone(),
    })));
    myself.stop(Some(StopReason::Escalated.as_str().into()));
}

pub(super) async fn cancel(
    myself: &ActorRef<SessionMsg>,
    state: &mut SessionState,
) -> Result<Next, ActorProcessingErr> {
    stop_turn(myself, state, TurnError::Cancelled).await
}

/// Turn `id`'s wall-clock cap passed: it is stopped and ends
/// `DeadlineExceeded` (a stale timer of an earlier turn does nothing).
pub(super) async fn deadline(
    myself: &ActorRef<SessionMsg>,
    state: &mut SessionState,
    id: u64,
) -> Result<Next, ActorProcessingErr> {
    let Some(after) = state.args.config.turn_deadline else {
        return Ok(Next::Wait);
    };
    if state.turn.as_ref().is_some_and(|t| t.machine.id() == id) {
        return stop_turn(myself, state, TurnError::DeadlineExceeded { after }).await;
    }
    Ok(Next::Wait)
}

/// The running turn's reply passed `limit` bytes: it is stopped and ends
/// `ReplyTooLarge`.
pub(super) async fn too_large(
    myself: &ActorRef<SessionMsg>,
    state: &mut SessionState,
    limit: usize,
) -> Result<Next, ActorProcessingErr> {
    stop_turn(myself, state, TurnError::ReplyTooLarge { limit }).await
}

/// Stops the running turn so that it ends with `why` (a cancel, its
/// deadline or its size cap), whatever its stream reports afterwards.
async fn stop_turn(
    myself: &ActorRef<SessionMsg>,
    state: &mut SessionState,
    why: TurnError,
) -> Result<Next, ActorProcessingErr> {
    let Some(turn) = state.turn.as_mut() else {
        return Ok(Next::Wait);
    };
    let decision = turn.machine.stop(why.clone());
    if decision == OnCancel::AlreadyRequested {
        return Ok(Next::Wait);
    }
    let id = turn.machine.id();
    let transition = match why {
        TurnError::DeadlineExceeded { after } => Transition::TurnDeadline { turn: id, after },
        TurnError::ReplyTooLarge { limit } => Transition::TurnTooLarge { turn: id, limit },
        _ => Transition::TurnCancelled { turn: id },
    };
    drop(transition.record(At {
        key: &state.args.key,
        conversation: state.record.agent_session_id.as_deref(),
        parent: Parent::Span(&turn.span),
        bus: Some(&state.args.bus),
    }));
    match decision {
        // The stream decides the race; its end finishes the turn as cancelled.
        OnCancel::StopStream => {
            if let Some(s) = &turn.stream {
                s.cancel();
            }
            Ok(Next::Wait)
        }
        // Nothing running: drop the pending retry and finish now.
        OnCancel::FinishNow | OnCancel::AlreadyRequested => {
            finish_turn(myself, state, Err(why)).await
        }
    }
}

/// Unsticks the running turn (see [`Unstick`]); whether anything was
/// done, and what comes next.
pub(super) fn recover(
    myself: &ActorRef<SessionMsg>,
    state: &mut SessionState,
    how: Unstick,
) -> (bool, Next) {
    let Some(turn) = state.turn.as_ref() else {
        return (false, Next::Wait);
    };
    let phase = turn.machine.phase();
    let fresh = match (how, state.record.agent_session_id.clone()) {
        (Unstick::Fresh, Some(id)) if state.args.escalate.is_some() => Some(id),
        _ => None,
    };
    match (phase, fresh) {
        (Phase::Admitting | Phase::Starting, _) => (false, Next::Wait),
        (_, Some(failed_id)) => {
            if let Some(s) = &turn.stream {
                s.cancel();
            }
            let error = StreamError::Interrupted {
                reason: "the conversation was dropped to recover the session".into(),
            };
            escalate_resume_failure(myself, state, failed_id, ResumeCause::OperatorReset, error);
            (true, Next::Wait)
        }
        (Phase::Streaming, None) => {
            if let Some(s) = &turn.stream {
                s.interrupt();
            }
            (true, Next::Wait)
        }
        (Phase::BackingOff, None) => (true, Next::StartAttempt),
    }
}

/// Cancels turn `id` only: the running one as [`cancel`] does, a queued
/// one by removing it (answered `Cancelled`, never streamed). Whether it
/// was still running or queued.
pub(super) async fn cancel_turn(
    myself: &ActorRef<SessionMsg>,
    state: &mut SessionState,
    id: u64,
) -> Result<(bool, Next), ActorProcessingErr> {
    if state.turn.as_ref().is_some_and(|t| t.machine.id() == id) {
        return Ok((true, cancel(myself, state).await?));
    }
    let Some(pos) = state.queue.iter().position(|q| q.message.id == id) else {
        return Ok((false, Next::Wait)); // already answered
    };
    let Some(queued) = state.queue.remove(pos) else {
        return Ok((false, Next::Wait));
    };
    // Answered: no longer pending, not re-delivered after a restart.
    state.record.answered(id);
    state
        .args
        .store
        .save(&state.record, Durability::Buffered)
        .await?;
    drop(Transition::TurnCancelled { turn: id }.record(state.at(Parent::Anchor(&state.anchor))));
    if let Some(r) = queued.reply {
        r.send(TurnEvent::Finished(Err(TurnError::Cancelled)));
    }
    Ok((true, Next::Wait))
}

/// The context report of a finished turn; updates the record's usage.
fn context_of_turn(
    record: &mut SessionRecord,
    turn: &Turn,
    cfg: &ContextConfig,
    source: &dyn EventSource,
    self_reported: Option<u32>,
) -> Option<ContextReport> {
    // The last report carrying input tokens, else what is stored.
    let window = cfg
        .window
        .or(turn.context_window)
        .or_else(|| source.context_window(record.model.as_deref()))
        .unwrap_or(context::DEFAULT_WINDOW);
    if let Some(u) = turn.context_usage {
        record.usage = Some(StoredUsage::from_usage(u, window));
    }
    record.usage.map(|u| ContextReport {
        tokens: u.context_tokens(),
        window: u.context_window,
        percent: u.context_percent,
        self_reported,
    })
}

/// Ends the running turn: context bookkeeping, record update, reply, next.
async fn finish_turn(
    myself: &ActorRef<SessionMsg>,
    state: &mut SessionState,
    result: Result<(), TurnError>,
) -> Result<Next, ActorProcessingErr> {
    let Some(turn) = state.turn.take() else {
        return Ok(Next::Wait);
    };
    state.turns_finished += 1;
    let id = turn.machine.id();
    let cfg = state.args.config.context.clone();
    let (text, self_reported) = if cfg.self_report {
        context::strip_self_report(&turn.text)
    } else {
        (turn.text.clone(), None)
    };
    let context = context_of_turn(
        &mut state.record,
        &turn,
        &cfg,
        state.args.source.as_ref(),
        self_reported,
    );
    if let (Some(c), true) = (context, result.is_ok()) {
        Transition::ContextUsage(c).record(state.at(Parent::Span(&turn.span)));
    }

    // The message is answered (with a reply or an error): no longer pending.
    state.record.answered(id);
    let verdict = state.args.mode.after_turn(&result);
    if verdict == FreshVerdict::Recovered {
        state.args.mode = StartMode::Resume;
    }
    state
        .args
        .store
        .save(&state.record, Durability::Buffered)
        .await?;

    let summary = result.map(|()| TurnSummary {
        turn: id,
        attempts: turn.machine.attempts(),
        continuations: turn.machine.continuations(),
        usage: turn.usage,
        context,
        indicator: context
            .filter(|_| cfg.indicator)
            .map(|c| context::indicator(c.percent)),
        text,
    });
    Transition::TurnFinished {
        turn: id,
        attempts: turn.machine.attempts(),
        error_code: summary.as_ref().err().map(TurnError::code),
        usage: turn.usage,
        context,
    }
    .record(state.at(Parent::Span(&turn.span)));
    match turn.queued.reply {
        Some(reply) => {
            reply.send(TurnEvent::Finished(summary.clone()));
        }
        None => state.args.notifier.notify(
            &state.args.key,
            Notice::RecoveredReply {
                message_id: id,
                result: summary.map(|s| s.relay_text()),
            },
        ),
    }

    if let (FreshVerdict::GiveUp { first_cause, error }, Some(escalate)) =
        (verdict, state.args.escalate.clone())
    {
        state.escalated = true;
        let reason = format!("session failed: {first_cause}; fresh start failed: {error}");
        for q in state.queue.drain(..) {
            if let Some(r) = q.reply {
                r.send(TurnEvent::Finished(Err(TurnError::SessionFailed {
                    reason: reason.clone(),
                })));
            }
        }
        escalate(Escalation::FreshStartFailed {
            key: state.args.key.clone(),
            first_cause,
            error,
        });
        myself.stop(Some(StopReason::Escalated.as_str().into()));
        return Ok(Next::Wait);
    }
    Ok(Next::StartNextTurn)
}
