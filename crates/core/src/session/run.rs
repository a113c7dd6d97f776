//! Running a turn: the session actor's handlers from a queued message to
//! its answer. They carry out what [`TurnMachine`] decides and record each
//! step as a [`Transition`]; they decide no rule themselves.

use std::sync::Arc;

use ractor::{ActorProcessingErr, ActorRef};
use tokio_util::task::AbortOnDropHandle;

use crate::admission::AdmissionPermit;
use crate::context::ContextReport;
use crate::context::{self, ContextConfig};
use crate::error::{ResumeCause, StreamError, TurnError};
use crate::event::AgentEvent;
use crate::notify::Notice;
use crate::source::AttemptId;
use crate::source::{EventSource, TurnRequest};
use crate::spans;
use crate::store::{Durability, SessionRecord, StoredUsage};
use crate::stream::{Credit, StreamArgs, StreamOutcome, StreamTask};
use crate::transition::{At, Parent, Transition};

use super::actor::{Admitting, SessionState, Turn, arm_idle, touch};
use super::escalation::{Escalation, Handoff, ResumeFailure, StopReason};
use super::handle::{Recovery, SessionMsg, TurnEvent, TurnSummary};
use super::turn::{Decision, FreshVerdict, OnCancel, Phase, Rules, StartMode, TurnMachine};

/// Starts the next queued turn when none runs; arms the idle timer when
/// nothing is left.
pub(super) async fn start_next_turn(
    myself: &ActorRef<SessionMsg>,
    state: &mut SessionState,
) -> Result<(), ActorProcessingErr> {
    if state.turn.is_some() {
        return Ok(());
    }
    let Some(mut queued) = state.queue.pop_front() else {
        arm_idle(myself, state);
        return Ok(());
    };
    touch(state);
    let id = queued.message.id;
    // A recovered turn whose relay offers the text its callers have (an
    // earlier node's partial reply) continues it instead of starting over.
    let offered = match queued.continue_from.take() {
        Some(rx) => tokio::time::timeout(super::handle::CONTINUE_FROM_WAIT, rx)
            .await
            .ok()
            .and_then(Result::ok)
            .flatten(),
        None => None,
    };
    let (machine, text) = match offered {
        Some(c) => (
            TurnMachine::continuing_from(id, c.broken_attempt),
            c.partial_text,
        ),
        None => (TurnMachine::new(id), String::new()),
    };
    let span = Transition::TurnStarted {
        turn: id,
        provider: state.args.source.provider(),
    }
    .record(state.at(Parent::Anchor(&state.anchor)));
    let deadline = state.args.config.turn_deadline.map(|after| {
        AbortOnDropHandle::new(myself.send_after(after, move || SessionMsg::Deadline(id)))
    });
    state.turn = Some(Turn {
        machine,
        queued,
        started: tokio::time::Instant::now(),
        admitting: None,
        permit: None,
        _deadline: deadline,
        span,
        attempt_span: None,
        last_attempt: None,
        stream: None,
        backoff: None,
        usage: None,
        context_usage: None,
        context_window: None,
        text,
    });
    start_attempt(myself, state)
}

/// Begins the turn's next attempt: asks for admission before anything is
/// opened or watched; the stream starts at once when admitted at once, else
/// the attempt is queued (its wait is never counted as silence).
pub(super) fn start_attempt(
    myself: &ActorRef<SessionMsg>,
    state: &mut SessionState,
) -> Result<(), ActorProcessingErr> {
    let resume_id = state.record.agent_session_id.clone();
    let Some(turn) = state.turn.as_mut() else {
        return Ok(());
    };
    let attempt = turn.machine.begin_attempt(resume_id);
    turn.backoff = None;
    let mut ticket = state.args.admission.enqueue(&state.args.pool);
    if let Some(permit) = ticket.try_take() {
        turn.machine.admitted(attempt);
        return launch(myself, state, attempt, permit);
    }
    let span = Transition::AttemptQueued {
        attempt,
        pool: &state.args.pool,
    }
    .record(At {
        key: &state.args.key,
        conversation: state.record.agent_session_id.as_deref(),
        parent: Parent::Span(&turn.span),
        bus: Some(&state.args.bus),
    });
    turn.send(TurnEvent::Queued(attempt));
    let me = myself.clone();
    let task = tokio::spawn(async move {
        let permit = ticket.await;
        // A session gone meanwhile drops the permit with the message.
        let _ = me.cast(SessionMsg::Admitted(attempt, permit));
    });
    turn.admitting = Some(Admitting {
        _task: AbortOnDropHandle::new(task),
        span,
        since: tokio::time::Instant::now(),
    });
    Ok(())
}

