//! Operators find turns that run too long (a stream that keeps sending
//! keep-alives but never finishes is alive to the watchdog) and recover
//! them: a retry of the turn, or a fresh conversation.

use std::time::Duration;

use crate::common::*;
use warden_core::{AgentEvent, Frame, LifecycleEvent, ResumeCause, Unstick};

/// Keeps `attempt` alive with a ping every 10 s for `total`.
async fn ping_for(attempt: &warden_core::testing::AttemptControl, total: Duration) {
    let step = Duration::from_secs(10);
    let mut t = Duration::ZERO;
    while t < total {
        tokio::time::sleep(step).await;
        assert!(attempt.ping(), "the stream is still open");
        t += step;
    }
}

#[tokio::test(start_paused = true)]
async fn a_turn_alive_but_never_finishing_is_listed_and_retried() {
    let (sup, ctl) = supervisor_with(config()).await;
    let mut events = sup.subscribe();
    let stuck_turn = sup.send("stuck", "hello").await.expect("send");
    let first = ctl
        .next_attempt()
        .within("the first attempt")
        .await
        .expect("opened");
    let healthy = sup.send("healthy", "hi").await.expect("send");
    let other = ctl
        .next_attempt()
        .within("the other attempt")
        .await
        .expect("opened");
    other.text("fine");
    other.finish();
    healthy
        .finish()
        .within("the healthy turn")
        .await
        .expect("answered");

    ping_for(&first, Duration::from_secs(600)).await;
    let stuck = sup.stuck(Duration::from_secs(300)).await.expect("statuses");
    assert_eq!(
        stuck.len(),
        1,
        "only the turn running for 10 min: {stuck:?}"
    );
    assert_eq!(stuck[0].key.as_str(), "stuck");
    assert!(stuck[0].turn_running_for >= Some(Duration::from_secs(600)));
    assert!(
        sup.stuck(Duration::from_secs(900))
            .await
            .expect("statuses")
            .is_empty()
    );

    assert!(sup.recover("stuck", Unstick::Retry).await.expect("recover"));
    first.dropped().within("the stuck stream is stopped").await;
    let retry = wait_for(&mut events, |e| {
        matches!(e, LifecycleEvent::RetryScheduled { .. })
    })
    .await;
    assert!(
        matches!(
            retry,
            LifecycleEvent::RetryScheduled {
                error_code: "ESTREAM_INTERRUPTED",
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
    assert_eq!(second.request.attempt, 2);
    second.text("done");
    second.finish();
    let (_, summary) = stuck_turn
        .finish()
        .within("the recovered turn")
        .await
        .expect("answered");
    assert_eq!((summary.text.as_str(), summary.attempts), ("done", 2));
    assert!(
        sup.stuck(Duration::ZERO)
            .await
            .expect("statuses")
            .is_empty()
    );
    assert!(
        !sup.recover("stuck", Unstick::Retry).await.expect("recover"),
        "nothing runs: nothing to recover"
    );
    assert!(
        !sup.recover("nobody", Unstick::Retry)
            .await
            .expect("recover"),
        "no such session"
    );
    sup.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_fresh_recovery_drops_the_conversation_and_keeps_the_message() {
    let (sup, ctl) = supervisor_with(config()).await;
    let mut events = sup.subscribe();
    let turn = sup.send("ws", "hello").await.expect("send");
    let first = ctl
        .next_attempt()
        .within("the first attempt")
        .await
        .expect("opened");
    first.send(Frame::Event(AgentEvent::SessionStarted {
        session_id: "conv-1".into(),
        model: None,
    }));
    ping_for(&first, Duration::from_secs(60)).await;

    assert!(sup.recover("ws", Unstick::Fresh).await.expect("recover"));
    let failed = wait_for(&mut events, |e| {
        matches!(e, LifecycleEvent::ResumeFailed { .. })
    })
    .await;
    assert!(
        matches!(&failed, LifecycleEvent::ResumeFailed { failed_id, cause: ResumeCause::OperatorReset, .. } if failed_id == "conv-1"),
        "{failed:?}"
    );
    first.dropped().within("the stuck stream is stopped").await;
    let fresh = ctl
        .next_attempt()
        .within("the fresh attempt")
        .await
        .expect("opened");
    assert_eq!(
        fresh.request.resume_id, None,
        "the conversation was dropped"
    );
    assert_eq!(fresh.request.message, "hello", "the message was kept");
    fresh.text("again");
    fresh.finish();
    let (_, summary) = turn.finish().within("the turn").await.expect("answered");
    assert_eq!(summary.text, "again");
    sup.shutdown().await;
}
