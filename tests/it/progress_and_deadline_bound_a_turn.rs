//! A server that only pings is alive to the silence watchdog; the optional
//! progress allowance catches it. The optional turn deadline caps a turn's
//! wall-clock time whatever its streams do.

use std::time::Duration;

use tokio::time::Instant;

use crate::common::*;
use warden_core::testing::AttemptControl;
use warden_core::{
    AgentEvent, Frame, LifecycleEvent, RetryPolicy, SessionConfig, StreamError, StreamOptions,
    SupervisorConfig, TurnError,
};

const PING: Duration = Duration::from_secs(10);

fn with_session(session: SessionConfig) -> SupervisorConfig {
    let base = config();
    let retry = base.session.retry.clone();
    base.with_session(session.with_retry(retry))
}

/// Pings `attempt` every 10 s until warden drops it; how long that took.
async fn ping_until_dropped(attempt: &AttemptControl) -> Duration {
    let t0 = Instant::now();
    let pinging = async {
        loop {
            tokio::time::sleep(PING).await;
            if !attempt.ping() {
                return;
            }
        }
    };
    tokio::select! {
        () = pinging => {}
        () = attempt.dropped() => {}
    }
    elapsed_since(t0)
}

#[tokio::test(start_paused = true)]
async fn a_stream_that_only_pings_is_killed_for_no_progress_and_retried() {
    let allowance = Duration::from_secs(60);
    let session = SessionConfig::default()
        .with_stream(StreamOptions::default().with_progress_timeout(allowance));
    let (sup, ctl) = supervisor_with(with_session(session)).await;
    let mut events = sup.subscribe();
    let turn = sup.send("ws", "hello").await.expect("send");
    let first = ctl
        .next_attempt()
        .within("the first attempt")
        .await
        .expect("opened");
    first.text("thinking out loud…");
    let lived = ping_until_dropped(&first).within("the kill").await;
    assert!(
        lived >= allowance && lived <= allowance + PING,
        "killed {lived:?} after its last content, allowance {allowance:?}"
    );
    let retry = wait_for(&mut events, |e| {
        matches!(e, LifecycleEvent::RetryScheduled { .. })
    })
    .await;
    assert!(
        matches!(
            retry,
            LifecycleEvent::RetryScheduled {
                error_code: "ESTREAM_NO_PROGRESS",
                ..
            }
        ),
        "{retry:?}"
    );
    let second = ctl
        .next_attempt()
        .within("the retry")
        .await
        .expect("opened");
    second.text("answer");
    second.finish();
    let (_, summary) = turn.finish().within("the turn").await.expect("answered");
    assert_eq!((summary.text.as_str(), summary.attempts), ("answer", 2));
    sup.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn slow_content_within_the_allowance_is_progress() {
    let session = SessionConfig::default()
        .with_stream(StreamOptions::default().with_progress_timeout(Duration::from_secs(60)));
    let (sup, ctl) = supervisor_with(with_session(session)).await;
    let turn = sup.send("ws", "hello").await.expect("send");
    let a = ctl
        .next_attempt()
        .within("the attempt")
        .await
        .expect("opened");
    // Ten minutes: a word every 50 s, pings in between.
    for _ in 0..12 {
        for _ in 0..5 {
            tokio::time::sleep(PING).await;
            assert!(a.ping(), "still open");
        }
        assert!(a.text("word "), "still open");
    }
    a.finish();
    let (_, summary) = turn.finish().within("the turn").await.expect("answered");
    assert_eq!(summary.attempts, 1);
    sup.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn progress_does_not_run_down_while_a_tool_runs() {
    let session = SessionConfig::default()
        .with_stream(StreamOptions::default().with_progress_timeout(Duration::from_secs(60)));
    let (sup, ctl) = supervisor_with(with_session(session)).await;
    let turn = sup.send("ws", "run the tests").await.expect("send");
    let a = ctl
        .next_attempt()
        .within("the attempt")
        .await
        .expect("opened");
    a.send(Frame::Event(AgentEvent::ToolUseStarted {
        id: "t1".into(),
        name: "Bash".into(),
    }));
    // A five-minute tool run, only pings from the agent.
    for _ in 0..30 {
        tokio::time::sleep(PING).await;
        assert!(a.ping(), "killed while the tool ran");
    }
    a.send(Frame::Event(AgentEvent::ToolUseFinished {
        id: "t1".into(),
    }));
    a.text("all green");
    a.finish();
    let (_, summary) = turn.finish().within("the turn").await.expect("answered");
    assert_eq!((summary.text.as_str(), summary.attempts), ("all green", 1));
    sup.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_turn_past_its_deadline_is_stopped_and_not_retried() {
    let after = Duration::from_secs(120);
    let (sup, ctl) = supervisor_with(with_session(
        SessionConfig::default().with_turn_deadline(after),
    ))
    .await;
    let t0 = Instant::now();
    let turn = sup.send("ws", "hello").await.expect("send");
    let a = ctl
        .next_attempt()
        .within("the attempt")
        .await
        .expect("opened");
    a.text("on and on");
    let lived = ping_until_dropped(&a).within("the stop").await;
    assert!(lived <= after, "stopped at {lived:?}");
    match turn.finish().within("the turn").await {
        Err(TurnError::DeadlineExceeded { after: a }) => assert_eq!(a, after),
        other => panic!("expected DeadlineExceeded, got {other:?}"),
    }
    assert_eq!(elapsed_since(t0), after, "at the deadline exactly");
    let next = tokio::time::timeout(Duration::from_secs(600), ctl.next_attempt()).await;
    assert!(next.is_err(), "a turn past its deadline is not retried");
    sup.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_deadline_during_backoff_ends_the_turn_at_once() {
    let after = Duration::from_secs(30);
    let slow_retry = RetryPolicy::default()
        .with_jitter(0.0)
        .with_backoff(Duration::from_secs(60), Duration::from_secs(60));
    let session = SessionConfig::default()
        .with_turn_deadline(after)
        .with_retry(slow_retry);
    let (sup, ctl) = supervisor_with(config().with_session(session)).await;
    let t0 = Instant::now();
    let turn = sup.send("ws", "hello").await.expect("send");
    let first = ctl
        .next_attempt()
        .within("the attempt")
        .await
        .expect("opened");
    tokio::time::sleep(Duration::from_secs(20)).await;
    first.fail(StreamError::Connection {
        message: "reset".into(),
    });
    // Backing off until 80 s; the deadline at 30 s ends the turn.
    match turn.finish().within("the turn").await {
        Err(TurnError::DeadlineExceeded { .. }) => {}
        other => panic!("expected DeadlineExceeded, got {other:?}"),
    }
    assert_eq!(elapsed_since(t0), after);
    let next = tokio::time::timeout(Duration::from_secs(600), ctl.next_attempt()).await;
    assert!(next.is_err(), "the pending retry was dropped");
    sup.shutdown().await;
}
