//! The task that reads one attempt: [`StreamTask`] and its
//! [`StreamHandle`] (see the [module](super) docs).

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures_util::{FutureExt, StreamExt};
use tokio::sync::{Notify, Semaphore, TryAcquireError};

use super::{
    AttemptId, Credit, ReportSink, StreamArgs, StreamOptions, StreamOutcome, StreamReport,
};
use crate::error::{ActorError, StreamError};
use crate::event::{AgentEvent, Frame};
use crate::source::{EventSource, TurnRequest};
use crate::transition::{At, Parent, Transition};
use crate::watchdog::{Heartbeat, Stopped, Stopper, Watch, WatchError, WatchId, WatchOptions};

/// What the stream's task shares with its handles once it has ended.
#[derive(Debug, Default)]
struct Done {
    /// Set once the task has released everything and reported `Ended`.
    done: AtomicBool,
    /// Wakes [`StreamHandle::finished`] waiters when `done` is set.
    finished: Notify,
}

/// A handle to a running [`StreamTask`]. Cloning refers to the same
/// stream; dropping the handles does not stop it.
#[derive(Debug, Clone)]
pub struct StreamHandle {
    stopper: Stopper,
    done: Arc<Done>,
    attempt: AttemptId,
    watch_id: WatchId,
}

impl StreamHandle {
    /// Asks the stream to stop as cancelled. If the reader or the watchdog
    /// ended it first, this does nothing.
    pub fn cancel(&self) {
        self.stopper.cancel();
    }

    /// Asks the stream to stop as failed with
    /// [`StreamError::Interrupted`] (retryable), so its session runs the
    /// turn again. If the reader, the watchdog or a cancel ended it first,
    /// this does nothing.
    pub fn interrupt(&self) {
        self.stopper.interrupt();
    }

    /// Which attempt of which turn this stream is.
    pub fn attempt(&self) -> AttemptId {
        self.attempt
    }

    /// The stream's watchdog entry.
    pub fn watch_id(&self) -> WatchId {
        self.watch_id
    }

    /// Whether the stream has ended (everything released, `Ended` sent).
    pub fn is_finished(&self) -> bool {
        self.done.done.load(Ordering::Acquire)
    }

