//! The task that reads one attempt: [`StreamTask`] and its
//! [`StreamHandle`] (see the [module](super) docs).

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use parking_lot::Mutex;

use futures_util::task::AtomicWaker;
use futures_util::{FutureExt, StreamExt};
use tokio::sync::{Notify, Semaphore, TryAcquireError};

use super::{
    AttemptId, Credit, ReportSink, StreamArgs, StreamOptions, StreamOutcome, StreamReport,
};
use crate::error::{ActorError, StreamError};
use crate::event::{AgentEvent, Frame};
use crate::source::{EventSource, TurnRequest};
use crate::transition::{At, Parent, Transition};
use crate::watchdog::{Expiry, Heartbeat, WatchGuard, WatchId};

/// Why a stream is asked to stop; the first request wins.
#[derive(Debug, Clone, Copy)]
enum Stop {
    Expired(Expiry),
    NoProgress(Expiry),
    Cancel,
    Interrupt,
}

/// What the stream's owner and the watchdog share with the stream's task.
#[derive(Debug)]
struct Control {
    /// The first stop request; later ones are ignored.
    stop: Mutex<Option<Stop>>,
    /// Whether `stop` is set: one load per poll on the hot path.
    stopping: AtomicBool,
    /// The task's waker, woken when `stop` is set.
    wake: AtomicWaker,
    /// Set once the task has released everything and reported `Ended`.
    done: AtomicBool,
    /// Wakes [`StreamHandle::finished`] waiters when `done` is set.
    finished: Notify,
}

impl Control {
    fn request(&self, stop: Stop) {
        let mut slot = self.stop.lock();
        if slot.is_none() {
            *slot = Some(stop);
            drop(slot);
            self.stopping.store(true, Ordering::Release);
            self.wake.wake();
        }
    }

    fn requested(&self) -> Option<Stop> {
        *self.stop.lock()
    }
}

/// A handle to a running [`StreamTask`]. Cloning refers to the same
/// stream; dropping the handles does not stop it.
#[derive(Debug, Clone)]
pub struct StreamHandle {
    control: Arc<Control>,
    attempt: AttemptId,
    watch_id: WatchId,
}

impl StreamHandle {
    /// Asks the stream to stop as cancelled. If the reader or the watchdog
    /// ended it first, this does nothing.
    pub fn cancel(&self) {
        self.control.request(Stop::Cancel);
    }

    /// Asks the stream to stop as failed with
    /// [`StreamError::Interrupted`] (retryable), so its session runs the
    /// turn again. If the reader, the watchdog or a cancel ended it first,
    /// this does nothing.
    pub fn interrupt(&self) {
        self.control.request(Stop::Interrupt);
    }

    /// The attempt.
    pub fn attempt(&self) -> AttemptId {
        self.attempt
    }

    /// The stream's watchdog entry.
    pub fn watch_id(&self) -> WatchId {
        self.watch_id
    }

    /// Whether the stream has ended (everything released, `Ended` sent).
    pub fn is_finished(&self) -> bool {
        self.control.done.load(Ordering::Acquire)
    }

    /// Waits until the stream has ended: its source dropped (socket closed,
    /// child signalled), its watch entry removed and `Ended` reported.
    pub async fn finished(&self) {
        let notified = self.control.finished.notified();
        tokio::pin!(notified);
        // Registered before the check, so a wake between the two is kept.
        notified.as_mut().enable();
        if !self.is_finished() {
            notified.await;
        }
    }
}

/// Reads one attempt's stream; see the module docs.
///
/// One tokio task, not an actor: its only input is the shared stop slot
/// (cancel from the owner, expiry from the watchdog). An actor per attempt
/// with ractor's mailboxes cost 7.9 KB and a second task; this costs a few
/// hundred bytes (see `docs/performance.md`).
#[derive(Debug, Default, Clone, Copy)]
pub struct StreamTask;

/// The former name of [`StreamTask`], which is a task, not an actor.
#[deprecated(
    since = "0.1.0",
    note = "renamed `StreamTask`: it is one task, not an actor"
)]
pub type StreamActor = StreamTask;

