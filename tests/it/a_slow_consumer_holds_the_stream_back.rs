//! Backpressure from the turn's consumer to the source: a caller that stops
//! reading its `TurnHandle` stops warden reading the stream (memory stays
//! bounded by `max_in_flight` events), and the stall is blamed on the
//! consumer, not the server: the watchdog does not kill the stream however
//! long the consumer pauses. Once the consumer reads again the source is
//! read again, and a source that then goes silent is killed at its
//! allowance as usual. Paused clock.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures_util::future::BoxFuture;
use tokio::time::Instant;
use warden_core::{
    AgentEvent, EventSource, EventStream, Frame, RetryPolicy, SessionConfig, SessionKey,
    StreamError, StreamOptions, Supervisor, SupervisorConfig, TurnError, TurnEvent, TurnRequest,
    WatchdogConfig,
};

const TIMEOUT: Duration = Duration::from_secs(45);
const WINDOW: usize = 16;

/// A text delta of `delta` bytes every 10 ms, `limit` of them, then
/// silence.
struct Firehose {
    pulled: Arc<AtomicUsize>,
    limit: usize,
    delta: usize,
}

impl EventSource for Firehose {
    fn open(&self, _: TurnRequest) -> BoxFuture<'static, Result<EventStream, StreamError>> {
        let pulled = self.pulled.clone();
        let limit = self.limit;
        let text = "x".repeat(self.delta);
        Box::pin(async move {
            let frames = futures_util::stream::unfold(0usize, move |n| {
                let pulled = pulled.clone();
                let text = text.clone();
                async move {
                    if n >= limit {
                        std::future::pending::<()>().await;
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    pulled.fetch_add(1, Ordering::SeqCst);
                    Some((Ok(Frame::Event(AgentEvent::TextDelta(text))), n + 1))
                }
            });
            Ok(Box::pin(frames) as EventStream)
        })
    }
}

async fn recv(turn: &mut warden_core::TurnHandle) -> TurnEvent {
    tokio::time::timeout(Duration::from_secs(600), turn.recv())
        .await
        .expect("an event within 600 s")
        .expect("the turn is not over")
}

#[tokio::test(start_paused = true)]
async fn a_consumer_that_stops_reading_stops_the_reader_and_is_not_blamed_on_the_server() {
    let pulled = Arc::new(AtomicUsize::new(0));
    let source: Arc<dyn EventSource> = Arc::new(Firehose {
        pulled: pulled.clone(),
        limit: 5_000,
        delta: 1,
    });
    let factory = move |_: &SessionKey| source.clone();
    let config = SupervisorConfig::default()
        .with_watchdog(
            WatchdogConfig::default()
                .with_default_timeout(TIMEOUT)
                .expect("valid"),
        )
        .with_session(
            SessionConfig::default()
                .with_retry(RetryPolicy::default().with_max_attempts(1))
                .with_stream(StreamOptions::default().with_max_in_flight(WINDOW)),
        );
    let sup = Supervisor::start(config, Arc::new(factory))
        .await
        .expect("starts");
    let mut turn = sup.send("ws", "go").await.expect("send");
    assert!(matches!(recv(&mut turn).await, TurnEvent::Started(_)));

    // The consumer pauses for ten minutes: over thirteen allowances.
    tokio::time::sleep(Duration::from_secs(600)).await;
    let held = pulled.load(Ordering::SeqCst);
    assert!(
        held <= WINDOW + 2,
        "the reader went on reading while nobody consumed: {held} events pulled"
    );
    assert_eq!(
        sup.watchdog().stats().await.expect("alive").kills,
        0,
        "a stall of warden's own consumer was blamed on the server"
    );

    // Reading again lets the reader read again.
    for _ in 0..1_000 {
        assert!(matches!(
            recv(&mut turn).await,
            TurnEvent::Event(AgentEvent::TextDelta(_))
        ));
    }
    assert!(pulled.load(Ordering::SeqCst) >= 1_000);

    // Read everything; the source then goes silent and is killed at its
    // allowance after its last frame, as any silent stream.
    let mut texts = 1_000;
    let last_frame = loop {
        match recv(&mut turn).await {
            TurnEvent::Event(AgentEvent::TextDelta(_)) => {
                texts += 1;
                if texts == 5_000 {
                    break Instant::now();
                }
            }
            other => panic!("unexpected {other:?}"),
        }
    };
    match recv(&mut turn).await {
        TurnEvent::Finished(Err(TurnError::RetriesExhausted {
            last: StreamError::InactivityTimeout { .. },
            ..
        })) => {}
        other => panic!("expected ESTREAM_TIMEOUT, got {other:?}"),
    }
    let silent = Instant::now() - last_frame;
    assert!(
        silent >= TIMEOUT && silent < TIMEOUT + Duration::from_secs(1),
        "killed {silent:?} after the last frame"
    );
    sup.shutdown().await;
}

/// What is in flight is bounded in bytes too: an event takes a credit and
/// one more per 4 KiB of its text, so 16 KiB deltas fill a window of 16
/// credits after 3 of them, not 16 (256 deltas of 64 KiB would be 16 MiB
/// held for a consumer that does not read).
#[tokio::test(start_paused = true)]
async fn large_deltas_take_a_credit_per_4_kib_so_the_bytes_held_are_bounded_too() {
    let pulled = Arc::new(AtomicUsize::new(0));
    let source: Arc<dyn EventSource> = Arc::new(Firehose {
        pulled: pulled.clone(),
        limit: 1_000,
        delta: 16 * 1024,
    });
    let factory = move |_: &SessionKey| source.clone();
    let config = SupervisorConfig::default().with_session(
        SessionConfig::default()
            .with_retry(RetryPolicy::default().with_max_attempts(1))
            .with_stream(StreamOptions::default().with_max_in_flight(WINDOW)),
    );
    let sup = Supervisor::start(config, Arc::new(factory))
        .await
        .expect("starts");
    let mut turn = sup.send("ws", "go").await.expect("send");
    assert!(matches!(recv(&mut turn).await, TurnEvent::Started(_)));
    tokio::time::sleep(Duration::from_secs(10)).await;
    let held = pulled.load(Ordering::SeqCst);
    // 5 credits each (one, and one per 4 KiB): 3 fit in 16, one waits.
    assert!(
        held <= WINDOW / 5 + 2,
        "{held} deltas of 16 KiB pulled for a window of {WINDOW} credits"
    );
    // A consumer that reads gets them all.
    for _ in 0..100 {
        assert!(matches!(
            recv(&mut turn).await,
            TurnEvent::Event(AgentEvent::TextDelta(_))
        ));
    }
    sup.shutdown().await;
}
