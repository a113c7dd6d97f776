//! `SupervisorConfig::max_sessions`: past the bound a new session makes
//! room by stopping the least recently used idle one (its record kept, so
//! it resumes when asked for again); when every live session is busy the
//! new one is refused with a typed error, and admitted once a turn ends.
//! Paused clock.

use std::sync::Arc;

use crate::common::*;
use warden_core::{MemoryStore, RecordStatus, SessionKey, SessionStore, SupervisorError};

#[tokio::test(start_paused = true)]
async fn past_the_bound_an_idle_session_makes_room_and_busy_ones_refuse() {
    let store = Arc::new(MemoryStore::new());
    let (sup, _src, ctl, _n) =
        supervisor_with_store(config().with_max_sessions(2), store.clone()).await;

    // "busy": a turn running (its stream open, not finished).
    let _busy = sup.send("busy", "long job").await.expect("send");
    let a = ctl
        .next_attempt()
        .within("busy's attempt")
        .await
        .expect("attempt");
    // "idle": one turn, answered.
    let turn = sup.send("idle", "hi").await.expect("send");
    let b = ctl
        .next_attempt()
        .within("idle's attempt")
        .await
        .expect("attempt");
    assert!(b.text("hello"));
    b.finish();
    consume(turn).within("idle's turn").await.text();

    // A third session: "idle" is stopped to make room, its record kept.
    let third = sup.send("third", "next").await.expect("room is made");
    let c = ctl
        .next_attempt()
        .within("third's attempt")
        .await
        .expect("attempt");
    let mut live = sup.sessions().await.expect("alive");
    live.sort();
    assert_eq!(
        live,
        vec![SessionKey::new("busy"), SessionKey::new("third")]
    );
    let record = store
        .load(&SessionKey::new("idle"))
        .await
        .expect("load")
        .expect("the evicted session's record is kept");
    assert_eq!(record.status, RecordStatus::Idle);

    // Both live sessions busy: a fourth is refused, typed.
    match sup.send("fourth", "no room").await {
        Err(SupervisorError::TooManySessions { key, limit }) => {
            assert_eq!(key, SessionKey::new("fourth"));
            assert_eq!(limit, 2);
        }
        other => panic!("expected TooManySessions, got {other:?}"),
    }

    // Once a turn ends its session is idle and makes room.
    assert!(c.text("done"));
    c.finish();
    consume(third).within("third's turn").await.text();
    let _fourth = sup.send("fourth", "now").await.expect("room after a turn");
    drop(a);
}
