//! An in-process [`EventSource`] driven by the test: [`ChannelSource`].
//!
//! Not a mock of an LLM: a real source whose frames come from a channel the
//! test holds, so a test decides exactly when each frame arrives (on tokio's
//! paused clock) and can observe when warden drops the stream.

use std::sync::Arc;

use futures_util::future::BoxFuture;
use futures_util::stream;
use tokio::sync::{Mutex, mpsc, watch};

use crate::error::StreamError;
use crate::event::{AgentEvent, Frame};
use crate::source::{EventSource, EventStream, TurnRequest};

/// A source whose every opened stream is handed to the test as an
/// [`AttemptControl`].
#[derive(Debug)]
pub struct ChannelSource {
    opened: mpsc::UnboundedSender<AttemptControl>,
    open_errors: parking_lot::Mutex<std::collections::VecDeque<StreamError>>,
    windows: parking_lot::Mutex<std::collections::HashMap<String, u64>>,
    continues: std::sync::atomic::AtomicBool,
}

/// The receiving side of a [`ChannelSource`]: one [`AttemptControl`] per
/// opened stream.
#[derive(Debug)]
pub struct ChannelSourceControl {
    opened: Mutex<mpsc::UnboundedReceiver<AttemptControl>>,
}

/// Drives one opened stream.
#[derive(Debug)]
pub struct AttemptControl {
    /// The request the stream was opened with.
    pub request: TurnRequest,
    tx: parking_lot::Mutex<Option<mpsc::UnboundedSender<Result<Frame, StreamError>>>>,
    /// Closed when warden drops the stream.
    alive: watch::Receiver<()>,
}

impl ChannelSource {
    /// A source and its control.
    pub fn new() -> (Arc<Self>, ChannelSourceControl) {
        let (tx, rx) = mpsc::unbounded_channel();
        (
            Arc::new(Self {
                opened: tx,
                open_errors: Default::default(),
                windows: Default::default(),
                continues: Default::default(),
            }),
            ChannelSourceControl {
                opened: Mutex::new(rx),
            },
        )
    }
}

impl ChannelSource {
    /// Makes the next `open` fail with `error` (as a connect error or an
    /// agent process exiting at start would), without a stream.
    pub fn fail_next_open(&self, error: StreamError) {
        self.open_errors.lock().push_back(error);
    }

    /// Makes the source declare that it continues broken replies
    /// ([`EventSource::continues`]): the test then plays the provider,
    /// reading [`TurnRequest::continuation`] and sending only what follows.
    pub fn set_continues(&self, on: bool) {
        self.continues
            .store(on, std::sync::atomic::Ordering::Relaxed);
    }

    /// Makes the source report `window` as the context window of `model`
    /// ([`EventSource::context_window`]), as an agent source knows its
    /// models' windows.
    pub fn set_context_window(&self, model: impl Into<String>, window: u64) {
        self.windows.lock().insert(model.into(), window);
    }
}

impl EventSource for ChannelSource {
    fn open(&self, request: TurnRequest) -> BoxFuture<'static, Result<EventStream, StreamError>> {
        let failure = self.open_errors.lock().pop_front();
        if let Some(error) = failure {
            return Box::pin(async move { Err(error) });
        }
        let (tx, rx) = mpsc::unbounded_channel();
        let (alive_tx, alive) = watch::channel(());
        let sent = self.opened.send(AttemptControl {
            request,
            tx: parking_lot::Mutex::new(Some(tx)),
            alive,
        });
        Box::pin(async move {
            sent.map_err(|_| StreamError::Connection {
                message: "channel source control dropped".into(),
            })?;
            // `alive_tx` lives exactly as long as the stream.
            let frames = stream::unfold((rx, alive_tx), |(mut rx, alive)| async move {
                rx.recv().await.map(|item| (item, (rx, alive)))
            });
            Ok(Box::pin(frames) as EventStream)
        })
    }

    fn provider(&self) -> &str {
        "channel"
    }

    fn continues(&self) -> bool {
        self.continues.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn context_window(&self, model: Option<&str>) -> Option<u64> {
        model.and_then(|m| self.windows.lock().get(m).copied())
    }
}

impl ChannelSourceControl {
    /// Waits for warden to open the next stream.
    pub async fn next_attempt(&self) -> Option<AttemptControl> {
        self.opened.lock().await.recv().await
    }
}

impl AttemptControl {
    /// Sends a frame; `false` once warden has dropped the stream or it was
    /// closed.
    pub fn send(&self, frame: Frame) -> bool {
        self.push(Ok(frame))
    }

    fn push(&self, item: Result<Frame, StreamError>) -> bool {
        self.tx
            .lock()
            .as_ref()
            .is_some_and(|tx| tx.send(item).is_ok())
    }

    /// Sends a text delta.
    pub fn text(&self, text: &str) -> bool {
        self.send(Frame::Event(AgentEvent::TextDelta(text.to_owned())))
    }

    /// Sends a keep-alive (a `ping`).
    pub fn ping(&self) -> bool {
        self.send(Frame::KeepAlive)
    }

    /// Sends a stream error.
    pub fn fail(&self, error: StreamError) -> bool {
        self.push(Err(error))
    }

    /// Ends the stream cleanly: the terminal frame, then end of stream.
    /// Later sends return `false`.
    pub fn finish(&self) {
        let _ = self.send(Frame::Event(AgentEvent::TurnComplete {
            context_window: None,
            duration: None,
        }));
        self.close();
    }

    /// Ends the stream (EOF) without a terminal frame.
    pub fn close(&self) {
        // Replacing the sender drops the original: the receiver sees EOF once
        // the queued frames are read.
        *self.tx.lock() = None;
    }

    /// Whether warden has dropped the stream (its reader is gone).
    pub fn is_dropped(&self) -> bool {
        self.alive.has_changed().is_err()
    }

    /// Waits until warden drops the stream.
    pub async fn dropped(&self) {
        let mut alive = self.alive.clone();
        while alive.changed().await.is_ok() {}
    }
}

/// Spawns a session without a supervisor (feature `testing`): loads its
/// record from `store` (or starts a new one), as the supervisor would for a
/// new key, with the log notifier and no escalation (a resume failure ends
/// the turn with its fatal error). For benchmarks and tests that measure or
/// drive one session on its own.
#[cfg(feature = "testing")]
pub async fn spawn_session(
    key: crate::SessionKey,
    source: Arc<dyn EventSource>,
    watchdog: crate::watchdog::WatchdogHandle,
    store: Arc<dyn crate::SessionStore>,
    config: crate::SessionConfig,
) -> Result<crate::SessionHandle, Box<dyn std::error::Error + Send + Sync>> {
    let record = match store.load(&key).await? {
        Some(r) => r,
        None => crate::SessionRecord::new(&key, None),
    };
    let args = crate::session::SessionArgs {
        admission: crate::Admission::default(),
        pool: Arc::from(source.provider()),
        key,
        record,
        source,
        watchdog,
        config,
        bus: crate::lifecycle::EventBus::default(),
        store,
        notifier: Arc::new(crate::LogNotifier),
        escalate: None,
        recovered: None,
        mode: crate::session::StartMode::Resume,
        previous: None,
        closing: tokio_util::sync::CancellationToken::new(),
    };
    let (handle, _) = crate::session::SessionActor::spawn(args, Vec::new(), None)
        .await
        .map_err(crate::ActorError::from)?;
    Ok(handle)
}
