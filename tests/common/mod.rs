//! Helpers shared by the integration tests.
#![allow(dead_code, unreachable_pub, missing_docs)]

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::broadcast;
use tokio::time::Instant;
use warden_core::testing::{ChannelSource, ChannelSourceControl};
use warden_core::{
    EventSource, LifecycleEvent, RetryPolicy, SessionConfig, SessionKey, Supervisor,
    SupervisorConfig, WatchdogConfig,
};

pub const T45: Duration = Duration::from_secs(45);

/// A supervisor whose every session reads from one channel source.
pub async fn supervisor_with(config: SupervisorConfig) -> (Supervisor, ChannelSourceControl) {
    let (source, control) = ChannelSource::new();
    let factory = move |_: &SessionKey| source.clone() as Arc<dyn EventSource>;
    let sup = Supervisor::start(config, Arc::new(factory))
        .await
        .expect("supervisor starts");
    (sup, control)
}

/// A supervisor with `store`, notices on a channel, and its source.
pub async fn supervisor_with_store(
    config: SupervisorConfig,
    store: Arc<dyn warden_core::SessionStore>,
) -> (
    Supervisor,
    Arc<ChannelSource>,
    ChannelSourceControl,
    tokio::sync::mpsc::UnboundedReceiver<(SessionKey, warden_core::Notice)>,
) {
    let (source, control) = ChannelSource::new();
    let src = source.clone();
    let factory = move |_: &SessionKey| src.clone() as Arc<dyn EventSource>;
    let (ntx, nrx) = tokio::sync::mpsc::unbounded_channel();
    let sup = Supervisor::builder(Arc::new(factory))
        .config(config)
        .store(store)
        .notifier(Arc::new(ntx))
        .start()
        .await
        .expect("supervisor starts");
    (sup, source, control, nrx)
}

/// Default config, but with retries without jitter so times are exact.
pub fn config() -> SupervisorConfig {
    SupervisorConfig::default()
        .with_watchdog(WatchdogConfig::default())
        .with_session(
            SessionConfig::default().with_retry(
                RetryPolicy::default()
                    .with_jitter(0.0)
                    .with_backoff(Duration::from_millis(500), Duration::from_secs(8)),
            ),
        )
}

/// How long any wait of a test may take before it fails instead of hanging.
/// On the paused clock this is virtual time: a wait that can never end fails
/// at once (tokio auto-advances to this deadline), and the bound is far above
/// every timer a test relies on (the longest is the 10 min tool allowance).
pub const LIMIT: Duration = Duration::from_secs(3600);

/// Awaits `fut` for at most `limit`, failing with `what` instead of hanging.
pub async fn bounded<T>(limit: Duration, what: &str, fut: impl Future<Output = T>) -> T {
    match tokio::time::timeout(limit, fut).await {
        Ok(v) => v,
        Err(_) => panic!("timed out after {limit:?} waiting for {what}"),
    }
}

/// How long a wait of a real-clock test may take.
pub const PATIENCE: Duration = Duration::from_secs(30);

/// `.within(what)` / `.patiently(what)`: any future, bounded.
pub trait Within: Future + Sized {
    /// Awaits at most [`LIMIT`] (for paused-clock tests); panics naming
    /// `what` if it does not end.
    fn within(self, what: &str) -> impl Future<Output = Self::Output> {
        bounded(LIMIT, what, self)
    }

    /// Awaits at most [`PATIENCE`] (for real-clock tests); panics naming
    /// `what` if it does not end.
    fn patiently(self, what: &str) -> impl Future<Output = Self::Output> {
        bounded(PATIENCE, what, self)
    }
}

impl<F: Future> Within for F {}

/// Waits (at most [`LIMIT`]) for the first lifecycle event matching `pred`.
pub async fn wait_for(
    rx: &mut broadcast::Receiver<LifecycleEvent>,
    pred: impl Fn(&LifecycleEvent) -> bool,
) -> LifecycleEvent {
    let wait = async {
        loop {
            let ev = rx.recv().await.expect("event bus open");
            if pred(&ev) {
                return ev;
            }
        }
    };
    wait.within("a matching lifecycle event").await
}

/// A [`SessionStore`](warden_core::SessionStore) over a [`MemoryStore`]
/// whose next save, once [`hold_next_save`](GatedStore::hold_next_save) is
/// called, blocks until [`release`](GatedStore::release): it keeps a
/// session busy inside its handler so a test can queue messages behind it
/// in an exact order.
#[derive(Debug, Default)]
pub struct GatedStore {
    inner: warden_core::MemoryStore,
    hold: std::sync::atomic::AtomicBool,
    entered: tokio::sync::Notify,
    released: tokio::sync::Notify,
}

