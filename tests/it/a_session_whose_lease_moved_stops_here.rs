//! When a session's record is no longer this process's to write — a
//! cluster store refuses the write with `StoreError::LeaseLost`, or the
//! node learns it lost the lease and calls `Supervisor::evict` — the
//! session stops at once (its stream dropped) and is not restarted here;
//! its pending messages stay in the store for the new owner.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::*;
use futures_util::future::BoxFuture;
use warden_core::{
    Durability, LifecycleEvent, MemoryStore, SessionKey, SessionRecord, SessionStore, StoreError,
    SupervisorError, TurnEvent,
};

/// A memory store that refuses writes of the keys it is told are gone.
#[derive(Clone, Default)]
struct FencedStore {
    inner: MemoryStore,
    lost: Arc<Mutex<HashSet<String>>>,
}

impl FencedStore {
    fn lose(&self, key: &str) {
        self.lost.lock().expect("lock").insert(key.to_owned());
    }
}

impl SessionStore for FencedStore {
    fn load(&self, key: &SessionKey) -> BoxFuture<'_, Result<Option<SessionRecord>, StoreError>> {
        self.inner.load(key)
    }

    fn save<'a>(
        &'a self,
        record: &'a SessionRecord,
        durability: Durability,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        if self.lost.lock().expect("lock").contains(&record.key) {
            return Box::pin(async move {
                Err(StoreError::LeaseLost {
                    key: record.key.clone(),
                    epoch: 1,
                })
            });
        }
        self.inner.save(record, durability)
    }

    fn list(&self) -> BoxFuture<'_, Result<Vec<Result<SessionRecord, StoreError>>, StoreError>> {
        self.inner.list()
    }
}

#[tokio::test(start_paused = true)]
async fn a_fenced_write_stops_the_session_and_it_is_not_restarted() {
    let store = FencedStore::default();
    let (sup, _source, control, _notices) =
        supervisor_with_store(config(), Arc::new(store.clone())).await;
    let mut events = sup.subscribe();
    let mut turn = sup.send("ws", "hello").await.expect("send");
    let attempt = bounded(LIMIT, "the attempt", control.next_attempt())
        .await
        .expect("an attempt");
    // Another node takes the session over; the next write here is refused.
    store.lose("ws");
    attempt.text("partial");
    attempt.finish();
    let ended = bounded(LIMIT, "the turn's end", async {
        while let Some(ev) = turn.recv().await {
            if let TurnEvent::Finished(r) = ev {
                return Some(r);
            }
        }
        None
    })
    .await;
    assert!(
        !matches!(ended, Some(Ok(_))),
        "the turn cannot be answered here: {ended:?}"
    );
    settle().await;
    assert!(
        sup.running("ws").await.expect("running").is_none(),
        "stopped"
    );
    tokio::time::advance(Duration::from_secs(60)).await;
    settle().await;
    assert!(
        sup.running("ws").await.expect("running").is_none(),
        "and not restarted"
    );
    // Stopped as evicted: no restart, no escalation.
    let mut seen = Vec::new();
    while let Ok(ev) = events.try_recv() {
        seen.push(ev);
    }
    assert!(
        seen.iter().any(|e| matches!(e, LifecycleEvent::SessionStopped { reason: Some(r), .. } if r.contains("another node"))),
        "{seen:?}"
    );
    assert!(
        !seen.iter().any(|e| matches!(
            e,
            LifecycleEvent::SessionRestarted { .. } | LifecycleEvent::SupervisorEscalated { .. }
        )),
        "{seen:?}"
    );
    // The message is still pending in the store, for the owner.
    let record = store
        .inner
        .load(&SessionKey::new("ws"))
        .await
        .expect("load")
        .expect("record");
    assert_eq!(record.pending.len(), 1);
    // A new message for it here gets the store's typed answer.
    let refused = sup.send("ws", "again").await;
    assert!(
        matches!(
            refused,
            Err(SupervisorError::Store {
                error: StoreError::LeaseLost { .. },
                ..
            })
        ),
        "{refused:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn evict_stops_a_running_stream_at_once_and_keeps_the_message_pending() {
    let store = FencedStore::default();
    let (sup, _source, control, _notices) =
        supervisor_with_store(config(), Arc::new(store.clone())).await;
    let _turn = sup.send("ws", "hello").await.expect("send");
    let attempt = bounded(LIMIT, "the attempt", control.next_attempt())
        .await
        .expect("an attempt");
    attempt.text("streaming");
    assert!(sup.evict("ws").await.expect("evict"), "it was running");
    bounded(
        Duration::from_secs(5),
        "the stream dropped",
        attempt.dropped(),
    )
    .await;
    settle().await;
    tokio::time::advance(Duration::from_secs(60)).await;
    settle().await;
    assert!(sup.running("ws").await.expect("running").is_none());
    assert!(
        !sup.evict("ws").await.expect("evict"),
        "nothing left to evict"
    );
    let record = store
        .inner
        .load(&SessionKey::new("ws"))
        .await
        .expect("load")
        .expect("record");
    assert_eq!(record.pending.len(), 1, "the owner re-delivers it");
}

/// A write refused in the middle of a stream (the agent's session id is
/// recorded, flushed, as soon as it arrives) fails the session actor, and
/// ractor runs no `post_stop` for a failing actor: the stream must still be
/// dropped at once — or this node would go on streaming (and paying for) a
/// session another node now runs, until the watchdog's timeout.
#[tokio::test(start_paused = true)]
async fn a_write_refused_mid_stream_drops_the_stream_at_once() {
    let store = FencedStore::default();
    let (sup, _source, control, _notices) =
        supervisor_with_store(config(), Arc::new(store.clone())).await;
    let _turn = sup.send("ws", "hello").await.expect("send");
    let attempt = bounded(LIMIT, "the attempt", control.next_attempt())
        .await
        .expect("an attempt");
    store.lose("ws");
    attempt.send(warden_core::Frame::Event(
        warden_core::AgentEvent::SessionStarted {
            session_id: "conv-1".into(),
            model: None,
        },
    ));
    // Well inside the watchdog's timeout: not the watchdog's doing.
    bounded(
        Duration::from_secs(1),
        "the stream dropped by the failing session",
        attempt.dropped(),
    )
    .await;
    settle().await;
    assert!(sup.running("ws").await.expect("running").is_none());
}
