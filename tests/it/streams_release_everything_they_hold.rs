//! After completion, error, cancel and watchdog kill, a stream leaves
//! nothing behind: no watchdog entry, no task, no open source.

use crate::common::*;
use warden_core::{StreamError, TurnEvent};

#[derive(Debug, Clone, Copy)]
enum End {
    Complete,
    Error,
    Cancel,
    Kill,
}

async fn run(end: End) {
    let (sup, ctl) = supervisor_with(config().with_session(
        warden_core::SessionConfig::default().with_retry(warden_core::RetryPolicy::never()),
    ))
    .await;
    let session = sup.session("ws").await.expect("session");
    settle().await;
    let baseline = tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks();

    let mut turn = session.submit("hi").await.expect("submit");
    let attempt = match turn.recv().within("the next event").await.expect("started") {
        TurnEvent::Started(a) => a,
        other => panic!("unexpected {other:?}"),
    };
    let a = ctl
        .next_attempt()
        .within("the next attempt to open")
        .await
        .expect("opened");
    assert_eq!(attempt.attempt, a.request.attempt);
    a.text("x");
    settle().await;
    let during = sup.watchdog().stats().await.expect("alive");
    assert_eq!(
        during.watched, 1,
        "{end:?}: stream is watched while it runs"
    );
    let status = session.status().await.expect("status");
    assert_eq!(status.streaming, Some(attempt), "{end:?}: the stream runs");

    match end {
        End::Complete => a.finish(),
        End::Error => {
            a.fail(StreamError::Connection {
                message: "reset".into(),
            });
        }
        End::Cancel => session.cancel().expect("the session runs"),
        End::Kill => {} // silence: the watchdog kills it at 45 s
    }
    let result = turn.finish().within("the turn to finish").await;
    match end {
        End::Complete => assert!(result.is_ok(), "{result:?}"),
        _ => assert!(result.is_err(), "{end:?}: {result:?}"),
    }
    assert!(a.is_dropped(), "{end:?}: source must be dropped");
    let stats = sup.watchdog().stats().await.expect("alive");
    assert_eq!(stats.watched, 0, "{end:?}: watchdog still holds the stream");
    assert_eq!(stats.kills, u64::from(matches!(end, End::Kill)), "{end:?}");
    assert_tasks_return_to(baseline).await;
    sup.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn completion_releases_everything() {
    run(End::Complete).await;
}

#[tokio::test(start_paused = true)]
async fn an_error_releases_everything() {
    run(End::Error).await;
}

#[tokio::test(start_paused = true)]
async fn a_cancel_releases_everything() {
    run(End::Cancel).await;
}

#[tokio::test(start_paused = true)]
async fn a_watchdog_kill_releases_everything() {
    run(End::Kill).await;
}

#[tokio::test(start_paused = true)]
async fn shutdown_stops_running_turns_and_leaves_no_task() {
    let baseline = tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks();
    let (sup, ctl) = supervisor_with(config()).await;
    let turn = sup.send("a", "hi").await.expect("send");
    let queued = sup.send("a", "later").await.expect("send");
    let other = sup.send("b", "hi").await.expect("send");
    let s1 = ctl
        .next_attempt()
        .within("the next attempt to open")
        .await
        .expect("opened");
    let s2 = ctl
        .next_attempt()
        .within("the next attempt to open")
        .await
        .expect("opened");
    sup.shutdown().await;
    for t in [turn, queued, other] {
        match t.finish().within("the turn to finish").await {
            Err(warden_core::TurnError::SessionStopped { .. }) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(s1.is_dropped() && s2.is_dropped());
    assert_tasks_return_to(baseline).await;
}

/// A source whose stream panics on its second poll.
struct PanickingSource;

impl warden_core::EventSource for PanickingSource {
    fn open(
        &self,
        _request: warden_core::TurnRequest,
    ) -> futures_util::future::BoxFuture<'static, Result<warden_core::EventStream, StreamError>>
    {
        use futures_util::StreamExt;
        Box::pin(async {
            let frames = futures_util::stream::iter(0..2).map(|i| {
                assert!(i == 0, "boom in the source");
                Ok(warden_core::Frame::KeepAlive)
            });
            Ok(Box::pin(frames) as warden_core::EventStream)
        })
    }
}

#[tokio::test(start_paused = true)]
async fn a_panicking_source_fails_the_turn_and_releases_everything() {
    let factory = |_: &warden_core::SessionKey| {
        std::sync::Arc::new(PanickingSource) as std::sync::Arc<dyn warden_core::EventSource>
    };
    let sup = warden_core::Supervisor::builder(std::sync::Arc::new(factory))
        .config(config().with_session(
            warden_core::SessionConfig::default().with_retry(warden_core::RetryPolicy::never()),
        ))
        .start()
        .await
        .expect("supervisor");
    let session = sup.session("ws").await.expect("session");
    let result = session
        .submit("hi")
        .await
        .expect("submit")
        .finish()
        .within("the turn to finish")
        .await;
    match result {
        Err(warden_core::TurnError::Fatal(StreamError::Internal { message })) => {
            // The payload may quote stream text: never in the error.
            assert!(message.contains("panicked"), "{message}");
            assert!(!message.contains("boom in the source"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(sup.watchdog().stats().await.expect("alive").watched, 0);
    // The session survived its stream's panic and takes the next message.
    let again = session
        .submit("again")
        .await
        .expect("submit")
        .finish()
        .within("the turn to finish")
        .await;
    assert!(again.is_err());
    sup.shutdown().await;
}
