//! A user cancel (Escape) against the watchdog, in both orders and at the
//! same instant: the first wins, a cancel is never retried, nothing panics,
//! no late event of the dead attempt reaches the user.

use std::sync::Arc;
use std::time::Duration;

use crate::common::*;
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
    let a = ctl
        .next_attempt()
        .within("the next attempt to open")
        .await
        .expect("opened");
    a.text("partial");
    sleep(Duration::from_secs(30)).await;
    let session = sup.session("ws").await.expect("session");
    session.cancel().expect("the session runs");
    // The stream keeps talking after Escape: none of it may reach the user.
    a.text("LATE");
    let mut seen = Vec::new();
    let result = loop {
        match turn.recv().within("the next event").await.expect("event") {
            TurnEvent::Event(AgentEvent::TextDelta(t)) => seen.push(t),
            TurnEvent::Finished(r) => break r,
            _ => {}
        }
    };
    assert_eq!(result, Err(TurnError::Cancelled));
    assert_eq!(seen, ["partial"]);
    a.dropped().within("the stream to be dropped").await;
    assert_eq!(sup.watchdog().stats().await.expect("alive").kills, 0);
    assert_no_more_attempts(&ctl).await;
    sup.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn watchdog_first_then_cancel_during_backoff_stops_the_retry() {
    let (sup, ctl) = supervisor_with(config()).await;
    let mut events = sup.subscribe();
    let turn = sup.send("ws", "hi").await.expect("send");
    let a = ctl
        .next_attempt()
        .within("the next attempt to open")
        .await
        .expect("opened");
    wait_for(&mut events, |e| {
        matches!(e, LifecycleEvent::RetryScheduled { .. })
    })
    .await;
    assert!(a.is_dropped());
    sup.session("ws")
        .await
        .expect("session")
        .cancel()
        .expect("the session runs");
    assert_eq!(
        turn.finish().within("the turn to finish").await.map(|_| ()),
        Err(TurnError::Cancelled)
    );
    assert_eq!(sup.watchdog().stats().await.expect("alive").kills, 1);
    assert_no_more_attempts(&ctl).await;
    sup.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn cancel_and_watchdog_at_the_same_instant_end_cancelled_without_retry() {
    let (sup, ctl) = supervisor_with(config()).await;
    let session = sup.session("ws").await.expect("session");
    let turn = session.submit("hi").await.expect("submit");
    let a = ctl
        .next_attempt()
        .within("the next attempt to open")
        .await
        .expect("opened");
    // Wake exactly at the watchdog's deadline, on the same tick as its timer.
    sleep(T45).await;
    session.cancel().expect("the session runs");
    assert_eq!(
        turn.finish().within("the turn to finish").await.map(|_| ()),
        Err(TurnError::Cancelled)
    );
    assert!(a.is_dropped());
    assert_no_more_attempts(&ctl).await;
    // The session is still healthy.
    let next = session.submit("again").await.expect("submit");
    let b = ctl
        .next_attempt()
        .within("the next attempt to open")
        .await
        .expect("opened");
    b.text("ok");
    b.finish();
    assert_eq!(
        next.finish()
            .within("the turn to finish")
            .await
            .expect("ok")
            .0,
        "ok"
    );
    sup.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn cancel_when_idle_or_twice_is_harmless() {
    let (sup, ctl) = supervisor_with(config()).await;
    let session = sup.session("ws").await.expect("session");
    session.cancel().expect("the session runs");
    let turn = session.submit("hi").await.expect("submit");
    let _a = ctl
        .next_attempt()
        .within("the next attempt to open")
        .await
        .expect("opened");
    session.cancel().expect("the session runs");
    session.cancel().expect("the session runs");
    assert_eq!(
        turn.finish().within("the turn to finish").await.map(|_| ()),
        Err(TurnError::Cancelled)
    );
    assert!(session.status().await.is_ok(), "session survived");
    sup.shutdown().await;
}

/// Turn 1 runs on `a`; the session is then kept busy accepting a second
/// message (its save held), so whatever is queued behind it is handled in
/// exactly the order it was queued.
async fn busy_session() -> (
    warden_core::Supervisor,
    Arc<GatedStore>,
    warden_core::SessionHandle,
    warden_core::TurnHandle,
    warden_core::testing::AttemptControl,
    tokio::task::JoinHandle<Result<warden_core::TurnHandle, warden_core::SubmitError>>,
    warden_core::testing::ChannelSourceControl,
) {
    let store = Arc::new(GatedStore::default());
    let (sup, _source, ctl, _notices) = supervisor_with_store(config(), store.clone()).await;
    let session = sup.session("ws").await.expect("session");
    let mut turn = session.submit("hi").await.expect("submit");
    let a = ctl
        .next_attempt()
        .within("the first attempt")
        .await
        .expect("opened");
    a.text("partial");
    assert_eq!(
        turn.recv().within("Started").await,
        Some(TurnEvent::Started(warden_core::AttemptId {
            turn: 1,
            attempt: 1
        }))
    );
    assert_eq!(
        turn.recv().within("the partial text").await,
        Some(TurnEvent::Event(AgentEvent::TextDelta("partial".into())))
    );
    store.hold_next_save();
    let s = session.clone();
    let second = tokio::spawn(async move { s.submit("second").await });
    store.held().await;
    (sup, store, session, turn, a, second, ctl)
}

/// The rest of turn 1: its events up to `Finished`, and whether it retried.
async fn rest_of(turn: &mut warden_core::TurnHandle) -> (Vec<TurnEvent>, Result<(), TurnError>) {
    let mut seen = Vec::new();
    loop {
        match turn.recv().within("the end of turn 1").await {
            Some(TurnEvent::Finished(r)) => return (seen, r.map(|_| ())),
            Some(ev) => seen.push(ev),
            None => panic!("turn ended without Finished"),
        }
    }
}

/// The next stream opened is the second message's first attempt, not a
/// retry of the cancelled turn.
async fn next_is_the_second_message(
    ctl: &warden_core::testing::ChannelSourceControl,
    second: tokio::task::JoinHandle<Result<warden_core::TurnHandle, warden_core::SubmitError>>,
) {
    let second = second
        .within("the second submit")
        .await
        .expect("task")
        .expect("accepted");
    let b = ctl
        .next_attempt()
        .within("the second message's attempt")
        .await
        .expect("opened");
    assert_eq!(
        (
            b.request.turn_id,
            b.request.attempt,
            b.request.message.as_str()
        ),
        (2, 1, "second"),
        "the cancelled turn must not be retried"
    );
    b.text("two");
    b.finish();
    assert_eq!(second.finish().within("turn 2").await.expect("ok").0, "two");
}

#[tokio::test(start_paused = true)]
async fn a_kill_reported_after_the_cancel_was_requested_ends_cancelled_without_retry() {
    let (sup, store, session, mut turn, a, second, ctl) = busy_session().await;
    // Escape is queued first; then the watchdog kills the silent stream and
    // its `Ended(ESTREAM_TIMEOUT)` is queued behind the cancel.
    session.cancel().expect("the session runs");
    sleep(T45 + Duration::from_secs(1)).await;
    assert_eq!(sup.watchdog().stats().await.expect("alive").kills, 1);
    assert!(a.is_dropped(), "the kill ended the stream");
    store.release();
    let (seen, result) = rest_of(&mut turn).await;
    assert_eq!(result, Err(TurnError::Cancelled));
    assert!(
        !seen.iter().any(|e| matches!(e, TurnEvent::Retrying { .. })),
        "a cancelled turn is not retried: {seen:?}"
    );
    next_is_the_second_message(&ctl, second).await;
    sup.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn events_the_stream_forwards_after_escape_never_reach_the_user() {
    let (sup, store, session, mut turn, a, second, ctl) = busy_session().await;
    // Escape is queued first; the stream has not heard of it yet, so it
    // reads and forwards these, queued behind the cancel.
    session.cancel().expect("the session runs");
    a.text("LATE");
    a.send(warden_core::Frame::Event(AgentEvent::Usage(
        warden_core::Usage {
            input_tokens: 1,
            output_tokens: 1,
            ..Default::default()
        },
    )));
    settle().await;
    assert!(!a.is_dropped(), "the stream is still reading");
    store.release();
    let (seen, result) = rest_of(&mut turn).await;
    assert_eq!(result, Err(TurnError::Cancelled));
    assert!(
        !seen.iter().any(|e| matches!(e, TurnEvent::Event(_))),
        "an event of the cancelled attempt reached the user: {seen:?}"
    );
    a.dropped().within("the stream to be dropped").await;
    next_is_the_second_message(&ctl, second).await;
    sup.shutdown().await;
}

/// The docs: after Escape "whatever the stream reports, the turn ends
/// Cancelled". A `Completed` queued behind the cancel had its late text
/// suppressed, so it must not end the turn `Ok` with a truncated answer
/// presented as complete.
#[tokio::test(start_paused = true)]
async fn a_stream_that_completes_after_escape_still_ends_the_turn_cancelled() {
    let (sup, store, session, mut turn, a, second, ctl) = busy_session().await;
    session.cancel().expect("the session runs");
    a.text(" and the rest");
    a.finish();
    a.dropped().within("the stream to end").await;
    store.release();
    let (seen, result) = rest_of(&mut turn).await;
    assert_eq!(result, Err(TurnError::Cancelled), "{seen:?}");
    next_is_the_second_message(&ctl, second).await;
    sup.shutdown().await;
}
