//! The [`SessionActor`]: one agent conversation, its turns and their retries.
//!
//! Messages are persisted (flushed) before they are acknowledged, then run
//! one turn at a time. Each attempt of a turn is a [`StreamActor`] (a task
//! the session cancels and waits for when it stops). A failed attempt is retried from scratch when its error is
//! retryable and the [`RetryPolicy`] allows it; `ESTREAM_TIMEOUT` from the
//! watchdog is retryable. A user cancel wins over everything that has not
//! already ended the turn: it is never retried, and no event of the
//! cancelled attempt reaches the user after it. Events of attempts that are
//! no longer current are dropped.
//!
//! A stored conversation that cannot be resumed (unknown id, prompt too
//! long) is escalated to the supervisor with every unanswered turn, so the
//! supervisor can start the session fresh and re-deliver them. A session
//! idle for [`SessionConfig::idle_timeout`] stops itself ("reaped") and
//! keeps its record; the next message resumes it.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorCell, ActorProcessingErr, ActorRef, RpcReplyPort};
use rand::SeedableRng;
use rand::rngs::SmallRng;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::context::{self, ContextConfig};
use crate::error::{ActorError, ResumeCause, StreamError, TurnError};
use crate::event::{AgentEvent, Usage};
use crate::lifecycle::{EventBus, LifecycleEvent};
use crate::notify::{Notice, Notifier};
use crate::policy::RetryPolicy;
use crate::source::{Diagnostics, EventSource, SessionKey, TurnRequest};
use crate::spans::{self, TraceAnchor, names};
use crate::store::{
    Durability, PendingMessage, RecordStatus, SessionRecord, SessionStore, StoreError, StoredUsage,
};
use crate::stream::{
    AttemptId, Credit, StreamActor, StreamArgs, StreamHandle, StreamOptions, StreamOutcome,
    StreamReport,
};
use crate::util::{AbortOnDrop, call};
use crate::watchdog::WatchdogHandle;

/// The stop reason of a session that reaped itself for idleness.
pub const REAPED: &str = "reaped: idle";
/// The stop reason of a session that escalated a failure to its supervisor.
pub const ESCALATED: &str = "escalated to supervisor";

/// Configuration of a session.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct SessionConfig {
    /// How failed attempts are retried. Default: [`RetryPolicy::default`].
    pub retry: RetryPolicy,
    /// Options of every stream. Default: [`StreamOptions::default`].
    pub stream: StreamOptions,
    /// Stop the session after this long without activity, keeping its
    /// record; `Duration::ZERO` disables. Default 15 min. Never while a turn
    /// runs or messages wait.
    pub idle_timeout: Duration,
    /// The context indicator. Default: [`ContextConfig::default`].
    pub context: ContextConfig,
}

impl Default for SessionConfig {
    fn default() -> Self {
        Self {
            retry: RetryPolicy::default(),
            stream: StreamOptions::default(),
            idle_timeout: Duration::from_secs(15 * 60),
            context: ContextConfig::default(),
        }
    }
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

    /// Sets the idle timeout (`Duration::ZERO` disables reaping).
    pub fn with_idle_timeout(mut self, idle: Duration) -> Self {
        self.idle_timeout = idle;
        self
    }

    /// Sets the context indicator configuration.
    pub fn with_context(mut self, context: ContextConfig) -> Self {
        self.context = context;
        self
    }
}

/// A turn handed from a failed session to its replacement.
#[derive(Debug)]
pub struct Handoff {
    /// The pending message.
    pub message: PendingMessage,
    /// The caller's channel, if the caller is still there.
    pub reply: Option<TurnSender>,
}

/// The session's end of a turn's event channel (the other end is the
/// [`TurnHandle`]). Events carry their stream [`Credit`], returned when the
/// caller takes them out, so a caller that does not read holds the stream
/// back instead of filling memory.
#[derive(Debug, Clone)]
pub struct TurnSender(mpsc::UnboundedSender<(TurnEvent, Credit)>);

impl TurnSender {
    /// A new channel: the sender and the caller's receiving end.
    pub(crate) fn channel() -> (Self, mpsc::UnboundedReceiver<(TurnEvent, Credit)>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (Self(tx), rx)
    }

