//! Running a turn: the session actor's handlers from a queued message to
//! its answer. They carry out what [`TurnMachine`] decides and record each
//! step as a [`Transition`]; they decide no rule themselves.

use std::sync::Arc;

use ractor::{ActorProcessingErr, ActorRef};
use tokio_util::task::AbortOnDropHandle;

use crate::admission::AdmissionPermit;
use crate::context;
use crate::error::{StreamError, TurnError};
use crate::event::AgentEvent;
use crate::lifecycle::AttemptOutcome;
use crate::source::{AttemptId, TurnRequest};
use crate::spans;
use crate::store::Durability;
use crate::stream::{Credit, StreamArgs, StreamOutcome, StreamTask};
use crate::transition::{At, Parent, Transition};

use super::attempt::RunningAttempt;
use super::handle::{SessionMsg, TurnEvent};
use super::state::{Admitting, Next, SessionState, Turn};
use super::turn::{Rules, TurnMachine};

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
        state.arm_idle(myself);
        return Ok(());
    };
    state.touch();
    let id = queued.message.id;
    // A recovered turn whose relay offers the text its callers have (an
    // earlier node's partial reply) continues it instead of starting over.
    let offered = match queued.continue_from.take() {
        Some(rx) => tokio::time::timeout(super::recovered::CONTINUE_FROM_WAIT, rx)
            .await
            .ok()
            .and_then(Result::ok)
            .flatten(),
        None => None,
    };
    let (machine, text, complete) = match offered {
        Some(c) => (
            TurnMachine::continuing_from(id, c.broken_attempt),
            c.partial_text,
            c.complete,
        ),
        None => (TurnMachine::new(id), String::new(), false),
    };
    // A trace of its own, linked to the incarnation and the turn before.
    let span = Transition::TurnStarted {
        turn: id,
        provider: state.args.source.provider(),
        anchor: &state.anchor,
        follows: state.last_turn.as_ref(),
        recovered: queued.recovered,
        previous: state.args.previous.as_ref(),
    }
    .record(state.at(Parent::Root));
    let ran_in = spans::context_of(&span);
    if let Some(reply) = &queued.reply {
        reply.runs_in(&ran_in);
    }
    state.last_turn = Some(ran_in);
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
        span: spans::Lasting::new(span),
        attempt_span: None,
        last_attempt: None,
        stream: None,
        backoff: None,
        usage: None,
        context_usage: None,
        context_window: None,
        reply_bytes: 0,
        text,
        complete,
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
        span: spans::Lasting::new(span),
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
    if state.args.closing.is_cancelled() {
        // Shutting down: the permit goes, the message stays pending.
        return Ok(());
    }
    turn.permit = Some(permit);
    let continuation = turn.machine.continuing().then(|| {
        crate::continuation::Continuation::new(turn.text.clone(), attempt.attempt - 1)
            .with_complete(turn.complete)
    });
    if continuation.is_none() {
        turn.text.clear(); // a restart: the consumer discards what it had
        turn.complete = false;
    }
    turn.usage = None;
    turn.context_usage = None;
    let mut request = TurnRequest::new(
        state.args.key.clone(),
        attempt.turn,
        turn.queued.message.text.clone(),
    );
    request.attempt = attempt.attempt;
    request.model = turn.queued.message.model.clone();
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
    turn.attempt_span = Some(RunningAttempt::new(
        attempt_span,
        attempt,
        state.args.key.clone(),
        state.args.bus.clone(),
    ));
    turn.send(TurnEvent::Started(attempt));
    turn.stream = Some(stream);
    Ok(())
}

pub(super) async fn on_event(
    myself: &ActorRef<SessionMsg>,
    state: &mut SessionState,
    attempt: AttemptId,
    event: AgentEvent,
    credit: Credit,
) -> Result<Next, ActorProcessingErr> {
    let Some(turn) = state.turn.as_mut() else {
        return Ok(Next::Wait);
    };
    if !turn.machine.forwards(attempt) {
        return Ok(Next::Wait); // a dead attempt, or the user already pressed Escape
    }
    turn.machine.saw(&event);
    let size = match &event {
        AgentEvent::TextDelta(t) | AgentEvent::ThinkingDelta(t) => t.len(),
        AgentEvent::ToolInputDelta { partial_json, .. } => partial_json.len(),
        _ => 0,
    };
    turn.reply_bytes = turn.reply_bytes.saturating_add(size);
    if let Some(limit) = state.args.config.max_reply_bytes
        && turn.reply_bytes > limit
    {
        // Not forwarded: the caller never holds more than the cap.
        return super::end::too_large(myself, state, limit).await;
    }
    match &event {
        AgentEvent::Usage(u) => {
            turn.usage = Some(*u);
            if u.context_tokens() > 0 {
                turn.context_usage = Some(*u);
            }
        }
        AgentEvent::TextDelta(t) => {
            turn.text.push_str(t);
            turn.complete = false;
        }
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
                if let Some(turn) = &state.turn {
                    Transition::AgentSessionId {
                        session_id,
                        previous: previous.as_deref(),
                    }
                    .record(state.at(Parent::Span(&turn.span)));
                }
            }
        }
        _ => {}
    }
    if let Some(turn) = state.turn.as_ref() {
        turn.send_with(TurnEvent::Event(event), credit);
    }
    Ok(Next::Wait)
}

/// An attempt ended: closes its span (recording a watchdog kill under
/// it), then lets the turn machine decide.
pub(super) async fn on_ended(
    myself: &ActorRef<SessionMsg>,
    state: &mut SessionState,
    attempt: AttemptId,
    outcome: StreamOutcome,
) -> Result<Next, ActorProcessingErr> {
    let SessionState {
        turn,
        args,
        record,
        rng,
        ..
    } = state;
    let Some(turn) = turn.as_mut().filter(|t| t.machine.is_current(attempt)) else {
        return Ok(Next::Wait); // a stale attempt
    };
    turn.stream = None;
    turn.permit = None;
    if let StreamOutcome::Failed(e) = &outcome
        && let Some(wait) = crate::policy::hold(&args.config.retry, e)
    {
        // The server asked the whole source to wait: hold every session's
        // new attempts on it (shared backoff), not only this one's.
        args.admission.hold(&args.pool, wait);
    }
    if let Some(running) = turn.attempt_span.take() {
        let span = running.span();
        let (ended, code) = match &outcome {
            StreamOutcome::Failed(e) => (AttemptOutcome::Failed, Some(e.code())),
            StreamOutcome::Cancelled => {
                (AttemptOutcome::Cancelled, Some(TurnError::Cancelled.code()))
            }
            StreamOutcome::Completed => (AttemptOutcome::Completed, None),
        };
        if let Some(code) = code {
            spans::fail(span, code);
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
                parent: Parent::Span(span),
                bus: Some(&args.bus),
            });
        }
        turn.last_attempt = Some(spans::context_of(span));
        running.end(ended, code);
    }
    let rules = Rules {
        retry: &args.config.retry,
        can_escalate: args.escalate.is_some(),
        continues: args.source.continues(),
        restarts_repeat_tools: args.source.restarts_repeat_tool_calls(),
    };
    match turn.machine.ended(attempt, outcome, rules, rng) {
        Some(decision) => super::end::carry_out(myself, state, attempt, decision).await,
        None => Ok(Next::Wait),
    }
}
