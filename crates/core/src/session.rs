//! The [`SessionActor`]: one agent conversation, its turns and their retries.
//!
//! Messages are queued and run one turn at a time. Each attempt of a turn
//! is a [`StreamActor`] linked to the session. A failed attempt is retried
//! from scratch when its error is retryable and the [`RetryPolicy`] allows
//! it; `ESTREAM_TIMEOUT` from the watchdog is retryable. A user cancel
//! wins over everything that has not already ended the turn: it is never
//! retried, and no event of the cancelled attempt reaches the user after it.
//! Events of attempts that are no longer current are dropped.

use std::collections::VecDeque;
use std::time::Duration;

use ractor::{Actor, ActorCell, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};
use rand::SeedableRng;
use rand::rngs::SmallRng;
use tokio::sync::mpsc;

use crate::error::{ActorError, StreamError, TurnError};
use crate::event::{AgentEvent, Usage};
use crate::lifecycle::{EventBus, LifecycleEvent};
use crate::policy::RetryPolicy;
use crate::source::{EventSource, SessionKey, TurnRequest};
use crate::stream::{
    AttemptId, StreamActor, StreamArgs, StreamHandle, StreamOptions, StreamOutcome, StreamReport,
};
use crate::util::{AbortOnDrop, call};
use crate::watchdog::WatchdogHandle;
use std::sync::Arc;

/// Configuration of a session.
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct SessionConfig {
    /// How failed attempts are retried. Default: [`RetryPolicy::default`].
    pub retry: RetryPolicy,
    /// Options of every stream. Default: [`StreamOptions::default`].
    pub stream: StreamOptions,
}

impl SessionConfig {
    /// Sets the retry policy.
    pub fn with_retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// Sets the stream options.
    pub fn with_stream(mut self, stream: StreamOptions) -> Self {
        self.stream = stream;
        self
    }
}

/// What a session needs to start.
#[derive(Clone)]
pub struct SessionArgs {
    /// The session's key.
    pub key: SessionKey,
    /// Where its turns' streams come from.
    pub source: Arc<dyn EventSource>,
    /// The watchdog its streams register with.
    pub watchdog: WatchdogHandle,
    /// Configuration.
    pub config: SessionConfig,
    /// Where lifecycle events go.
    pub bus: EventBus,
}

/// Progress of one turn, in order: `Started` (once per attempt), any
/// `Event`s and `Retrying`s, then exactly one `Finished`.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum TurnEvent {
    /// An attempt started.
    Started(AttemptId),
    /// An event of the current attempt.
    Event(AgentEvent),
    /// The attempt failed; the turn restarts from scratch after `delay`.
    /// Discard partial output received for this attempt.
    Retrying {
        /// The attempt that failed.
        failed: AttemptId,
        /// Backoff before the next attempt.
        delay: Duration,
        /// Why it failed.
        error: StreamError,
    },
    /// The turn is over.
    Finished(Result<TurnSummary, TurnError>),
}

/// A completed turn.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct TurnSummary {
    /// Turn number.
    pub turn: u64,
    /// Attempts used, the first included.
    pub attempts: u32,
    /// The last usage report of the turn, if any.
    pub usage: Option<Usage>,
}

/// The caller's side of one submitted message.
#[derive(Debug)]
pub struct TurnHandle {
    rx: mpsc::UnboundedReceiver<TurnEvent>,
    done: bool,
}

impl TurnHandle {
    /// The next progress event; `None` after `Finished`.
    pub async fn recv(&mut self) -> Option<TurnEvent> {
        if self.done {
            return None;
        }
        let ev =
            self.rx
                .recv()
                .await
                .unwrap_or(TurnEvent::Finished(Err(TurnError::SessionStopped {
                    reason: "session ended without answering (crashed)".into(),
                })));
        if matches!(ev, TurnEvent::Finished(_)) {
            self.done = true;
        }
        Some(ev)
    }