    /// Sends an event that holds no stream credit; `false` if the caller is
    /// gone.
    pub fn send(&self, event: TurnEvent) -> bool {
        self.send_with(event, Credit::none())
    }

    /// Sends a stream event with its credit; `false` if the caller is gone
    /// (the credit is then returned at once).
    pub fn send_with(&self, event: TurnEvent, credit: Credit) -> bool {
        self.0.send((event, credit)).is_ok()
    }
}

/// A stored conversation could not be resumed.
#[derive(Debug)]
#[non_exhaustive]
pub struct ResumeFailure {
    /// The session.
    pub key: SessionKey,
    /// The id that failed to resume.
    pub failed_id: String,
    /// The error.
    pub error: StreamError,
    /// The workspace (the agent's cwd).
    pub cwd: Option<PathBuf>,
    /// What the source knows (stderr tail, transcript size).
    pub diagnostics: Diagnostics,
    /// The session's record as last written.
    pub record: SessionRecord,
    /// Every unanswered turn, the failed one first.
    pub handoff: Vec<Handoff>,
    /// The failed incarnation's trace anchor.
    pub anchor: TraceAnchor,
}

/// What a session escalates to its supervisor.
#[derive(Debug)]
#[non_exhaustive]
#[allow(clippy::large_enum_variant)] // sent at most twice in a session's life
pub enum Escalation {
    /// Resume failed: start fresh and re-deliver.
    ResumeFailed(Box<ResumeFailure>),
    /// A fresh start after a resume failure failed too.
    FreshStartFailed {
        /// The session.
        key: SessionKey,
        /// The resume failure that led to the fresh start.
        first_cause: String,
        /// Why the fresh start failed.
        error: TurnError,
    },
}

/// Receives a session's escalations (the supervisor's mailbox).
pub type EscalationSink = Arc<dyn Fn(Escalation) + Send + Sync + 'static>;

/// How a session starts.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum StartMode {
    /// Resume the stored agent session id, if any.
    #[default]
    Resume,
    /// Start fresh after a resume failure with `cause`; if the first turn
    /// fails too, escalate [`Escalation::FreshStartFailed`].
    FreshFallback {
        /// The resume failure.
        cause: String,
    },
}

/// What a session needs to start.
#[derive(Clone)]
pub struct SessionArgs {
    /// The session's key.
    pub key: SessionKey,
    /// Its stored record (a new one for a new session).
    pub record: SessionRecord,
    /// Where its turns' streams come from.
    pub source: Arc<dyn EventSource>,
    /// The watchdog its streams register with.
    pub watchdog: WatchdogHandle,
    /// Configuration.
    pub config: SessionConfig,
    /// Where lifecycle events go.
    pub bus: EventBus,
    /// Where records are written.
    pub store: Arc<dyn SessionStore>,
    /// Tells the user about recovered replies.
    pub notifier: Arc<dyn Notifier>,
    /// Where escalations go; without one, a resume failure ends the turn
    /// with a fatal error.
    pub escalate: Option<EscalationSink>,
    /// How to start.
    pub mode: StartMode,
    /// The previous incarnation's trace anchor, linked from this one's.
    pub previous: Option<TraceAnchor>,
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
    /// The stored conversation could not be resumed; the message moves to a
    /// fresh session and this turn continues there.
    Restarting {
        /// Why the conversation could not be resumed.
        cause: ResumeCause,
    },
    /// The turn is over.
    Finished(Result<TurnSummary, TurnError>),
}

/// Context usage at the end of a turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContextReport {
    /// Tokens in context (input + cache creation + cache read of the last
    /// usage report).
    pub tokens: u64,
    /// The window measured against.
    pub window: u64,
    /// Percent, rounded.
    pub percent: u32,
    /// The agent's own estimate, when the self-report track is on.
    pub self_reported: Option<u32>,
}

/// A completed turn.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct TurnSummary {
    /// Turn number (the pending message id).
    pub turn: u64,
    /// Attempts used, the first included.
    pub attempts: u32,
    /// The last usage report of the turn, if any.
    pub usage: Option<Usage>,
    /// Context in use, once any usage is known.
    pub context: Option<ContextReport>,
    /// The text to relay: the successful attempt's text, the self-report
    /// stripped, `[ctx: NN%]` appended when enabled and known.
    pub text: String,
}