/// A queued attempt was admitted: its stream starts, unless the turn moved
/// on meanwhile (the permit is then dropped, freeing the slot).
pub(super) fn on_admitted(
    myself: &ActorRef<SessionMsg>,
    state: &mut SessionState,
    attempt: AttemptId,
    permit: AdmissionPermit,
) -> Result<(), ActorProcessingErr> {
    let Some(turn) = state.turn.as_mut() else {
        return Ok(());
    };
    if !turn.machine.admitted(attempt) {
        return Ok(());
    }
    if let Some(waited) = turn.admitting.take() {
        Transition::AttemptAdmitted {
            attempt,
            waited: waited.since.elapsed(),
        }
        .record(At {
            key: &state.args.key,
            conversation: state.record.agent_session_id.as_deref(),
            parent: Parent::Span(&waited.span),
            bus: Some(&state.args.bus),
        });
    }
    launch(myself, state, attempt, permit)
}

/// Starts the admitted attempt's stream (registered with the watchdog
/// before the source is opened).
fn launch(
    myself: &ActorRef<SessionMsg>,
    state: &mut SessionState,
    attempt: AttemptId,
    permit: AdmissionPermit,
) -> Result<(), ActorProcessingErr> {
    let resume_id = state.record.agent_session_id.clone();
    let timeout = state
        .args
        .config
        .stream
        .timeout
        .unwrap_or(state.args.watchdog.default_timeout());
    let Some(turn) = state.turn.as_mut() else {
        return Ok(());
    };
    turn.permit = Some(permit);
    let continuation = turn
        .machine
        .continuing()
        .then(|| crate::continuation::Continuation::new(turn.text.clone(), attempt.attempt - 1));
    if continuation.is_none() {
        turn.text.clear(); // a restart: the consumer discards what it had
    }
    turn.usage = None;
    turn.context_usage = None;
    let mut request = TurnRequest::new(
        state.args.key.clone(),
        attempt.turn,
        turn.queued.message.text.clone(),
    );
    request.attempt = attempt.attempt;
    request.resume_id = resume_id;
    request.workspace = state.record.workspace.clone();
    request.continuation = continuation;
    if state.args.config.context.self_report {
        request.append_system_prompt = Some(context::SELF_REPORT_INSTRUCTION.to_owned());
    }
    let at = At {
        key: &state.args.key,
        conversation: state.record.agent_session_id.as_deref(),
        parent: Parent::Span(&turn.span),
        bus: Some(&state.args.bus),
    };
    let attempt_span = Transition::AttemptStarted {
        attempt,
        timeout,
        provider: state.args.source.provider(),
        retries: turn.last_attempt.as_ref(),
    }
    .record(at);
    let me = myself.clone();
    let stream = StreamTask::spawn(StreamArgs {
        attempt,
        source: state.args.source.clone(),
        request,
        watchdog: state.args.watchdog.clone(),
        options: state.args.config.stream.clone(),
        sink: Arc::new(move |r| {
            let _ = me.cast(SessionMsg::Report(r));
        }),
        span: attempt_span.clone(),
    })?;
    turn.attempt_span = Some(attempt_span);
    turn.send(TurnEvent::Started(attempt));
    turn.stream = Some(stream);
    Ok(())
}

