//! A turn read as its reader shows it: `TurnHandle` is a `Stream` of its
//! events, and `text_stream()` turns them into edits of the reply text —
//! kept across a continuation, dropped for a retry from scratch — that
//! leave exactly the answer's text.

use std::time::Duration;

use crate::common::*;
use futures_util::StreamExt as _;
use warden_core::{StreamError, TextEdit, TurnEvent};

fn broke() -> StreamError {
    StreamError::InactivityTimeout {
        silent_for: Duration::from_secs(45),
        timeout: Duration::from_secs(45),
    }
}

/// Applies `edits` to an empty string: what the reader shows, and the
/// answer's text from the last edit.
async fn shown(mut edits: futures_util::stream::BoxStream<'static, TextEdit>) -> (String, String) {
    let mut shown = String::new();
    while let Some(edit) = edits.next().within("the next edit").await {
        match edit {
            TextEdit::Append(t) => shown.push_str(&t),
            TextEdit::Discard { chars } => {
                let keep = shown.chars().count() - chars;
                shown = shown.chars().take(keep).collect();
            }
            TextEdit::Finished(result) => {
                let summary = result.expect("answered");
                return (shown, summary.text);
            }
            _ => {}
        }
    }
    panic!("the edits ended without Finished");
}

#[tokio::test(start_paused = true)]
async fn a_retried_turns_edits_drop_the_broken_attempt_and_leave_the_answer() {
    let (sup, source, ctl, _) = supervisor_with_store(
        config(),
        std::sync::Arc::new(warden_core::MemoryStore::new()),
    )
    .await;
    source.set_continues(false);
    let turn = sup.send("ws", "hi").await.expect("send");
    let reader = tokio::spawn(shown(turn.text_stream()));
    let first = ctl.next_attempt().within("attempt 1").await.expect("open");
    first.text("a partial answer that ");
    first.fail(broke());
    let second = ctl.next_attempt().within("attempt 2").await.expect("open");
    second.text("The whole answer.");
    second.finish();
    let (shown, answer) = reader.within("the reader").await.expect("reader");
    assert_eq!(answer, "The whole answer.");
    assert_eq!(shown, answer, "what the reader shows is the answer");
}

#[tokio::test(start_paused = true)]
async fn a_continued_turns_edits_keep_what_was_shown() {
    let (sup, source, ctl, _) = supervisor_with_store(
        config(),
        std::sync::Arc::new(warden_core::MemoryStore::new()),
    )
    .await;
    source.set_continues(true);
    let turn = sup.send("ws", "hi").await.expect("send");
    let reader = tokio::spawn(shown(turn.text_stream()));
    let first = ctl.next_attempt().within("attempt 1").await.expect("open");
    first.text("Hello, ");
    first.fail(broke());
    let second = ctl.next_attempt().within("attempt 2").await.expect("open");
    assert!(second.request.continuation.is_some(), "a continuation");
    second.text("world.");
    second.finish();
    let (shown, answer) = reader.within("the reader").await.expect("reader");
    assert_eq!(answer, "Hello, world.");
    assert_eq!(shown, answer);
}

#[tokio::test(start_paused = true)]
async fn a_turn_handle_is_a_stream_of_its_events_ending_after_finished() {
    let (sup, ctl) = supervisor_with(config()).await;
    let mut turn = sup.send("ws", "hi").await.expect("send");
    let a = ctl.next_attempt().within("an attempt").await.expect("open");
    a.text("ok");
    a.finish();
    let mut kinds = Vec::new();
    while let Some(event) = turn.next().within("the next event").await {
        kinds.push(match event {
            TurnEvent::Started(_) => "started",
            TurnEvent::Event(_) => "event",
            TurnEvent::Finished(Ok(_)) => "finished",
            _ => "other",
        });
    }
    assert_eq!(kinds.first(), Some(&"started"));
    assert_eq!(kinds.last(), Some(&"finished"));
    assert!(turn.next().await.is_none(), "nothing after Finished");
}