/// The caller's side of one submitted message.
#[derive(Debug)]
pub struct TurnHandle {
    rx: mpsc::UnboundedReceiver<(TurnEvent, Credit)>,
    done: bool,
}

impl TurnHandle {
    /// The next progress event; `None` after `Finished`.
    pub async fn recv(&mut self) -> Option<TurnEvent> {
        if self.done {
            return None;
        }
        // Taking the event out returns its credit: the stream reads on.
        let ev = self
            .rx
            .recv()
            .await
            .map(|(ev, _credit)| ev)
            .unwrap_or(TurnEvent::Finished(Err(TurnError::SessionStopped {
                reason: "session ended without answering (crashed)".into(),
            })));
        if matches!(ev, TurnEvent::Finished(_)) {
            self.done = true;
        }
        Some(ev)
    }

    /// Waits for the end; returns the text to relay and the summary.
    pub async fn finish(mut self) -> Result<(String, TurnSummary), TurnError> {
        while let Some(ev) = self.recv().await {
            if let TurnEvent::Finished(r) = ev {
                return r.map(|s| (s.text.clone(), s));
            }
        }
        Err(TurnError::SessionStopped {
            reason: "turn already finished".into(),
        })
    }
}

/// Why a message was not accepted.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SubmitError {
    /// The session is not running (stopped, reaped, or restarting).
    #[error(transparent)]
    Actor(#[from] ActorError),
    /// The message could not be persisted; it was not accepted.
    #[error(transparent)]
    Store(#[from] StoreError),
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
    /// The record as last written.
    pub record: SessionRecord,
}

/// Message of the [`SessionActor`]; use [`SessionHandle`].
pub struct SessionMsg(Inner);

enum Inner {
    Submit(
        String,
        RpcReplyPort<Result<mpsc::UnboundedReceiver<(TurnEvent, Credit)>, StoreError>>,
    ),
    Cancel,
    Report(StreamReport),
    Retry(AttemptId),
    IdleCheck(u64),
    Status(RpcReplyPort<SessionStatus>),
    Fail(String),
}

/// A cloneable handle to a running session.
#[derive(Debug, Clone)]
pub struct SessionHandle {
    actor: ActorRef<SessionMsg>,
    key: SessionKey,
    anchor: TraceAnchor,
}

impl SessionHandle {
    /// This incarnation's trace anchor.
    pub fn anchor(&self) -> &TraceAnchor {
        &self.anchor
    }

    /// Persists `message` (flushed) and queues it; its turn runs after the
    /// turns before it. Returns once the message is durable.
    pub async fn submit(&self, message: impl Into<String>) -> Result<TurnHandle, SubmitError> {
        let message = message.into();
        let rx = call(
            &self.actor,
            "session",
            |r| SessionMsg(Inner::Submit(message, r)),
            None,
        )
        .await??;
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

struct Queued {
    message: PendingMessage,
    reply: Option<TurnSender>,
}

struct Turn {
    queued: Queued,
    /// `session.turn`, open while the turn runs.
    span: tracing::Span,
    /// `stream.attempt` of the running attempt.
    attempt_span: Option<tracing::Span>,
    /// The span of the last failed attempt, linked from the next one.
    last_attempt: Option<opentelemetry::trace::SpanContext>,
    attempt: u32,
    phase: Phase,
    cancel_requested: bool,
    resume_id: Option<String>,
    /// Last usage report of the turn.
    usage: Option<Usage>,
    /// Last usage report carrying context (input side) tokens.
    context_usage: Option<Usage>,
    context_window: Option<u64>,
    text: String,
}

impl Turn {
    fn id(&self) -> u64 {
        self.queued.message.id
    }

    fn send(&self, ev: TurnEvent) {
        self.send_with(ev, Credit::none());
    }

    fn send_with(&self, ev: TurnEvent, credit: Credit) {
        if let Some(r) = &self.queued.reply {
            r.send_with(ev, credit);
        }
    }
}

/// State of the [`SessionActor`].
pub struct SessionState {
    args: SessionArgs,
    record: SessionRecord,
    queue: VecDeque<Queued>,
    turn: Option<Turn>,
    turns_finished: u64,
    rng: SmallRng,
    /// Bumped on every activity; an idle check for an older value is stale.
    activity: u64,
    last_active: Instant,
    idle_timer: Option<AbortOnDrop<Result<(), ractor::MessagingErr<SessionMsg>>>>,
    /// Set once the session escalated: it answers nothing more.
    escalated: bool,
    anchor: TraceAnchor,
}

impl SessionActor {
    /// Spawns a session under `supervisor`.
    pub async fn spawn_linked(
        args: SessionArgs,
        supervisor: ActorCell,
    ) -> Result<SessionHandle, ActorError> {
        Self::spawn_inner(args, Vec::new(), Some(supervisor))
            .await
            .map(|(h, _)| h)
    }

    async fn spawn_inner(
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
        Ok((SessionHandle { actor, key, anchor }, join))
    }

    /// Spawns a session under `supervisor` that first runs `handoff` (turns
    /// re-delivered from a failed session).
    pub async fn spawn_with_handoff(
        args: SessionArgs,
        handoff: Vec<Handoff>,
        supervisor: ActorCell,
    ) -> Result<SessionHandle, ActorError> {
        Self::spawn_inner(args, handoff, Some(supervisor))
            .await
            .map(|(h, _)| h)
    }

    /// Spawns an unsupervised session.
    pub async fn spawn(
        args: SessionArgs,
    ) -> Result<(SessionHandle, tokio::task::JoinHandle<()>), ActorError> {
        Self::spawn_inner(args, Vec::new(), None).await
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
        if record.status != RecordStatus::Active {
            record.status = RecordStatus::Active;
        }
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
        let recovered = queue.iter().filter(|q| q.reply.is_none()).count();
        args.store.save(&record, Durability::Buffered).await?;
        match &args.mode {
            StartMode::Resume => match &record.agent_session_id {
                Some(id) => {
                    // A missing transcript here usually means a cwd mismatch.
                    let d = args.source.diagnostics(id, record.workspace.as_deref());
                    tracing::info!(
                        event = "session.resume",
                        session.key = %args.key,
                        gen_ai.conversation.id = %id,
                        cwd = ?record.workspace,
                        transcript = ?d.transcript_path,
                        transcript_bytes = ?d.transcript_bytes,
                        "resuming stored session"
                    )
                }
                None => tracing::info!(
                    event = "session.spawn",
                    session.key = %args.key,
                    cwd = ?record.workspace,
                    model = ?record.model,
                    "new session"
                ),
            },
            StartMode::FreshFallback { cause } => tracing::warn!(
                event = "session.fresh_fallback",
                session.key = %args.key,
                cause = %cause,
                cwd = ?record.workspace,
                "starting fresh after a resume failure"
            ),
        }
        if recovered > 0 {
            tracing::info!(session.key = %args.key, recovered, "re-delivering unanswered messages");
        }
        let anchor_name = match (&args.mode, &record.agent_session_id) {
            (StartMode::FreshFallback { .. }, _) => names::SESSION_FRESH_FALLBACK,
            (StartMode::Resume, Some(_)) => names::SESSION_RESUME,
            (StartMode::Resume, None) => names::SESSION_SPAWN,
        };
        let anchor = spans::anchor(
            anchor_name,
            args.key.as_str(),
            record.agent_session_id.as_deref(),
            record.workspace.as_deref(),
            record.restart_count,
            args.previous.as_ref(),
        );
        let _ = anchor_tx.send(anchor.clone());
        args.bus.publish(LifecycleEvent::SessionSpawned {
            key: args.key.clone(),
        });
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
        if state.queue.is_empty() {
            arm_idle(&myself, state);
        } else {
            start_next_turn(&myself, state).await?;
        }
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        SessionMsg(msg): Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        if state.escalated {
            return Ok(()); // stopping; the supervisor owns everything now
        }
        match msg {
            Inner::Submit(text, reply) => {
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
                    tracing::error!(session.key = %state.args.key, error = %e, "could not persist message");
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
                if state.turn.is_none() {
                    start_next_turn(&myself, state).await?;
                }
            }
            Inner::Cancel => cancel(&myself, state).await?,
            Inner::Report(StreamReport::Event {
                attempt,
                event,
                credit,
            }) => on_event(state, attempt, event, credit).await?,
            Inner::Report(StreamReport::Ended {
                attempt, outcome, ..
            }) => on_ended(&myself, state, attempt, outcome).await?,
            Inner::Retry(attempt) => {
                let due = state
                    .turn
                    .as_ref()
                    .is_some_and(|t| t.id() == attempt.turn && t.attempt + 1 == attempt.attempt);
                if due {
                    start_attempt(&myself, state).await?;
                }
            }
            Inner::IdleCheck(activity) => {
                if activity == state.activity && state.turn.is_none() && state.queue.is_empty() {
                    reap(&myself, state).await?;
                }
            }
            Inner::Status(reply) => {
                let t = state.turn.as_ref();
                let _ = reply.send(SessionStatus {
                    key: state.args.key.clone(),
                    turn: t.map(Turn::id),
                    streaming: t.and_then(|t| match &t.phase {
                        Phase::Streaming(s) => Some(s.attempt()),
                        Phase::Backoff(_) | Phase::Starting => None,
                    }),
                    backing_off: t.is_some_and(|t| matches!(t.phase, Phase::Backoff(_))),
                    queued: state.queue.len(),
                    turns_finished: state.turns_finished,
                    record: state.record.clone(),
                });
            }
            Inner::Fail(reason) => return Err(reason.into()),
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
        if let Some(Phase::Streaming(stream)) = state.turn.as_ref().map(|t| &t.phase) {
            stream.cancel();
            let _ = tokio::time::timeout(Duration::from_secs(5), stream.finished()).await;
        }
        // A stopped session is not active any more (a shutdown, or a stop
        // asked by the supervisor); after a crash or a kill the record keeps
        // saying Active, which is how a restart can tell.
        if state.record.status == RecordStatus::Active {
            state.record.status = RecordStatus::Idle;
            if let Err(error) = state
                .args
                .store
                .save(&state.record, Durability::Flushed)
                .await
            {
                tracing::warn!(
                    event = "session.store_failed",
                    session.key = %state.args.key,
                    %error,
                    "could not mark the stopped session idle"
                );
            }
        }
        // Unanswered messages stay pending in the record: the next start of
        // this session re-delivers them. Callers are told now.
        let reason = "session stopped".to_owned();
        let turns = state.turn.take().map(|t| t.queued);
        for q in turns.into_iter().chain(state.queue.drain(..)) {
            if let Some(r) = q.reply {
                let _ = r.send(TurnEvent::Finished(Err(TurnError::SessionStopped {
                    reason: reason.clone(),
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
    let timer = myself.send_after(idle, move || SessionMsg(Inner::IdleCheck(activity)));
    state.idle_timer = Some(AbortOnDrop(timer));
}

async fn reap(
    myself: &ActorRef<SessionMsg>,
    state: &mut SessionState,
) -> Result<(), ActorProcessingErr> {
    let idle_for = state.last_active.elapsed();
    state.record.status = RecordStatus::Idle;
    state
        .args
        .store
        .save(&state.record, Durability::Buffered)
        .await?;
    let tokens = state
        .record
        .usage
        .map(|u| u.input_tokens + u.cache_creation_input_tokens + u.cache_read_input_tokens);
    let span = tracing::info_span!(
        "session.reap",
        warden.session.key = state.args.key.as_str(),
        gen_ai.conversation.id = state.record.agent_session_id.as_deref().unwrap_or(""),
        warden.idle_ms = idle_for.as_millis() as u64,
        warden.context_tokens = tokens.unwrap_or(0),
    );
    state.anchor.adopt(&span);
    let _entered = span.enter();
    tracing::info!(
        event = "session.reap",
        session.key = %state.args.key,
        cwd = ?state.record.workspace,
        idle_ms = idle_for.as_millis() as u64,
        context_tokens = ?tokens,
        "reaping idle session"
    );
    state.args.bus.publish(LifecycleEvent::SessionReaped {
        key: state.args.key.clone(),
        idle_for,
        context_tokens: tokens,
    });
    myself.stop(Some(REAPED.into()));
    Ok(())
}

async fn start_next_turn(
    myself: &ActorRef<SessionMsg>,
    state: &mut SessionState,
) -> Result<(), ActorProcessingErr> {
    while state.turn.is_none() {
        let Some(queued) = state.queue.pop_front() else {
            arm_idle(myself, state);
            return Ok(());
        };
        touch(state);
        let id = queued.message.id;
        state.args.bus.publish(LifecycleEvent::TurnStarted {
            key: state.args.key.clone(),
            turn: id,
        });
        tracing::info!(event = "session.turn", session.key = %state.args.key, turn = id, "turn started");
        let span = tracing::info_span!(
            "session.turn",
            warden.session.key = state.args.key.as_str(),
            gen_ai.conversation.id = state.record.agent_session_id.as_deref().unwrap_or(""),
            gen_ai.operation.name = "chat",
            gen_ai.provider.name = state.args.source.provider(),
            warden.turn = id,
            warden.attempts = tracing::field::Empty,
            warden.ctx_pct = tracing::field::Empty,
            gen_ai.usage.input_tokens = tracing::field::Empty,
            gen_ai.usage.output_tokens = tracing::field::Empty,
            error.r#type = tracing::field::Empty,
            otel.status_code = tracing::field::Empty,
        );
        state.anchor.adopt(&span);
        state.turn = Some(Turn {
            queued,
            span,
            attempt_span: None,
            last_attempt: None,
            attempt: 0,
            phase: Phase::Starting,
            cancel_requested: false,
            resume_id: None,
            usage: None,
            context_usage: None,
            context_window: None,
            text: String::new(),
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
    turn.text.clear();
    turn.usage = None;
    turn.context_usage = None;
    let attempt = AttemptId {
        turn: turn.id(),
        attempt: turn.attempt,
    };
    let mut request = TurnRequest::new(
        state.args.key.clone(),
        turn.id(),
        turn.queued.message.text.clone(),
    );
    request.attempt = turn.attempt;
    request.resume_id = state.record.agent_session_id.clone();
    request.workspace = state.record.workspace.clone();
    if state.args.config.context.self_report {
        request.append_system_prompt = Some(context::SELF_REPORT_INSTRUCTION.to_owned());
    }
    turn.resume_id = request.resume_id.clone();
    let timeout = state
        .args
        .config
        .stream
        .timeout
        .unwrap_or(state.args.watchdog.default_timeout());
    let attempt_span = tracing::info_span!(
        parent: &turn.span,
        "stream.attempt",
        warden.session.key = state.args.key.as_str(),
        gen_ai.conversation.id = state.record.agent_session_id.as_deref().unwrap_or(""),
        gen_ai.provider.name = state.args.source.provider(),
        warden.turn = attempt.turn,
        warden.attempt = attempt.attempt,
        warden.timeout_ms = timeout.as_millis() as u64,
        error.r#type = tracing::field::Empty,
        otel.status_code = tracing::field::Empty,
    );
    if let Some(prev) = &turn.last_attempt {
        spans::link(&attempt_span, prev);
    }
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
        span: attempt_span.clone(),
    };
    let stream = StreamActor::spawn(args)?;
    turn.attempt_span = Some(attempt_span);
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
    turn.send(TurnEvent::Started(attempt));
    turn.phase = Phase::Streaming(stream);
    Ok(())
}

fn is_live(turn: &Turn, attempt: AttemptId) -> bool {
    turn.id() == attempt.turn
        && turn.attempt == attempt.attempt
        && matches!(turn.phase, Phase::Streaming(_))
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
    if !is_live(turn, attempt) || turn.cancel_requested {
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
                tracing::info!(
                    event = "session.agent_id",
                    session.key = %state.args.key,
                    gen_ai.conversation.id = %session_id,
                    previous = ?state.record.past_session_ids.last(),
                    "agent session id stored"
                );
                state.args.bus.publish(LifecycleEvent::AgentSessionId {
                    key: state.args.key.clone(),
                    session_id: session_id.clone(),
                });
            }
        }
        _ => {}
    }
    turn.send_with(TurnEvent::Event(event), credit);
    Ok(())
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
    // Close the attempt's span with its outcome; remember it for the link
    // from a retry.
    if let Some(span) = turn.attempt_span.take() {
        match &outcome {
            StreamOutcome::Failed(e) => spans::fail(&span, e.code()),
            StreamOutcome::Cancelled => spans::fail(&span, "ECANCELLED"),
            StreamOutcome::Completed => {}
        }
        if let StreamOutcome::Failed(StreamError::InactivityTimeout {
            silent_for,
            timeout,
        }) = &outcome
        {
            let t = tracing::info_span!(
                parent: &span,
                "stream.timeout",
                warden.session.key = key.as_str(),
                gen_ai.conversation.id = state.record.agent_session_id.as_deref().unwrap_or(""),
                warden.attempt = attempt.attempt,
                warden.silent_ms = silent_for.as_millis() as u64,
                warden.timeout_ms = timeout.as_millis() as u64,
                error.r#type = "ESTREAM_TIMEOUT",
                otel.status_code = "ERROR",
            );
            drop(t);
        }
        turn.last_attempt = Some(spans::context_of(&span));
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
        // After Escape the turn ends Cancelled whatever the stream reports:
        // a completion queued behind the cancel had its late text
        // suppressed, so it must not pass for a whole answer.
        _ if turn.cancel_requested => Err(TurnError::Cancelled),
        StreamOutcome::Completed => Ok(()),
        StreamOutcome::Cancelled => Err(TurnError::Cancelled),
        StreamOutcome::Failed(error) => {
            if let (Some(cause), Some(failed_id)) =
                (error.resume_failure_cause(), turn.resume_id.clone())
                && state.args.escalate.is_some()
            {
                return escalate_resume_failure(myself, state, failed_id, cause, error);
            }
            match state
                .args
                .config
                .retry
                .next_delay(turn.attempt, &error, &mut state.rng)
            {
                Some(delay) => {
                    let retry = tracing::info_span!(
                        parent: &turn.span,
                        "stream.retry",
                        warden.session.key = key.as_str(),
                        gen_ai.conversation.id =
                            state.record.agent_session_id.as_deref().unwrap_or(""),
                        warden.attempt = attempt.attempt + 1,
                        warden.delay_ms = delay.as_millis() as u64,
                        error.r#type = error.code(),
                    );
                    if let Some(prev) = &turn.last_attempt {
                        spans::link(&retry, prev);
                    }
                    drop(retry);
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
                    turn.send(TurnEvent::Retrying {
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
    finish_turn(myself, state, result).await
}

fn escalate_resume_failure(
    myself: &ActorRef<SessionMsg>,
    state: &mut SessionState,
    failed_id: String,
    cause: ResumeCause,
    error: StreamError,
) -> Result<(), ActorProcessingErr> {
    let Some(escalate) = state.args.escalate.clone() else {
        return Ok(());
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
    for q in state.queue.drain(..) {
        handoff.push(Handoff {
            message: q.message,
            reply: q.reply,
        });
    }
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
    myself.stop(Some(ESCALATED.into()));
    Ok(())
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
    drop(tracing::info_span!(
        parent: &turn.span,
        "stream.cancel",
        warden.session.key = state.args.key.as_str(),
        gen_ai.conversation.id = state.record.agent_session_id.as_deref().unwrap_or(""),
        warden.turn = turn.id(),
    ));
    tracing::info!(event = "stream.cancel", session.key = %state.args.key, turn = turn.id(), "turn cancelled by user");
    match &turn.phase {
        // The stream decides the race; its end finishes the turn as cancelled.
        Phase::Streaming(stream) => stream.cancel(),
        // Nothing running: drop the pending retry and finish now.
        Phase::Backoff(_) | Phase::Starting => {
            finish_turn(myself, state, Err(TurnError::Cancelled)).await?;
        }
    }
    Ok(())
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
    let id = turn.id();
    let cfg = &state.args.config.context;

    // Context: the last report carrying input tokens, else what is stored.
    let window = cfg
        .window
        .or(turn.context_window)
        .unwrap_or_else(|| context::window_for_model(state.record.model.as_deref()));
    if let Some(u) = turn.context_usage {
        state.record.usage = Some(StoredUsage::from_usage(u, window));
    }
    let (text, self_reported) = if cfg.self_report {
        context::strip_self_report(&turn.text)
    } else {
        (turn.text.clone(), None)
    };
    let context = state.record.usage.map(|u| ContextReport {
        tokens: u.input_tokens + u.cache_creation_input_tokens + u.cache_read_input_tokens,
        window: u.context_window,
        percent: u.context_percent,
        self_reported,
    });
    if let (Some(c), true) = (context, result.is_ok()) {
        tracing::info!(
            event = "context_usage",
            session.key = %state.args.key,
            input_tokens = c.tokens,
            sdk_pct = c.percent,
            self_reported_pct = ?c.self_reported,
            drift_pct = ?c.self_reported.map(|s| i64::from(s) - i64::from(c.percent)),
            "context usage"
        );
        state.args.bus.publish(LifecycleEvent::ContextUsage {
            key: state.args.key.clone(),
            tokens: c.tokens,
            window: c.window,
            percent: c.percent,
            self_reported: c.self_reported,
        });
    }

    // The message is answered (with a reply or an error): no longer pending.
    state.record.answered(id);
    let fresh_failed = match &state.args.mode {
        StartMode::FreshFallback { cause } => match &result {
            Ok(()) => {
                state.args.mode = StartMode::Resume;
                None
            }
            Err(TurnError::Cancelled) => None,
            Err(e) => Some((cause.clone(), e.clone())),
        },
        StartMode::Resume => None,
    };
    state
        .args
        .store
        .save(&state.record, Durability::Buffered)
        .await?;

    let summary = result.map(|()| TurnSummary {
        turn: id,
        attempts: turn.attempt,
        usage: turn.usage,
        context,
        text: match (cfg.indicator, context) {
            (true, Some(c)) if text.is_empty() => context::indicator(c.percent),
            (true, Some(c)) => format!("{text}\n{}", context::indicator(c.percent)),
            _ => text,
        },
    });
    let error_code = summary.as_ref().err().map(TurnError::code);
    turn.span.record("warden.attempts", turn.attempt);
    turn.span.record(
        "gen_ai.conversation.id",
        state.record.agent_session_id.as_deref().unwrap_or(""),
    );
    if let Some(u) = turn.usage {
        turn.span
            .record("gen_ai.usage.output_tokens", u.output_tokens);
    }
    if let Some(c) = context {
        turn.span.record("gen_ai.usage.input_tokens", c.tokens);
        turn.span.record("warden.ctx_pct", c.percent);
    }
    if let Some(code) = error_code {
        spans::fail(&turn.span, code);
    }
    state.args.bus.publish(LifecycleEvent::TurnFinished {
        key: state.args.key.clone(),
        turn: id,
        attempts: turn.attempt,
        error_code,
    });
    tracing::info!(
        event = "session.turn_finished",
        session.key = %state.args.key,
        turn = id,
        attempts = turn.attempt,
        error.r#type = error_code.unwrap_or(""),
        "turn finished"
    );
    match turn.queued.reply {
        Some(reply) => {
            let _ = reply.send(TurnEvent::Finished(summary.clone()));
        }
        None => state.args.notifier.notify(
            &state.args.key,
            Notice::RecoveredReply {
                message_id: id,
                result: summary.clone().map(|s| s.text),
            },
        ),
    }

    if let (Some((first_cause, error)), Some(escalate)) =
        (fresh_failed, state.args.escalate.clone())
    {
        state.escalated = true;
        for q in state.queue.drain(..) {
            if let Some(r) = q.reply {
                let _ = r.send(TurnEvent::Finished(Err(TurnError::SessionStopped {
                    reason: format!("session failed: {first_cause}; fresh start failed: {error}"),
                })));
            }
        }
        escalate(Escalation::FreshStartFailed {
            key: state.args.key.clone(),
            first_cause,
            error,
        });
        myself.stop(Some(ESCALATED.into()));
        return Ok(());
    }
    start_next_turn(myself, state).await
}