    /// Waits for the end; returns the text of the successful attempt.
    pub async fn finish(mut self) -> Result<(String, TurnSummary), TurnError> {
        let mut text = String::new();
        while let Some(ev) = self.recv().await {
            match ev {
                TurnEvent::Started(_) => text.clear(),
                TurnEvent::Event(AgentEvent::TextDelta(t)) => text.push_str(&t),
                TurnEvent::Finished(r) => return r.map(|s| (text, s)),
                _ => {}
            }
        }
        Err(TurnError::SessionStopped {
            reason: "turn already finished".into(),
        })
    }
}

/// A snapshot of a session.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct SessionStatus {
    /// The key.
    pub key: SessionKey,
    /// The running turn, if any.
    pub turn: Option<u64>,
    /// The current attempt, if a stream is running.
    pub streaming: Option<AttemptId>,
    /// Whether the running turn waits in backoff.
    pub backing_off: bool,
    /// Messages queued behind the running turn.
    pub queued: usize,
    /// Turns finished since the session started.
    pub turns_finished: u64,
}

/// Message of the [`SessionActor`]; use [`SessionHandle`].
pub struct SessionMsg(Inner);

enum Inner {
    Submit(String, mpsc::UnboundedSender<TurnEvent>),
    Cancel,
    Report(StreamReport),
    Retry(AttemptId),
    Status(RpcReplyPort<SessionStatus>),
    Fail(String),
}

/// A cloneable handle to a running session.
#[derive(Debug, Clone)]
pub struct SessionHandle {
    actor: ActorRef<SessionMsg>,
    key: SessionKey,
}

impl SessionHandle {
    pub(crate) fn new(actor: ActorRef<SessionMsg>, key: SessionKey) -> Self {
        Self { actor, key }
    }

    /// Queues `message`; its turn runs after the turns before it.
    pub fn submit(&self, message: impl Into<String>) -> Result<TurnHandle, ActorError> {
        let (tx, rx) = mpsc::unbounded_channel();
        self.actor
            .cast(SessionMsg(Inner::Submit(message.into(), tx)))
            .map_err(|_| ActorError::NotRunning { what: "session" })?;
        Ok(TurnHandle { rx, done: false })
    }

    /// Cancels the running turn (the Escape key). Queued messages stay.
    pub fn cancel(&self) {
        let _ = self.actor.cast(SessionMsg(Inner::Cancel));
    }

    /// Fails the session as a crash would, so its supervisor applies the
    /// restart policy. For operators forcing a restart, and for tests.
    pub fn fail(&self, reason: impl Into<String>) {
        let _ = self.actor.cast(SessionMsg(Inner::Fail(reason.into())));
    }

    /// A snapshot of the session.
    pub async fn status(&self) -> Result<SessionStatus, ActorError> {
        call(
            &self.actor,
            "session",
            |r| SessionMsg(Inner::Status(r)),
            None,
        )
        .await
    }

    /// The key.
    pub fn key(&self) -> &SessionKey {
        &self.key
    }

    /// The actor, for linking, waiting and stopping.
    pub fn actor(&self) -> &ActorRef<SessionMsg> {
        &self.actor
    }
}

/// One agent conversation; see the module docs.
#[derive(Debug, Default, Clone, Copy)]
pub struct SessionActor;

enum Phase {
    /// Between turn creation and the first stream spawn.
    Starting,
    Streaming(StreamHandle),
    /// Waiting to retry; dropping the timer cancels the retry.
    Backoff(#[allow(dead_code)] AbortOnDrop<Result<(), ractor::MessagingErr<SessionMsg>>>),
}

struct Turn {
    id: u64,
    message: String,
    reply: mpsc::UnboundedSender<TurnEvent>,
    attempt: u32,
    phase: Phase,
    cancel_requested: bool,
    usage: Option<Usage>,
}

/// State of the [`SessionActor`].
pub struct SessionState {
    args: SessionArgs,
    queue: VecDeque<(String, mpsc::UnboundedSender<TurnEvent>)>,
    turn: Option<Turn>,
    next_turn: u64,
    turns_finished: u64,
    rng: SmallRng,
}

impl SessionActor {
    /// Spawns a session under `supervisor`.
    pub async fn spawn_linked(
        args: SessionArgs,
        supervisor: ActorCell,
    ) -> Result<SessionHandle, ActorError> {
        let key = args.key.clone();
        let (actor, _) = Actor::spawn_linked(None, SessionActor, args, supervisor)
            .await
            .map_err(|e| ActorError::Spawn {
                what: "session",
                message: e.to_string(),
            })?;
        Ok(SessionHandle::new(actor, key))
    }

