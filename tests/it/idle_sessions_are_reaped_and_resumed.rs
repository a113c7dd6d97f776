//! Idle reap: never during a turn; the record stays; the next message
//! resumes the stored conversation.

use std::sync::Arc;
use std::time::Duration;

use crate::common::*;
use tokio::time::{Instant, sleep};
use warden_core::{
    AgentEvent, Frame, LifecycleEvent, MemoryStore, RecordStatus, SessionConfig, SessionKey,
    SessionStore,
};

const IDLE: Duration = Duration::from_secs(15 * 60);

#[tokio::test(start_paused = true)]
async fn a_session_is_reaped_after_idling_but_never_during_a_turn() {
    let store = Arc::new(MemoryStore::new());
    let (sup, _src, ctl, _n) = supervisor_with_store(config(), store.clone()).await;
    let mut events = sup.subscribe();
    let turn = sup.send("ws", "long job").await.expect("send");
    let a = ctl
        .next_attempt()
        .within("the next attempt to open")
        .await
        .expect("attempt");
    a.send(Frame::Event(AgentEvent::SessionStarted {
        session_id: "id-1".into(),
        model: None,
    }));
    // A 20-minute turn (longer than the idle timeout), kept alive by pings.
    for _ in 0..120 {
        sleep(Duration::from_secs(10)).await;
        assert!(a.ping());
    }
    assert_eq!(
        sup.sessions().await.expect("alive").len(),
        1,
        "reaped during a turn"
    );
    a.finish();
    turn.finish()
        .within("the turn to finish")
        .await
        .expect("ok");
    let finished = Instant::now();

    let ev = wait_for(&mut events, |e| {
        matches!(e, LifecycleEvent::SessionReaped { .. })
    })
    .await;
    let idle = elapsed_since(finished);
    assert!(
        idle >= IDLE && idle <= IDLE + Duration::from_millis(10),
        "{idle:?}"
    );
    assert!(matches!(ev, LifecycleEvent::SessionReaped { idle_for, .. } if idle_for >= IDLE));
    settle().await;
    assert!(sup.sessions().await.expect("alive").is_empty());
    let r = store
        .load(&SessionKey::new("ws"))
        .await
        .expect("load")
        .expect("record kept");
    assert_eq!(r.status, RecordStatus::Idle);
    assert_eq!(r.agent_session_id.as_deref(), Some("id-1"));

    // The next message resumes it.
    let turn = sup.send("ws", "are you there?").await.expect("send");
    let b = ctl
        .next_attempt()
        .within("the next attempt to open")
        .await
        .expect("attempt");
    assert_eq!(b.request.resume_id.as_deref(), Some("id-1"));
    b.finish();
    turn.finish()
        .within("the turn to finish")
        .await
        .expect("ok");
    sup.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn activity_postpones_the_reap_and_zero_disables_it() {
    let (sup, ctl) = supervisor_with(config()).await;
    let mut events = sup.subscribe();
    for _ in 0..3 {
        sleep(IDLE - Duration::from_secs(60)).await;
        let t = sup.send("ws", "ping").await.expect("send");
        ctl.next_attempt()
            .within("the next attempt to open")
            .await
            .expect("attempt")
            .finish();
        t.finish().within("the turn to finish").await.expect("ok");
    }
    while let Ok(ev) = events.try_recv() {
        assert!(
            !matches!(ev, LifecycleEvent::SessionReaped { .. }),
            "{ev:?}"
        );
    }
    sup.shutdown().await;

    let config = config().with_session(SessionConfig::default().with_idle_timeout(Duration::ZERO));
    let (sup, _ctl) = supervisor_with(config).await;
    let mut events = sup.subscribe();
    sup.session("ws").await.expect("session");
    sleep(Duration::from_secs(24 * 3600)).await;
    assert_eq!(sup.sessions().await.expect("alive").len(), 1);
    while let Ok(ev) = events.try_recv() {
        assert!(
            !matches!(ev, LifecycleEvent::SessionReaped { .. }),
            "{ev:?}"
        );
    }
    sup.shutdown().await;
}
