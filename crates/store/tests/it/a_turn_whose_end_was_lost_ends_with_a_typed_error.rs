//! A turn whose message was answered but whose log has no end (the
//! write-ahead log lost its last batch, or the process died between the
//! session recording the answer and the turn storing its end) is ended at
//! the next open with an `error` event `ETURN_LOG_DAMAGED`, so a client
//! re-attaching to it is told instead of waiting for ever; a turn whose
//! message still waits (a restart re-delivers it) is left to run again.

use warden_core::store::TurnEventData;
use warden_core::store::turn_event::Delta;
use warden_core::store::{StoredEvent, TurnEventKind, TurnStore};
use warden_core::{Durability, SessionKey, SessionRecord, SessionStore};
use warden_store::{SledStore, TURN_LOG_DAMAGED};

fn text(id: u64, t: &str) -> StoredEvent {
    StoredEvent::new(id, TurnEventData::Text(Delta::new(t)))
}

#[tokio::test]
async fn an_answered_turn_without_an_end_is_ended_at_the_next_open_and_a_pending_one_is_not() {
    let dir = tempfile::tempdir().expect("tempdir");
    let key = SessionKey::new("ws");
    {
        let store = SledStore::open(dir.path()).expect("open");
        let mut record = SessionRecord::new(&key, None);
        let answered = record.accept("first");
        let waiting = record.accept("second");
        store
            .save(&record, Durability::Flushed)
            .await
            .expect("save");
        let turns = store.turns().expect("turns");
        turns
            .open(
                &key,
                answered,
                "turn_answered",
                None,
                &warden_core::store::TurnAsked::default(),
            )
            .await
            .expect("open");
        turns
            .append(
                &key,
                "turn_answered",
                &[text(1, "Hel"), text(2, "lo")],
                false,
            )
            .await
            .expect("append");
        turns
            .open(
                &key,
                waiting,
                "turn_waiting",
                None,
                &warden_core::store::TurnAsked::default(),
            )
            .await
            .expect("open");
        // The session answers the first message; its turn's end never
        // reaches the log.
        record.answered(answered);
        store
            .save(&record, Durability::Flushed)
            .await
            .expect("save");
    }
    for open in 1..=2 {
        let store = SledStore::open(dir.path()).expect("reopen");
        let turns = store.turns().expect("turns");
        let lost = turns
            .read("turn_answered", 0)
            .await
            .expect("read")
            .expect("known");
        assert!(lost.ended, "open {open}: the turn ends");
        assert_eq!(lost.events.len(), 3, "open {open}: one end, once");
        let end = &lost.events[2];
        assert_eq!((end.id, end.kind()), (3, TurnEventKind::Error));
        assert_eq!(end.data_value()["code"], TURN_LOG_DAMAGED);
        assert_eq!(end.data_value()["exit"], 1);
        assert!(end.is_last());
        let waiting = turns
            .read("turn_waiting", 0)
            .await
            .expect("read")
            .expect("known");
        assert!(
            !waiting.ended && waiting.events.is_empty(),
            "open {open}: a pending message's turn runs again"
        );
    }
}
