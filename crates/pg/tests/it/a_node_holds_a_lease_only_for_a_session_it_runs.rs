//! A node holds the lease of a session with waiting messages only while
//! it runs that session, so every acknowledged message is answered (its
//! turn ends) however a database outage falls. Against a real PostgreSQL
//! (`WARDEN_PG_URL`; skipped with a message without it, failed under
//! `WARDEN_REQUIRE_POSTGRES=1`).
//!
//! The outage is played by hand, deterministically: the node's renewer is
//! not running, so its lease lapses by its own clock after a TTL and
//! [`NodeStore::fence_expired`] gives it up, exactly as a node whose
//! renewals cannot get through does; the steps that race in a real outage
//! (the stopping copy's last write, the orphan scan) are then run in the
//! order that used to strand the session.

use std::sync::Arc;
use std::time::Duration;

use warden_core::testing::{ChannelSource, ChannelSourceControl};
use warden_core::{
    Durability, EventSource, SessionKey, SessionRecord, SessionStore, StoreError, Supervisor,
};
use warden_pg::cluster::Node;
use warden_pg::low_level::{NodeStore, TAKEOVER_GRACE};

use crate::common::{fresh_db, store, within};

/// A supervisor keeping its sessions in `store`, its agent a channel the
/// test drives.
async fn supervisor_on(store: &NodeStore) -> (Supervisor, ChannelSourceControl) {
    let (source, control) = ChannelSource::new();
    let factory = move |_: &SessionKey| source.clone() as Arc<dyn EventSource>;
    let supervisor = within(
        "supervisor",
        Supervisor::builder(Arc::new(factory))
            .store(Arc::new(store.clone()))
            .start(),
    )
    .await
    .expect("supervisor starts");
    (supervisor, control)
}

