//! The WorkspaceSupervisor's restart policy, as a matrix.

use std::time::Duration;

use crate::common::*;
use warden_core::{LifecycleEvent, Restart, RestartIntensity, SupervisorError};

fn restarted(e: &LifecycleEvent) -> bool {
    matches!(e, LifecycleEvent::SessionRestarted { .. })
}

#[tokio::test(start_paused = true)]
async fn a_failing_session_is_restarted_and_serves_again() {
    let (sup, ctl) = supervisor_with(config()).await;
    let mut events = sup.subscribe();
    let first = sup.session("ws").await.expect("session");
    first.fail("boom");
    let ev = wait_for(&mut events, restarted).await;
    let LifecycleEvent::SessionRestarted {
        cause,
        restarts_in_window,
        ..
    } = ev
    else {
        unreachable!()
    };
    assert!(cause.contains("boom"), "{cause}");
    assert_eq!(restarts_in_window, 1);
    let second = sup.session("ws").await.expect("session");
    assert_ne!(first.actor().get_id(), second.actor().get_id());
    let turn = second.submit("hi").await.expect("submit");
    let a = ctl
        .next_attempt()
        .within("the next attempt to open")
        .await
        .expect("opened");
    a.text("ok");
    a.finish();
    assert_eq!(
        turn.finish()
            .within("the turn to finish")
            .await
            .expect("ok")
            .0,
        "ok"
    );
    sup.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn exceeding_the_intensity_escalates_with_the_original_cause() {
    let config = config().with_intensity(RestartIntensity::new(2, Duration::from_secs(60)));
    let (sup, _ctl) = supervisor_with(config).await;
    let mut events = sup.subscribe();
    for i in 0..3 {
        let s = sup.session("ws").await.expect("session");
        s.fail(format!("crash {i}"));
        let ev = wait_for(&mut events, |e| {
            restarted(e) || matches!(e, LifecycleEvent::SupervisorEscalated { .. })
        })
        .await;
        match (i, ev) {
            (0 | 1, LifecycleEvent::SessionRestarted { .. }) => {}
            (2, LifecycleEvent::SupervisorEscalated { cause, .. }) => {
                assert!(cause.contains("crash 2"), "{cause}")
            }
            (i, ev) => panic!("step {i}: unexpected {ev:?}"),
        }
    }
    match sup.session("ws").await {
        Err(SupervisorError::SessionFailed { cause, .. }) => assert!(cause.contains("crash 2")),
        other => panic!("unexpected {other:?}"),
    }
    // Other sessions are unaffected, and a reset lets the key start again.
    assert!(sup.session("other").await.is_ok());
    sup.reset("ws").await.expect("reset");
    assert!(sup.session("ws").await.is_ok());
    sup.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn failures_outside_the_window_do_not_add_up() {
    let config = config().with_intensity(RestartIntensity::new(1, Duration::from_secs(10)));
    let (sup, _ctl) = supervisor_with(config).await;
    let mut events = sup.subscribe();
    for _ in 0..3 {
        sup.session("ws").await.expect("session").fail("boom");
        wait_for(&mut events, restarted).await;
        tokio::time::sleep(Duration::from_secs(11)).await;
    }
    sup.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_transient_session_stopping_normally_is_not_restarted() {
    let (sup, _ctl) = supervisor_with(config().with_restart(Restart::Transient)).await;
    let mut events = sup.subscribe();
    let s = sup.session("ws").await.expect("session");
    s.actor().stop(Some("done".into()));
    let ev = wait_for(&mut events, |e| {
        matches!(e, LifecycleEvent::SessionStopped { .. })
    })
    .await;
    assert!(matches!(
        ev,
        LifecycleEvent::SessionStopped {
            abnormal: false,
            ..
        }
    ));
    settle().await;
    assert!(events.try_recv().is_err(), "nothing after the stop");
    assert!(sup.sessions().await.expect("alive").is_empty());
    sup.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_permanent_session_is_restarted_even_after_a_normal_stop() {
    let (sup, _ctl) = supervisor_with(config().with_restart(Restart::Permanent)).await;
    let mut events = sup.subscribe();
    sup.session("ws").await.expect("session").actor().stop(None);
    wait_for(&mut events, restarted).await;
    assert_eq!(sup.sessions().await.expect("alive").len(), 1);
    sup.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_temporary_session_is_never_restarted() {
    let (sup, _ctl) = supervisor_with(config().with_restart(Restart::Temporary)).await;
    let mut events = sup.subscribe();
    sup.session("ws").await.expect("session").fail("boom");
    let ev = wait_for(&mut events, |e| {
        matches!(e, LifecycleEvent::SessionStopped { .. })
    })
    .await;
    assert!(matches!(
        ev,
        LifecycleEvent::SessionStopped { abnormal: true, .. }
    ));
    settle().await;
    assert!(events.try_recv().is_err(), "no restart");
    // On-demand: the next message spawns it afresh.
    assert!(sup.sessions().await.expect("alive").is_empty());
    sup.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_crashed_turn_is_answered_not_lost() {
    let (sup, ctl) = supervisor_with(config()).await;
    let s = sup.session("ws").await.expect("session");
    let turn = s.submit("hi").await.expect("submit");
    let a = ctl
        .next_attempt()
        .within("the next attempt to open")
        .await
        .expect("opened");
    s.fail("boom");
    match turn.finish().within("the turn to finish").await {
        Err(warden_core::TurnError::SessionStopped { .. }) => {}
        other => panic!("unexpected {other:?}"),
    }
    a.dropped().within("the stream to be dropped").await;
    sup.shutdown().await;
}

/// A notifier that panics, to crash the session from inside its handler.
struct PanickingNotifier;

impl warden_core::Notifier for PanickingNotifier {
    fn notify(&self, _key: &warden_core::SessionKey, _notice: warden_core::Notice) {
        panic!("notifier exploded");
    }
}

#[tokio::test(start_paused = true)]
async fn a_session_that_panics_is_restarted_per_policy() {
    use std::sync::Arc;
    use warden_core::{Durability, MemoryStore, SessionKey, SessionRecord, SessionStore};

    // A recovered message is answered through the notifier, which panics
    // inside the session's handler.
    let store = Arc::new(MemoryStore::new());
    let key = SessionKey::new("ws");
    let mut r = SessionRecord::new(&key, None);
    r.pending.push(warden_core::PendingMessage {
        id: 1,
        text: "left over".into(),
        accepted_at_ms: 0,
        model: None,
        idempotency_key: None,
    });
    r.next_message_id = 2;
    store.save(&r, Durability::Flushed).await.expect("save");
    let (source, ctl) = warden_core::testing::ChannelSource::new();
    let factory = move |_: &SessionKey| source.clone() as Arc<dyn warden_core::EventSource>;
    let sup = warden_core::Supervisor::builder(Arc::new(factory))
        .config(config())
        .store(store.clone())
        .notifier(Arc::new(PanickingNotifier))
        .start()
        .await
        .expect("supervisor");
    let mut events = sup.subscribe();
    let first = sup.session("ws").await.expect("session");
    let a = ctl
        .next_attempt()
        .within("the next attempt to open")
        .await
        .expect("recovered message re-delivered");
    assert_eq!(a.request.message, "left over");
    a.finish();
    let ev = wait_for(&mut events, restarted).await;
    let LifecycleEvent::SessionRestarted { cause, .. } = ev else {
        unreachable!()
    };
    assert!(cause.contains("notifier exploded"), "{cause}");
    let second = sup.session("ws").await.expect("restarted session");
    assert_ne!(first.actor().get_id(), second.actor().get_id());
    // The answered message is not pending any more: no crash loop.
    let status = second.status().await.expect("alive");
    assert!(status.record.pending.is_empty());
    assert_eq!(status.record.restart_count, 1);
    sup.shutdown().await;
}

fn escalated(e: &LifecycleEvent) -> bool {
    matches!(e, LifecycleEvent::SupervisorEscalated { .. })
}

/// Fails the session of "ws" and returns what the supervisor did about it.
async fn fail_once(
    sup: &warden_core::Supervisor,
    events: &mut tokio::sync::broadcast::Receiver<LifecycleEvent>,
    cause: String,
) -> LifecycleEvent {
    sup.session("ws").await.expect("session").fail(cause);
    wait_for(events, |e| restarted(e) || escalated(e)).await
}

#[tokio::test(start_paused = true)]
async fn by_default_three_restarts_within_60_s_are_allowed_and_the_fourth_failure_escalates() {
    assert_eq!(
        RestartIntensity::default(),
        RestartIntensity::new(3, Duration::from_secs(60))
    );
    let (sup, _ctl) = supervisor_with(warden_core::SupervisorConfig::default()).await;
    let mut events = sup.subscribe();
    // Four failures 19 s apart: all inside one 60 s window.
    for i in 1..=4u32 {
        match (i, fail_once(&sup, &mut events, format!("crash {i}")).await) {
            (
                1..=3,
                LifecycleEvent::SessionRestarted {
                    restarts_in_window, ..
                },
            ) => assert_eq!(restarts_in_window, i),
            (4, LifecycleEvent::SupervisorEscalated { cause, .. }) => {
                assert!(cause.contains("crash 4"), "{cause}")
            }
            (i, ev) => panic!("failure {i}: unexpected {ev:?}"),
        }
        tokio::time::sleep(Duration::from_secs(19)).await;
    }
    sup.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn by_default_a_failure_60_s_after_the_first_restart_is_restarted_again() {
    let (sup, _ctl) = supervisor_with(warden_core::SupervisorConfig::default()).await;
    let mut events = sup.subscribe();
    let t0 = tokio::time::Instant::now();
    for i in 1..=3u64 {
        tokio::time::sleep_until(t0 + Duration::from_secs(10 * (i - 1))).await;
        let ev = fail_once(&sup, &mut events, format!("crash {i}")).await;
        assert!(restarted(&ev), "{ev:?}");
    }
    // At 60 s the first restart (only) slides out of the window: the
    // others, 50 s and 40 s old, still count.
    tokio::time::sleep_until(t0 + Duration::from_secs(60)).await;
    let ev = fail_once(&sup, &mut events, "crash 4".into()).await;
    assert!(
        matches!(
            ev,
            LifecycleEvent::SessionRestarted {
                restarts_in_window: 3,
                ..
            }
        ),
        "{ev:?}"
    );
    sup.shutdown().await;
}

/// A session given up is `Failed` on disk with its cause, so a restarted
/// orchestrator does not bring it back until `Supervisor::reset`.
#[tokio::test(start_paused = true)]
async fn a_session_given_up_stays_given_up_after_an_orchestrator_restart() {
    use std::sync::Arc;
    use warden_core::{MemoryStore, RecordStatus, SessionKey, SessionStore};
    let store = Arc::new(MemoryStore::new());
    let config = config().with_intensity(RestartIntensity::new(0, Duration::from_secs(60)));
    let (sup, _source, _ctl, _notices) = supervisor_with_store(config.clone(), store.clone()).await;
    let mut events = sup.subscribe();
    match fail_once(&sup, &mut events, "crash 1".into()).await {
        LifecycleEvent::SupervisorEscalated { .. } => {}
        other => panic!("unexpected {other:?}"),
    }
    let record = store
        .load(&SessionKey::new("ws"))
        .await
        .expect("load")
        .expect("record");
    match &record.status {
        RecordStatus::Failed { reason } => assert!(reason.contains("crash 1"), "{reason}"),
        other => panic!("the give-up is not on disk: {other:?}"),
    }
    sup.shutdown().await;

    // The orchestrator restarts on the same store.
    let (sup, _source, _ctl, _notices) = supervisor_with_store(config, store.clone()).await;
    match sup.send("ws", "hello again").await {
        Err(SupervisorError::SessionFailed { cause, .. }) => {
            assert!(cause.contains("crash 1"), "{cause}")
        }
        other => panic!("a given-up session came back: {other:?}"),
    }
    sup.reset("ws").await.expect("reset");
    assert!(sup.session("ws").await.is_ok());
    sup.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn restarts_wait_their_doubling_backoff_and_a_message_meanwhile_starts_the_session_at_once() {
    let intensity = RestartIntensity::new(10, Duration::from_secs(600))
        .with_backoff(Duration::from_secs(1), Duration::from_secs(3));
    let (sup, ctl) = supervisor_with(config().with_intensity(intensity)).await;
    let mut events = sup.subscribe();
    for (i, wait) in [1u64, 2, 3, 3].into_iter().enumerate() {
        let t0 = tokio::time::Instant::now();
        let ev = fail_once(&sup, &mut events, format!("crash {i}")).await;
        assert!(restarted(&ev), "{ev:?}");
        assert_eq!(
            t0.elapsed(),
            Duration::from_secs(wait),
            "restart {} waited its backoff",
            i + 1
        );
    }
    // A crash, then a message before the restart is due: the message
    // starts the session now, and the restart, when due, adds no second one.
    sup.session("ws")
        .await
        .expect("session")
        .fail("crash again");
    tokio::time::sleep(Duration::from_millis(10)).await;
    let t0 = tokio::time::Instant::now();
    let turn = sup.send("ws", "hi").await.expect("send");
    let a = ctl
        .next_attempt()
        .within("the message's attempt")
        .await
        .expect("opened");
    assert_eq!(t0.elapsed(), Duration::ZERO, "the message did not wait");
    let serving = sup.session("ws").await.expect("session").actor().get_id();
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        sup.session("ws").await.expect("session").actor().get_id(),
        serving,
        "the due restart replaced the session serving the message"
    );
    a.text("ok");
    a.finish();
    assert_eq!(turn.finish().within("the turn").await.expect("ok").0, "ok");
    sup.shutdown().await;
}
