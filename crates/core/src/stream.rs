//! The [`StreamActor`]: reads one attempt's stream under the watchdog.
//!
//! On spawn it registers with the watchdog (before the request is sent),
//! then starts a reader task that opens the stream, stamps the heartbeat on
//! every frame and sends parsed events straight to the [`ReportSink`] (no
//! extra actor hop on the hot path). Exactly one of three things ends it,
//! whichever reaches the actor first:
//!
//! 1. the reader finishes (stream complete, or a stream error),
//! 2. the watchdog's expiry (`ESTREAM_TIMEOUT`),
//! 3. a cancel.
//!
//! Ending aborts the reader task and waits until it is gone, so the stream
//! and its connection are dropped *before* the single
//! [`StreamReport::Ended`] is sent; then the watchdog entry is removed and
//! the actor stops. The reader task and the watchdog entry are also
//! released if the actor is killed or panics (both are owned by its state).

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use ractor::{Actor, ActorCell, ActorProcessingErr, ActorRef};

use crate::error::{ActorError, StreamError};
use crate::event::{AgentEvent, Frame};
use crate::source::{EventSource, TurnRequest};
use crate::util::AbortOnDrop;
use crate::watchdog::{Expiry, Heartbeat, WatchGuard, WatchId, WatchdogHandle};

/// Identifies one attempt of one turn within a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AttemptId {
    /// Turn number within the session.
    pub turn: u64,
    /// Attempt number within the turn, from 1.
    pub attempt: u32,
}

/// How an attempt ended.
#[derive(Debug, Clone, PartialEq)]
pub enum StreamOutcome {
    /// The stream ended after its terminal frame.
    Completed,
    /// Cancelled by the user before anything else ended it.
    Cancelled,
    /// Failed; `ESTREAM_TIMEOUT` when the watchdog killed it.
    Failed(StreamError),
}

/// What a [`StreamActor`] reports to its owner.
#[derive(Debug, Clone, PartialEq)]
pub enum StreamReport {
    /// A parsed event of the attempt.
    Event {
        /// The attempt.
        attempt: AttemptId,
        /// The event.
        event: AgentEvent,
    },
    /// The attempt is over; sent exactly once, after its last event.
    Ended {
        /// The attempt.
        attempt: AttemptId,
        /// How it ended.
        outcome: StreamOutcome,
        /// The watch entry it had.
        watch_id: WatchId,
    },
}

/// Receives a stream's reports. Called on the reader task for events and on
/// the actor for the end: it must not block (cast to an actor, send on an
/// unbounded channel).
pub type ReportSink = Arc<dyn Fn(StreamReport) + Send + Sync + 'static>;

/// Per-stream options.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct StreamOptions {
    /// Silence allowance for this stream; `None` uses the watchdog's default
    /// (45 s or `WARDEN_STREAM_TIMEOUT`).
    pub timeout: Option<Duration>,
    /// Silence allowance while a tool runs (after `ToolUseStarted`, before
    /// its `ToolUseFinished`). Default 10 min.
    pub tool_timeout: Duration,
}

impl Default for StreamOptions {
    fn default() -> Self {
        Self {
            timeout: None,
            tool_timeout: Duration::from_secs(600),
        }
    }
}

impl StreamOptions {
    /// Sets the per-stream timeout override.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Sets the tool allowance.
    pub fn with_tool_timeout(mut self, timeout: Duration) -> Self {
        self.tool_timeout = timeout;
        self
    }
}

/// Everything a [`StreamActor`] needs.
pub struct StreamArgs {
    /// Which attempt this is.
    pub attempt: AttemptId,
    /// The source to open.
    pub source: Arc<dyn EventSource>,
    /// The request to send.
    pub request: TurnRequest,
    /// The watchdog to register with.
    pub watchdog: WatchdogHandle,
    /// Per-stream options.
    pub options: StreamOptions,
    /// Where reports go.
    pub sink: ReportSink,
    /// The attempt's span (`stream.attempt`); `watchdog.kill` is its child.
    /// `tracing::Span::none()` when not traced.
    pub span: tracing::Span,
}

/// Message of the [`StreamActor`].
pub struct StreamMsg(Inner);

enum Inner {
    ReaderDone(Result<(), StreamError>),
    Expired(Expiry),
    Cancel,
}

/// A handle to a running [`StreamActor`].
#[derive(Debug, Clone)]
pub struct StreamHandle {
    actor: ActorRef<StreamMsg>,
    attempt: AttemptId,
    watch_id: WatchId,
}

impl StreamHandle {
    /// Asks the stream to stop as cancelled. If the reader or the watchdog
    /// ended it first, this does nothing.
    pub fn cancel(&self) {
        let _ = self.actor.cast(StreamMsg(Inner::Cancel));
    }

    /// The attempt.
    pub fn attempt(&self) -> AttemptId {
        self.attempt
    }

    /// The stream's watchdog entry.
    pub fn watch_id(&self) -> WatchId {
        self.watch_id
    }

    /// The actor, for linking, waiting and killing.
    pub fn actor(&self) -> &ActorRef<StreamMsg> {
        &self.actor
    }
}

/// Reads one attempt's stream; see the module docs.
#[derive(Debug, Default, Clone, Copy)]
pub struct StreamActor;

/// State of the [`StreamActor`].
pub struct StreamState {
    attempt: AttemptId,
    span: tracing::Span,
    key: crate::source::SessionKey,
    conversation: Option<String>,
    sink: ReportSink,
    reader: Option<AbortOnDrop>,
    guard: Option<WatchGuard>,
    watch_id: WatchId,
    ended: bool,
}

