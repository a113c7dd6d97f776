//! A reply that breaks mid-text is continued by a source that can: the
//! consumer keeps what it has and receives the rest, one reply with nothing
//! repeated and nothing missing. Anything else (nothing shown yet, a
//! thinking block, a source that cannot continue, a continuation that
//! starts over) restarts from scratch with the discard notice.

use std::sync::Arc;

use crate::common::*;
use warden_core::testing::{ChannelSource, ChannelSourceControl};
use warden_core::{
    AgentEvent, EventSource, Frame, LifecycleEvent, SessionKey, StreamError, Supervisor, TurnHandle,
};

async fn supervisor(continues: bool) -> (Supervisor, ChannelSourceControl) {
    let (source, ctl) = ChannelSource::new();
    source.set_continues(continues);
    let sup = Supervisor::start(
        config(),
        Arc::new(move |_: &SessionKey| source.clone() as Arc<dyn EventSource>),
    )
    .await
    .expect("supervisor");
    (sup, ctl)
}

/// The consumer's text, its notices and the answer's text.
async fn consumed(turn: TurnHandle) -> (String, Vec<&'static str>, String) {
    let c = consume(turn).within("the turn's events").await;
    let text = c.text().to_owned();
    (c.shown, c.notices, text)
}

#[tokio::test(start_paused = true)]
async fn a_reply_killed_mid_text_is_continued_into_one_whole_reply() {
    let (sup, ctl) = supervisor(true).await;
    let mut events = sup.subscribe();
    let turn = sup.send("ws", "greet").await.expect("send");
    let consumer = tokio::spawn(consumed(turn));
    let first = ctl
        .next_attempt()
        .within("the first attempt")
        .await
        .expect("opened");
    assert_eq!(first.request.continuation, None);
    first.text("Hello, wor");
    // Silence: the watchdog kills it.
    let second = ctl
        .next_attempt()
        .within("the continuation")
        .await
        .expect("opened");
    let c = second.request.continuation.clone().expect("a continuation");
    assert_eq!(
        (c.partial_text.as_str(), c.broken_attempt),
        ("Hello, wor", 1)
    );
    second.text("ld!");
    second.finish();
    let (shown, notices, text) = consumer.await.expect("consumer");
    assert_eq!(shown, "Hello, world!");
    assert_eq!(text, "Hello, world!");
    assert_eq!(notices, ["continuing"]);
    let ev = wait_for(&mut events, |e| {
        matches!(e, LifecycleEvent::ContinueScheduled { .. })
    })
    .await;
    assert!(
        matches!(
            ev,
            LifecycleEvent::ContinueScheduled {
                kept_bytes: 10,
                error_code: "ESTREAM_TIMEOUT",
                ..
            }
        ),
        "{ev:?}"
    );
    sup.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_continuation_broken_before_its_first_byte_continues_again() {
    let (sup, ctl) = supervisor(true).await;
    let turn = sup.send("ws", "greet").await.expect("send");
    let consumer = tokio::spawn(consumed(turn));
    let first = ctl
        .next_attempt()
        .within("the first attempt")
        .await
        .expect("opened");
    first.text("Hello, ");
    let second = ctl
        .next_attempt()
        .within("a continuation")
        .await
        .expect("opened");
    second.fail(StreamError::Connection {
        message: "reset".into(),
    });
    let third = ctl
        .next_attempt()
        .within("another continuation")
        .await
        .expect("opened");
    let c = third
        .request
        .continuation
        .clone()
        .expect("still a continuation");
    assert_eq!(c.partial_text, "Hello, ");
    third.text("world!");
    third.finish();
    let (shown, notices, text) = consumer.await.expect("consumer");
    assert_eq!(
        (shown.as_str(), text.as_str()),
        ("Hello, world!", "Hello, world!")
    );
    assert_eq!(notices, ["continuing", "continuing"]);
    sup.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_break_mid_thinking_restarts_from_scratch() {
    let (sup, ctl) = supervisor(true).await;
    let turn = sup.send("ws", "think").await.expect("send");
    let consumer = tokio::spawn(consumed(turn));
    let first = ctl
        .next_attempt()
        .within("the first attempt")
        .await
        .expect("opened");
    first.send(Frame::Event(AgentEvent::ThinkingDelta("Let me see".into())));
    let second = ctl
        .next_attempt()
        .within("the restart")
        .await
        .expect("opened");
    assert_eq!(
        second.request.continuation, None,
        "thinking cannot be continued"
    );
    second.text("Done.");
    second.finish();
    let (shown, notices, text) = consumer.await.expect("consumer");
    assert_eq!((shown.as_str(), text.as_str()), ("Done.", "Done."));
    assert_eq!(notices, ["retrying"]);
    sup.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_source_that_cannot_continue_replays_as_before() {
    let (sup, ctl) = supervisor(false).await;
    let turn = sup.send("ws", "greet").await.expect("send");
    let consumer = tokio::spawn(consumed(turn));
    let first = ctl
        .next_attempt()
        .within("the first attempt")
        .await
        .expect("opened");
    first.text("Hello, wor");
    let second = ctl
        .next_attempt()
        .within("the restart")
        .await
        .expect("opened");
    assert_eq!(second.request.continuation, None);
    second.text("Hello, world!");
    second.finish();
    let (shown, notices, text) = consumer.await.expect("consumer");
    assert_eq!(
        (shown.as_str(), text.as_str()),
        ("Hello, world!", "Hello, world!")
    );
    assert_eq!(notices, ["retrying"]);
    sup.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_continuation_that_starts_over_restarts_the_turn_with_the_discard_notice() {
    let (sup, ctl) = supervisor(true).await;
    let turn = sup.send("ws", "tell").await.expect("send");
    let consumer = tokio::spawn(consumed(turn));
    let first = ctl
        .next_attempt()
        .within("the first attempt")
        .await
        .expect("opened");
    first.text("Once upon a time");
    let second = ctl
        .next_attempt()
        .within("the continuation")
        .await
        .expect("opened");
    assert!(second.request.continuation.is_some());
    second.fail(StreamError::ContinuationFailed {
        message: "the continuation starts the reply over".into(),
    });
    let third = ctl
        .next_attempt()
        .within("the restart")
        .await
        .expect("opened");
    assert_eq!(third.request.continuation, None);
    third.text("Once upon a time, the end.");
    third.finish();
    let (shown, notices, text) = consumer.await.expect("consumer");
    assert_eq!(shown, "Once upon a time, the end.");
    assert_eq!(text, "Once upon a time, the end.");
    assert_eq!(notices, ["continuing", "retrying"]);
    sup.shutdown().await;
}
