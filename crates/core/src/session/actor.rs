//! The session actor: carries out the [`TurnMachine`]'s decisions. It owns
//! the record (the only writer while it runs), the queue, the running
//! stream and the timers; the rules live in [`super::turn`], the telemetry
//! in [`crate::transition`].

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use opentelemetry::trace::SpanContext;
use ractor::{Actor, ActorCell, ActorProcessingErr, ActorRef, MessagingErr};
use rand::SeedableRng;
use rand::rngs::SmallRng;
use tokio::time::Instant;
use tokio_util::task::AbortOnDropHandle;

use crate::context::{self, ContextConfig};
use crate::error::{ActorError, ResumeCause, StreamError, TurnError};
use crate::event::{AgentEvent, Usage};
use crate::lifecycle::EventBus;
use crate::notify::{Notice, Notifier};
use crate::source::{EventSource, SessionKey, TurnRequest};
use crate::spans::{self, TraceAnchor};
use crate::store::{Durability, RecordStatus, SessionRecord, SessionStore, StoredUsage};
use crate::stream::{
    AttemptId, Credit, StreamActor, StreamArgs, StreamHandle, StreamOutcome, StreamReport,
};
use crate::transition::{At, Incarnation, Parent, Transition};
use crate::watchdog::WatchdogHandle;

use super::SessionConfig;
use super::escalation::{Escalation, EscalationSink, Handoff, ResumeFailure, StopReason};
use super::handle::{
    ContextReport, SessionHandle, SessionMsg, SessionStatus, TurnEvent, TurnSender, TurnSummary,
};
use super::turn::{
    Decision, FreshVerdict, OnCancel, Phase, Rules, StartMode, TurnMachine, reap_due,
};

/// A timer task that dies with the state that owns it.
type Timer = AbortOnDropHandle<Result<(), MessagingErr<SessionMsg>>>;

/// What a session needs to start.
#[derive(Clone)]
pub(crate) struct SessionArgs {
    /// The session's key.
    pub(crate) key: SessionKey,
    /// Its stored record (a new one for a new session).
    pub(crate) record: SessionRecord,
    /// Where its turns' streams come from.
    pub(crate) source: Arc<dyn EventSource>,
    /// The watchdog its streams register with.
    pub(crate) watchdog: WatchdogHandle,
    /// Configuration.
    pub(crate) config: SessionConfig,
    /// Where lifecycle events go.
    pub(crate) bus: EventBus,
    /// Where records are written.
    pub(crate) store: Arc<dyn SessionStore>,
    /// Tells the user about recovered replies.
    pub(crate) notifier: Arc<dyn Notifier>,
    /// Where escalations go; without one, a resume failure ends the turn
    /// with a fatal error.
    pub(crate) escalate: Option<EscalationSink>,
    /// How to start.
    pub(crate) mode: StartMode,
    /// The previous incarnation's trace anchor, linked from this one's.
    pub(crate) previous: Option<TraceAnchor>,
}

/// One agent conversation; see the module docs of [`crate::session`].
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct SessionActor;

/// A message waiting for its turn, with its caller's channel.
struct Queued {
    message: crate::store::PendingMessage,
    reply: Option<TurnSender>,
}

/// The running turn: its rules ([`TurnMachine`]) and its resources.
struct Turn {
    machine: TurnMachine,
    queued: Queued,
    /// `session.turn`, open while the turn runs.
    span: tracing::Span,
    /// `stream.attempt` of the running attempt.
    attempt_span: Option<tracing::Span>,
    /// The span of the last failed attempt, linked from the next one.
    last_attempt: Option<SpanContext>,
    /// The running attempt's stream.
    stream: Option<StreamHandle>,
    /// The pending retry; dropping it cancels the retry.
    backoff: Option<Timer>,
    /// Last usage report of the attempt.
    usage: Option<Usage>,
    /// Last usage report carrying context (input side) tokens.
    context_usage: Option<Usage>,
    context_window: Option<u64>,
    text: String,
}

impl Turn {
    fn send(&self, ev: TurnEvent) {
        self.send_with(ev, Credit::none());
    }

    fn send_with(&self, ev: TurnEvent, credit: Credit) {
        if let Some(r) = &self.queued.reply {
            r.send_with(ev, credit);
        }
    }
}

