//! The public side of a session: [`SessionHandle`], and one turn's
//! [`TurnHandle`] with its [`TurnEvent`]s and [`TurnSummary`].

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use ractor::{ActorCell, ActorRef, RpcReplyPort};
use tokio::sync::mpsc;

use crate::error::{ActorError, ResumeCause, StreamError, TurnError};
use crate::event::{AgentEvent, Usage};
use crate::source::AttemptId;
use crate::source::SessionKey;
use crate::spans::TraceAnchor;
use crate::store::{SessionRecord, StoreError};
use crate::stream::{Credit, StreamReport};
use crate::util::call;

/// The session's end of a turn's event channel (the other end is the
/// [`TurnHandle`]). Events carry their stream [`Credit`], returned when the
/// caller takes them out, so a caller that does not read holds the stream
/// back instead of filling memory.
#[derive(Debug, Clone)]
pub(crate) struct TurnSender {
    tx: mpsc::UnboundedSender<(TurnEvent, Credit)>,
    owner: Owner,
    trace: RanIn,
}

/// The traces a turn runs in, once it started ([`super::ran_in`]).
type RanIn = Arc<super::ran_in::RanIn>;

/// The session that runs a turn now. A turn handed to a fresh session
/// (resume failure) moves its owner with it, so the caller's
/// [`TurnCanceller`] follows the turn.
pub(crate) type Owner = Arc<Mutex<ActorRef<SessionMsg>>>;

impl TurnSender {
    /// A new channel for turn `turn` run by `session`: the sender and the
    /// caller's handle.
    pub(crate) fn channel(turn: u64, session: ActorRef<SessionMsg>) -> (Self, TurnHandle) {
        let (tx, rx) = mpsc::unbounded_channel();
        let owner = Arc::new(Mutex::new(session));
        let trace = RanIn::new(super::ran_in::RanIn::new());
        let handle = TurnHandle {
            rx,
            done: false,
            cancel_on_drop: false,
            canceller: TurnCanceller {
                turn,
                owner: owner.clone(),
                trace: trace.clone(),
            },
        };
        (Self { tx, owner, trace }, handle)
    }

    /// The turn runs in the trace of `span` (its `turn_started` span).
    pub(crate) fn runs_in(&self, span: &opentelemetry::trace::SpanContext) {
        self.trace.set(span);
    }

    /// The turn now runs in `session`.
    pub(crate) fn moved_to(&self, session: &ActorRef<SessionMsg>) {
        *self.owner.lock() = session.clone();
    }

    /// Sends an event that holds no stream credit; `false` if the caller is
    /// gone.
    pub(crate) fn send(&self, event: TurnEvent) -> bool {
        self.send_with(event, Credit::none())
    }

    /// Sends a stream event with its credit; `false` if the caller is gone
    /// (the credit is then returned at once).
    pub(crate) fn send_with(&self, event: TurnEvent, credit: Credit) -> bool {
        self.tx.send((event, credit)).is_ok()
    }
}

/// Progress of one turn, in order: `Waiting` if other turns of its session
/// are ahead of it, then per attempt an optional `Queued` (it waits for
/// admission) then `Started`, any `Event`s and `Retrying`s, then exactly
/// one `Finished`.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum TurnEvent {
    /// The message waits behind `behind` turns of its session (the one
    /// running and those queued before it); it runs when they are done.
    Waiting {
        /// Turns ahead of it.
        behind: usize,
    },
    /// The attempt waits for admission (a concurrency limit or a shared
    /// backoff of its source); no stream is open and no silence is counted.
    /// `Started` follows when it is admitted.
    Queued(AttemptId),
    /// An attempt started.
    Started(AttemptId),
    /// An event of the current attempt.
    Event(AgentEvent),
    /// The attempt broke mid-text; after `delay` the next attempt
    /// *continues* the reply. Keep what you received: the text that follows
    /// extends it (nothing repeated, nothing missing).
    Continuing {
        /// The attempt that broke.
        failed: AttemptId,
        /// Backoff before the continuation.
        delay: Duration,
        /// Why it broke.
        error: StreamError,
    },
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

