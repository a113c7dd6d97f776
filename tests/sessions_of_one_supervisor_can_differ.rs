//! One supervisor, sessions with their own settings: the factory returns a
//! `SessionSpec` per key, and every setting it leaves out is the
//! supervisor's.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use warden_core::testing::ChannelSource;
use warden_core::{
    EventSource, LifecycleEvent, Restart, RetryPolicy, SessionConfig, SessionKey, SessionSpec,
    StreamError, Supervisor, TurnError, specs,
};

fn stalled() -> StreamError {
    StreamError::Connection {
        message: "reset by peer".into(),
    }
}

#[tokio::test(start_paused = true)]
async fn a_planner_and_its_workers_retry_and_restart_by_their_own_specs() {
    let (source, ctl) = ChannelSource::new();
    let factory = specs(move |key: &SessionKey| {
        let spec = SessionSpec::new(source.clone() as Arc<dyn EventSource>);
        match key.as_str() {
            // The planner never retries and is never restarted.
            "planner" => spec
                .with_config(SessionConfig::default().with_retry(RetryPolicy::never()))
                .with_restart(Restart::Temporary),
            // Workers take the supervisor's settings.
            _ => spec,
        }
    });
    let sup = Supervisor::start(config(), Arc::new(factory))
        .await
        .expect("supervisor");
    let mut events = sup.subscribe();

    // The planner's failed attempt ends its turn: no retry.
    let planner = sup.send("planner", "plan").await.expect("send");
    ctl.next_attempt()
        .within("the planner's attempt")
        .await
        .expect("opened")
        .fail(stalled());
    match planner.finish().within("the planner's turn").await {
        Err(TurnError::RetriesExhausted { attempts: 1, .. }) => {}
        other => panic!("unexpected {other:?}"),
    }

    // A worker's failed attempt is retried under the supervisor's policy.
    let worker = sup.send("worker-1", "work").await.expect("send");
    ctl.next_attempt()
        .within("the worker's first attempt")
        .await
        .expect("opened")
        .fail(stalled());
    let retry = ctl
        .next_attempt()
        .within("the worker's retry")
        .await
        .expect("opened");
    assert_eq!(retry.request.attempt, 2);
    retry.text("done");
    retry.finish();
    let (_, summary) = worker
        .finish()
        .within("the worker's turn")
        .await
        .expect("ok");
    assert_eq!((summary.text.as_str(), summary.attempts), ("done", 2));

    // A crash: the worker (supervisor's Transient) is restarted, the
    // planner (its own Temporary) is not.
    sup.session("worker-1").await.expect("worker").fail("boom");
    let ev = wait_for(&mut events, |e| {
        matches!(e, LifecycleEvent::SessionRestarted { .. })
    })
    .await;
    assert!(
        matches!(&ev, LifecycleEvent::SessionRestarted { key, .. } if key.as_str() == "worker-1"),
        "{ev:?}"
    );
    sup.session("planner").await.expect("planner").fail("boom");
    let stopped = wait_for(
        &mut events,
        |e| matches!(e, LifecycleEvent::SessionStopped { key, .. } if key.as_str() == "planner"),
    )
    .await;
    assert!(matches!(
        stopped,
        LifecycleEvent::SessionStopped { abnormal: true, .. }
    ));
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(
        sup.sessions().await.expect("sessions"),
        [SessionKey::new("worker-1")],
        "the planner was not restarted"
    );
    sup.shutdown().await;
}