pub(super) async fn on_event(
    state: &mut SessionState,
    attempt: AttemptId,
    event: AgentEvent,
    credit: Credit,
) -> Result<(), ActorProcessingErr> {
    let Some(turn) = state.turn.as_mut() else {
        return Ok(());
    };
    if !turn.machine.forwards(attempt) {
        return Ok(()); // a dead attempt, or the user already pressed Escape
    }
    turn.machine.saw(&event);
    match &event {
        AgentEvent::Usage(u) => {
            turn.usage = Some(*u);
            if u.context_tokens() > 0 {
                turn.context_usage = Some(*u);
            }
        }
        AgentEvent::TextDelta(t) => turn.text.push_str(t),
        AgentEvent::TurnComplete {
            context_window: Some(w),
            ..
        } => turn.context_window = Some(*w),
        AgentEvent::SessionStarted { session_id, model } => {
            let previous = state.record.agent_session_id.clone();
            let mut changed = state.record.set_agent_session_id(session_id);
            if let Some(m) = model
                && state.record.model.as_deref() != Some(m)
            {
                state.record.model = Some(m.clone());
                changed = true;
            }
            if changed {
                // A durable point: flushed before the turn goes on.
                state
                    .args
                    .store
                    .save(&state.record, Durability::Flushed)
                    .await?;
                Transition::AgentSessionId {
                    session_id,
                    previous: previous.as_deref(),
                }
                .record(state.at(Parent::Root));
            }
        }
        _ => {}
    }
    if let Some(turn) = state.turn.as_ref() {
        turn.send_with(TurnEvent::Event(event), credit);
    }
    Ok(())
}

/// An attempt ended: closes its span (recording a watchdog kill under
/// it), then lets the turn machine decide.
pub(super) async fn on_ended(
    myself: &ActorRef<SessionMsg>,
    state: &mut SessionState,
    attempt: AttemptId,
    outcome: StreamOutcome,
) -> Result<(), ActorProcessingErr> {
    let SessionState {
        turn,
        args,
        record,
        rng,
        ..
    } = state;
    let Some(turn) = turn.as_mut().filter(|t| t.machine.is_current(attempt)) else {
        return Ok(()); // a stale attempt
    };
    turn.stream = None;
    turn.permit = None;
    if let StreamOutcome::Failed(e) = &outcome
        && let Some(wait) = e.retry_after()
    {
        // The server asked the whole source to wait: hold every session's
        // new attempts on it (shared backoff), not only this one's.
        args.admission
            .hold(&args.pool, wait.min(args.config.retry.max_retry_after));
    }
    if let Some(span) = turn.attempt_span.take() {
        match &outcome {
            StreamOutcome::Failed(e) => spans::fail(&span, e.code()),
            StreamOutcome::Cancelled => spans::fail(&span, TurnError::Cancelled.code()),
            StreamOutcome::Completed => {}
        }
        if let StreamOutcome::Failed(StreamError::InactivityTimeout {
            silent_for,
            timeout,
        }) = outcome
        {
            Transition::StreamTimedOut {
                attempt,
                phase: turn.machine.stream_phase(),
                silent_for,
                timeout,
            }
            .record(At {
                key: &args.key,
                conversation: record.agent_session_id.as_deref(),
                parent: Parent::Span(&span),
                bus: Some(&args.bus),
            });
        }
        turn.last_attempt = Some(spans::context_of(&span));
    }
    let rules = Rules {
        retry: &args.config.retry,
        can_escalate: args.escalate.is_some(),
        continues: args.source.continues(),
        restarts_repeat_tools: args.source.restarts_repeat_tool_calls(),
    };
    match turn.machine.ended(attempt, outcome, rules, rng) {
        Some(decision) => carry_out(myself, state, attempt, decision).await,
        None => Ok(()),
    }
}