impl GatedStore {
    /// Makes the next save wait for [`release`](Self::release).
    pub fn hold_next_save(&self) {
        self.hold.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Waits until a save is held.
    pub async fn held(&self) {
        self.entered.notified().within("a save to be held").await;
    }

    /// Lets the held save go on.
    pub fn release(&self) {
        self.released.notify_one();
    }
}

impl warden_core::SessionStore for GatedStore {
    fn load(
        &self,
        key: &SessionKey,
    ) -> futures_util::future::BoxFuture<
        '_,
        Result<Option<warden_core::SessionRecord>, warden_core::StoreError>,
    > {
        self.inner.load(key)
    }

    fn save<'a>(
        &'a self,
        record: &'a warden_core::SessionRecord,
        durability: warden_core::Durability,
    ) -> futures_util::future::BoxFuture<'a, Result<(), warden_core::StoreError>> {
        Box::pin(async move {
            if self.hold.swap(false, std::sync::atomic::Ordering::SeqCst) {
                self.entered.notify_one();
                self.released.notified().await;
            }
            self.inner.save(record, durability).await
        })
    }

    fn list(
        &self,
    ) -> futures_util::future::BoxFuture<
        '_,
        Result<
            Vec<Result<warden_core::SessionRecord, warden_core::StoreError>>,
            warden_core::StoreError,
        >,
    > {
        self.inner.list()
    }
}

/// Lets every ready task run without moving the paused clock much.
pub async fn settle() {
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
}

/// Polls until the runtime has at most `n` alive tasks; panics if never.
pub async fn assert_tasks_return_to(n: usize) {
    let metrics = tokio::runtime::Handle::current().metrics();
    for _ in 0..200 {
        if metrics.num_alive_tasks() <= n {
            return;
        }
        tokio::task::yield_now().await;
    }
    panic!(
        "tasks leaked: {} alive, expected at most {n}",
        metrics.num_alive_tasks()
    );
}

pub fn elapsed_since(t0: Instant) -> Duration {
    Instant::now() - t0
}

/// A supervisor whose sessions stream from `base_url` through the real
/// Anthropic SSE source, with watchdog allowance `timeout` and `retry`.
pub async fn anthropic_supervisor(
    base_url: String,
    timeout: Duration,
    retry: RetryPolicy,
) -> Supervisor {
    let source = Arc::new(
        warden_llm::AnthropicSource::new(
            warden_llm::AnthropicOptions::default()
                .with_base_url(base_url)
                .with_api_key("dummy"),
        )
        .expect("source"),
    );
    let factory = move |_: &SessionKey| source.clone() as Arc<dyn EventSource>;
    let config = SupervisorConfig::default()
        .with_watchdog(
            WatchdogConfig::default()
                .with_default_timeout(timeout)
                .expect("valid"),
        )
        .with_session(SessionConfig::default().with_retry(retry));
    Supervisor::start(config, Arc::new(factory))
        .await
        .expect("supervisor")
}

/// A supervisor whose every session streams from `source`, with a
/// real-time watchdog allowance `timeout` and quick retries (10-20 ms).
pub async fn supervisor_over(source: Arc<dyn EventSource>, timeout: Duration) -> Supervisor {
    let config = SupervisorConfig::default()
        .with_watchdog(
            WatchdogConfig::default()
                .with_default_timeout(timeout)
                .expect("valid"),
        )
        .with_session(
            SessionConfig::default().with_retry(
                RetryPolicy::default()
                    .with_backoff(Duration::from_millis(10), Duration::from_millis(20)),
            ),
        );
    Supervisor::start(config, Arc::new(move |_: &SessionKey| source.clone()))
        .await
        .expect("supervisor")
}

/// What a consumer that honours `Retrying` (discard what it shows) and
/// `Continuing` (keep it) ends with: the text it shows, the notices in
/// order, and how the turn ended.
#[derive(Debug)]
pub struct Consumed {
    pub shown: String,
    pub notices: Vec<&'static str>,
    pub result: Result<warden_core::TurnSummary, warden_core::TurnError>,
}

impl Consumed {
    /// The answer's text; panics if the turn failed.
    pub fn text(&self) -> &str {
        &self.result.as_ref().expect("answered").text
    }
}

/// Reads `turn` to its end as such a consumer. Not bounded itself: wrap it
/// in `within` / `patiently`.
pub async fn consume(mut turn: warden_core::TurnHandle) -> Consumed {
    use warden_core::{AgentEvent, TurnEvent};
    let mut shown = String::new();
    let mut notices = Vec::new();
    while let Some(ev) = turn.recv().await {
        match ev {
            TurnEvent::Event(AgentEvent::TextDelta(t)) => shown.push_str(&t),
            TurnEvent::Retrying { .. } => {
                shown.clear();
                notices.push("retrying");
            }
            TurnEvent::Continuing { .. } => notices.push("continuing"),
            TurnEvent::Finished(result) => {
                return Consumed {
                    shown,
                    notices,
                    result,
                };
            }
            _ => {}
        }
    }
    panic!("the turn ended without Finished");
}