/// State of the session actor.
pub(crate) struct SessionState {
    args: SessionArgs,
    record: SessionRecord,
    queue: VecDeque<Queued>,
    turn: Option<Turn>,
    turns_finished: u64,
    rng: SmallRng,
    /// Bumped on every activity; an idle check for an older value is stale.
    activity: u64,
    last_active: Instant,
    idle_timer: Option<Timer>,
    /// Set once the session escalated: it answers nothing more and writes
    /// nothing more (the supervisor owns the record now).
    escalated: bool,
    anchor: TraceAnchor,
}

impl SessionState {
    /// Where a transition of this session is recorded.
    fn at<'a>(&'a self, parent: Parent<'a>) -> At<'a> {
        At {
            key: &self.args.key,
            conversation: self.record.agent_session_id.as_deref(),
            parent,
            bus: Some(&self.args.bus),
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
    ) -> Result<(SessionHandle, tokio::task::JoinHandle<()>), ActorError> {
        let key = args.key.clone();
        let (tx, mut rx) = tokio::sync::oneshot::channel();
        let spawned = match supervisor {
            Some(s) => Actor::spawn_linked(None, SessionActor, (args, handoff, tx), s).await,
            None => Actor::spawn(None, SessionActor, (args, handoff, tx)).await,
        };
        let (actor, join) = spawned.map_err(|e| ActorError::Spawn {
            what: "session",
            message: e.to_string(),
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
        _myself: ActorRef<Self::Msg>,
        (args, handoff, anchor_tx): Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        let mut record = args.record.clone();
        record.status = RecordStatus::Active;
        // Messages handed over first, then those recovered from the record
        // that the handoff does not already carry.
        let mut queue: VecDeque<Queued> = handoff
            .into_iter()
            .map(|h| Queued {
                message: h.message,
                reply: h.reply,
            })
            .collect();
        for m in &record.pending {
            if !queue.iter().any(|q| q.message.id == m.id) {
                queue.push_back(Queued {
                    message: m.clone(),
                    reply: None,
                });
            }
        }
        args.store.save(&record, Durability::Buffered).await?;
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
        if state.escalated {
            return Ok(()); // stopping; the supervisor owns everything now
        }
        match msg {
            SessionMsg::Submit(text, reply) => {
                let id = state.record.accept(text);
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
                    Transition::StoreFailed { error: &e }.record(state.at(Parent::Root));
                    let _ = reply.send(Err(e));
                    return Ok(());
                }
                let (tx, rx) = TurnSender::channel();
                let _ = reply.send(Ok(rx));
                touch(state);
                state.queue.push_back(Queued {
                    message,
                    reply: Some(tx),
                });
                start_next_turn(&myself, state).await?;
            }
            SessionMsg::Cancel => cancel(&myself, state).await?,
            SessionMsg::Report(StreamReport::Event {
                attempt,
                event,
                credit,
            }) => on_event(state, attempt, event, credit).await?,
            SessionMsg::Report(StreamReport::Ended {
                attempt, outcome, ..
            }) => on_ended(&myself, state, attempt, outcome).await?,
            SessionMsg::Retry(next) => {
                if state
                    .turn
                    .as_ref()
                    .is_some_and(|t| t.machine.retry_due(next))
                {
                    start_attempt(&myself, state)?;
                }
            }
            SessionMsg::IdleCheck(armed) => {
                if reap_due(
                    armed,
                    state.activity,
                    state.turn.is_some(),
                    state.queue.len(),
                ) {
                    reap(&myself, state).await?;
                }
            }
            SessionMsg::Status(reply) => {
                let t = state.turn.as_ref();
                let _ = reply.send(SessionStatus {
                    key: state.args.key.clone(),
                    turn: t.map(|t| t.machine.id()),
                    streaming: t.and_then(|t| t.stream.as_ref()).map(StreamHandle::attempt),
                    backing_off: t.is_some_and(|t| t.machine.phase() == Phase::BackingOff),
                    queued: state.queue.len(),
                    turns_finished: state.turns_finished,
                    record: state.record.clone(),
                });
            }
            SessionMsg::Fail(reason) => return Err(reason.into()),
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        // The running stream goes first: its source (socket, child) is
        // released before the session is reported stopped.
        if let Some(stream) = state.turn.as_ref().and_then(|t| t.stream.as_ref()) {
            stream.cancel();
            let wait = state.args.config.stream_stop_timeout;
            let _ = tokio::time::timeout(wait, stream.finished()).await;
        }
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
                Transition::StoreFailed { error: &error }.record(state.at(Parent::Root));
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

fn touch(state: &mut SessionState) {
    state.activity += 1;
    state.last_active = Instant::now();
    state.idle_timer = None;
}

fn arm_idle(myself: &ActorRef<SessionMsg>, state: &mut SessionState) {
    let idle = state.args.config.idle_timeout;
    if idle.is_zero() || state.turn.is_some() || !state.queue.is_empty() {
        return;
    }
    let activity = state.activity;
    let timer = myself.send_after(idle, move || SessionMsg::IdleCheck(activity));
    state.idle_timer = Some(AbortOnDropHandle::new(timer));
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

/// Starts the next queued turn when none runs; arms the idle timer when
/// nothing is left.
async fn start_next_turn(
    myself: &ActorRef<SessionMsg>,
    state: &mut SessionState,
) -> Result<(), ActorProcessingErr> {
    if state.turn.is_some() {
        return Ok(());
    }
    let Some(queued) = state.queue.pop_front() else {
        arm_idle(myself, state);
        return Ok(());
    };
    touch(state);
    let id = queued.message.id;
    let span = Transition::TurnStarted {
        turn: id,
        provider: state.args.source.provider(),
    }
    .record(state.at(Parent::Anchor(&state.anchor)));
    state.turn = Some(Turn {
        machine: TurnMachine::new(id),
        queued,
        span,
        attempt_span: None,
        last_attempt: None,
        stream: None,
        backoff: None,
        usage: None,
        context_usage: None,
        context_window: None,
        text: String::new(),
    });
    start_attempt(myself, state)
}

fn start_attempt(
    myself: &ActorRef<SessionMsg>,
    state: &mut SessionState,
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
    let attempt = turn.machine.start_attempt(resume_id.clone());
    turn.backoff = None;
    turn.text.clear();
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
    let stream = StreamActor::spawn(StreamArgs {
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

async fn on_event(
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
async fn on_ended(
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
        Decision::Retry { next, delay, error } => {
            Transition::RetryScheduled {
                failed: attempt,
                delay,
                error_code: error.code(),
                retries: turn.last_attempt.as_ref(),
            }
            .record(At {
                key: &state.args.key,
                conversation: state.record.agent_session_id.as_deref(),
                parent: Parent::Span(&turn.span),
                bus: Some(&state.args.bus),
            });
            turn.send(TurnEvent::Retrying {
                failed: attempt,
                delay,
                error,
            });
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
        error,
        cwd: state.record.workspace.clone(),
        diagnostics,
        record: state.record.clone(),
        handoff,
        anchor: state.anchor.clone(),
    })));
    myself.stop(Some(StopReason::Escalated.as_str().into()));
}

async fn cancel(
    myself: &ActorRef<SessionMsg>,
    state: &mut SessionState,
) -> Result<(), ActorProcessingErr> {
    let Some(turn) = state.turn.as_mut() else {
        return Ok(());
    };
    let decision = turn.machine.cancel();
    if decision == OnCancel::AlreadyRequested {
        return Ok(());
    }
    drop(
        Transition::TurnCancelled {
            turn: turn.machine.id(),
        }
        .record(At {
            key: &state.args.key,
            conversation: state.record.agent_session_id.as_deref(),
            parent: Parent::Span(&turn.span),
            bus: Some(&state.args.bus),
        }),
    );
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
            finish_turn(myself, state, Err(TurnError::Cancelled)).await
        }
    }
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
        usage: turn.usage,
        context,
        text: match (cfg.indicator, context) {
            (true, Some(c)) if text.is_empty() => context::indicator(c.percent),
            (true, Some(c)) => format!("{text}\n{}", context::indicator(c.percent)),
            _ => text,
        },
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
                result: summary.map(|s| s.text),
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
                r.send(TurnEvent::Finished(Err(TurnError::SessionStopped {
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

/// The stream-stop wait used when a session has no configuration of its own.
pub(crate) const DEFAULT_STREAM_STOP_TIMEOUT: Duration = Duration::from_secs(5);