impl StreamActor {
    /// Spawns the stream under `supervisor` (usually its session).
    pub async fn spawn_linked(
        args: StreamArgs,
        supervisor: ActorCell,
    ) -> Result<StreamHandle, ActorError> {
        Self::spawn_inner(args, Some(supervisor)).await
    }

    /// Spawns an unsupervised stream (for custom supervisors and tests).
    pub async fn spawn(args: StreamArgs) -> Result<StreamHandle, ActorError> {
        Self::spawn_inner(args, None).await
    }

    async fn spawn_inner(
        args: StreamArgs,
        supervisor: Option<ActorCell>,
    ) -> Result<StreamHandle, ActorError> {
        let attempt = args.attempt;
        let (tx, mut rx) = tokio::sync::oneshot::channel();
        let spawned = match supervisor {
            Some(s) => Actor::spawn_linked(None, StreamActor, (args, tx), s).await,
            None => Actor::spawn(None, StreamActor, (args, tx)).await,
        };
        let (actor, _join) = spawned.map_err(|e| ActorError::Spawn {
            what: "stream",
            message: e.to_string(),
        })?;
        // pre_start has run: the watch id is there.
        let watch_id = rx
            .try_recv()
            .map_err(|_| ActorError::NotRunning { what: "stream" })?;
        Ok(StreamHandle {
            actor,
            attempt,
            watch_id,
        })
    }
}

impl Actor for StreamActor {
    type Msg = StreamMsg;
    type State = StreamState;
    type Arguments = (StreamArgs, tokio::sync::oneshot::Sender<WatchId>);

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        (args, id_tx): Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        // Armed before the request is sent: connecting and the first byte are
        // covered by the allowance.
        let me = myself.clone();
        let guard = args.watchdog.watch(args.options.timeout, move |expiry| {
            let _ = me.cast(StreamMsg(Inner::Expired(expiry)));
        })?;
        let watch_id = guard.id();
        let _ = id_tx.send(watch_id);
        let key = args.request.session_key.clone();
        let conversation = args.request.resume_id.clone();
        let reader = tokio::spawn(read(
            args.source,
            args.request,
            guard.heartbeat(),
            args.options.tool_timeout,
            args.attempt,
            args.sink.clone(),
            myself,
        ));
        Ok(StreamState {
            span: args.span,
            key,
            conversation,
            attempt: args.attempt,
            sink: args.sink,
            reader: Some(AbortOnDrop(reader)),
            guard: Some(guard),
            watch_id,
            ended: false,
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        StreamMsg(msg): Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let outcome = match msg {
            Inner::ReaderDone(Ok(())) => StreamOutcome::Completed,
            Inner::ReaderDone(Err(e)) => StreamOutcome::Failed(e),
            Inner::Expired(expiry) => {
                if !state.ended {
                    drop(tracing::warn_span!(
                        parent: &state.span,
                        "watchdog.kill",
                        warden.session.key = state.key.as_str(),
                        gen_ai.conversation.id = state.conversation.as_deref().unwrap_or(""),
                        warden.watch_id = expiry.id.get(),
                        warden.silent_ms = expiry.silent_for.as_millis() as u64,
                        warden.timeout_ms = expiry.timeout.as_millis() as u64,
                        error.r#type = "ESTREAM_TIMEOUT",
                        otel.status_code = "ERROR",
                    ));
                }
                StreamOutcome::Failed(expiry.into())
            }
            Inner::Cancel => StreamOutcome::Cancelled,
        };
        end(state, outcome).await;
        myself.stop(None);
        Ok(())
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        // Stopped from outside (session or supervisor shutdown) before any end.
        end(state, StreamOutcome::Cancelled).await;
        Ok(())
    }
}

/// Ends the attempt once: release the stream, unwatch, report.
async fn end(state: &mut StreamState, outcome: StreamOutcome) {
    if state.ended {
        return;
    }
    state.ended = true;
    if let Some(mut reader) = state.reader.take() {
        reader.abort_and_wait().await;
    }
    state.guard.take();
    (state.sink)(StreamReport::Ended {
        attempt: state.attempt,
        outcome,
        watch_id: state.watch_id,
    });
}

/// The reader task: open, then beat on every frame and forward events.
async fn read(
    source: Arc<dyn EventSource>,
    request: TurnRequest,
    heartbeat: Heartbeat,
    tool_timeout: Duration,
    attempt: AttemptId,
    sink: ReportSink,
    actor: ActorRef<StreamMsg>,
) {
    let result = async {
        let mut stream = source.open(request).await?;
        heartbeat.beat(); // response headers: the connection is alive
        let stream_timeout = heartbeat.timeout();
        let mut tools_running = 0usize;
        while let Some(frame) = stream.next().await {
            heartbeat.beat();
            match frame? {
                Frame::KeepAlive => {}
                Frame::Event(event) => {
                    match &event {
                        AgentEvent::ToolUseStarted { .. } => {
                            tools_running += 1;
                            if tools_running == 1 && tool_timeout > stream_timeout {
                                let _ = heartbeat.set_timeout(tool_timeout);
                            }
                        }
                        AgentEvent::ToolUseFinished { .. } if tools_running > 0 => {
                            tools_running -= 1;
                            if tools_running == 0 {
                                let _ = heartbeat.set_timeout(stream_timeout);
                            }
                        }
                        _ => {}
                    }
                    sink(StreamReport::Event { attempt, event });
                }
            }
        }
        Ok(())
    }
    .await;
    let _ = actor.cast(StreamMsg(Inner::ReaderDone(result)));
}
