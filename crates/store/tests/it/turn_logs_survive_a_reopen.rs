//! `SledTurns`, a single node's turn event logs: one turn per message
//! (opening it again returns the same id and its events), events read
//! after a number, everything still there after the database is closed
//! and reopened (a restart), finished logs expired after `keep`, and a
//! corrupt entry a typed error, never a panic.

use std::time::Duration;

use serde_json::json;
use warden_core::SessionKey;
use warden_core::store::TurnEventData;
use warden_core::store::turn_event::Delta;
use warden_core::store::{StoredEvent, TurnAsked, TurnEventKind, TurnStore, TurnStoreError};
use warden_store::SledStore;

fn text(id: u64, t: &str) -> StoredEvent {
    // A fixed time: two events made alike compare equal.
    StoredEvent::new(id, TurnEventData::Text(Delta::new(t)))
        .made_at(Some(warden_core::store::EventTime::from_unix_ms(id)))
}

#[tokio::test]
async fn a_turn_log_keeps_its_id_and_events_across_a_reopen() {
    let dir = tempfile::tempdir().expect("tempdir");
    let key = SessionKey::new("ws");
    {
        let store = SledStore::open(dir.path()).expect("open");
        let turns = store.turns().expect("turns");
        let asked = TurnAsked::new(&"é".repeat(2000)).with_model(Some("m1".into()));
        let opened = turns
            .open(&key, 1, "turn_a", None, &asked)
            .await
            .expect("open");
        assert_eq!(opened.asked, asked);
        assert_eq!(opened.id, "turn_a");
        assert!(opened.events.is_empty() && !opened.ended);
        turns
            .append(&key, "turn_a", &[text(1, "Hel"), text(2, "lo")], false)
            .await
            .expect("append");
        // The same message again (a re-delivery): the same turn.
        let again = turns
            .open(&key, 1, "turn_b", None, &TurnAsked::new("another"))
            .await
            .expect("open");
        assert_eq!(again.asked, asked, "what the first request asked is kept");
        assert_eq!(again.id, "turn_a");
        assert_eq!(again.events.len(), 2);
        // Another message: another turn.
        let other = turns
            .open(&key, 2, "turn_c", None, &TurnAsked::default())
            .await
            .expect("open");
        assert_eq!(other.id, "turn_c");
    }
    // Closed and reopened, as after a restart.
    let store = SledStore::open(dir.path()).expect("reopen");
    let turns = store.turns().expect("turns");
    let read = turns.read("turn_a", 1).await.expect("read").expect("known");
    assert_eq!(read.events, vec![text(2, "lo")]);
    // The prompt's head is kept whole characters within 2,048 bytes, with
    // the model and when the turn was opened, across the reopen.
    let prompt = read.asked.prompt.as_deref().expect("the prompt's head");
    assert_eq!((prompt.len(), prompt.chars().count()), (2048, 1024));
    assert_eq!(read.asked.model.as_deref(), Some("m1"));
    assert!(read.asked.opened_at.is_some());
    assert_eq!(
        (read.key.as_str(), read.message_id, read.ended),
        ("ws", 1, false)
    );
    let done = StoredEvent::new(
        3,
        TurnEventData::Done(warden_core::store::turn_event::Done::new(1, "Hello", 1, 0)),
    );
    assert!(done.at.is_some(), "an event is made with its time");
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
    assert_eq!(recent[1].events[0].kind(), TurnEventKind::Done);
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
    turns
        .open(&key, 1, "finished", None, &TurnAsked::default())
        .await
        .expect("open");
    turns
        .append(&key, "finished", &[text(1, "x")], true)
        .await
        .expect("append");
    turns
        .open(&key, 2, "running", None, &TurnAsked::default())
        .await
        .expect("open");
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(turns.expire(Duration::from_secs(60)).expect("expire"), 0);
    assert_eq!(turns.expire(Duration::from_millis(1)).expect("expire"), 1);
    assert_eq!(turns.read("finished", 0).await.expect("read"), None);
    assert!(turns.read("running", 0).await.expect("read").is_some());
    // The message's turn is gone with it: a re-delivery opens a new log.
    let again = turns
        .open(&key, 1, "fresh", None, &TurnAsked::default())
        .await
        .expect("open");
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

/// Set in the child process of the crash test: the database to write to.
const CRASH_CHILD: &str = "WARDEN_TURN_LOG_CRASH_CHILD";

/// A process that dies right after its appends were acknowledged — before
/// sled's own flush (every 500 ms) could run — leaves every acknowledged
/// event behind: the write-ahead log is replayed at the next open.
#[tokio::test]
async fn events_acknowledged_just_before_a_crash_are_there_after_it() {
    if let Some(dir) = std::env::var_os(CRASH_CHILD) {
        // The child: open, append 50 batches, say so, die without any
        // cleanup (no destructor, no flush).
        let store = SledStore::open(dir).expect("open");
        let turns = store.turns().expect("turns");
        let key = SessionKey::new("ws");
        turns
            .open(&key, 1, "turn_a", None, &TurnAsked::default())
            .await
            .expect("open");
        for n in 1..=50 {
            turns
                .append(&key, "turn_a", &[text(n, &format!("<{n}>"))], n == 50)
                .await
                .expect("append");
        }
        println!("acknowledged");
        std::process::abort();
    }
    let dir = tempfile::tempdir().expect("tempdir");
    // libtest names this test by its path without the crate's name.
    let test = concat!(
        module_path!(),
        "::events_acknowledged_just_before_a_crash_are_there_after_it"
    );
    let test = test.split_once("::").map_or(test, |(_, name)| name);
    let mut child = std::process::Command::new(std::env::current_exe().expect("exe"));
    child
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(CRASH_CHILD, dir.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null());
    let out = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::process::Command::from(child).output(),
    )
    .await
    .expect("the child finishes within a minute")
    .expect("run the child");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("acknowledged"), "child said: {stdout}");
    assert!(!out.status.success(), "the child aborted: {:?}", out.status);

    let store = SledStore::open(dir.path()).expect("reopen");
    let turns = store.turns().expect("turns (replays the log)");
    let read = turns.read("turn_a", 0).await.expect("read").expect("known");
    assert!(read.ended, "the last batch's end mark survived");
    let texts: Vec<_> = read
        .events
        .iter()
        .map(|e| e.data_value()["text"].clone())
        .collect();
    let wanted: Vec<_> = (1..=50).map(|n| json!(format!("<{n}>"))).collect();
    assert_eq!(texts, wanted, "every acknowledged event, once, in order");
}