/// A completed turn.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct TurnSummary {
    /// Turn number (the pending message id).
    pub turn: u64,
    /// Attempts used, the first included.
    pub attempts: u32,
    /// How many of them continued a broken reply (instead of restarting).
    pub continuations: u32,
    /// The last usage report of the turn, if any.
    pub usage: Option<Usage>,
    /// Context in use, once any usage is known.
    pub context: Option<crate::context::ContextReport>,
    /// The answer: the successful attempt's text, the self-report
    /// stripped, nothing appended. Feed this to another agent.
    pub text: String,
    /// The context indicator (`[ctx: NN%]`) when it is on and any usage is
    /// known; [`relay_text`](Self::relay_text) appends it for a human.
    pub indicator: Option<String>,
}

/// The caller's side of one submitted message.
///
/// **Dropping it leaves the turn running**: the message was acknowledged
/// durable, so the session answers it to its end (its reply is kept in the
/// conversation, its events go nowhere) and the turns queued behind it wait
/// for that. To stop it, [`cancel`](Self::cancel) first, or make the drop
/// cancel it with [`cancel_on_drop`](Self::cancel_on_drop) (a bridge whose
/// reader task may die). [`detach`](Self::detach) says "let it run" in code.
#[derive(Debug)]
#[must_use = "dropping a TurnHandle leaves its turn running unread: read it, `detach()` it, or `cancel_on_drop()`"]
pub struct TurnHandle {
    rx: mpsc::UnboundedReceiver<(TurnEvent, Credit)>,
    done: bool,
    cancel_on_drop: bool,
    canceller: TurnCanceller,
}

/// Cancels one turn, from any task: see [`TurnHandle::canceller`].
#[derive(Debug, Clone)]
pub struct TurnCanceller {
    turn: u64,
    owner: Owner,
    trace: RanIn,
}

impl TurnCanceller {
    /// The turn's number (its pending message id).
    pub fn turn(&self) -> u64 {
        self.turn
    }

    /// The trace the turn runs in (hex, as Jaeger names it): its own, whose
    /// root is its `turn_started` span; the latest one if it started again
    /// in a fresh session. `None` before it starts, or without an
    /// OpenTelemetry layer.
    pub fn trace_id(&self) -> Option<String> {
        self.trace.trace_id()
    }

    /// Every trace the turn ran in, oldest first (two when it started
    /// again in a fresh session); empty before it starts.
    pub fn trace_ids(&self) -> Vec<String> {
        self.trace.trace_ids()
    }

    /// Says in its trace (a `turn_redelivered` span under the root) what
    /// happened to the turn before its re-delivery to `key`, once it starts.
    pub async fn record_redelivery(&self, key: &SessionKey, before: &super::Redelivery) {
        self.trace.record(key, self.turn, before).await;
    }

    /// Cancels this turn, and only this one: if it runs, as the Escape key
    /// does (never retried, no event of it after this); if it still waits
    /// in the queue, it is removed and answered `Cancelled` without ever
    /// opening a stream. `Ok(true)` if the turn was still running or
    /// queued, `Ok(false)` if it had already finished. An error when the
    /// session that runs it is gone (stopped or crashed).
    pub async fn cancel(&self) -> Result<bool, ActorError> {
        let session = self.owner.lock().clone();
        call(&session, "session", |r| {
            SessionMsg::CancelTurn(self.turn, r)
        })
        .await
    }
}

impl TurnSummary {
    /// The text to show a human: [`text`](Self::text) with the
    /// [`indicator`](Self::indicator) on a line of its own after it.
    pub fn relay_text(&self) -> String {
        match &self.indicator {
            Some(i) if self.text.is_empty() => i.clone(),
            Some(i) => format!("{}\n{i}", self.text),
            None => self.text.clone(),
        }
    }
}

impl TurnHandle {
    /// The turn's number (its pending message id).
    pub fn id(&self) -> u64 {
        self.canceller.turn
    }

    /// Cancels this turn; see [`TurnCanceller::cancel`].
    pub async fn cancel(&self) -> Result<bool, ActorError> {
        self.canceller.cancel().await
    }

    /// A cloneable canceller of this turn, for another task (a UI's stop
    /// button) while this handle is read.
    pub fn canceller(&self) -> TurnCanceller {
        self.canceller.clone()
    }

