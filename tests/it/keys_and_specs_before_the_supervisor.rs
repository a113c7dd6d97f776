//! What an orchestrator knows before its supervisor runs: the key of a
//! workspace (`SessionKey::for_workspace`, the same the supervisor gives),
//! and which kind of session a key is, chosen with its first send
//! (`send_with_spec`) rather than by matching key strings in a factory —
//! kept for its restarts.

use std::sync::Arc;

use crate::common::*;
use warden_core::testing::ChannelSource;
use warden_core::{EventSource, SendOptions, SessionKey, SessionSpec, Supervisor};

/// A supervisor whose factory gives every session the `default` source.
async fn supervisor_over_default() -> (Supervisor, warden_core::testing::ChannelSourceControl) {
    let (source, ctl) = ChannelSource::new();
    let sup = Supervisor::builder(Arc::new(move |_: &SessionKey| {
        source.clone() as Arc<dyn EventSource>
    }))
    .config(config())
    .start()
    .await
    .expect("supervisor");
    (sup, ctl)
}

#[tokio::test(start_paused = true)]
async fn a_spec_given_with_the_first_send_makes_the_session_and_its_restarts() {
    let (sup, default_ctl) = supervisor_over_default().await;
    let (planner_source, planner_ctl) = ChannelSource::new();
    let spec = SessionSpec::new(planner_source as Arc<dyn EventSource>);

    let turn = sup
        .send_with_spec("planner", spec, "plan", SendOptions::default())
        .await
        .expect("send");
    let a = planner_ctl
        .next_attempt()
        .within("the planner's source to be asked")
        .await
        .expect("open");
    a.text("a plan");
    a.finish();
    turn.finish().within("the plan").await.expect("answered");

    // A crash: the supervisor restarts it from the same spec.
    let mut events = sup.subscribe();
    sup.session("planner").await.expect("running").fail("boom");
    wait_for(&mut events, |e| {
        matches!(e, warden_core::LifecycleEvent::SessionRestarted { .. })
    })
    .await;
    let again = sup.send("planner", "again").await.expect("send");
    let b = planner_ctl
        .next_attempt()
        .within("the restarted planner's source to be asked")
        .await
        .expect("open");
    b.text("still the planner");
    b.finish();
    again.finish().within("the answer").await.expect("answered");

    // A key sent without a spec gets the factory's.
    let worker = sup.send("worker", "work").await.expect("send");
    let w = default_ctl
        .next_attempt()
        .within("the factory's source to be asked")
        .await
        .expect("open");
    w.finish();
    worker
        .finish()
        .within("the worker")
        .await
        .expect("answered");
    sup.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_workspaces_key_is_known_before_the_supervisor_starts() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir(dir.path().join("repo")).expect("mkdir");
    let spelled = dir.path().join("repo/./sub/../");
    let key = SessionKey::for_workspace(&spelled).expect("key");

    let (sup, ctl) = supervisor_over_default().await;
    assert_eq!(sup.key_for(dir.path().join("repo")).expect("key"), key);
    let turn = sup.send_to_workspace(&spelled, "hi").await.expect("send");
    ctl.next_attempt()
        .within("an attempt")
        .await
        .expect("open")
        .finish();
    turn.finish().within("the answer").await.expect("answered");
    assert_eq!(sup.sessions().await.expect("list"), [key]);
    sup.shutdown().await;
}
