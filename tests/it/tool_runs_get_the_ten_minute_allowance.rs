//! While a tool runs (between `ToolUseStarted` and `ToolUseFinished`) a
//! stream's silence allowance is `StreamOptions::tool_timeout` (10 min by
//! default), not the 45 s stream allowance; after the tool it is 45 s again.

use std::time::Duration;

use crate::common::*;
use tokio::time::{Instant, sleep};
use warden_core::{AgentEvent, Frame, LifecycleEvent, StreamOptions};

const TEN_MINUTES: Duration = Duration::from_secs(600);
/// The documented late-kill bound on an idle watchdog.
const BOUND: Duration = Duration::from_millis(2);

fn tool_started() -> Frame {
    Frame::Event(AgentEvent::ToolUseStarted {
        id: "toolu_1".into(),
        name: "bash".into(),
    })
}

fn tool_finished() -> Frame {
    Frame::Event(AgentEvent::ToolUseFinished {
        id: "toolu_1".into(),
    })
}

/// Waits for the watchdog's kill; returns when it came and the silence.
async fn killed(events: &mut tokio::sync::broadcast::Receiver<LifecycleEvent>) -> Duration {
    match wait_for(events, |e| {
        matches!(e, LifecycleEvent::StreamTimedOut { .. })
    })
    .await
    {
        LifecycleEvent::StreamTimedOut { silent_for, .. } => silent_for,
        _ => unreachable!(),
    }
}

#[test]
fn the_default_tool_allowance_is_ten_minutes() {
    assert_eq!(StreamOptions::default().tool_timeout, TEN_MINUTES);
}

#[tokio::test(start_paused = true)]
async fn a_stream_inside_a_tool_run_survives_nine_minutes_of_silence_and_is_killed_after_ten() {
    let (sup, ctl) = supervisor_with(config()).await;
    let mut events = sup.subscribe();
    let _turn = sup.send("ws", "run the tests").await.expect("send");
    let a = ctl
        .next_attempt()
        .within("the attempt")
        .await
        .expect("opened");
    assert!(a.send(tool_started()));
    let last_frame = Instant::now();
    sleep(Duration::from_secs(9 * 60)).await;
    assert!(!a.is_dropped(), "killed during a tool run before 10 min");
    assert_eq!(sup.watchdog().stats().await.expect("alive").kills, 0);
    let silent_for = killed(&mut events).await;
    let waited = Instant::now() - last_frame;
    assert!(waited >= TEN_MINUTES, "killed early: {waited:?}");
    assert!(waited <= TEN_MINUTES + BOUND, "killed late: {waited:?}");
    assert!(silent_for >= TEN_MINUTES, "{silent_for:?}");
    assert!(a.is_dropped());
    sup.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn after_tool_use_finished_the_allowance_is_45_seconds_again() {
    let (sup, ctl) = supervisor_with(config()).await;
    let mut events = sup.subscribe();
    let _turn = sup.send("ws", "run the tests").await.expect("send");
    let a = ctl
        .next_attempt()
        .within("the attempt")
        .await
        .expect("opened");
    assert!(a.send(tool_started()));
    sleep(Duration::from_secs(5 * 60)).await;
    assert!(a.send(tool_finished()), "the tool run was not killed");
    let last_frame = Instant::now();
    let silent_for = killed(&mut events).await;
    let waited = Instant::now() - last_frame;
    assert!(waited >= T45, "killed early: {waited:?}");
    assert!(
        waited <= T45 + BOUND,
        "still on the tool allowance: {waited:?}"
    );
    assert!(silent_for < TEN_MINUTES, "{silent_for:?}");
    sup.shutdown().await;
}
