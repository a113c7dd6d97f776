//! A message accepted before a restart (or by a node that died) is
//! re-delivered when its session starts again. With a
//! `recovered_turns` channel the whole turn — its events, not only the
//! final answer — reaches whoever relays it (`warden serve` re-attaches
//! its clients to it); without one, or once that channel's receiver is
//! gone, the notifier answers it as before.

use std::sync::Arc;

use crate::common::*;
use warden_core::testing::ChannelSource;
use warden_core::{
    EventSource, MemoryStore, Notice, SessionKey, SessionRecord, SessionStore as _, Supervisor,
};

/// A store holding session `key` with two accepted, unanswered messages.
async fn store_with_pending(key: &SessionKey) -> Arc<MemoryStore> {
    let store = Arc::new(MemoryStore::new());
    let mut record = SessionRecord::new(key, None);
    record.accept("first");
    record.accept("second");
    store
        .save(&record, warden_core::Durability::Flushed)
        .await
        .expect("save");
    store
}

#[tokio::test(start_paused = true)]
async fn recovered_messages_are_handed_over_with_their_events() {
    let key = SessionKey::new("k");
    let store = store_with_pending(&key).await;
    let (source, ctl) = ChannelSource::new();
    let factory = move |_: &SessionKey| source.clone() as Arc<dyn EventSource>;
    let (ntx, mut notices) = tokio::sync::mpsc::unbounded_channel();
    let (rtx, mut recovered) = tokio::sync::mpsc::unbounded_channel();
    let sup = Supervisor::builder(Arc::new(factory))
        .config(config())
        .store(store.clone())
        .notifier(Arc::new(ntx))
        .recovered_turns(rtx)
        .start()
        .await
        .expect("supervisor");

    sup.session(key.clone()).await.expect("session");
    let mut handed = Vec::new();
    for _ in 0..2 {
        let turn = recovered.recv().within("a recovered turn").await;
        handed.push(turn.expect("handed over"));
    }
    assert_eq!(
        handed
            .iter()
            .map(|t| (
                t.key.as_str().to_owned(),
                t.message_id,
                t.handle.canceller().turn()
            ))
            .collect::<Vec<_>>(),
        [("k".to_owned(), 1, 1), ("k".to_owned(), 2, 2)],
        "both pending messages, in order, as turns numbered by their message ids"
    );

    // The first one runs: its relay sees its text as it streams.
    let attempt = ctl.next_attempt().within("the re-delivery").await;
    let attempt = attempt.expect("attempt");
    assert_eq!(attempt.request.message, "first");
    attempt.text("late ");
    attempt.text("answer");
    attempt.finish();
    let second = handed.pop().expect("second");
    let first = handed.pop().expect("first");
    let consumed = consume(first.handle)
        .within("the first turn's events")
        .await;
    assert_eq!(consumed.shown, "late answer");
    assert_eq!(consumed.text(), "late answer");

    let attempt = ctl.next_attempt().within("the second re-delivery").await;
    let attempt = attempt.expect("attempt");
    assert_eq!(attempt.request.message, "second");
    attempt.text("two");
    attempt.finish();
    let consumed = consume(second.handle)
        .within("the second turn's events")
        .await;
    assert_eq!(consumed.text(), "two");

    // Answered through the handles: none is pending, and the notifier was
    // not asked to deliver them a second time.
    let record = store.load(&key).await.expect("load").expect("record");
    assert!(record.pending.is_empty(), "{:?}", record.pending);
    sup.shutdown().await;
    while let Ok((_, notice)) = notices.try_recv() {
        assert!(
            !matches!(notice, Notice::RecoveredReply { .. }),
            "delivered twice: {notice:?}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn without_a_receiver_the_notifier_answers_recovered_messages() {
    let key = SessionKey::new("k");
    let store = store_with_pending(&key).await;
    let (source, ctl) = ChannelSource::new();
    let factory = move |_: &SessionKey| source.clone() as Arc<dyn EventSource>;
    let (ntx, mut notices) = tokio::sync::mpsc::unbounded_channel();
    let (rtx, recovered) = tokio::sync::mpsc::unbounded_channel();
    drop(recovered); // the relay went away
    let sup = Supervisor::builder(Arc::new(factory))
        .config(config())
        .store(store)
        .notifier(Arc::new(ntx))
        .recovered_turns(rtx)
        .start()
        .await
        .expect("supervisor");
    sup.session(key.clone()).await.expect("session");
    for expected in ["one", "two"] {
        let attempt = ctl.next_attempt().within("a re-delivery").await;
        let attempt = attempt.expect("attempt");
        attempt.text(expected);
        attempt.finish();
        let (k, notice) = notices.recv().within("the notice").await.expect("notice");
        assert_eq!(k, key);
        assert!(
            matches!(notice, Notice::RecoveredReply { result: Ok(ref t), .. } if t == expected),
            "{notice:?}"
        );
    }
    sup.shutdown().await;
}

/// A supervisor over `store` whose source continues broken replies or not,
/// relaying recovered turns to the returned receiver.
async fn relayed(
    store: Arc<MemoryStore>,
    continues: bool,
) -> (
    Supervisor,
    warden_core::testing::ChannelSourceControl,
    tokio::sync::mpsc::UnboundedReceiver<warden_core::RecoveredTurn>,
) {
    let (source, ctl) = ChannelSource::new();
    source.set_continues(continues);
    let factory = move |_: &SessionKey| source.clone() as Arc<dyn EventSource>;
    let (rtx, recovered) = tokio::sync::mpsc::unbounded_channel();
    let sup = Supervisor::builder(Arc::new(factory))
        .config(config())
        .store(store)
        .recovered_turns(rtx)
        .start()
        .await
        .expect("supervisor");
    (sup, ctl, recovered)
}

#[tokio::test(start_paused = true)]
async fn an_offered_partial_reply_is_continued_not_started_over() {
    let key = SessionKey::new("k");
    let store = store_with_pending(&key).await;
    let (sup, ctl, mut recovered) = relayed(store, true).await;
    sup.session(key.clone()).await.expect("session");
    let first = recovered.recv().within("a recovered turn").await;
    let first = first.expect("turn");
    // What a node that died had streamed of attempt 2: the callers have it.
    assert!(first.continue_from.accepts());
    let offer = warden_core::Continuation::new("Hello, wor", 2);
    assert!(first.continue_from.offer(offer.clone()), "taken");
    let attempt = ctl.next_attempt().within("the continuation").await;
    let attempt = attempt.expect("attempt");
    assert_eq!(attempt.request.attempt, 3, "the attempts go on");
    assert_eq!(attempt.request.continuation, Some(offer));
    attempt.text("ld!");
    attempt.finish();
    let consumed = consume(first.handle).within("the turn").await;
    assert_eq!(consumed.shown, "ld!", "only what follows the kept text");
    let summary = consumed.result.expect("answered");
    assert_eq!(
        summary.text, "Hello, world!",
        "the answer includes the kept text"
    );
    assert_eq!((summary.attempts, summary.continuations), (3, 1));

    // The second message: no offer (its port dropped) — from scratch, at
    // once.
    let second = recovered.recv().within("the second turn").await;
    let second = second.expect("turn");
    drop(second.continue_from);
    let attempt = ctl.next_attempt().within("the second attempt").await;
    let attempt = attempt.expect("attempt");
    assert_eq!(
        (
            attempt.request.attempt,
            attempt.request.continuation.clone()
        ),
        (1, None)
    );
    attempt.text("two");
    attempt.finish();
    let consumed = consume(second.handle).within("the turn").await;
    assert_eq!(consumed.text(), "two");
    sup.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_source_that_does_not_continue_refuses_the_offer_and_starts_over() {
    let key = SessionKey::new("k");
    let store = store_with_pending(&key).await;
    let (sup, ctl, mut recovered) = relayed(store, false).await;
    sup.session(key.clone()).await.expect("session");
    let first = recovered.recv().within("a recovered turn").await;
    let first = first.expect("turn");
    assert!(!first.continue_from.accepts());
    assert!(
        !first
            .continue_from
            .offer(warden_core::Continuation::new("Hello, wor", 2)),
        "refused: the callers must discard what they had"
    );
    let attempt = ctl.next_attempt().within("the attempt").await;
    let attempt = attempt.expect("attempt");
    assert_eq!(
        (
            attempt.request.attempt,
            attempt.request.continuation.clone()
        ),
        (1, None)
    );
    attempt.text("whole");
    attempt.finish();
    let consumed = consume(first.handle).within("the turn").await;
    assert_eq!(consumed.text(), "whole");
    sup.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_relay_that_never_answers_delays_the_turn_five_seconds_at_most() {
    let key = SessionKey::new("k");
    let store = store_with_pending(&key).await;
    let (sup, ctl, mut recovered) = relayed(store, true).await;
    let t0 = tokio::time::Instant::now();
    sup.session(key.clone()).await.expect("session");
    let first = recovered.recv().within("a recovered turn").await;
    let first = first.expect("turn");
    let port = first.continue_from; // held, never answered
    let attempt = ctl.next_attempt().within("the attempt").await;
    let attempt = attempt.expect("attempt");
    assert_eq!(t0.elapsed(), std::time::Duration::from_secs(5));
    assert_eq!(attempt.request.continuation, None, "from scratch");
    assert!(!port.accepts());
    assert!(
        !port.offer(warden_core::Continuation::new("late", 1)),
        "an offer after the wait is refused"
    );
    drop(attempt);
    sup.shutdown().await;
}
