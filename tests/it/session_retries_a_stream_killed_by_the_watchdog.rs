//! Streams under a real supervisor tree, fed by a channel source, on the
//! paused clock.

use std::time::Duration;

use crate::common::*;
use tokio::time::{Instant, sleep};
use warden_core::{LifecycleEvent, RetryPolicy, SessionConfig, StreamError, TurnError, TurnEvent};

#[tokio::test(start_paused = true)]
async fn a_normal_stream_completes_and_the_watchdog_never_fires() {
    let (sup, ctl) = supervisor_with(config()).await;
    let turn = sup.send("ws", "hello").await.expect("send");
    let a = ctl
        .next_attempt()
        .within("the next attempt to open")
        .await
        .expect("opened");
    assert_eq!(a.request.message, "hello");
    for word in ["Hel", "lo ", "there"] {
        sleep(Duration::from_millis(100)).await;
        a.text(word);
    }
    a.finish();
    let (text, summary) = turn
        .finish()
        .within("the turn to finish")
        .await
        .expect("turn succeeds");
    assert_eq!(text, "Hello there");
    assert_eq!(summary.attempts, 1);
    assert_eq!(sup.watchdog().stats().await.expect("alive").kills, 0);
    sup.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn pings_through_a_long_thinking_pause_keep_the_stream_alive() {
    let (sup, ctl) = supervisor_with(config()).await;
    let mut events = sup.subscribe();
    let turn = sup.send("ws", "think hard").await.expect("send");
    let a = ctl
        .next_attempt()
        .within("the next attempt to open")
        .await
        .expect("opened");
    a.text("Let me think.");
    // 30 s with no content, a ping every 10 s, under a 45 s timeout, then
    // another 40 s of pings: 70 s in all, longer than the timeout.
    for _ in 0..7 {
        sleep(Duration::from_secs(10)).await;
        assert!(a.ping(), "stream was dropped during thinking");
    }
    a.text(" Done.");
    a.finish();
    let (text, summary) = turn
        .finish()
        .within("the turn to finish")
        .await
        .expect("turn succeeds");
    assert_eq!(text, "Let me think. Done.");
    assert_eq!(summary.attempts, 1);
    assert_eq!(sup.watchdog().stats().await.expect("alive").kills, 0);
    while let Ok(ev) = events.try_recv() {
        assert!(
            !matches!(ev, LifecycleEvent::StreamTimedOut { .. }),
            "{ev:?}"
        );
    }
    sup.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_dead_stream_times_out_at_45s_and_the_retry_succeeds() {
    let (sup, ctl) = supervisor_with(config()).await;
    let mut events = sup.subscribe();
    let mut turn = sup.send("ws", "hi").await.expect("send");
    let first = ctl
        .next_attempt()
        .within("the next attempt to open")
        .await
        .expect("opened");
    for w in ["a", "b", "c"] {
        first.text(w);
    }
    let last_frame = Instant::now();
    // ... then silence, socket held open.
    let ev = wait_for(&mut events, |e| {
        matches!(e, LifecycleEvent::StreamTimedOut { .. })
    })
    .await;
    let waited = elapsed_since(last_frame);
    assert!(waited >= T45, "killed early: {waited:?}");
    assert!(
        waited <= T45 + Duration::from_millis(2),
        "killed late: {waited:?}"
    );
    let LifecycleEvent::StreamTimedOut { attempt, .. } = ev else {
        unreachable!()
    };
    assert_eq!(attempt.attempt, 1);
    assert!(
        first.is_dropped(),
        "the dead stream must be dropped (socket closed)"
    );

    let second = ctl
        .next_attempt()
        .within("the next attempt to open")
        .await
        .expect("retried");
    assert_eq!(second.request.attempt, 2);
    // The retry waited the backoff (500 ms without jitter).
    assert!(elapsed_since(last_frame) >= T45 + Duration::from_millis(500));
    second.text("fresh answer");
    second.finish();

    let mut saw_retry = None;
    let mut text = String::new();
    while let Some(ev) = turn.recv().within("the next turn event").await {
        match ev {
            TurnEvent::Started(_) => text.clear(),
            TurnEvent::Event(warden_core::AgentEvent::TextDelta(t)) => text.push_str(&t),
            TurnEvent::Retrying { error, .. } => saw_retry = Some(error),
            TurnEvent::Finished(r) => {
                let s = r.expect("second attempt succeeds");
                assert_eq!(s.attempts, 2);
            }
            _ => {}
        }
    }
    let err = saw_retry.expect("a Retrying event");
    assert_eq!(err.code(), "ESTREAM_TIMEOUT");
    assert!(
        err.to_string()
            .starts_with("Connection lost during streaming")
    );
    assert_eq!(text, "fresh answer");
    sup.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn silence_before_the_first_byte_is_covered() {
    let (sup, ctl) = supervisor_with(config()).await;
    let t0 = Instant::now();
    let mut events = sup.subscribe();
    let _turn = sup.send("ws", "hi").await.expect("send");
    let first = ctl
        .next_attempt()
        .within("the next attempt to open")
        .await
        .expect("opened");
    wait_for(&mut events, |e| {
        matches!(e, LifecycleEvent::StreamTimedOut { .. })
    })
    .await;
    assert!(elapsed_since(t0) <= T45 + Duration::from_millis(2));
    assert!(first.is_dropped());
    sup.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn exhausted_retries_end_in_a_final_typed_error() {
    let config = config().with_session(
        SessionConfig::default().with_retry(RetryPolicy::default().with_max_attempts(3)),
    );
    let (sup, ctl) = supervisor_with(config).await;
    let turn = sup.send("ws", "hi").await.expect("send");
    let mut attempts = Vec::new();
    for _ in 0..3 {
        attempts.push(
            ctl.next_attempt()
                .within("the next attempt to open")
                .await
                .expect("opened"),
        ); // each goes silent
    }
    let err = turn
        .finish()
        .within("the turn to finish")
        .await
        .expect_err("must fail");
    match err {
        TurnError::RetriesExhausted { attempts: n, last } => {
            assert_eq!(n, 3);
            assert_eq!(last.code(), "ESTREAM_TIMEOUT");
        }
        other => panic!("unexpected {other:?}"),
    }
    assert!(attempts.iter().all(|a| a.is_dropped()));
    settle().await;
    assert!(
        tokio::time::timeout(Duration::from_secs(600), ctl.next_attempt())
            .await
            .is_err(),
        "no fourth attempt"
    );
    sup.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn fatal_errors_are_not_retried_and_retryable_ones_are() {
    let (sup, ctl) = supervisor_with(config()).await;
    // Retryable: an overloaded error mid-stream.
    let turn = sup.send("ws", "one").await.expect("send");
    let a = ctl
        .next_attempt()
        .within("the next attempt to open")
        .await
        .expect("opened");
    a.fail(StreamError::Api {
        status: Some(529),
        kind: "overloaded_error".into(),
        message: "Overloaded".into(),
        retryable: true,
        retry_after: Some(Duration::from_secs(2)),
    });
    let t0 = Instant::now();
    let b = ctl
        .next_attempt()
        .within("the next attempt to open")
        .await
        .expect("retried");
    assert!(
        elapsed_since(t0) >= Duration::from_secs(2),
        "retry-after honoured"
    );
    b.finish();
    assert_eq!(
        turn.finish()
            .within("the turn to finish")
            .await
            .expect("ok")
            .1
            .attempts,
        2
    );

    // Fatal: malformed frame.
    let turn = sup.send("ws", "two").await.expect("send");
    let a = ctl
        .next_attempt()
        .within("the next attempt to open")
        .await
        .expect("opened");
    a.fail(StreamError::Malformed {
        message: "bad json".into(),
    });
    match turn.finish().within("the turn to finish").await {
        Err(TurnError::Fatal(StreamError::Malformed { .. })) => {}
        other => panic!("unexpected {other:?}"),
    }
    assert!(
        tokio::time::timeout(Duration::from_secs(60), ctl.next_attempt())
            .await
            .is_err(),
        "fatal errors are not retried"
    );
    sup.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn messages_queue_behind_the_running_turn() {
    let (sup, ctl) = supervisor_with(config()).await;
    let t1 = sup.send("ws", "first").await.expect("send");
    let t2 = sup.send("ws", "second").await.expect("send");
    let a = ctl
        .next_attempt()
        .within("the next attempt to open")
        .await
        .expect("opened");
    assert_eq!(a.request.message, "first");
    a.text("1");
    a.finish();
    let b = ctl
        .next_attempt()
        .within("the next attempt to open")
        .await
        .expect("opened");
    assert_eq!(
        (b.request.message.as_str(), b.request.turn_id),
        ("second", 2)
    );
    b.text("2");
    b.finish();
    assert_eq!(
        t1.finish()
            .within("the turn to finish")
            .await
            .expect("ok")
            .0,
        "1"
    );
    assert_eq!(
        t2.finish()
            .within("the turn to finish")
            .await
            .expect("ok")
            .0,
        "2"
    );
    sup.shutdown().await;
}

/// A source whose first `open` never returns (a connect or a response that
/// never comes); later opens are the channel source's.
struct FirstOpenHangs {
    inner: std::sync::Arc<warden_core::testing::ChannelSource>,
    hung: std::sync::atomic::AtomicBool,
    /// Set when warden drops the hanging `open`.
    abandoned: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

/// Sets its flag when dropped.
struct SetOnDrop(std::sync::Arc<std::sync::atomic::AtomicBool>);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

impl warden_core::EventSource for FirstOpenHangs {
    fn open(
        &self,
        request: warden_core::TurnRequest,
    ) -> futures_util::future::BoxFuture<'static, Result<warden_core::EventStream, StreamError>>
    {
        if self.hung.swap(true, std::sync::atomic::Ordering::SeqCst) {
            return self.inner.open(request);
        }
        let flag = SetOnDrop(self.abandoned.clone());
        Box::pin(async move {
            let _flag = flag;
            std::future::pending().await
        })
    }
}

#[tokio::test(start_paused = true)]
async fn an_open_that_never_returns_is_killed_at_the_allowance_and_retried() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let (inner, ctl) = warden_core::testing::ChannelSource::new();
    let abandoned = Arc::new(AtomicBool::new(false));
    let source = Arc::new(FirstOpenHangs {
        inner,
        hung: AtomicBool::new(false),
        abandoned: abandoned.clone(),
    });
    let factory =
        move |_: &warden_core::SessionKey| source.clone() as Arc<dyn warden_core::EventSource>;
    let sup = warden_core::Supervisor::start(config(), Arc::new(factory))
        .await
        .expect("supervisor");
    let mut events = sup.subscribe();
    let t0 = Instant::now();
    let turn = sup.send("ws", "hi").await.expect("send");
    let ev = wait_for(&mut events, |e| {
        matches!(e, LifecycleEvent::StreamTimedOut { .. })
    })
    .await;
    let waited = elapsed_since(t0);
    assert!(waited >= T45, "killed early: {waited:?}");
    assert!(
        waited <= T45 + Duration::from_millis(2),
        "killed late: {waited:?}"
    );
    assert!(
        matches!(ev, LifecycleEvent::StreamTimedOut { attempt, .. } if attempt.attempt == 1),
        "{ev:?}"
    );
    assert!(
        abandoned.load(Ordering::SeqCst),
        "the hanging open was dropped"
    );
    let b = ctl
        .next_attempt()
        .within("the retry")
        .await
        .expect("retried");
    assert_eq!(b.request.attempt, 2);
    b.text("ok");
    b.finish();
    let (text, summary) = turn
        .finish()
        .within("the turn")
        .await
        .expect("retry succeeds");
    assert_eq!((text.as_str(), summary.attempts), ("ok", 2));
    sup.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn by_default_a_turn_gets_four_attempts() {
    assert_eq!(RetryPolicy::default().max_attempts, 4);
    let (sup, ctl) = supervisor_with(warden_core::SupervisorConfig::default()).await;
    let turn = sup.send("ws", "hi").await.expect("send");
    let mut attempts = Vec::new();
    for n in 1..=4 {
        let a = ctl
            .next_attempt()
            .within("an attempt")
            .await
            .expect("opened");
        assert_eq!(a.request.attempt, n);
        attempts.push(a); // each goes silent and is killed
    }
    match turn.finish().within("the turn").await {
        Err(TurnError::RetriesExhausted { attempts: 4, last }) => {
            assert_eq!(last.code(), "ESTREAM_TIMEOUT")
        }
        other => panic!("unexpected {other:?}"),
    }
    assert!(
        tokio::time::timeout(Duration::from_secs(600), ctl.next_attempt())
            .await
            .is_err(),
        "no fifth attempt"
    );
    sup.shutdown().await;
}
