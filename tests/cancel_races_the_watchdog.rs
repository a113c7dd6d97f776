//! A user cancel (Escape) against the watchdog, in both orders and at the
//! same instant: the first wins, a cancel is never retried, nothing panics,
//! no late event of the dead attempt reaches the user.

mod common;

use std::time::Duration;

use common::*;
use tokio::time::sleep;
use warden_core::{AgentEvent, LifecycleEvent, TurnError, TurnEvent};

async fn assert_no_more_attempts(ctl: &warden_core::testing::ChannelSourceControl) {
    assert!(
        tokio::time::timeout(Duration::from_secs(120), ctl.next_attempt())
            .await
            .is_err(),
        "a cancelled turn must never be retried"
    );
}

#[tokio::test(start_paused = true)]
async fn cancel_before_the_deadline_wins_and_no_late_event_leaks() {
    let (sup, ctl) = supervisor_with(config()).await;
    let mut turn = sup.send("ws", "hi").await.expect("send");
    let a = ctl.next_attempt().await.expect("opened");
    a.text("partial");
    sleep(Duration::from_secs(30)).await;
    let session = sup.session("ws").await.expect("session");
    session.cancel();
    // The stream keeps talking after Escape: none of it may reach the user.
    a.text("LATE");
    let mut seen = Vec::new();
    let result = loop {
        match turn.recv().await.expect("event") {
            TurnEvent::Event(AgentEvent::TextDelta(t)) => seen.push(t),
            TurnEvent::Finished(r) => break r,
            _ => {}
        }
    };
    assert_eq!(result, Err(TurnError::Cancelled));
    assert_eq!(seen, ["partial"]);
    a.dropped().await;
    assert_eq!(sup.watchdog().stats().await.expect("alive").kills, 0);
    assert_no_more_attempts(&ctl).await;
    sup.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn watchdog_first_then_cancel_during_backoff_stops_the_retry() {
    let (sup, ctl) = supervisor_with(config()).await;
    let mut events = sup.subscribe();
    let turn = sup.send("ws", "hi").await.expect("send");
    let a = ctl.next_attempt().await.expect("opened");
    wait_for(&mut events, |e| {
        matches!(e, LifecycleEvent::RetryScheduled { .. })
    })
    .await;
    assert!(a.is_dropped());
    sup.session("ws").await.expect("session").cancel();
    assert_eq!(turn.finish().await.map(|_| ()), Err(TurnError::Cancelled));
    assert_eq!(sup.watchdog().stats().await.expect("alive").kills, 1);
    assert_no_more_attempts(&ctl).await;
    sup.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn cancel_and_watchdog_at_the_same_instant_end_cancelled_without_retry() {
    let (sup, ctl) = supervisor_with(config()).await;
    let session = sup.session("ws").await.expect("session");
    let turn = session.submit("hi").await.expect("submit");
    let a = ctl.next_attempt().await.expect("opened");
    // Wake exactly at the watchdog's deadline, on the same tick as its timer.
    sleep(T45).await;
    session.cancel();
    assert_eq!(turn.finish().await.map(|_| ()), Err(TurnError::Cancelled));
    assert!(a.is_dropped());
    assert_no_more_attempts(&ctl).await;
    // The session is still healthy.
    let next = session.submit("again").await.expect("submit");
    let b = ctl.next_attempt().await.expect("opened");
    b.text("ok");
    b.finish();
    assert_eq!(next.finish().await.expect("ok").0, "ok");
    sup.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn cancel_when_idle_or_twice_is_harmless() {
    let (sup, ctl) = supervisor_with(config()).await;
    let session = sup.session("ws").await.expect("session");
    session.cancel();
    let turn = session.submit("hi").await.expect("submit");
    let _a = ctl.next_attempt().await.expect("opened");
    session.cancel();
    session.cancel();
    assert_eq!(turn.finish().await.map(|_| ()), Err(TurnError::Cancelled));
    assert!(session.status().await.is_ok(), "session survived");
    sup.shutdown().await;
}
