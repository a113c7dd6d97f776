//! Load spreads by handing idle sessions over, never a busy one: the move
//! is one statement that refuses a session with a message waiting or a
//! turn whose end is not stored, and a taker that is not alive; the taker
//! adopts what it was handed, and the giver's late write is fenced out. A
//! busy session moves at its turn boundary: marked, its new turns wait
//! while its turn in flight ends, then it moves as an idle one and they go
//! on.
//! Against a real PostgreSQL (`WARDEN_PG_URL`; skipped with a message
//! without it, failed under `WARDEN_REQUIRE_POSTGRES=1`).

use std::time::Duration;

use warden_core::{Durability, SessionKey, SessionRecord, SessionStore, StoreError};
use warden_pg::low_level::NodeStore;

use crate::common::{fresh_db, store, within};

const TTL: Duration = Duration::from_secs(5);

#[tokio::test]
async fn an_idle_session_is_handed_over_and_adopted_a_busy_one_never() {
    let Some(config) = fresh_db().await else {
        return;
    };
    let pg = store(&config).await;
    for node in ["a", "b"] {
        pg.register_node_with_ttl(node, "", TTL)
            .await
            .expect("register");
    }
    pg.register_node_with_ttl("gone", "", TTL)
        .await
        .expect("register");
    let a = NodeStore::new(pg.clone(), "a", TTL);
    let b = NodeStore::new(pg.clone(), "b", TTL);
    // Three sessions of a's: idle, a message waiting, a turn open.
    let (idle, waiting, open) = (
        SessionKey::new("idle"),
        SessionKey::new("waiting"),
        SessionKey::new("open"),
    );
    for key in [&idle, &waiting, &open] {
        let mut record = SessionRecord::new(key, None);
        if key == &waiting {
            record.accept("still running");
        }
        within("save", a.save(&record, Durability::Flushed))
            .await
            .expect("a takes the lease with its first write");
    }
    within("open a turn", a.open_turn(&open, 1, "turn_open"))
        .await
        .expect("open turn");

    let held = a.held();
    let handed = within("hand over", a.hand_over("b", &held))
        .await
        .expect("hand over");
    let handed: Vec<&str> = handed.iter().map(|l| l.key.as_str()).collect();
    assert_eq!(handed, ["idle"], "only the idle session moves");
    assert!(a.lease_of(&idle).is_none(), "a holds it no more");
    assert!(a.lease_of(&waiting).is_some() && a.lease_of(&open).is_some());
    let info = pg.lease_info(&idle).await.expect("lease");
    assert_eq!((info.owner.as_deref(), info.epoch), (Some("b"), 2));
    let moves = pg.moves(10).await.expect("moves");
    assert!(
        moves
            .iter()
            .any(|m| m.key == "idle" && m.from == "a" && m.to == "b" && m.kind == "handover"),
        "{moves:?}"
    );

    // A late write of a's copy is fenced out.
    let record = SessionRecord::new(&idle, None);
    let late = a.save(&record, Durability::Flushed);
    assert!(matches!(
        within("late write", late).await,
        Err(StoreError::LeaseLost { .. })
    ));

    // b adopts it at the epoch handed, once; then renews it as its own.
    let adopted = within("adopt", b.adopt_handed()).await.expect("adopt");
    assert_eq!(adopted.len(), 1);
    assert_eq!(b.lease_of(&idle).map(|l| l.epoch), Some(2));
    assert!(
        within("adopt again", b.adopt_handed())
            .await
            .expect("adopt")
            .is_empty()
    );
    assert_eq!(within("renew", b.renew_all()).await.expect("renew"), 0);

    // Nothing to a node that stopped beating (half its TTL silent), nor to
    // one that left.
    tokio::time::sleep(TTL / 2 + Duration::from_millis(200)).await;
    pg.heartbeat("a").await.expect("beat");
    let idle2 = SessionKey::new("idle2");
    within(
        "save",
        a.save(&SessionRecord::new(&idle2, None), Durability::Flushed),
    )
    .await
    .expect("save");
    let lease = a.lease_of(&idle2).expect("held");
    let to_gone = a.hand_over("gone", std::slice::from_ref(&lease)).await;
    assert!(to_gone.expect("asked").is_empty(), "gone is silent");
    pg.heartbeat("b").await.expect("beat");
    pg.mark_node_left("b").await.expect("left");
    let to_left = a.hand_over("b", std::slice::from_ref(&lease)).await;
    assert!(to_left.expect("asked").is_empty(), "b left");
    assert!(a.lease_of(&idle2).is_some(), "still a's");
}

#[tokio::test]
async fn a_busy_session_marked_to_move_holds_its_new_turns_until_it_moved() {
    let Some(config) = fresh_db().await else {
        return;
    };
    let pg = store(&config).await;
    for node in ["a", "b"] {
        pg.register_node_with_ttl(node, "", TTL)
            .await
            .expect("register");
    }
    let a = NodeStore::new(pg.clone(), "a", TTL);
    let key = SessionKey::new("busy");
    let mut record = SessionRecord::new(&key, None);
    let id = record.accept("a turn in flight");
    within("save", a.save(&record, Durability::Flushed))
        .await
        .expect("a takes the lease with its first write");
    within("open a turn", a.open_turn(&key, id, "turn_busy"))
        .await
        .expect("open turn");

    // Not marked: a new turn is placed at once.
    within("not marked", a.wait_while_moving(&key)).await;
    a.mark_moving(key.as_str(), "b");
    let held = tokio::spawn({
        let a = a.clone();
        let key = key.clone();
        async move { a.wait_while_moving(&key).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !held.is_finished(),
        "a new turn waits while the session is marked"
    );
    let lease = a.lease_of(&key).expect("held");
    let busy = within("hand over", a.hand_over("b", std::slice::from_ref(&lease)))
        .await
        .expect("hand over");
    assert!(busy.is_empty(), "not while its turn runs");

    // The turn ends (answered, its end stored): the turn boundary.
    record.answered(id);
    within("answer", a.save(&record, Durability::Flushed))
        .await
        .expect("save");
    let done = {
        use warden_core::store::turn_event::Done;
        use warden_core::store::{StoredEvent, TurnEventData};
        StoredEvent::new(1, TurnEventData::Done(Done::new(1, "", 1, 0)))
    };
    within(
        "end the turn",
        a.append_turn(&key, "turn_busy", &[done], true),
    )
    .await
    .expect("end turn");
    let handed = within("hand over", a.hand_over("b", std::slice::from_ref(&lease)))
        .await
        .expect("hand over");
    assert_eq!(handed.len(), 1, "idle at its boundary, it moves");
    a.unmark_moving([key.as_str()]);
    within("the held turn goes on", held).await.expect("waiter");
    assert!(a.lease_of(&key).is_none(), "it goes on to b, not here");
    let info = pg.lease_info(&key).await.expect("lease");
    assert_eq!(info.owner.as_deref(), Some("b"));
}