/// A database written before batches were stored whole (one key per
/// event) reads the same, and appends to it continue the turn.
#[tokio::test]
async fn a_log_written_one_event_per_key_reads_the_same() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let db = sled::open(dir.path()).expect("sled");
        let tree = db.open_tree("turns").expect("tree");
        tree.insert(
            b"mws\x00\x00\x00\x00\x00\x00\x00\x00\x01",
            b"turn_old".to_vec(),
        )
        .expect("insert");
        tree.insert(
            b"tturn_old",
            br#"{"key":"ws","message_id":1,"ended":false,"updated_ms":1}"#.to_vec(),
        )
        .expect("insert");
        for n in 1u64..=3 {
            let mut k = b"eturn_old\x00".to_vec();
            k.extend_from_slice(&n.to_be_bytes());
            let v = json!({"kind": "text", "data": {"text": format!("<{n}>")}});
            tree.insert(k, v.to_string().into_bytes()).expect("insert");
        }
        db.flush().expect("flush");
    }
    let store = SledStore::open(dir.path()).expect("open");
    let turns = store.turns().expect("turns");
    let key = SessionKey::new("ws");
    let read = turns
        .read("turn_old", 1)
        .await
        .expect("read")
        .expect("known");
    // Stored before events kept their time: read without one.
    let untimed = |id, t| text(id, t).made_at(None);
    assert_eq!(read.events, vec![untimed(2, "<2>"), untimed(3, "<3>")]);
    turns
        .append(&key, "turn_old", &[text(4, "<4>"), text(5, "<5>")], true)
        .await
        .expect("append");
    let read = turns
        .read("turn_old", 2)
        .await
        .expect("read")
        .expect("known");
    assert!(read.ended);
    let ids: Vec<_> = read.events.iter().map(|e| e.id).collect();
    assert_eq!(ids, [3, 4, 5]);
    let read = turns
        .read("turn_old", 4)
        .await
        .expect("read")
        .expect("known");
    assert_eq!(read.events, vec![text(5, "<5>")], "from inside a batch");
    let recent = turns.recent(&key, 1).await.expect("recent");
    assert_eq!(
        recent[0].events,
        vec![text(5, "<5>")],
        "the last event only"
    );
}

/// A turn sent with an idempotency key keeps its request's fingerprint
/// across a reopen (a restart, kill -9 included: it is written with the
/// turn's entry); a re-delivery of its message, which has none, and a
/// later open with another never replace it; an entry written before
/// fingerprints were kept reads as unknown.
#[tokio::test]
async fn a_keyed_turn_keeps_the_fingerprint_of_its_first_request() {
    let dir = tempfile::tempdir().expect("tempdir");
    let key = SessionKey::new("ws");
    {
        let db = sled::open(dir.path()).expect("sled");
        let tree = db.open_tree("turns").expect("tree");
        tree.insert(
            b"mws\x00\x00\x00\x00\x00\x00\x00\x00\x09",
            b"turn_old".to_vec(),
        )
        .expect("insert");
        tree.insert(
            b"tturn_old",
            br#"{"key":"ws","message_id":9,"ended":true,"updated_ms":1}"#.to_vec(),
        )
        .expect("insert");
        db.flush().expect("flush");
    }
    {
        let store = SledStore::open(dir.path()).expect("open");
        let turns = store.turns().expect("turns");
        let opened = turns
            .open(
                &key,
                1,
                "turn_keyed",
                Some("fp-first"),
                &TurnAsked::default(),
            )
            .await
            .expect("open");
        assert_eq!(opened.fingerprint.as_deref(), Some("fp-first"));
        turns
            .append(&key, "turn_keyed", &[text(1, "x")], true)
            .await
            .expect("append");
        let plain = turns
            .open(&key, 2, "turn_plain", None, &TurnAsked::default())
            .await
            .expect("open");
        assert_eq!(plain.fingerprint, None);
    }
    let store = SledStore::open(dir.path()).expect("reopen");
    let turns = store.turns().expect("turns");
    let read = turns
        .read("turn_keyed", 0)
        .await
        .expect("read")
        .expect("known");
    assert_eq!(read.fingerprint.as_deref(), Some("fp-first"));
    // Re-delivered (no fingerprint), then opened with another: the first.
    for given in [None, Some("fp-other")] {
        let again = turns
            .open(&key, 1, "turn_x", given, &TurnAsked::default())
            .await
            .expect("open");
        assert_eq!(again.id, "turn_keyed");
        assert_eq!(again.fingerprint.as_deref(), Some("fp-first"), "{given:?}");
    }
    let read = turns
        .read("turn_keyed", 0)
        .await
        .expect("read")
        .expect("known");
    assert_eq!(read.fingerprint.as_deref(), Some("fp-first"));
    assert!(read.ended, "its events and end untouched");
    let old = turns
        .read("turn_old", 0)
        .await
        .expect("read")
        .expect("known");
    assert_eq!(old.fingerprint, None, "unknown, not an error");
    assert!(old.ended);
}
