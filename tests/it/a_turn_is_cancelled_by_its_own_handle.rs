//! `TurnHandle::cancel` cancels that turn, not whatever runs now: a queued
//! turn is removed without ever opening a stream, a running one ends
//! `Cancelled`, a finished one reports `false`, and a handle whose session
//! is gone is an error, not a silent no-op.

use std::sync::Arc;
use std::time::Duration;

use crate::common::*;
use warden_core::{
    AgentEvent, Frame, MemoryStore, SessionKey, SessionRecord, SessionStore, StreamError, TurnError,
};

#[tokio::test(start_paused = true)]
async fn a_queued_turn_cancelled_by_its_handle_never_opens_a_stream() {
    let store = Arc::new(MemoryStore::new());
    let (sup, _source, ctl, _notices) = supervisor_with_store(config(), store.clone()).await;
    let first = sup.send("ws", "first").await.expect("send");
    let second = sup.send("ws", "second").await.expect("send");
    let third = sup.send("ws", "third").await.expect("send");
    let running = ctl
        .next_attempt()
        .within("the first attempt")
        .await
        .expect("opened");
    assert_eq!(running.request.message, "first");

    assert!(
        second.cancel().await.expect("session runs"),
        "it was queued"
    );
    match second.finish().within("the cancelled turn").await {
        Err(TurnError::Cancelled) => {}
        other => panic!("unexpected {other:?}"),
    }
    // Answered: no longer pending, so never re-delivered.
    let r = store
        .load(&SessionKey::new("ws"))
        .await
        .expect("load")
        .expect("record");
    assert!(
        r.pending.iter().all(|m| m.text != "second"),
        "{:?}",
        r.pending
    );

    // The running turn was not touched.
    running.text("one");
    running.finish();
    assert_eq!(first.finish().within("first").await.expect("ok").0, "one");
    // The next stream is the third message's: the second never opened one.
    let next = ctl
        .next_attempt()
        .within("the third attempt")
        .await
        .expect("opened");
    assert_eq!(next.request.message, "third");
    next.text("three");
    next.finish();
    let canceller = third.canceller();
    assert_eq!(third.finish().within("third").await.expect("ok").0, "three");
    assert!(
        !canceller.cancel().await.expect("session runs"),
        "a finished turn is not cancelled again"
    );
    sup.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_running_turn_cancelled_by_its_handle_ends_cancelled_and_the_next_runs() {
    let (sup, ctl) = supervisor_with(config()).await;
    let first = sup.send("ws", "first").await.expect("send");
    let second = sup.send("ws", "second").await.expect("send");
    let running = ctl
        .next_attempt()
        .within("the first attempt")
        .await
        .expect("opened");
    assert!(first.cancel().await.expect("session runs"));
    assert!(!running.text("late"), "the stream was dropped");
    match first.finish().within("the cancelled turn").await {
        Err(TurnError::Cancelled) => {}
        other => panic!("unexpected {other:?}"),
    }
    let next = ctl
        .next_attempt()
        .within("the second attempt")
        .await
        .expect("opened");
    assert_eq!(next.request.message, "second");
    next.text("two");
    next.finish();
    assert_eq!(second.finish().within("second").await.expect("ok").0, "two");
    sup.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_handle_of_a_session_that_is_gone_is_an_error() {
    let (sup, ctl) = supervisor_with(config()).await;
    let session = sup.session("ws").await.expect("session");
    let turn = session.submit("hello").await.expect("submit");
    let canceller = turn.canceller();
    let a = ctl
        .next_attempt()
        .within("the attempt")
        .await
        .expect("opened");
    sup.shutdown().await;
    drop(a);
    assert!(session.cancel().is_err(), "cancel on a stopped incarnation");
    assert!(
        canceller.cancel().await.is_err(),
        "its turns' cancellers too"
    );
}

#[tokio::test(start_paused = true)]
async fn a_turn_moved_to_a_fresh_session_is_still_cancelled_by_its_handle() {
    let store = Arc::new(MemoryStore::new());
    let mut r = SessionRecord::new(&SessionKey::new("ws"), None);
    r.set_agent_session_id("11111111-1111-4111-8111-111111111111");
    store
        .save(&r, warden_core::Durability::Flushed)
        .await
        .expect("seed");
    let (sup, _source, ctl, _notices) = supervisor_with_store(config(), store).await;
    let turn = sup.send("ws", "keep").await.expect("send");
    let resumed = ctl
        .next_attempt()
        .within("the resumed attempt")
        .await
        .expect("opened");
    resumed.fail(StreamError::UnknownSession {
        session_id: "11111111-1111-4111-8111-111111111111".into(),
        message: "No conversation found".into(),
    });
    let fresh = ctl
        .next_attempt()
        .within("the fresh attempt")
        .await
        .expect("opened");
    fresh.send(Frame::Event(AgentEvent::TextDelta("partial".into())));
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert!(
        turn.cancel().await.expect("the fresh session runs it"),
        "the canceller followed the turn"
    );
    match turn.finish().within("the cancelled turn").await {
        Err(TurnError::Cancelled) => {}
        other => panic!("unexpected {other:?}"),
    }
    sup.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_handle_that_cancels_on_drop_stops_its_turn_and_the_next_starts_at_once() {
    let (sup, ctl) = supervisor_with(config()).await;
    let first = sup
        .send("ws", "first")
        .await
        .expect("send")
        .cancel_on_drop();
    let second = sup.send("ws", "second").await.expect("send");
    let running = ctl
        .next_attempt()
        .within("the first attempt")
        .await
        .expect("opened");
    assert_eq!(running.request.message, "first");
    let t0 = tokio::time::Instant::now();
    drop(first);
    let next = ctl
        .next_attempt()
        .within("the second attempt")
        .await
        .expect("opened");
    assert_eq!(next.request.message, "second");
    assert_eq!(
        t0.elapsed(),
        Duration::ZERO,
        "no wait behind the dropped turn"
    );
    assert!(
        !running.text("late"),
        "the dropped turn's stream was closed"
    );
    next.text("two");
    next.finish();
    assert_eq!(second.finish().within("second").await.expect("ok").0, "two");
    sup.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_dropped_handle_leaves_its_turn_running_to_its_end() {
    let (sup, ctl) = supervisor_with(config()).await;
    let first = sup.send("ws", "first").await.expect("send");
    let second = sup.send("ws", "second").await.expect("send");
    let running = ctl
        .next_attempt()
        .within("the first attempt")
        .await
        .expect("opened");
    first.detach();
    // Half an allowance later the first still runs, the second waits.
    assert!(
        tokio::time::timeout(Duration::from_secs(20), ctl.next_attempt())
            .await
            .is_err(),
        "the second turn started before the first ended"
    );
    assert!(
        running.text("still read"),
        "the detached turn's stream is open"
    );
    running.finish();
    let next = ctl
        .next_attempt()
        .within("the second attempt")
        .await
        .expect("opened");
    assert_eq!(next.request.message, "second");
    next.text("two");
    next.finish();
    assert_eq!(second.finish().within("second").await.expect("ok").0, "two");
    sup.shutdown().await;
}