impl StreamTask {
    /// Registers the stream with the watchdog and starts it on the current
    /// tokio runtime. Fails only if the watchdog is not running.
    pub fn spawn(args: StreamArgs) -> Result<StreamHandle, ActorError> {
        let control = Arc::new(Control {
            stop: Mutex::new(None),
            stopping: AtomicBool::new(false),
            wake: AtomicWaker::new(),
            done: AtomicBool::new(false),
            finished: Notify::new(),
        });
        // Armed before the request is sent: connecting and the first byte
        // are covered by the allowance.
        let on_expire = Arc::downgrade(&control);
        let guard = args.watchdog.watch(args.options.timeout, move |expiry| {
            if let Some(control) = on_expire.upgrade() {
                control.request(Stop::Expired(expiry));
            }
        })?;
        // The progress allowance is a second entry of the same watchdog,
        // beaten only by content.
        let progress = match args.options.progress_timeout {
            Some(allowance) => {
                let on_expire = Arc::downgrade(&control);
                Some(args.watchdog.watch(Some(allowance), move |expiry| {
                    if let Some(control) = on_expire.upgrade() {
                        control.request(Stop::NoProgress(expiry));
                    }
                })?)
            }
            None => None,
        };
        let handle = StreamHandle {
            control: control.clone(),
            attempt: args.attempt,
            watch_id: guard.id(),
        };
        tokio::spawn(run(args, guard, progress, control));
        Ok(handle)
    }
}

/// The stream's task: the reader raced against the stop slot.
async fn run(
    args: StreamArgs,
    guard: WatchGuard,
    progress: Option<WatchGuard>,
    control: Arc<Control>,
) {
    let StreamArgs {
        attempt,
        source,
        request,
        options,
        sink,
        span,
        ..
    } = args;
    let watch_id = guard.id();
    let key = request.session_key.clone();
    let conversation = request.resume_id.clone();
    let reader = AssertUnwindSafe(read(
        source,
        request,
        guard.heartbeat(),
        progress.as_ref().map(WatchGuard::heartbeat),
        &options,
        attempt,
        sink.clone(),
    ))
    .catch_unwind();
    let outcome = {
        let ended = Race {
            reader,
            control: &control,
            registered: None,
        };
        match ended.await {
            Err(Stop::Expired(expiry)) => {
                drop(
                    Transition::WatchdogKill {
                        watch_id: expiry.id.get(),
                        silent_for: expiry.silent_for,
                        timeout: expiry.timeout,
                    }
                    .record(At {
                        key: &key,
                        conversation: conversation.as_deref(),
                        parent: Parent::Span(&span),
                        bus: None,
                    }),
                );
                StreamOutcome::Failed(expiry.into())
            }
            Err(Stop::NoProgress(expiry)) => StreamOutcome::Failed(StreamError::NoProgress {
                idle_for: expiry.silent_for,
                allowance: expiry.timeout,
            }),
            Err(Stop::Cancel) => StreamOutcome::Cancelled,
            Err(Stop::Interrupt) => StreamOutcome::Failed(StreamError::Interrupted {
                reason: "interrupted to run the turn again".into(),
            }),
            Ok(Ok(Ok(()))) => StreamOutcome::Completed,
            Ok(Ok(Err(error))) => StreamOutcome::Failed(error),
            Ok(Err(panic)) => {
                // A source's panic message may quote the stream (prompt or
                // completion text): only a debug log, which is opt-in,
                // carries it; the error says what happened.
                tracing::debug!(
                    event = "stream.reader_panicked",
                    session.key = key.as_str(),
                    payload = %panic_message(&*panic),
                    "the stream reader panicked"
                );
                StreamOutcome::Failed(StreamError::Internal {
                    message: "the stream reader panicked (a bug in the event source; \
                              RUST_LOG=warden_core=debug shows its message)"
                        .to_owned(),
                })
            }
        }
        // Leaving this block drops the reader: the stream and its
        // connection (or child pipe) are gone before anything is reported.
    };
    drop(progress);
    drop(guard); // unwatch
    sink(StreamReport::Ended {
        attempt,
        outcome,
        watch_id,
    });
    control.done.store(true, Ordering::Release);
    control.finished.notify_waiters();
}

pin_project_lite::pin_project! {
    /// The reader raced against the stop slot. Per poll it costs one atomic
    /// load (and registers the task's waker only when it changes), where a
    /// `select!` on a `Notify` would lock a mutex on every frame.
    struct Race<'a, R> {
        #[pin]
        reader: R,
        control: &'a Control,
        registered: Option<Waker>,
    }
}