/// Waits until `key` no longer runs in `supervisor` (its copy stopped).
async fn stopped(supervisor: &Supervisor, key: &SessionKey) {
    within("the copy stops", async {
        while supervisor.sessions().await.expect("sessions").contains(key) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
}

/// Runs the node's orphan scan until a message of `key` is sent to the
/// agent again: its attempt (bounded; the failure says what the scans did).
async fn scans_until_resent(
    store: &NodeStore,
    supervisor: &Supervisor,
    control: &ChannelSourceControl,
    key: &SessionKey,
) -> warden_core::testing::AttemptControl {
    let mut scans = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let done = within(
            "a scan",
            Node::headless(store.clone()).take_over(supervisor),
        )
        .await;
        scans.push(format!("{done:?}"));
        if let Ok(Some(attempt)) =
            tokio::time::timeout(Duration::from_millis(200), control.next_attempt()).await
        {
            assert_eq!(&attempt.request.session_key, key);
            return attempt;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the message of {key} was never sent again; lease {:?}, held {:?}, scans {scans:?}",
            store.pg().lease_info(key).await,
            store.held(),
        );
    }
}

/// The reported path: the node gives a session's lease up during an
/// outage (and stops it), the database answers again, and the stopping
/// copy's last write (`post_stop` saving the record idle) came through
/// `NodeStore::save` holding no lease — which took a fresh one (epoch 2)
/// for a session nothing runs. The node's own scan skipped it (its lease),
/// the others too (live): the message waited forever. Now that write is
/// refused as `LeaseLost`, the lease lapses, and a scan takes the session
/// and sends its message again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_write_from_a_copy_stopping_after_its_lease_was_given_up_takes_no_lease() {
    let Some(config) = fresh_db().await else {
        return;
    };
    let pg = store(&config).await;
    let ttl = Duration::from_millis(600);
    let a = NodeStore::new(pg.clone(), "node-a", ttl);
    let (supervisor, control) = supervisor_on(&a).await;
    let key = SessionKey::new("k1");

    // A turn streams on A (its first write took the lease, epoch 1).
    let turn = within("send", supervisor.send(key.clone(), "hello"))
        .await
        .expect("accepted");
    let held = within("the stream opens", control.next_attempt())
        .await
        .expect("an attempt");
    assert_eq!(a.lease_of(&key).map(|l| l.epoch), Some(1));

    // No renewal gets through for a TTL: A gives the lease up.
    tokio::time::sleep(ttl).await;
    assert_eq!(a.fence_expired(), 1);
    assert!(a.held().is_empty());
    // Nor does this node take it back at once, by any path: the stopped
    // copy's turn relays must be refused first.
    assert!(a.cooling_down(&key).is_some());
    assert_eq!(a.claim(&key).await.expect("claim"), None);

    // Its copy stops (what the lost lease triggers) and writes its record
    // on the way out, the database answering again.
    within("evict", supervisor.evict(key.clone()))
        .await
        .expect("evict");
    stopped(&supervisor, &key).await;
    within("the upstream stream is released", held.dropped()).await;
    let ended = within("the caller's turn ends", turn.finish()).await;
    assert!(ended.is_err(), "stopped, not answered here: {ended:?}");
    assert!(
        a.held().is_empty(),
        "no lease taken for a session not running here: {:?}",
        a.held()
    );
    let info = pg.lease_info(&key).await.expect("info");
    assert_eq!(
        (info.owner.as_deref(), info.epoch),
        (Some("node-a"), 1),
        "the late write took the lease again: {info:?}"
    );
    // Any write for it is refused the same way, also once this node may
    // claim the session again (a copy can take seconds to stop).
    if let Some(left) = a.cooling_down(&key) {
        tokio::time::sleep(left).await;
    }
    let mut record = pg.load(&key).await.expect("load").expect("a record");
    assert_eq!(record.pending.len(), 1, "{record:?}");
    record.status = warden_core::store::RecordStatus::Idle;
    assert!(
        matches!(
            a.save(&record, Durability::Flushed).await,
            Err(StoreError::LeaseLost { .. })
        ),
        "a write does not take back a lease its node gave up"
    );
    assert!(a.held().is_empty());

    // A scan (this node's own here) takes the session, runs it, and its
    // message is answered.
    let again = scans_until_resent(&a, &supervisor, &control, &key).await;
    assert_eq!(again.request.message, "hello");
    again.text("hi");
    again.finish();
    assert_eq!(a.lease_of(&key).map(|l| l.epoch), Some(2));
    within("answered", async {
        while !pg
            .load(&key)
            .await
            .expect("load")
            .is_some_and(|r| r.pending.is_empty())
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    supervisor.shutdown().await;
}

/// The orphan scan used to count a session as started when the copy it
/// found running here was the one stopping after its lease was given up:
/// it took the lease (epoch 2), the copy then stopped, and nothing ran the
/// session under a live lease. Now a session whose copy still runs here is
/// left for a later scan, which takes it once that copy is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_orphan_scan_does_not_count_a_copy_still_stopping_here_as_started() {
    let Some(config) = fresh_db().await else {
        return;
    };
    let pg = store(&config).await;
    let ttl = Duration::from_millis(600);
    let a = NodeStore::new(pg.clone(), "node-a", ttl);
    let (supervisor, control) = supervisor_on(&a).await;
    let key = SessionKey::new("k1");
    let _turn = within("send", supervisor.send(key.clone(), "hello"))
        .await
        .expect("accepted");
    let _held = within("the stream opens", control.next_attempt())
        .await
        .expect("an attempt");

    // The lease is given up; the copy has not stopped yet (busy, or the
    // stop not delivered) when the lease can be taken again, by the
    // database and by this node.
    tokio::time::sleep(ttl).await;
    assert_eq!(a.fence_expired(), 1);
    let cooling = a.cooling_down(&key).expect("just given up");
    tokio::time::sleep(cooling.max(TAKEOVER_GRACE) + Duration::from_millis(100)).await;
    let early = within("a scan", Node::headless(a.clone()).take_over(&supervisor)).await;
    assert!(
        early.taken.is_empty() && a.held().is_empty(),
        "the copy still running here was counted as started: {early:?}"
    );
    // Then it stops.
    within("evict", supervisor.evict(key.clone()))
        .await
        .expect("evict");
    stopped(&supervisor, &key).await;

    let again = scans_until_resent(&a, &supervisor, &control, &key).await;
    assert_eq!(again.request.message, "hello");
    again.text("hi");
    again.finish();
    supervisor.shutdown().await;
}

/// However a node came to hold the lease of a session with waiting
/// messages without running it (here: a turn placed here took it, and the
/// request was refused before the session started), its next scan starts
/// the session, which sends the messages again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_session_a_node_holds_but_does_not_run_is_started_by_its_next_scan() {
    let Some(config) = fresh_db().await else {
        return;
    };
    let pg = store(&config).await;
    let a = NodeStore::new(pg.clone(), "node-a", Duration::from_secs(10));
    let (supervisor, control) = supervisor_on(&a).await;
    let key = SessionKey::new("k1");
    let mut record = SessionRecord::new(&key, None);
    record.accept("are you there?");
    pg.save(&record, Durability::Flushed).await.expect("save");
    assert!(a.claim(&key).await.expect("claim").is_some());

    let again = scans_until_resent(&a, &supervisor, &control, &key).await;
    assert_eq!(again.request.message, "are you there?");
    again.text("yes");
    again.finish();
    assert_eq!(
        a.lease_of(&key).map(|l| l.epoch),
        Some(1),
        "started under the lease it held"
    );
    supervisor.shutdown().await;
}

fn stored(seq: u64, kind: warden_core::store::TurnEventKind) -> warden_core::store::StoredEvent {
    use warden_core::store::TurnEventData;
    use warden_core::store::turn_event::{Done, Started};
    let data = match kind {
        warden_core::store::TurnEventKind::Done => TurnEventData::Done(Done::new(1, "", 1, 0)),
        _ => TurnEventData::Started(Started::new(1)),
    };
    warden_core::store::StoredEvent::new(seq, data)
}

