//! Liveness is frames, not bytes: a server that sends one frame and then a
//! byte every half second without ever ending a line (or only bare blank
//! lines) is killed at the allowance, like a silent one. Comments every
//! half second still keep a stream alive. Paused clock, the real SSE
//! decoder of `warden-llm` in front of the real watchdog and session.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::future::BoxFuture;
use tokio::time::Instant;
use warden_core::{
    EventSource, EventStream, RetryPolicy, SessionConfig, SessionKey, StreamError, Supervisor,
    SupervisorConfig, TurnError, TurnRequest, WatchdogConfig,
};
use warden_llm::decode::{Protocol, decode_frames};

const TIMEOUT: Duration = Duration::from_secs(45);
const MESSAGE_START: &[u8] = b"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":1}}}\n\n";

/// Sends `MESSAGE_START`, then `unit` every 500 ms for ever.
struct Trickle {
    unit: &'static [u8],
}

impl EventSource for Trickle {
    fn open(&self, _: TurnRequest) -> BoxFuture<'static, Result<EventStream, StreamError>> {
        let unit = self.unit;
        Box::pin(async move {
            let first = futures_util::stream::iter([Ok::<_, StreamError>(MESSAGE_START.to_vec())]);
            let rest = futures_util::stream::unfold((), move |()| async move {
                tokio::time::sleep(Duration::from_millis(500)).await;
                Some((Ok(unit.to_vec()), ()))
            });
            Ok(decode_frames(
                Protocol::Anthropic,
                first.chain(rest),
                1 << 20,
            ))
        })
    }
}

/// One attempt under a 45 s allowance; how long until it ends, and how.
async fn run(unit: &'static [u8]) -> (Duration, Result<(), TurnError>) {
    let source: Arc<dyn EventSource> = Arc::new(Trickle { unit });
    let factory = move |_: &SessionKey| source.clone();
    let config = SupervisorConfig::default()
        .with_watchdog(
            WatchdogConfig::default()
                .with_default_timeout(TIMEOUT)
                .expect("valid"),
        )
        .with_session(
            SessionConfig::default().with_retry(RetryPolicy::default().with_max_attempts(1)),
        );
    let sup = Supervisor::start(config, Arc::new(factory))
        .await
        .expect("starts");
    let t0 = Instant::now();
    let turn = sup.send("ws", "hi").await.expect("send");
    // Bounded: a stream kept alive by the trickle ends here as a failure.
    let result = tokio::time::timeout(Duration::from_secs(600), turn.finish())
        .await
        .map_err(|_| TurnError::SessionStopped {
            reason: "still alive after 600 s".into(),
        })
        .and_then(|r| r.map(|_| ()));
    let elapsed = Instant::now() - t0;
    sup.shutdown().await;
    (elapsed, result)
}

fn assert_killed_at_the_allowance(
    unit: &'static [u8],
    (elapsed, result): (Duration, Result<(), TurnError>),
) {
    match result {
        Err(TurnError::RetriesExhausted {
            last: StreamError::InactivityTimeout { .. },
            ..
        }) => {}
        other => panic!("{unit:?}: expected ESTREAM_TIMEOUT, got {other:?} after {elapsed:?}"),
    }
    assert!(
        elapsed >= TIMEOUT && elapsed < TIMEOUT + Duration::from_secs(1),
        "{unit:?}: killed after {elapsed:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_partial_line_trickling_in_is_killed_at_the_allowance() {
    assert_killed_at_the_allowance(b"x", run(b"x").await);
}

#[tokio::test(start_paused = true)]
async fn bare_blank_lines_are_killed_at_the_allowance() {
    assert_killed_at_the_allowance(b"\n", run(b"\n").await);
}

#[tokio::test(start_paused = true)]
async fn comments_every_half_second_keep_the_stream_alive() {
    let (elapsed, result) = run(b": keep-alive\n").await;
    assert!(
        matches!(&result, Err(TurnError::SessionStopped { reason }) if reason.contains("600")),
        "{result:?} after {elapsed:?}"
    );
}
