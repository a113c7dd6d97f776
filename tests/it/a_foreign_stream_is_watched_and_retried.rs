//! A stream from another client crate, adapted with `source_fn`, gets the
//! watchdog and retries without a hand-written `EventSource`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use futures_util::{StreamExt as _, stream};

use crate::common::*;
use warden_core::prelude::*;
use warden_core::{LifecycleEvent, Supervisor};

/// A supervisor whose every session streams from `source`.
async fn supervisor_over(source: Arc<dyn EventSource>) -> Supervisor {
    Supervisor::start(config(), Arc::new(move |_: &SessionKey| source.clone()))
        .await
        .expect("supervisor")
}

#[tokio::test(start_paused = true)]
async fn a_foreign_stream_that_stalls_is_killed_and_retried() {
    let opens = Arc::new(AtomicU32::new(0));
    let counter = opens.clone();
    // Attempt 1 sends a word and goes silent (a dropped connection);
    // attempt 2 answers.
    let source = Arc::new(source_fn("foreign", move |r: TurnRequest| {
        let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
        async move {
            let head = stream::iter([Ok(AgentEvent::TextDelta(format!("attempt {n}: ")))]);
            let tail = if n == 1 {
                stream::pending().boxed()
            } else {
                stream::iter([
                    Ok(AgentEvent::TextDelta(r.message)),
                    Ok(AgentEvent::TurnComplete {
                        context_window: None,
                        duration: None,
                    }),
                ])
                .boxed()
            };
            Ok(head.chain(tail))
        }
    }));
    let sup = supervisor_over(source).await;
    let mut events = sup.subscribe();
    let turn = sup.send("ws", "hello").await.expect("send");
    let (_, summary) = turn.finish().within("the turn").await.expect("answered");
    assert_eq!(summary.text, "attempt 2: hello");
    assert_eq!(summary.attempts, 2);
    assert_eq!(opens.load(Ordering::SeqCst), 2);
    let killed = wait_for(&mut events, |e| {
        matches!(e, LifecycleEvent::StreamTimedOut { .. })
    })
    .await;
    assert!(
        matches!(killed, LifecycleEvent::StreamTimedOut { silent_for, .. } if silent_for >= T45),
        "{killed:?}"
    );
    sup.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_foreign_stream_ending_without_turn_complete_is_retried_as_truncated() {
    let counter = AtomicU32::new(0);
    let source = Arc::new(source_fn("foreign", move |_: TurnRequest| {
        let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
        async move {
            let mut items = vec![Ok(AgentEvent::TextDelta(format!("attempt {n}")))];
            if n == 2 {
                items.push(Ok(AgentEvent::TurnComplete {
                    context_window: None,
                    duration: None,
                }));
            }
            Ok(stream::iter(items))
        }
    }));
    let sup = supervisor_over(source).await;
    let mut events = sup.subscribe();
    let turn = sup.send("ws", "hello").await.expect("send");
    let (_, summary) = turn.finish().within("the turn").await.expect("answered");
    assert_eq!((summary.text.as_str(), summary.attempts), ("attempt 2", 2));
    let retry = wait_for(&mut events, |e| {
        matches!(e, LifecycleEvent::RetryScheduled { .. })
    })
    .await;
    assert!(
        matches!(
            retry,
            LifecycleEvent::RetryScheduled {
                error_code: "ESTREAM_TRUNCATED",
                ..
            }
        ),
        "{retry:?}"
    );
    sup.shutdown().await;
}