/// The other way an outage left a turn without an end: the session
/// answered the message (its record written: nothing pending) just before
/// the node gave the lease up, and the turn's last batch was then refused
/// (the node holds no lease). Nothing re-delivers an answered message, so
/// the turn never ended. Now the node's scan ends it with a typed error
/// once no node runs the session — and every node's minute sweep ends one
/// a dead node left — while a turn whose message still waits, or whose
/// session runs, is left alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_answered_but_whose_end_was_lost_with_its_lease_ends_with_a_typed_error() {
    use warden_core::store::TurnEventKind;
    let Some(config) = fresh_db().await else {
        return;
    };
    let pg = store(&config).await;
    let ttl = Duration::from_millis(600);
    let a = NodeStore::new(pg.clone(), "node-a", ttl);
    let (supervisor, _control) = supervisor_on(&a).await;

    // Three sessions of A's, each with a turn under way: k1 is answered
    // (its record says so) but its end is not stored yet; k2 still waits;
    // k3 is answered and runs on another node now (taken over).
    let mut turns = Vec::new();
    for (key, turn) in [("k1", "t1"), ("k2", "t2"), ("k3", "t3")] {
        let key = SessionKey::new(key);
        assert!(a.claim(&key).await.expect("claim").is_some());
        let mut record = SessionRecord::new(&key, None);
        let id = record.accept("hello");
        a.save(&record, Durability::Flushed).await.expect("save");
        a.open_turn(&key, id, turn).await.expect("open");
        a.append_turn(&key, turn, &[stored(1, TurnEventKind::Started)], false)
            .await
            .expect("append");
        turns.push((key, record, id));
    }
    for i in [0, 2] {
        let (_, record, id) = &mut turns[i];
        record.answered(*id);
        a.save(record, Durability::Flushed).await.expect("answered");
    }
    // The outage: no renewal for a TTL, A gives every lease up, and the
    // turns' last batches are refused.
    tokio::time::sleep(ttl).await;
    assert_eq!(a.fence_expired(), 3);
    let k1 = &turns[0].0;
    assert!(matches!(
        a.append_turn(k1, "t1", &[stored(2, TurnEventKind::Done)], true)
            .await,
        Err(StoreError::LeaseLost { .. })
    ));
    // B takes k3 (a new turn there, say).
    tokio::time::sleep(TAKEOVER_GRACE + Duration::from_millis(100)).await;
    let b = NodeStore::new(pg.clone(), "node-b", ttl);
    assert!(b.claim(&turns[2].0).await.expect("claim").is_some());

    let scan = within("a scan", Node::headless(a.clone()).take_over(&supervisor)).await;
    assert_eq!(scan.ended_lost, ["t1"], "{scan:?}");
    let t1 = pg.read_turn("t1", 0).await.expect("read").expect("t1");
    assert!(t1.ended);
    let last = t1.events.last().expect("events");
    assert_eq!(
        (last.id, last.kind(), last.data_value()["code"].as_str()),
        (
            2,
            TurnEventKind::Error,
            Some(warden_pg::low_level::TURN_END_LOST)
        ),
        "{t1:?}"
    );
    // A write of the old owner still in flight cannot land after it.
    let old = warden_pg::low_level::Lease {
        key: "k1".into(),
        node: "node-a".into(),
        epoch: 1,
    };
    assert!(matches!(
        pg.append_turn(&old, "t1", &[stored(2, TurnEventKind::Done)], true)
            .await,
        Err(StoreError::LeaseLost { .. })
    ));
    for id in ["t2", "t3"] {
        let t = pg.read_turn(id, 0).await.expect("read").expect("turn");
        assert!(!t.ended, "{id}: {t:?}");
    }

    // A dead node's: found by the sweep over every session.
    let dead = SessionKey::new("k4");
    let lease = pg
        .acquire(&dead, "node-dead", Duration::from_millis(100))
        .await
        .expect("acquire")
        .expect("free");
    let mut record = SessionRecord::new(&dead, None);
    let id = record.accept("hello");
    pg.save_fenced(&lease, &record).await.expect("save");
    pg.open_turn(&lease, id, "t4").await.expect("open");
    record.answered(id);
    pg.save_fenced(&lease, &record).await.expect("answered");
    assert_eq!(
        pg.end_stranded_turns(None).await.expect("sweep"),
        Vec::<String>::new(),
        "not while its lease may still be renewed"
    );
    tokio::time::sleep(Duration::from_millis(100) + TAKEOVER_GRACE).await;
    assert_eq!(pg.end_stranded_turns(None).await.expect("sweep"), ["t4"]);
    supervisor.shutdown().await;
}