impl<R: Future> Future for Race<'_, R> {
    type Output = Result<R::Output, Stop>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        // A stop already requested wins over a reader that is ready now.
        if this.control.stopping.load(Ordering::Acquire) {
            if let Some(stop) = this.control.requested() {
                return Poll::Ready(Err(stop));
            }
        }
        if !this
            .registered
            .as_ref()
            .is_some_and(|w| w.will_wake(cx.waker()))
        {
            this.control.wake.register(cx.waker());
            *this.registered = Some(cx.waker().clone());
            // A stop requested before the registration would be missed.
            if this.control.stopping.load(Ordering::Acquire) {
                if let Some(stop) = this.control.requested() {
                    return Poll::Ready(Err(stop));
                }
            }
        }
        this.reader.poll(cx).map(Ok)
    }
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into())
}

/// The reader task: open, then beat on every frame and forward events.
async fn read(
    source: Arc<dyn EventSource>,
    request: TurnRequest,
    heartbeat: Heartbeat,
    progress: Option<Heartbeat>,
    options: &StreamOptions,
    attempt: AttemptId,
    sink: ReportSink,
) -> Result<(), StreamError> {
    {
        // The tool allowance is for tools that run inside the stream (an
        // agent CLI); an API's tool_use block is the model still writing.
        let tool_timeout = if source.tools_run_in_stream() {
            options.tool_timeout
        } else {
            Duration::ZERO
        };
        let progress_timeout = options.progress_timeout;
        let window = Arc::new(Semaphore::new(
            options.max_in_flight.clamp(1, Semaphore::MAX_PERMITS),
        ));
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
                            // A running tool produces nothing for the stream:
                            // the tool allowance covers it.
                            if let (1, Some(p), Some(allowance)) =
                                (tools_running, &progress, progress_timeout)
                                && tool_timeout > allowance
                            {
                                let _ = p.set_timeout(tool_timeout);
                            }
                        }
                        AgentEvent::ToolUseFinished { .. } if tools_running > 0 => {
                            tools_running -= 1;
                            if tools_running == 0 {
                                let _ = heartbeat.set_timeout(stream_timeout);
                                if let (Some(p), Some(allowance)) = (&progress, progress_timeout) {
                                    let _ = p.set_timeout(allowance);
                                }
                            }
                        }
                        _ => {}
                    }
                    if let Some(p) = &progress
                        && is_content(&event)
                    {
                        p.beat();
                    }
                    let credit = match Arc::clone(&window).try_acquire_owned() {
                        Ok(permit) => Credit(Some(permit)),
                        // Held back by the consumer: not the source's silence,
                        // nor its lack of progress.
                        Err(TryAcquireError::NoPermits) => {
                            wait_for_credit(&window, &heartbeat, progress.as_ref()).await
                        }
                        Err(TryAcquireError::Closed) => Credit::none(), // never closed
                    };
                    sink(StreamReport::Event {
                        attempt,
                        event,
                        credit,
                    });
                }
            }
        }
        Ok(())
    }
}

/// Whether `event` is progress: content the model produced.
fn is_content(event: &AgentEvent) -> bool {
    matches!(
        event,
        AgentEvent::TextDelta(_)
            | AgentEvent::ThinkingDelta(_)
            | AgentEvent::ToolUseStarted { .. }
            | AgentEvent::ToolInputDelta { .. }
            | AgentEvent::ToolUseFinished { .. }
            | AgentEvent::TurnComplete { .. }
    )
}

/// Waits until the consumer returns a credit. The source is not read
/// meanwhile, and its silence is not its fault: the stream is kept alive,
/// and its allowance starts afresh once a credit is back.
async fn wait_for_credit(
    window: &Arc<Semaphore>,
    heartbeat: &Heartbeat,
    progress: Option<&Heartbeat>,
) -> Credit {
    let acquire = Arc::clone(window).acquire_owned();
    tokio::pin!(acquire);
    let beat = || {
        heartbeat.beat();
        if let Some(p) = progress {
            p.beat();
        }
    };
    loop {
        let shortest = progress.map_or(heartbeat.timeout(), |p| {
            p.timeout().min(heartbeat.timeout())
        });
        let period = (shortest / 3).max(Duration::from_millis(1));
        tokio::select! {
            permit = &mut acquire => {
                beat();
                return Credit(permit.ok());
            }
            () = tokio::time::sleep(period) => beat(),
        }
    }
}
