//! After completion, error, cancel and watchdog kill, a stream leaves
//! nothing behind: no watchdog entry, no task, no open source.

mod common;

use common::*;
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
    let attempt = match turn.recv().await.expect("started") {
        TurnEvent::Started(a) => a,
        other => panic!("unexpected {other:?}"),
    };
    let a = ctl.next_attempt().await.expect("opened");
    assert_eq!(attempt.attempt, a.request.attempt);
    a.text("x");
    settle().await;
    let during = sup.watchdog().stats().await.expect("alive");
    assert_eq!(
        during.watched, 1,
        "{end:?}: stream is watched while it runs"
    );
    assert!(
        tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks()
            > baseline,
        "the stream's actor and reader are running"
    );

    match end {
        End::Complete => a.finish(),
        End::Error => {
            a.fail(StreamError::Connection {
                message: "reset".into(),
            });
        }
        End::Cancel => session.cancel(),
        End::Kill => {} // silence: the watchdog kills it at 45 s
    }
    let result = turn.finish().await;
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
    let s1 = ctl.next_attempt().await.expect("opened");
    let s2 = ctl.next_attempt().await.expect("opened");
    sup.shutdown().await;
    for t in [turn, queued, other] {
        match t.finish().await {
            Err(warden_core::TurnError::SessionStopped { .. }) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(s1.is_dropped() && s2.is_dropped());
    assert_tasks_return_to(baseline).await;
}