/// Carries out what the turn machine decided about an ended attempt.
async fn carry_out(
    myself: &ActorRef<SessionMsg>,
    state: &mut SessionState,
    attempt: AttemptId,
    decision: Decision,
) -> Result<(), ActorProcessingErr> {
    let Some(turn) = state.turn.as_mut() else {
        return Ok(());
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
            Ok(())
        }
        Decision::Escalate {
            cause,
            failed_id,
            error,
        } => {
            escalate_resume_failure(myself, state, failed_id, cause, error);
            Ok(())
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
) -> Result<(), ActorProcessingErr> {
    stop_turn(myself, state, TurnError::Cancelled).await
}

/// Turn `id`'s wall-clock cap passed: it is stopped and ends
/// `DeadlineExceeded` (a stale timer of an earlier turn does nothing).
pub(super) async fn deadline(
    myself: &ActorRef<SessionMsg>,
    state: &mut SessionState,
    id: u64,
) -> Result<(), ActorProcessingErr> {
    let Some(after) = state.args.config.turn_deadline else {
        return Ok(());
    };
    if state.turn.as_ref().is_some_and(|t| t.machine.id() == id) {
        stop_turn(myself, state, TurnError::DeadlineExceeded { after }).await?;
    }
    Ok(())
}

/// Stops the running turn so that it ends with `why` (a cancel or its
/// deadline), whatever its stream reports afterwards.
async fn stop_turn(
    myself: &ActorRef<SessionMsg>,
    state: &mut SessionState,
    why: TurnError,
) -> Result<(), ActorProcessingErr> {
    let Some(turn) = state.turn.as_mut() else {
        return Ok(());
    };
    let decision = turn.machine.stop(why.clone());
    if decision == OnCancel::AlreadyRequested {
        return Ok(());
    }
    let id = turn.machine.id();
    let transition = match why {
        TurnError::DeadlineExceeded { after } => Transition::TurnDeadline { turn: id, after },
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
            Ok(())
        }
        // Nothing running: drop the pending retry and finish now.
        OnCancel::FinishNow | OnCancel::AlreadyRequested => {
            finish_turn(myself, state, Err(why)).await
        }
    }
}

/// Unsticks the running turn (see [`Recovery`]); whether anything was done.
pub(super) fn recover(
    myself: &ActorRef<SessionMsg>,
    state: &mut SessionState,
    how: Recovery,
) -> Result<bool, ActorProcessingErr> {
    let Some(turn) = state.turn.as_ref() else {
        return Ok(false);
    };
    let phase = turn.machine.phase();
    let fresh = match (how, state.record.agent_session_id.clone()) {
        (Recovery::Fresh, Some(id)) if state.args.escalate.is_some() => Some(id),
        _ => None,
    };
    match (phase, fresh) {
        (Phase::Admitting | Phase::Starting, _) => Ok(false),
        (_, Some(failed_id)) => {
            if let Some(s) = &turn.stream {
                s.cancel();
            }
            let error = StreamError::Interrupted {
                reason: "the conversation was dropped to recover the session".into(),
            };
            escalate_resume_failure(myself, state, failed_id, ResumeCause::OperatorReset, error);
            Ok(true)
        }
        (Phase::Streaming, None) => {
            if let Some(s) = &turn.stream {
                s.interrupt();
            }
            Ok(true)
        }
        (Phase::BackingOff, None) => {
            start_attempt(myself, state)?;
            Ok(true)
        }
    }
}

/// Cancels turn `id` only: the running one as [`cancel`] does, a queued
/// one by removing it (answered `Cancelled`, never streamed). Whether it
/// was still running or queued.
pub(super) async fn cancel_turn(
    myself: &ActorRef<SessionMsg>,
    state: &mut SessionState,
    id: u64,
) -> Result<bool, ActorProcessingErr> {
    if state.turn.as_ref().is_some_and(|t| t.machine.id() == id) {
        cancel(myself, state).await?;
        return Ok(true);
    }
    let Some(pos) = state.queue.iter().position(|q| q.message.id == id) else {
        return Ok(false); // already answered
    };
    let Some(queued) = state.queue.remove(pos) else {
        return Ok(false);
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
    Ok(true)
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
) -> Result<(), ActorProcessingErr> {
    let Some(turn) = state.turn.take() else {
        return Ok(());
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
        Transition::ContextUsage(c).record(state.at(Parent::Root));
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
        return Ok(());
    }
    start_next_turn(myself, state).await
}
