//! One supervisor, sessions with their own settings: the factory returns a
//! `SessionSpec` per key, and every setting it leaves out is the
//! supervisor's.

use std::sync::Arc;
use std::time::Duration;

use crate::common::*;
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

/// A source whose agent works in its session's workspace, as an agent CLI
/// does (over the channel source).
struct InWorkspace(Arc<ChannelSource>);

impl EventSource for InWorkspace {
    fn open(
        &self,
        request: warden_core::TurnRequest,
    ) -> futures_util::future::BoxFuture<'static, Result<warden_core::EventStream, StreamError>>
    {
        self.0.open(request)
    }

    fn runs_in_workspace(&self) -> bool {
        true
    }
}

/// A session whose agent works in a workspace always has one — from its
/// key (`SessionKey::for_workspace`) or its spec (`with_workspace`) — and
/// is refused without, never run in the orchestrator's own directory; a
/// second, different spec for a running session is refused, not kept
/// unseen.
#[tokio::test(start_paused = true)]
async fn an_agent_that_works_in_a_workspace_gets_one_or_is_refused_and_specs_do_not_change_under_it()
 {
    let dir = tempfile::tempdir().expect("tempdir");
    let (channel, ctl) = ChannelSource::new();
    let source: Arc<dyn EventSource> = Arc::new(InWorkspace(channel));
    let plain = source.clone();
    let factory_source = source.clone();
    let sup = Supervisor::start(
        config(),
        Arc::new(move |_: &SessionKey| factory_source.clone()),
    )
    .await
    .expect("supervisor");

    // A plain name and no workspace anywhere: refused, nothing opened.
    let spec = SessionSpec::new(plain.clone());
    match sup
        .send_with_spec("planner", spec, "plan", Default::default())
        .await
    {
        Err(warden_core::SupervisorError::NoWorkspace { key }) => {
            assert_eq!(key.as_str(), "planner")
        }
        other => panic!("unexpected {other:?}"),
    }

    // The spec names it: the agent runs there (normalized).
    let repo = dir.path().join("repo");
    std::fs::create_dir_all(&repo).expect("mkdir");
    let spec = SessionSpec::new(plain.clone()).with_workspace(dir.path().join("repo/."));
    let turn = sup
        .send_with_spec("planner", spec.clone(), "plan", Default::default())
        .await
        .expect("send");
    let a = ctl
        .next_attempt()
        .within("the planner's attempt")
        .await
        .expect("opened");
    let expected = std::fs::canonicalize(&repo).expect("canonical");
    assert_eq!(a.request.workspace.as_deref(), Some(expected.as_path()));
    // The same spec again is fine; another one while it runs is refused.
    let again = sup
        .send_with_spec("planner", spec, "more", Default::default())
        .await
        .expect("the same spec");
    let other = SessionSpec::new(plain.clone()).with_restart(Restart::Temporary);
    match sup
        .send_with_spec("planner", other, "x", Default::default())
        .await
    {
        Err(warden_core::SupervisorError::SpecConflict { key }) => {
            assert_eq!(key.as_str(), "planner")
        }
        other => panic!("unexpected {other:?}"),
    }
    a.text("planned");
    a.finish();
    turn.finish()
        .within("the planner's turn")
        .await
        .expect("ok");
    let b = ctl
        .next_attempt()
        .within("the second turn")
        .await
        .expect("opened");
    b.finish();
    again.finish().within("the second turn").await.expect("ok");

    // A key made from the workspace is the workspace, spec or none.
    let key = SessionKey::for_workspace(&repo).expect("key");
    let turn = sup
        .send_with_spec(
            key.clone(),
            SessionSpec::new(plain.clone()),
            "work",
            Default::default(),
        )
        .await
        .expect("send");
    let c = ctl
        .next_attempt()
        .within("the worker's attempt")
        .await
        .expect("opened");
    assert_eq!(c.request.workspace.as_deref(), Some(expected.as_path()));
    c.finish();
    turn.finish().within("the worker's turn").await.expect("ok");
    sup.shutdown().await;
}
