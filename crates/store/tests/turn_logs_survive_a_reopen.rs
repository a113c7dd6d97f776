//! `SledTurns`, a single node's turn event logs: one turn per message
//! (opening it again returns the same id and its events), events read
//! after a number, everything still there after the database is closed
//! and reopened (a restart), finished logs expired after `keep`, and a
//! corrupt entry a typed error, never a panic.

use std::time::Duration;

use serde_json::json;
use warden_core::SessionKey;
use warden_core::store::{StoredEvent, TurnEventKind, TurnStore, TurnStoreError};
use warden_store::SledStore;

fn text(id: u64, t: &str) -> StoredEvent {
    StoredEvent::new(id, TurnEventKind::Text, json!({"text": t}))
}

#[tokio::test]
async fn a_turn_log_keeps_its_id_and_events_across_a_reopen() {
    let dir = tempfile::tempdir().expect("tempdir");
    let key = SessionKey::new("ws");
    {
        let store = SledStore::open(dir.path()).expect("open");
        let turns = store.turns().expect("turns");
        let opened = turns.open(&key, 1, "turn_a").await.expect("open");
        assert_eq!(opened.id, "turn_a");
        assert!(opened.events.is_empty() && !opened.ended);
        turns
            .append(&key, "turn_a", &[text(1, "Hel"), text(2, "lo")], false)
            .await
            .expect("append");
        // The same message again (a re-delivery): the same turn.
        let again = turns.open(&key, 1, "turn_b").await.expect("open");
        assert_eq!(again.id, "turn_a");
        assert_eq!(again.events.len(), 2);
        // Another message: another turn.
        let other = turns.open(&key, 2, "turn_c").await.expect("open");
        assert_eq!(other.id, "turn_c");
    }
    // Closed and reopened, as after a restart.
    let store = SledStore::open(dir.path()).expect("reopen");
    let turns = store.turns().expect("turns");
    let read = turns.read("turn_a", 1).await.expect("read").expect("known");
    assert_eq!(read.events, vec![text(2, "lo")]);
    assert_eq!(
        (read.key.as_str(), read.message_id, read.ended),
        ("ws", 1, false)
    );
    let done = StoredEvent::new(3, TurnEventKind::Done, json!({"text": "Hello"}));
    turns
        .append(&key, "turn_a", std::slice::from_ref(&done), true)
        .await
        .expect("append");
    let read = turns.read("turn_a", 2).await.expect("read").expect("known");
    assert!(read.ended);
    assert_eq!(read.events, vec![done]);
    assert_eq!(turns.read("turn_unknown", 0).await.expect("read"), None);
    // The session's turns, newest first, each with its last event.
    let recent = turns.recent(&key, 10).await.expect("recent");
    let listed: Vec<_> = recent
        .iter()
        .map(|t| (t.id.as_str(), t.message_id, t.ended, t.events.len()))
        .collect();
    assert_eq!(listed, [("turn_c", 2, false, 0), ("turn_a", 1, true, 1)]);
    assert_eq!(recent[1].events[0].kind, TurnEventKind::Done);
    assert_eq!(turns.recent(&key, 1).await.expect("recent").len(), 1);
    let other = turns
        .recent(&SessionKey::new("w"), 10)
        .await
        .expect("recent");
    assert!(
        other.is_empty(),
        "a key that is a prefix of another's is its own: {other:?}"
    );
}

#[tokio::test]
async fn finished_logs_expire_and_unfinished_ones_stay() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = SledStore::open(dir.path()).expect("open");
    let turns = store.turns().expect("turns");
    let key = SessionKey::new("ws");
    turns.open(&key, 1, "finished").await.expect("open");
    turns
        .append(&key, "finished", &[text(1, "x")], true)
        .await
        .expect("append");
    turns.open(&key, 2, "running").await.expect("open");
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(turns.expire(Duration::from_secs(60)).expect("expire"), 0);
    assert_eq!(turns.expire(Duration::from_millis(1)).expect("expire"), 1);
    assert_eq!(turns.read("finished", 0).await.expect("read"), None);
    assert!(turns.read("running", 0).await.expect("read").is_some());
    // The message's turn is gone with it: a re-delivery opens a new log.
    let again = turns.open(&key, 1, "fresh").await.expect("open");
    assert_eq!(again.id, "fresh");
    assert!(again.events.is_empty());
}

#[tokio::test]
async fn a_corrupt_entry_is_a_typed_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let db = sled::open(dir.path()).expect("sled");
        let tree = db.open_tree("turns").expect("tree");
        tree.insert(b"tbroken", b"not json".to_vec())
            .expect("insert");
        db.flush().expect("flush");
    }
    let store = SledStore::open(dir.path()).expect("open");
    let turns = store.turns().expect("turns");
    match turns.read("broken", 0).await {
        Err(TurnStoreError::Failed(why)) => assert!(why.contains("corrupt"), "{why}"),
        other => panic!("expected a typed error, got {other:?}"),
    }
}