    /// Makes dropping this handle before the turn's `Finished` cancel the
    /// turn, as [`cancel`](Self::cancel) does (a running turn stops, a
    /// queued one is removed and never opens a stream), so the turns queued
    /// behind it start at once instead of waiting for an answer nobody
    /// reads. For a relay whose reading task may die.
    pub fn cancel_on_drop(mut self) -> Self {
        self.cancel_on_drop = true;
        self
    }

    /// Lets the turn run to its end unread: what dropping the handle does
    /// (unless [`cancel_on_drop`](Self::cancel_on_drop) was asked), said in
    /// code.
    pub fn detach(mut self) {
        self.cancel_on_drop = false;
    }

    /// The next progress event; `None` after `Finished`. (`TurnHandle`
    /// is also a [`Stream`](futures_util::Stream) of them.)
    pub async fn recv(&mut self) -> Option<TurnEvent> {
        std::future::poll_fn(|cx| self.poll_event(cx)).await
    }

    /// Polls for the next event: see [`recv`](Self::recv).
    pub(super) fn poll_event(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<TurnEvent>> {
        if self.done {
            return std::task::Poll::Ready(None);
        }
        // Taking the event out returns its credit: the stream reads on.
        let ev = match self.rx.poll_recv(cx) {
            std::task::Poll::Pending => return std::task::Poll::Pending,
            std::task::Poll::Ready(Some((ev, _credit))) => ev,
            std::task::Poll::Ready(None) => TurnEvent::Finished(Err(TurnError::SessionStopped {
                reason: "session ended without answering (crashed)".into(),
            })),
        };
        if matches!(ev, TurnEvent::Finished(_)) {
            self.done = true;
        }
        std::task::Poll::Ready(Some(ev))
    }

    /// Waits for the end; returns the text to relay to a human
    /// ([`TurnSummary::relay_text`]) and the summary (whose `text` is the
    /// raw answer).
    pub async fn finish(mut self) -> Result<(String, TurnSummary), TurnError> {
        while let Some(ev) = self.recv().await {
            if let TurnEvent::Finished(r) = ev {
                return r.map(|s| (s.relay_text(), s));
            }
        }
        Err(TurnError::SessionStopped {
            reason: "turn already finished".into(),
        })
    }
}

impl Drop for TurnHandle {
    fn drop(&mut self) {
        if self.cancel_on_drop && !self.done {
            // Nobody waits for the answer: the reply port's receiver goes
            // with this handle.
            let (reply, _) = ractor::concurrency::oneshot();
            let session = self.canceller.owner.lock().clone();
            let _ = session.cast(SessionMsg::CancelTurn(self.canceller.turn, reply.into()));
        }
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

/// How [`Supervisor::recover`](crate::Supervisor::recover) (or
/// [`SessionHandle::recover`]) unsticks a session whose turn runs too long
/// (a stream that keeps sending keep-alives but never finishes is alive to
/// the watchdog).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Unstick {
    /// Stop the running attempt as failed
    /// ([`StreamError::Interrupted`], retryable) so the turn is retried per
    /// its policy; a turn in backoff starts its next attempt now. The
    /// conversation is kept.
    Retry,
    /// Drop the stored conversation: the session restarts fresh with the
    /// running turn and every queued message, as after a resume failure
    /// (cause [`ResumeCause::OperatorReset`]; the user gets the fresh-start
    /// notice). A session with no stored conversation has nothing to drop:
    /// this is then [`Retry`](Self::Retry).
    Fresh,
}

/// A snapshot of a session.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct SessionStatus {
    /// Which session this is.
    pub key: SessionKey,
    /// The running turn, if any.
    pub turn: Option<u64>,
    /// The current attempt, if a stream is running.
    pub streaming: Option<AttemptId>,
    /// Whether the running turn waits in backoff.
    pub backing_off: bool,
    /// Whether the running turn's attempt waits for admission (a
    /// concurrency limit or a shared backoff).
    pub admitting: bool,
    /// How long the running turn has run (queued, streaming and backing
    /// off included), if one runs.
    pub turn_running_for: Option<Duration>,
    /// Messages queued behind the running turn.
    pub queued: usize,
    /// Turns finished since the session started.
    pub turns_finished: u64,
    /// The record as last written.
    pub record: SessionRecord,
}

/// Message of the session actor; use [`SessionHandle`].
pub(crate) enum SessionMsg {
    Submit(
        String,
        crate::SendOptions,
        RpcReplyPort<Result<TurnHandle, StoreError>>,
    ),
    Cancel,
    CancelTurn(u64, RpcReplyPort<bool>),
    Report(StreamReport),
    Retry(AttemptId),
    Admitted(AttemptId, crate::admission::AdmissionPermit),
    Recover(Unstick, RpcReplyPort<bool>),
    Deadline(u64),
    IdleCheck(u64),
    /// Stop now if idle (no turn, nothing queued), as an idle reap does:
    /// whether it stops.
    StopIfIdle(RpcReplyPort<bool>),
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
    /// Unsticks the running turn as `how` says; `false` when no turn runs,
    /// or the one running waits for admission or has no stream yet (there
    /// is nothing stuck to stop).
    pub async fn recover(&self, how: Unstick) -> Result<bool, ActorError> {
        call(&self.actor, "session", |r| SessionMsg::Recover(how, r)).await
    }