    /// Spawns an unsupervised session.
    pub async fn spawn(
        args: SessionArgs,
    ) -> Result<(SessionHandle, tokio::task::JoinHandle<()>), ActorError> {
        let key = args.key.clone();
        let (actor, join) =
            Actor::spawn(None, SessionActor, args)
                .await
                .map_err(|e| ActorError::Spawn {
                    what: "session",
                    message: e.to_string(),
                })?;
        Ok((SessionHandle::new(actor, key), join))
    }
}

impl Actor for SessionActor {
    type Msg = SessionMsg;
    type State = SessionState;
    type Arguments = SessionArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        args: SessionArgs,
    ) -> Result<Self::State, ActorProcessingErr> {
        args.bus.publish(LifecycleEvent::SessionSpawned {
            key: args.key.clone(),
        });
        tracing::info!(event = "session.spawn", session.key = %args.key, "session started");
        Ok(SessionState {
            args,
            queue: VecDeque::new(),
            turn: None,
            next_turn: 1,
            turns_finished: 0,
            rng: SmallRng::from_rng(&mut rand::rng()),
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        SessionMsg(msg): Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            Inner::Submit(message, reply) => {
                state.queue.push_back((message, reply));
                if state.turn.is_none() {
                    start_next_turn(&myself, state).await?;
                }
            }
            Inner::Cancel => cancel(&myself, state).await?,
            Inner::Report(StreamReport::Event { attempt, event }) => {
                on_event(state, attempt, event)
            }
            Inner::Report(StreamReport::Ended {
                attempt, outcome, ..
            }) => on_ended(&myself, state, attempt, outcome).await?,
            Inner::Retry(attempt) => {
                let due = state
                    .turn
                    .as_ref()
                    .is_some_and(|t| t.id == attempt.turn && t.attempt + 1 == attempt.attempt);
                if due {
                    start_attempt(&myself, state).await?;
                }
            }
            Inner::Status(reply) => {
                let t = state.turn.as_ref();
                let _ = reply.send(SessionStatus {
                    key: state.args.key.clone(),
                    turn: t.map(|t| t.id),
                    streaming: t.and_then(|t| match &t.phase {
                        Phase::Streaming(s) => Some(s.attempt()),
                        Phase::Backoff(_) | Phase::Starting => None,
                    }),
                    backing_off: t.is_some_and(|t| matches!(t.phase, Phase::Backoff(_))),
                    queued: state.queue.len(),
                    turns_finished: state.turns_finished,
                });
            }
            Inner::Fail(reason) => return Err(reason.into()),
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<Self::Msg>,
        event: SupervisionEvent,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        // Streams report their own end; only a crash of the current one needs
        // handling here (a normal termination is already reported).
        if let SupervisionEvent::ActorFailed(cell, err) = event {
            let current = state.turn.as_ref().and_then(|t| match &t.phase {
                Phase::Streaming(s) if s.actor().get_id() == cell.get_id() => Some(s.attempt()),
                _ => None,
            });
            if let Some(attempt) = current {
                let outcome = StreamOutcome::Failed(StreamError::Internal {
                    message: format!("stream actor failed: {err}"),
                });
                on_ended(&myself, state, attempt, outcome).await?;
            }
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        myself
            .stop_children_and_wait(None, Some(Duration::from_secs(5)))
            .await;
        let reason = "session stopped".to_owned();
        if let Some(turn) = state.turn.take() {
            let _ = turn
                .reply
                .send(TurnEvent::Finished(Err(TurnError::SessionStopped {
                    reason: reason.clone(),
                })));
        }
        for (_, reply) in state.queue.drain(..) {
            let _ = reply.send(TurnEvent::Finished(Err(TurnError::SessionStopped {
                reason: reason.clone(),
            })));
        }
        Ok(())
    }
}

async fn start_next_turn(
    myself: &ActorRef<SessionMsg>,
    state: &mut SessionState,
) -> Result<(), ActorProcessingErr> {
    while state.turn.is_none() {
        let Some((message, reply)) = state.queue.pop_front() else {
            return Ok(());
        };
        if reply.is_closed() {
            continue; // the caller went away before its turn began
        }
        let id = state.next_turn;
        state.next_turn += 1;
        state.args.bus.publish(LifecycleEvent::TurnStarted {
            key: state.args.key.clone(),
            turn: id,
        });
        tracing::info!(event = "session.turn", session.key = %state.args.key, turn = id, "turn started");
        state.turn = Some(Turn {
            id,
            message,
            reply,
            attempt: 0,
            // Replaced by start_attempt right away.
            phase: Phase::Starting,
            cancel_requested: false,
            usage: None,
        });
        start_attempt(myself, state).await?;
    }
    Ok(())
}

async fn start_attempt(
    myself: &ActorRef<SessionMsg>,
    state: &mut SessionState,
) -> Result<(), ActorProcessingErr> {
    let Some(turn) = state.turn.as_mut() else {
        return Ok(());
    };
    turn.attempt += 1;
    let attempt = AttemptId {
        turn: turn.id,
        attempt: turn.attempt,
    };
    let mut request = TurnRequest::new(state.args.key.clone(), turn.id, turn.message.clone());
    request.attempt = turn.attempt;
    let me = myself.clone();
    let args = StreamArgs {
        attempt,
        source: state.args.source.clone(),
        request,
        watchdog: state.args.watchdog.clone(),
        options: state.args.config.stream.clone(),
        sink: Arc::new(move |r| {
            let _ = me.cast(SessionMsg(Inner::Report(r)));
        }),
    };
    let stream = StreamActor::spawn_linked(args, myself.get_cell()).await?;
    let timeout = state
        .args
        .config
        .stream
        .timeout
        .unwrap_or(state.args.watchdog.default_timeout());
    state.args.bus.publish(LifecycleEvent::AttemptStarted {
        key: state.args.key.clone(),
        attempt,
        timeout,
    });
    tracing::debug!(
        event = "stream.attempt",
        session.key = %state.args.key,
        turn = attempt.turn,
        attempt = attempt.attempt,
        timeout_ms = timeout.as_millis() as u64,
        "stream attempt started"
    );
    let _ = turn.reply.send(TurnEvent::Started(attempt));
    turn.phase = Phase::Streaming(stream);
    Ok(())
}

fn is_live(turn: &Turn, attempt: AttemptId) -> bool {
    turn.id == attempt.turn
        && turn.attempt == attempt.attempt
        && matches!(turn.phase, Phase::Streaming(_))
}

fn on_event(state: &mut SessionState, attempt: AttemptId, event: AgentEvent) {
    let Some(turn) = state.turn.as_mut() else {
        return;
    };
    if !is_live(turn, attempt) || turn.cancel_requested {
        return; // a dead attempt, or the user already pressed Escape
    }
    if let AgentEvent::Usage(u) = &event {
        turn.usage = Some(*u);
    }
    let _ = turn.reply.send(TurnEvent::Event(event));
}

async fn on_ended(
    myself: &ActorRef<SessionMsg>,
    state: &mut SessionState,
    attempt: AttemptId,
    outcome: StreamOutcome,
) -> Result<(), ActorProcessingErr> {
    let key = state.args.key.clone();
    let Some(turn) = state.turn.as_mut() else {
        return Ok(());
    };
    if !is_live(turn, attempt) {
        return Ok(());
    }
    if let StreamOutcome::Failed(StreamError::InactivityTimeout { silent_for, .. }) = &outcome {
        state.args.bus.publish(LifecycleEvent::StreamTimedOut {
            key: key.clone(),
            attempt,
            silent_for: *silent_for,
        });
        tracing::warn!(
            event = "stream.timeout",
            session.key = %key,
            turn = attempt.turn,
            attempt = attempt.attempt,
            error.r#type = "ESTREAM_TIMEOUT",
            silent_ms = silent_for.as_millis() as u64,
            "Connection lost during streaming"
        );
    }
    let result = match outcome {
        StreamOutcome::Completed => Ok(TurnSummary {
            turn: turn.id,
            attempts: turn.attempt,
            usage: turn.usage,
        }),
        StreamOutcome::Cancelled => Err(TurnError::Cancelled),
        StreamOutcome::Failed(_) if turn.cancel_requested => Err(TurnError::Cancelled),
        StreamOutcome::Failed(error) => {
            match state
                .args
                .config
                .retry
                .next_delay(turn.attempt, &error, &mut state.rng)
            {
                Some(delay) => {
                    state.args.bus.publish(LifecycleEvent::RetryScheduled {
                        key: key.clone(),
                        failed: attempt,
                        delay,
                        error_code: error.code(),
                    });
                    tracing::info!(
                        event = "stream.retry",
                        session.key = %key,
                        turn = attempt.turn,
                        attempt = attempt.attempt,
                        delay_ms = delay.as_millis() as u64,
                        error.r#type = error.code(),
                        "retrying turn from scratch"
                    );
                    let _ = turn.reply.send(TurnEvent::Retrying {
                        failed: attempt,
                        delay,
                        error,
                    });
                    let next = AttemptId {
                        turn: attempt.turn,
                        attempt: attempt.attempt + 1,
                    };
                    let timer = myself.send_after(delay, move || SessionMsg(Inner::Retry(next)));
                    turn.phase = Phase::Backoff(AbortOnDrop(timer));
                    return Ok(());
                }
                None if error.is_retryable() => Err(TurnError::RetriesExhausted {
                    attempts: turn.attempt,
                    last: error,
                }),
                None => Err(TurnError::Fatal(error)),
            }
        }
    };
    finish_turn(state, result);
    start_next_turn(myself, state).await
}

async fn cancel(
    myself: &ActorRef<SessionMsg>,
    state: &mut SessionState,
) -> Result<(), ActorProcessingErr> {
    let Some(turn) = state.turn.as_mut() else {
        return Ok(());
    };
    if turn.cancel_requested {
        return Ok(());
    }
    turn.cancel_requested = true;
    tracing::info!(event = "stream.cancel", session.key = %state.args.key, turn = turn.id, "turn cancelled by user");
    match &turn.phase {
        // The stream decides the race; its end finishes the turn as cancelled.
        Phase::Streaming(stream) => stream.cancel(),
        // Nothing running: drop the pending retry and finish now.
        Phase::Backoff(_) | Phase::Starting => {
            finish_turn(state, Err(TurnError::Cancelled));
            start_next_turn(myself, state).await?;
        }
    }
    Ok(())
}

fn finish_turn(state: &mut SessionState, result: Result<TurnSummary, TurnError>) {
    let Some(turn) = state.turn.take() else {
        return;
    };
    state.turns_finished += 1;
    let error_code = result.as_ref().err().map(TurnError::code);
    state.args.bus.publish(LifecycleEvent::TurnFinished {
        key: state.args.key.clone(),
        turn: turn.id,
        attempts: turn.attempt,
        error_code,
    });
    tracing::info!(
        event = "session.turn_finished",
        session.key = %state.args.key,
        turn = turn.id,
        attempts = turn.attempt,
        error.r#type = error_code.unwrap_or(""),
        "turn finished"
    );
    let _ = turn.reply.send(TurnEvent::Finished(result));
}