    /// Waits until the stream has ended: its source dropped (socket closed,
    /// child signalled), its watch entry removed and `Ended` reported.
    pub async fn finished(&self) {
        let notified = self.done.finished.notified();
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
/// One tokio task, not an actor: its only input is its [`Watch`]'s stop slot
/// (cancel from the owner, expiry from the watchdog). An actor per attempt
/// with ractor's mailboxes cost 7.9 KB and a second task; this costs a few
/// hundred bytes (see `docs/performance.md`).
#[derive(Debug, Default, Clone, Copy)]
pub struct StreamTask;

impl StreamTask {
    /// Registers the stream with the watchdog and starts it on the current
    /// tokio runtime. Fails only if the watchdog is not running.
    pub fn spawn(args: StreamArgs) -> Result<StreamHandle, ActorError> {
        // Armed before the request is sent: connecting and the first byte
        // are covered by the allowance. The progress allowance is a second
        // entry of the same watchdog, beaten only by content.
        let watch = Watch::arm(
            &args.watchdog,
            WatchOptions {
                timeout: args.options.timeout,
                progress: args.options.progress_timeout,
                ..WatchOptions::default()
            },
        )?;
        let done = Arc::new(Done::default());
        let handle = StreamHandle {
            stopper: watch.stopper(),
            done: done.clone(),
            attempt: args.attempt,
            watch_id: watch.id(),
        };
        tokio::spawn(run(args, watch, done));
        Ok(handle)
    }
}

/// The stream's task: the reader, which stops at the watch's first stop.
async fn run(args: StreamArgs, watch: Watch, done: Arc<Done>) {
    let StreamArgs {
        attempt,
        source,
        request,
        options,
        sink,
        span,
        ..
    } = args;
    let watch_id = watch.id();
    let key = request.session_key.clone();
    let conversation = request.resume_id.clone();
    let reader = AssertUnwindSafe(read(
        source,
        request,
        watch,
        &options,
        attempt,
        sink.clone(),
    ))
    .catch_unwind();
    let outcome = match reader.await {
        Ok(Err(WatchError::Stopped(Stopped::Expired(expiry)))) => {
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
        Ok(Err(WatchError::Stopped(stop))) => match stop.error() {
            Some(error) => StreamOutcome::Failed(error),
            None => StreamOutcome::Cancelled,
        },
        Ok(Ok(())) => StreamOutcome::Completed,
        Ok(Err(WatchError::Source(error))) => StreamOutcome::Failed(error),
        Err(panic) => {
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
        } // The reader is gone here, and the watch with it: the stream and
          // its connection (or child pipe) are closed and the watch entries
          // removed before anything is reported.
    };
    sink(StreamReport::Ended {
        attempt,
        outcome,
        watch_id,
    });
    done.done.store(true, Ordering::Release);
    done.finished.notify_waiters();
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
    mut watch: Watch,
    options: &StreamOptions,
    attempt: AttemptId,
    sink: ReportSink,
) -> Result<(), WatchError> {
    {
        // The tool allowance is for tools that run inside the stream (an
        // agent CLI); an API's tool_use block is the model still writing.
        let tool_timeout = if source.tools_run_in_stream() {
            options.tool_timeout
        } else {
            Duration::ZERO
        };
        let progress_timeout = options.progress_timeout;
        let capacity = options.max_in_flight.clamp(1, Semaphore::MAX_PERMITS);
        let window = Arc::new(Semaphore::new(capacity));
        let stream = watch
            .until(source.open(request))
            .await
            .map_err(WatchError::Stopped)??;
        let heartbeat = watch.heartbeat().clone();
        let progress = watch.progress().cloned();
        heartbeat.beat(); // response headers: the connection is alive
        let stream_timeout = heartbeat.timeout();
        let mut tools_running = 0usize;
        // Every frame beats the watch; content beats its progress entry.
        let mut stream = watch.stream(stream, Some(is_content_frame));
        while let Some(frame) = stream.next().await {
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
                    let weight = credits_for(&event, capacity);
                    let credit = match Arc::clone(&window).try_acquire_many_owned(weight) {
                        Ok(permit) => Credit(Some(permit)),
                        // Held back by the consumer: not the source's silence,
                        // nor its lack of progress.
                        Err(TryAcquireError::NoPermits) => stream
                            .watch_mut()
                            .until(wait_for_credit(
                                &window,
                                weight,
                                &heartbeat,
                                progress.as_ref(),
                            ))
                            .await
                            .map_err(WatchError::Stopped)?,
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

/// How many of a window of `capacity` credits `event` takes: one, and one
/// more per [`CREDIT_BYTES`] of its text, at most the whole window (a huge
/// delta still passes, alone). So what is in flight is bounded in bytes
/// too, not only in events: 256 deltas of 64 KiB would be 16 MiB.
fn credits_for(event: &AgentEvent, capacity: usize) -> u32 {
    let text = match event {
        AgentEvent::TextDelta(t) | AgentEvent::ThinkingDelta(t) => t.len(),
        AgentEvent::ToolInputDelta { partial_json, .. } => partial_json.len(),
        _ => 0,
    };
    let weight = 1 + text / CREDIT_BYTES;
    u32::try_from(weight.min(capacity)).unwrap_or(u32::MAX)
}

/// The text one credit stands for, beyond the first.
const CREDIT_BYTES: usize = 4096;

/// Whether `frame` is progress: an event that
/// [is](AgentEvent::is_progress).
fn is_content_frame(frame: &Frame) -> bool {
    matches!(frame, Frame::Event(event) if event.is_progress())
}

/// Waits until the consumer returns a credit. The source is not read
/// meanwhile, and its silence is not its fault: the stream is kept alive,
/// and its allowance starts afresh once a credit is back.
async fn wait_for_credit(
    window: &Arc<Semaphore>,
    weight: u32,
    heartbeat: &Heartbeat,
    progress: Option<&Heartbeat>,
) -> Credit {
    let acquire = Arc::clone(window).acquire_many_owned(weight);
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