    /// Stops the session now if it is idle (no turn running, no message
    /// waiting), keeping its record, as the idle reaper does; whether it
    /// stops. `false` too when it is already gone or does not answer
    /// within a second.
    pub(crate) async fn stop_if_idle(&self) -> bool {
        let asked = call(&self.actor, "session", SessionMsg::StopIfIdle);
        matches!(
            tokio::time::timeout(Duration::from_secs(1), asked).await,
            Ok(Ok(true))
        )
    }

    /// This incarnation's trace anchor.
    pub fn anchor(&self) -> &TraceAnchor {
        &self.anchor
    }

    /// Persists `message` (flushed) and queues it; its turn runs after the
    /// turns before it. Returns once the message is durable.
    pub async fn submit(&self, message: impl Into<String>) -> Result<TurnHandle, SubmitError> {
        self.submit_with(message, crate::SendOptions::default())
            .await
    }

    /// [`submit`](Self::submit) with per-turn options (the model), stored
    /// with the message: a re-delivered message keeps them.
    pub async fn submit_with(
        &self,
        message: impl Into<String>,
        options: crate::SendOptions,
    ) -> Result<TurnHandle, SubmitError> {
        let message = message.into();
        Ok(call(&self.actor, "session", |r| {
            SessionMsg::Submit(message, options, r)
        })
        .await??)
    }

    /// Cancels whatever turn runs now (the Escape key); queued messages
    /// stay. To cancel one particular turn, use [`TurnHandle::cancel`]. An
    /// error when this incarnation of the session is gone (a handle kept
    /// across a restart): nothing was cancelled.
    pub fn cancel(&self) -> Result<(), ActorError> {
        self.actor
            .cast(SessionMsg::Cancel)
            .map_err(|_| ActorError::NotRunning { what: "session" })
    }

    /// Fault injection: fails the session as a crash would (its running
    /// turn and queued messages stay pending, as after a real crash), so
    /// its supervisor applies its [`Restart`](crate::Restart) policy and
    /// [`RestartIntensity`](crate::RestartIntensity): a way to see them act
    /// in a chaos test or a staging run. Supported on every build (no
    /// feature); `reason` is the crash's cause in `SessionRestarted` and the
    /// logs.
    pub fn fail(&self, reason: impl Into<String>) {
        let _ = self.actor.cast(SessionMsg::Fail(reason.into()));
    }

    /// A snapshot of the session.
    pub async fn status(&self) -> Result<SessionStatus, ActorError> {
        call(&self.actor, "session", SessionMsg::Status).await
    }

    /// The key the session was started for (its supervisor's map key).
    pub fn key(&self) -> &SessionKey {
        &self.key
    }

    /// The session's actor cell, for linking, waiting and stopping.
    pub fn actor(&self) -> &ActorCell {
        &self.actor
    }

    /// Builds a handle (the actor's spawn does this).
    pub(crate) fn new(actor: ActorRef<SessionMsg>, key: SessionKey, anchor: TraceAnchor) -> Self {
        Self { actor, key, anchor }
    }
}
