//! `warden-pg` against a real PostgreSQL (`WARDEN_PG_URL`, an admin URL;
//! `.ci/run` starts a throwaway cluster and sets it). Each test makes its
//! own database. Without the variable the tests say why and pass, unless
//! `WARDEN_REQUIRE_POSTGRES=1` (CI) makes them fail.

use crate::common;
use std::time::Duration;

use tokio_postgres::NoTls;
use warden_core::{Durability, SessionKey, SessionRecord, SessionStore, StoreError};
use warden_pg::low_level::{NodeStore, PgStore, TAKEOVER_GRACE};

use crate::common::{fresh_db, store, within};

fn record(key: &str, text: &str) -> SessionRecord {
    let mut r = SessionRecord::new(&SessionKey::new(key), None);
    r.accept(text);
    r
}

/// Takes the lease of `key` for `node`; it must be free.
async fn take(
    pg: &PgStore,
    key: &SessionKey,
    node: &str,
    ttl: Duration,
) -> warden_pg::low_level::Lease {
    pg.acquire(key, node, ttl)
        .await
        .expect("acquire")
        .expect("taken")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_round_trip_and_a_corrupt_one_is_a_typed_error_in_its_slot() {
    let Some(config) = fresh_db().await else {
        return;
    };
    let pg = store(&config).await;
    let a = record("a", "first");
    pg.save(&a, Durability::Flushed).await.expect("save");
    assert_eq!(
        pg.load(&SessionKey::new("a")).await.expect("load"),
        Some(a.clone())
    );
    assert_eq!(pg.load(&SessionKey::new("nope")).await.expect("load"), None);
    pg.save(&record("b", "second"), Durability::Buffered)
        .await
        .expect("save");

    // A record someone damaged by hand.
    let (client, conn) = config.connect(NoTls).await.expect("connect");
    tokio::spawn(conn);
    client
        .execute(
            "INSERT INTO warden_sessions (key, schema_version, record) VALUES ('c', 1, '{\"key\": 5}')",
            &[],
        )
        .await
        .expect("insert");
    client
        .execute(
            "INSERT INTO warden_sessions (key, schema_version, record) VALUES ('d', 99, '{}')",
            &[],
        )
        .await
        .expect("insert");
    let listed = pg.list().await.expect("list");
    assert_eq!(listed.len(), 4);
    assert_eq!(listed[0].as_ref().map(|r| r.key.as_str()), Ok("a"));
    assert!(
        matches!(&listed[2], Err(StoreError::Corrupt { key, .. }) if key == "c"),
        "{listed:?}"
    );
    assert!(
        matches!(&listed[3], Err(StoreError::NewerSchema { key, found: 99, .. }) if key == "d"),
        "{listed:?}"
    );
    assert!(matches!(
        pg.load(&SessionKey::new("c")).await,
        Err(StoreError::Corrupt { .. })
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_owner_at_a_time_and_a_takeover_fences_the_old_owner_out() {
    let Some(config) = fresh_db().await else {
        return;
    };
    let pg = store(&config).await;
    let key = SessionKey::new("ws");
    let ttl = Duration::from_millis(600);

    let a = pg
        .acquire(&key, "node-a", ttl)
        .await
        .expect("acquire")
        .expect("free: taken");
    assert_eq!(a.epoch, 1);
    assert_eq!(
        pg.acquire(&key, "node-b", ttl).await.expect("acquire"),
        None,
        "a live lease is not taken"
    );
    pg.save_fenced(&a, &record("ws", "by a"))
        .await
        .expect("the owner writes");
    assert!(pg.renew(&a, ttl).await.expect("renew"));

    // A pauses past its lease (by the database's clock). Within the
    // takeover grace only A may still renew it; then B takes over.
    tokio::time::sleep(ttl + Duration::from_millis(200)).await;
    let info = pg.lease_info(&key).await.expect("info");
    assert!(info.remaining_secs.is_some_and(|s| s < 0.0), "{info:?}");
    assert!(
        pg.acquire(&key, "node-b", ttl)
            .await
            .expect("acquire")
            .is_none(),
        "not within the takeover grace"
    );
    tokio::time::sleep(TAKEOVER_GRACE).await;
    let b = pg
        .acquire(&key, "node-b", ttl)
        .await
        .expect("acquire")
        .expect("expired: taken");
    assert_eq!(b.epoch, 2, "every take raises the epoch");

    // A wakes up: its write is rejected by the fence, its renewal too.
    let err = pg
        .save_fenced(&a, &record("ws", "by a, late"))
        .await
        .expect_err("fenced");
    assert_eq!(
        err,
        StoreError::LeaseLost {
            key: "ws".into(),
            epoch: 1
        }
    );
    assert!(
        !pg.renew(&a, ttl).await.expect("renew"),
        "a lost lease is not renewed"
    );
    pg.save_fenced(&b, &record("ws", "by b"))
        .await
        .expect("the new owner writes");
    let stored = pg.load(&key).await.expect("load").expect("record");
    assert_eq!(
        stored.pending[0].text, "by b",
        "nothing of the old owner's late write"
    );

    // A release lets another node in at once.
    pg.release(&b).await.expect("release");
    let a2 = pg
        .acquire(&key, "node-a", ttl)
        .await
        .expect("acquire")
        .expect("released: taken");
    assert_eq!(a2.epoch, 3);
    // The same node's older lease is fenced out by the epoch alone.
    assert!(matches!(
        pg.save_fenced(&a, &record("ws", "stale handle")).await,
        Err(StoreError::LeaseLost { epoch: 1, .. })
    ));
    pg.save_fenced(&a2, &record("ws", "current handle"))
        .await
        .expect("writes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_takeovers_elect_exactly_one_owner() {
    let Some(config) = fresh_db().await else {
        return;
    };
    let pg = store(&config).await;
    let key = SessionKey::new("contested");
    for round in 0..5u64 {
        let tasks: Vec<_> = (0..12)
            .map(|i| {
                let pg = pg.clone();
                let key = key.clone();
                tokio::spawn(async move {
                    pg.acquire(&key, &format!("node-{i}"), Duration::from_secs(30))
                        .await
                        .expect("acquire")
                })
            })
            .collect();
        let mut winners = Vec::new();
        for t in tasks {
            if let Some(l) = t.await.expect("task") {
                winners.push(l);
            }
        }
        assert_eq!(winners.len(), 1, "round {round}: {winners:?}");
        assert_eq!(winners[0].epoch, round + 1);
        // Expire it for the next round.
        pg.release(&winners[0]).await.expect("release");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_starting_together_migrate_once() {
    let Some(config) = fresh_db().await else {
        return;
    };
    let starts: Vec<_> = (0..6)
        .map(|_| {
            let c = config.clone();
            tokio::spawn(async move { PgStore::connect_config(c).await.map(|_| ()) })
        })
        .collect();
    for s in starts {
        within("a start", s)
            .await
            .expect("task")
            .expect("every start succeeds");
    }
    let (client, conn) = config.connect(NoTls).await.expect("connect");
    tokio::spawn(conn);
    let versions: Vec<i32> = client
        .query(
            "SELECT version FROM warden_schema_migrations ORDER BY version",
            &[],
        )
        .await
        .expect("query")
        .iter()
        .map(|r| r.get(0))
        .collect();
    let expected: Vec<i32> = warden_pg::low_level::MIGRATIONS
        .iter()
        .map(|(v, _)| *v)
        .collect();
    assert_eq!(versions, expected);
    // A database migrated by a newer warden is refused, not downgraded.
    client
        .execute(
            "INSERT INTO warden_schema_migrations (version) VALUES (999)",
            &[],
        )
        .await
        .expect("insert");
    let newer = PgStore::connect_config(config.clone()).await;
    assert!(
        matches!(
            newer,
            Err(warden_pg::PgError::NewerSchema { found: 999, .. })
        ),
        "{newer:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_keeps_its_leases_alive_and_reports_the_one_it_loses() {
    let Some(config) = fresh_db().await else {
        return;
    };
    let pg = store(&config).await;
    let ttl = Duration::from_millis(900);
    let a = NodeStore::new(pg.clone(), "node-a", ttl);
    let b = NodeStore::new(pg.clone(), "node-b", ttl);
    let mut lost = a.lost();
    let _renewing = a.spawn_renewer();

    // The first write takes the lease; B cannot write the session.
    a.save(&record("s1", "hello"), Durability::Flushed)
        .await
        .expect("a writes");
    a.save(&record("s2", "hello"), Durability::Flushed)
        .await
        .expect("a writes");
    assert!(matches!(
        b.save(&record("s1", "b"), Durability::Flushed).await,
        Err(StoreError::LeaseLost { epoch: 0, .. })
    ));
    // Renewed past three TTLs: still A's.
    tokio::time::sleep(ttl * 3).await;
    let info = pg.lease_info(&SessionKey::new("s1")).await.expect("info");
    assert_eq!(info.owner.as_deref(), Some("node-a"));
    assert!(info.remaining_secs.is_some_and(|s| s > 0.0), "{info:?}");
    assert!(
        b.claim(&SessionKey::new("s1"))
            .await
            .expect("claim")
            .is_none()
    );

    // A stalls (its lease runs out by the database's clock) and B takes s1.
    let (client, conn) = config.connect(NoTls).await.expect("connect");
    tokio::spawn(conn);
    client
        .execute(
            "UPDATE warden_sessions SET lease_until = now() - interval '1 second' WHERE key = 's1'",
            &[],
        )
        .await
        .expect("expire");
    let taken = b
        .claim(&SessionKey::new("s1"))
        .await
        .expect("claim")
        .expect("taken over");
    assert_eq!(taken.epoch, 2);

    // A learns it lost s1 at its next renewal, and only s1.
    let gone = within("the lost lease", lost.recv())
        .await
        .expect("a lost lease");
    assert_eq!((gone.key.as_str(), gone.epoch), ("s1", 1));
    assert_eq!(
        a.held().iter().map(|l| l.key.as_str()).collect::<Vec<_>>(),
        ["s2"]
    );
    // And cannot write it any more.
    assert!(matches!(
        a.save(&record("s1", "late"), Durability::Flushed).await,
        Err(StoreError::LeaseLost { .. })
    ));

    // Membership: both registered, with their live sessions.
    pg.register_node("node-a", "http://127.0.0.1:1")
        .await
        .expect("register");
    pg.register_node("node-b", "http://127.0.0.1:2")
        .await
        .expect("register");
    assert!(pg.heartbeat("node-a").await.expect("heartbeat"));
    assert!(!pg.heartbeat("node-x").await.expect("heartbeat"));
    let nodes = pg.nodes().await.expect("nodes");
    let by = |id: &str| nodes.iter().find(|n| n.node_id == id).map(|n| n.sessions);
    assert_eq!(
        (by("node-a"), by("node-b")),
        (Some(1), Some(1)),
        "{nodes:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orphans_are_sessions_with_pending_messages_and_no_live_lease() {
    let Some(config) = fresh_db().await else {
        return;
    };
    let pg = store(&config).await;
    let ttl = Duration::from_secs(30);
    // Pending, never leased (a single-node write): an orphan.
    pg.save(&record("free", "waiting"), Durability::Flushed)
        .await
        .expect("save");
    // Pending, leased by a live node: not one.
    let live = take(&pg, &SessionKey::new("live"), "n1", ttl).await;
    pg.save_fenced(&live, &record("live", "waiting"))
        .await
        .expect("save");
    // Pending, its lease expired (the owner died): an orphan.
    let dead = take(
        &pg,
        &SessionKey::new("dead"),
        "n2",
        Duration::from_millis(200),
    )
    .await;
    pg.save_fenced(&dead, &record("dead", "waiting"))
        .await
        .expect("save");
    // Nothing pending: not one, whatever its lease.
    let mut answered = record("answered", "done");
    answered.answered(1);
    pg.save(&answered, Durability::Flushed).await.expect("save");
    tokio::time::sleep(Duration::from_millis(400) + TAKEOVER_GRACE).await;
    let orphans: Vec<String> = pg
        .orphans()
        .await
        .expect("orphans")
        .iter()
        .map(|k| k.as_str().to_owned())
        .collect();
    assert_eq!(orphans, ["dead", "free"]);
    // Whoever writes a record (an older node, by hand), the database keeps
    // track of whether it waits: `pending` a non-empty array.
    let (client, conn) = config.connect(NoTls).await.expect("connect");
    tokio::spawn(conn);
    client
        .batch_execute(
            "INSERT INTO warden_sessions (key, record) VALUES \
             ('raw', '{\"pending\": [{\"text\": \"x\"}]}'), \
             ('odd', '{\"pending\": 5}'), ('none', NULL)",
        )
        .await
        .expect("insert");
    let orphans: Vec<String> = pg
        .orphans()
        .await
        .expect("orphans")
        .iter()
        .map(|k| k.as_str().to_owned())
        .collect();
    assert_eq!(orphans, ["dead", "free", "raw"]);
    client
        .batch_execute("UPDATE warden_sessions SET record = '{\"pending\": []}' WHERE key = 'raw'")
        .await
        .expect("update");
    let orphans = pg.orphans().await.expect("orphans");
    assert_eq!(orphans.len(), 2, "answered: no longer waiting: {orphans:?}");
    client
        .batch_execute("DELETE FROM warden_sessions WHERE key IN ('raw', 'odd', 'none')")
        .await
        .expect("delete");
    // The same with workspaces, and when the next lease can be taken: the
    // live one's, seen from another node; none seen from its owner.
    let mut bound = SessionRecord::new(
        &SessionKey::new("bound"),
        Some(std::path::PathBuf::from("/srv/ws")),
    );
    bound.accept("waiting");
    pg.save(&bound, Durability::Flushed).await.expect("save");
    let seen = pg.orphans_with_workspaces("n2").await.expect("orphans");
    let mut sessions: Vec<(String, Option<std::path::PathBuf>)> = seen
        .sessions
        .iter()
        .map(|(k, w)| (k.as_str().to_owned(), w.clone()))
        .collect();
    sessions.sort();
    assert_eq!(
        sessions,
        [
            ("bound".to_owned(), Some("/srv/ws".into())),
            ("dead".to_owned(), None),
            ("free".to_owned(), None)
        ]
    );
    let next = seen.next_in.expect("the live lease");
    assert!(
        next > ttl - Duration::from_secs(5) && next <= ttl + TAKEOVER_GRACE,
        "{next:?}"
    );
    let own = pg.orphans_with_workspaces("n1").await.expect("orphans");
    assert_eq!(own.next_in, None, "its own lease is not another node's");
    // And each node is told the waiting sessions it holds itself, which
    // it must be running.
    let held = |o: &warden_pg::low_level::Orphans| -> Vec<String> {
        o.held_waiting
            .iter()
            .map(|k| k.as_str().to_owned())
            .collect()
    };
    assert_eq!(held(&own), ["live"]);
    assert!(held(&seen).is_empty(), "{seen:?}");
    let leases = pg.leases().await.expect("leases");
    let live_info = leases
        .iter()
        .find(|(k, _)| k == "live")
        .map(|(_, l)| l.clone());
    assert_eq!(live_info.and_then(|l| l.owner), Some("n1".to_owned()));
}

/// A dead node's many sessions taken a batch per statement: nodes racing
/// over the same keys split them (each taken once, at one more epoch, as a
/// failover), a live lease is not taken, and each lease comes with the
/// record as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_takes_split_a_dead_nodes_sessions_and_skip_live_leases() {
    let Some(config) = fresh_db().await else {
        return;
    };
    let pg = store(&config).await;
    let short = Duration::from_millis(200);
    let keys: Vec<SessionKey> = (0..200)
        .map(|i| SessionKey::new(format!("s-{i:03}")))
        .collect();
    for key in &keys {
        let lease = take(&pg, key, "dead", short).await;
        pg.save_fenced(&lease, &record(key.as_str(), "waiting"))
            .await
            .expect("save");
    }
    // One session still held by a live node.
    let live = take(
        &pg,
        &SessionKey::new("live"),
        "n-live",
        Duration::from_secs(30),
    )
    .await;
    // And one racer's own, live: a scan that raced its own start of the
    // session does not take it again.
    let own = take(&pg, &SessionKey::new("own"), "n-0", Duration::from_secs(30)).await;
    tokio::time::sleep(short + TAKEOVER_GRACE + Duration::from_millis(200)).await;
    let mut asked = keys.clone();
    asked.push(SessionKey::new("live"));
    asked.push(SessionKey::new("own"));
    let racers: Vec<_> = (0..4)
        .map(|i| {
            let pg = pg.clone();
            let mut asked = asked.clone();
            // Each in an order of its own, as nodes shuffle theirs.
            asked.rotate_left(i * 50);
            tokio::spawn(async move {
                let mut taken = Vec::new();
                for batch in asked.chunks(16) {
                    taken.extend(
                        pg.acquire_many(batch, &format!("n-{i}"), Duration::from_secs(30))
                            .await
                            .expect("acquire_many"),
                    );
                }
                taken
            })
        })
        .collect();
    let mut owners = std::collections::HashMap::new();
    for racer in racers {
        for (lease, record) in within("racer", racer).await.expect("racer") {
            let record = record.expect("decoded").expect("a record");
            assert_eq!(record.key, lease.key);
            assert_eq!(record.pending.len(), 1, "{record:?}");
            assert_eq!(lease.epoch, 2, "{lease:?}");
            assert!(
                owners.insert(lease.key.clone(), lease.node).is_none(),
                "{} taken twice",
                lease.key
            );
        }
    }
    assert_eq!(owners.len(), keys.len(), "every dead session taken once");
    assert!(!owners.contains_key("live"));
    assert!(
        !owners.contains_key("own"),
        "its own live lease, taken again"
    );
    assert!(
        pg.renew(&own, Duration::from_secs(30))
            .await
            .expect("renew")
    );
    let leases = pg.leases().await.expect("leases");
    for (key, info) in &leases {
        let expected = match key.as_str() {
            "live" => "n-live",
            "own" => "n-0",
            _ => &owners[key],
        };
        assert_eq!(info.owner.as_deref(), Some(expected), "{key}");
    }
    assert!(
        pg.renew(&live, Duration::from_secs(30))
            .await
            .expect("renew"),
        "the live lease stands"
    );
    let moves = pg.moves(10).await.expect("moves");
    assert_eq!(moves.len(), 10);
    assert!(
        moves.iter().all(|m| m.from == "dead"
            && m.kind == "failover"
            && m.epoch == 2
            && owners.get(&m.key) == Some(&m.to)),
        "{moves:?}"
    );
}

/// A turn's conversation reads and writes wait for a database that is
/// away (its connections cut, new ones refused, as in a restart) and go on
/// once it is back, instead of failing the turn `EINTERNAL` ("cannot read
/// a conversation: connection closed", issue 50).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversation_waits_for_a_database_that_is_away() {
    use warden_core::store::ConversationStore as _;
    let Some(config) = fresh_db().await else {
        return;
    };
    let admin = common::admin_url().expect("admin URL");
    let db = config.get_dbname().expect("a database").to_owned();
    let c = store(&config).await.conversations();
    within("create", c.create("conv_w")).await.expect("create");
    let away = common::Outage::begin(&admin, &db).await;
    let (load, create, append) = (c.clone(), c.clone(), c.clone());
    let load = tokio::spawn(async move { load.load("conv_w").await });
    let create = tokio::spawn(async move { create.create("conv_x").await });
    let append =
        tokio::spawn(async move { append.append_turn_once("conv_w", 1, "q1", "a1").await });
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(
        !load.is_finished(),
        "a read waits while the database is away"
    );
    assert!(!create.is_finished(), "so does a create");
    assert!(!append.is_finished(), "and a write");
    away.end().await;
    within("read", load)
        .await
        .expect("task")
        .expect("the conversation, once the database is back");
    within("create", create)
        .await
        .expect("task")
        .expect("created");
    assert!(
        within("write", append)
            .await
            .expect("task")
            .expect("written")
    );
    let entries = within("load", c.load("conv_w")).await.expect("load");
    assert_eq!(entries.len(), 2, "{entries:?}");
}

/// The HTTP agents' conversations in the database: any node reads what
/// another wrote, an unknown one is the CLI's "No conversation found", and
/// a turn is recorded once per (turn id, message) even when nodes race.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conversations_are_shared_by_nodes_and_each_turn_is_recorded_once() {
    use warden_core::store::{ConversationStore as _, Role};
    let Some(config) = fresh_db().await else {
        return;
    };
    let a = within("connect", PgStore::connect_config(config.clone()))
        .await
        .expect("a")
        .conversations();
    let b = within("connect", PgStore::connect_config(config))
        .await
        .expect("b")
        .conversations();

    let missing = within("load", a.load("conv_missing")).await;
    assert!(
        matches!(&missing, Err(warden_core::StreamError::UnknownSession { message, .. })
            if message == "No conversation found with session ID: conv_missing"),
        "{missing:?}"
    );
    within("create", a.create("conv_1")).await.expect("create");
    assert_eq!(
        within("load", b.load("conv_1")).await.expect("load"),
        vec![]
    );

    assert!(
        within("append", a.append_turn_once("conv_1", 1, "q1", "a1"))
            .await
            .expect("append")
    );
    assert!(
        !within("append", b.append_turn_once("conv_1", 1, "q1", "a1 again"))
            .await
            .expect("append"),
        "the same turn with the same message is not recorded twice"
    );
    assert!(
        within("append", b.append_turn_once("conv_1", 1, "other", "a2"))
            .await
            .expect("append"),
        "the same id with another message is another turn"
    );

    // Two nodes racing to record one re-delivered turn: exactly one does.
    let mut racers = Vec::new();
    for i in 0..8 {
        let c = if i % 2 == 0 { a.clone() } else { b.clone() };
        racers.push(tokio::spawn(async move {
            c.append_turn_once("conv_1", 2, "q3", "a3")
                .await
                .expect("append")
        }));
    }
    let mut won = 0;
    for r in racers {
        if within("racer", r).await.expect("task") {
            won += 1;
        }
    }
    assert_eq!(won, 1, "one append of turn 2 wins");

    let entries = within("load", a.load("conv_1")).await.expect("load");
    let seen: Vec<(Role, &str, Option<u64>)> = entries
        .iter()
        .map(|e| (e.role, e.content.as_str(), e.turn))
        .collect();
    assert_eq!(
        seen,
        vec![
            (Role::User, "q1", Some(1)),
            (Role::Assistant, "a1", Some(1)),
            (Role::User, "other", Some(1)),
            (Role::Assistant, "a2", Some(1)),
            (Role::User, "q3", Some(2)),
            (Role::Assistant, "a3", Some(2)),
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turns_log_moves_with_its_session_and_numbers_on_without_a_gap() {
    use warden_core::store::StoredEvent;
    let Some(config) = fresh_db().await else {
        return;
    };
    let pg = store(&config).await;
    let key = SessionKey::new("ws");
    let ttl = Duration::from_millis(600);
    let ev = |seq: u64, text: &str| {
        StoredEvent::new(
            seq,
            warden_core::store::TurnEventData::Text(warden_core::store::turn_event::Delta::new(
                text,
            )),
        )
        .made_at(Some(warden_core::store::EventTime::from_unix_ms(seq)))
    };

    let a = pg.acquire(&key, "node-a", ttl).await.expect("acquire");
    let a = a.expect("free");
    let opened = pg.open_turn(&a, 1, "turn-a").await.expect("open");
    assert_eq!((opened.id.as_str(), opened.events.len()), ("turn-a", 0));
    pg.append_turn(&a, "turn-a", &[ev(1, "he"), ev(2, "ll")], false)
        .await
        .expect("append");
    let read = pg
        .read_turn("turn-a", 1)
        .await
        .expect("read")
        .expect("turn");
    assert_eq!(read.events, [ev(2, "ll")], "only the events after 1");
    assert_eq!(
        (read.key.as_str(), read.message_id, read.ended),
        ("ws", 1, false)
    );
    assert!(pg.read_turn("turn-x", 0).await.expect("read").is_none());

    // A's lease runs out and B takes the session: B's turn for the same
    // message is A's, with A's events.
    tokio::time::sleep(ttl + TAKEOVER_GRACE + Duration::from_millis(200)).await;
    let b = pg.acquire(&key, "node-b", ttl).await.expect("acquire");
    let b = b.expect("expired: taken");
    let opened = pg.open_turn(&b, 1, "turn-b").await.expect("open");
    assert_eq!(opened.id, "turn-a", "the re-delivered turn keeps its id");
    assert_eq!(opened.events, [ev(1, "he"), ev(2, "ll")]);

    // A wakes up: fenced out, for a new turn and for an old one.
    assert!(matches!(
        pg.append_turn(&a, "turn-a", &[ev(3, "late")], false).await,
        Err(StoreError::LeaseLost { epoch: 1, .. })
    ));
    assert!(matches!(
        pg.open_turn(&a, 2, "turn-a2").await,
        Err(StoreError::LeaseLost { epoch: 1, .. })
    ));
    pg.append_turn(&b, "turn-a", &[ev(3, "o")], true)
        .await
        .expect("B appends");
    // A number already stored is refused, not overwritten.
    assert!(matches!(
        pg.append_turn(&b, "turn-a", &[ev(3, "again")], true).await,
        Err(StoreError::Backend { .. })
    ));
    let read = pg
        .read_turn("turn-a", 0)
        .await
        .expect("read")
        .expect("turn");
    assert_eq!(read.events, [ev(1, "he"), ev(2, "ll"), ev(3, "o")]);
    assert!(read.ended);

    // Logs of ended turns untouched for longer than kept are deleted; a
    // turn that has not ended is kept (a day longer).
    let running = pg.open_turn(&b, 2, "turn-running").await.expect("open");
    assert_eq!(running.id, "turn-running");
    // The session's turns, newest first, each with its last event.
    let recent = pg.recent_turns(&key, 10).await.expect("recent");
    let listed: Vec<_> = recent
        .iter()
        .map(|t| (t.id.as_str(), t.message_id, t.ended, t.events.clone()))
        .collect();
    assert_eq!(
        listed,
        [
            ("turn-running", 2, false, vec![]),
            ("turn-a", 1, true, vec![ev(3, "o")]),
        ]
    );
    assert_eq!(pg.recent_turns(&key, 1).await.expect("recent").len(), 1);
    assert_eq!(
        pg.expire_turns(Duration::from_secs(3600))
            .await
            .expect("expire"),
        0
    );
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(
        pg.expire_turns(Duration::from_millis(1))
            .await
            .expect("expire"),
        1
    );
    assert!(pg.read_turn("turn-a", 0).await.expect("read").is_none());
    assert!(
        pg.read_turn("turn-running", 0)
            .await
            .expect("read")
            .is_some(),
        "a turn still running is kept"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_owner_appending_through_a_takeover_never_collides_with_the_new_one() {
    use warden_core::store::StoredEvent;
    let Some(config) = fresh_db().await else {
        return;
    };
    let pg = store(&config).await;
    // A slow write (a busy disk, a long commit): an event whose text is
    // "slow" takes 400 ms to insert, so the takeover happens while the old
    // owner's append is in flight.
    let (admin, conn) = config.connect(NoTls).await.expect("connect");
    tokio::spawn(conn);
    admin
        .batch_execute(
            "CREATE FUNCTION slow_insert() RETURNS trigger LANGUAGE plpgsql AS $$ \
             BEGIN IF NEW.data ->> 'text' = 'slow' THEN PERFORM pg_sleep(0.4); END IF; \
             RETURN NEW; END $$; \
             CREATE TRIGGER slow BEFORE INSERT ON warden_turn_events \
             FOR EACH ROW EXECUTE FUNCTION slow_insert();",
        )
        .await
        .expect("trigger");
    let key = SessionKey::new("ws");
    let ttl = Duration::from_millis(300);
    let ev = |seq: u64, text: &str| {
        StoredEvent::new(
            seq,
            warden_core::store::TurnEventData::Text(warden_core::store::turn_event::Delta::new(
                text,
            )),
        )
        .made_at(Some(warden_core::store::EventTime::from_unix_ms(seq)))
    };
    let a = pg.acquire(&key, "node-a", ttl).await.expect("acquire");
    let a = a.expect("free");
    pg.open_turn(&a, 1, "turn").await.expect("open");
    pg.append_turn(&a, "turn", &[ev(1, "fast")], false)
        .await
        .expect("append");
    tokio::time::sleep(ttl + TAKEOVER_GRACE + Duration::from_millis(100)).await; // expired

    // A's append is in flight when B takes over.
    let slow = {
        let pg = pg.clone();
        let a = a.clone();
        tokio::spawn(async move { pg.append_turn(&a, "turn", &[ev(2, "slow")], false).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let b = pg.acquire(&key, "node-b", ttl).await.expect("acquire");
    let b = b.expect("expired: taken");
    let opened = pg.open_turn(&b, 1, "other").await.expect("open");
    let last = opened.events.last().map_or(0, |e| e.id);
    let a_said = within("A's append", slow).await.expect("task");
    // The takeover waited for A's append (the fence holds the lease row),
    // so B saw it and numbers on after it.
    assert_eq!(a_said, Ok(()), "A's append landed before the takeover");
    assert_eq!(last, 2, "B saw every event A was told is stored");
    pg.append_turn(&b, "turn", &[ev(last + 1, "b")], true)
        .await
        .expect("the new owner's next number is free");
    assert!(matches!(
        pg.append_turn(&a, "turn", &[ev(4, "late")], false).await,
        Err(StoreError::LeaseLost { epoch: 1, .. })
    ));
    let read = pg.read_turn("turn", 0).await.expect("read").expect("turn");
    let seqs: Vec<u64> = read.events.iter().map(|e| e.id).collect();
    assert_eq!(seqs, [1, 2, 3]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_changing_nodes_is_listed_as_a_failover_or_a_handover() {
    let Some(config) = fresh_db().await else {
        return;
    };
    let pg = store(&config).await;
    let key = SessionKey::new("moving");
    let ttl = Duration::from_millis(200);
    // A takes it, renews it (a renewal is no move), and dies: its lease
    // runs out, and B takes the session over.
    let a = pg
        .acquire(&key, "a", ttl)
        .await
        .expect("acquire")
        .expect("free");
    assert!(pg.renew(&a, ttl).await.expect("renew"));
    assert!(
        pg.moves(10).await.expect("moves").is_empty(),
        "nothing moved yet"
    );
    tokio::time::sleep(ttl + TAKEOVER_GRACE + Duration::from_millis(100)).await;
    let b = pg
        .acquire(&key, "b", ttl)
        .await
        .expect("acquire")
        .expect("expired");
    let moves = pg.moves(10).await.expect("moves");
    assert_eq!(moves.len(), 1, "{moves:?}");
    let m = &moves[0];
    assert_eq!(
        (
            m.key.as_str(),
            m.from.as_str(),
            m.to.as_str(),
            m.kind,
            m.epoch
        ),
        ("moving", "a", "b", "failover", b.epoch)
    );
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as u64;
    assert!(
        m.at_ms <= now_ms + 1_000 && m.at_ms + 60_000 > now_ms,
        "{m:?}"
    );
    // B gives it back (a graceful stop) and A takes it: a handover; B
    // taking back its own released lease would be no move.
    pg.release(&b).await.expect("release");
    let a2 = pg
        .acquire(&key, "a", ttl)
        .await
        .expect("acquire")
        .expect("released");
    let moves = pg.moves(10).await.expect("moves");
    assert_eq!(moves.len(), 1, "each session's latest move: {moves:?}");
    assert_eq!(
        (
            moves[0].from.as_str(),
            moves[0].to.as_str(),
            moves[0].kind,
            moves[0].epoch
        ),
        ("b", "a", "handover", a2.epoch)
    );
    pg.release(&a2).await.expect("release");
    let a3 = pg
        .acquire(&key, "a", ttl)
        .await
        .expect("acquire")
        .expect("released");
    let moves = pg.moves(10).await.expect("moves");
    assert_eq!(
        (moves[0].from.as_str(), moves[0].kind, moves[0].epoch),
        ("b", "handover", a2.epoch),
        "re-taking one's own lease keeps the last move"
    );
    assert!(a3.epoch > a2.epoch);
}

fn text_event(seq: u64, text: &str) -> warden_core::store::StoredEvent {
    use warden_core::store::{StoredEvent, TurnEventData, turn_event::Delta};
    StoredEvent::new(seq, TurnEventData::Text(Delta::new(text)))
        .made_at(Some(warden_core::store::EventTime::from_unix_ms(seq)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_whose_fence_fails_is_refused_alone_and_the_others_in_its_transaction_commit() {
    let Some(config) = fresh_db().await else {
        return;
    };
    let pg = store(&config).await;
    let ttl = Duration::from_secs(30);
    let (k1, k2, k3) = (
        SessionKey::new("s1"),
        SessionKey::new("s2"),
        SessionKey::new("s3"),
    );
    let l1 = pg
        .acquire(&k1, "a", ttl)
        .await
        .expect("acquire")
        .expect("free");
    let l2 = pg
        .acquire(&k2, "a", ttl)
        .await
        .expect("acquire")
        .expect("free");
    let l3 = pg
        .acquire(&k3, "a", ttl)
        .await
        .expect("acquire")
        .expect("free");
    for (l, id) in [(&l1, "t1"), (&l2, "t2"), (&l3, "t3")] {
        pg.open_turn(l, 1, id).await.expect("open");
    }
    // s2 moves to node b (a takeover: the owner and the epoch change).
    let (client, conn) = config.connect(NoTls).await.expect("connect");
    tokio::spawn(conn);
    client
        .execute(
            "UPDATE warden_sessions SET owner = 'b', epoch = epoch + 1 WHERE key = 's2'",
            &[],
        )
        .await
        .expect("take s2");
    let batch = |lease: &warden_pg::low_level::Lease, id: &str, text: &str| {
        warden_pg::low_level::TurnBatch {
            lease: lease.clone(),
            id: id.to_owned(),
            events: vec![text_event(1, text), text_event(2, "!")],
            ended: false,
        }
    };
    let (b1, b2, b3) = (
        batch(&l1, "t1", "one"),
        batch(&l2, "t2", "two"),
        batch(&l3, "t3", "three"),
    );
    let results = pg
        .append_turns(&[&b1, &b2, &b3])
        .await
        .expect("one statement");
    assert!(results[0].is_ok(), "{results:?}");
    assert!(
        matches!(&results[1], Err(StoreError::LeaseLost { key, epoch: 1 }) if key == "s2"),
        "{results:?}"
    );
    assert!(results[2].is_ok(), "{results:?}");
    let events = |id: &'static str| {
        let pg = pg.clone();
        async move {
            pg.read_turn(id, 0)
                .await
                .expect("read")
                .expect("turn")
                .events
        }
    };
    assert_eq!(
        events("t1").await,
        [text_event(1, "one"), text_event(2, "!")]
    );
    assert!(
        events("t2").await.is_empty(),
        "nothing of the fenced-out batch"
    );
    assert_eq!(
        events("t3").await,
        [text_event(1, "three"), text_event(2, "!")]
    );

    // A batch that repeats a stored number fails a shared statement as a
    // whole; the group commit then tries each batch alone: only that one
    // fails. To put both in one transaction, the committer is held busy
    // first: its append for s4 waits on s4's row, locked elsewhere.
    assert!(
        pg.append_turns(&[&batch(&l1, "t1", "again"), &batch(&l3, "t3", "x")])
            .await
            .is_err(),
        "a repeated number fails the shared statement, nothing of it written"
    );
    assert_eq!(events("t3").await.len(), 2);
    let k4 = SessionKey::new("s4");
    let node = NodeStore::new(pg.clone(), "a", ttl);
    for k in [&k1, &k3, &k4] {
        node.claim(k).await.expect("claim").expect("ours");
    }
    node.open_turn(&k4, 1, "t4").await.expect("open");
    client
        .batch_execute("BEGIN; SELECT 1 FROM warden_sessions WHERE key = 's4' FOR UPDATE")
        .await
        .expect("lock s4");
    let before = node.turn_commits();
    let blocked = {
        let node = node.clone();
        let k4 = k4.clone();
        tokio::spawn(async move {
            node.append_turn(&k4, "t4", &[text_event(1, "x")], false)
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let again = vec![text_event(2, "again")];
    let fresh = vec![text_event(3, "more")];
    let both = {
        let node = node.clone();
        let (k1, k3) = (k1.clone(), k3.clone());
        tokio::spawn(async move {
            tokio::join!(
                node.append_turn(&k1, "t1", &again, false),
                node.append_turn(&k3, "t3", &fresh, true),
            )
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    client.batch_execute("ROLLBACK").await.expect("unlock s4");
    within("the blocked append", blocked)
        .await
        .expect("task")
        .expect("s4 appended");
    let (dup, ok) = within("the shared group", both).await.expect("task");
    assert!(matches!(dup, Err(StoreError::Backend { .. })), "{dup:?}");
    assert!(ok.is_ok(), "{ok:?}");
    let after = node.turn_commits();
    assert_eq!(
        (
            after.transactions - before.transactions,
            after.batches - before.batches
        ),
        (2, 3),
        "s4's alone, then the other two together"
    );
    assert_eq!(events("t3").await.len(), 3);
    assert_eq!(
        events("t1").await,
        [text_event(1, "one"), text_event(2, "!")]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_turns_on_a_node_share_transactions_and_every_event_lands_in_order() {
    let Some(config) = fresh_db().await else {
        return;
    };
    let pg = store(&config).await;
    let node = NodeStore::new(pg.clone(), "a", Duration::from_secs(30));
    const TURNS: usize = 40;
    const BATCHES: u64 = 10;
    for i in 0..TURNS {
        let key = SessionKey::new(format!("g{i}"));
        node.claim(&key).await.expect("claim").expect("ours");
        node.open_turn(&key, 1, &format!("gt{i}"))
            .await
            .expect("open");
    }
    let before = node.turn_commits();
    let tasks: Vec<_> = (0..TURNS)
        .map(|i| {
            let node = node.clone();
            tokio::spawn(async move {
                let key = SessionKey::new(format!("g{i}"));
                for seq in 1..=BATCHES {
                    let e = [text_event(seq, &format!("{i}:{seq}"))];
                    node.append_turn(&key, &format!("gt{i}"), &e, seq == BATCHES)
                        .await
                        .expect("append");
                }
            })
        })
        .collect();
    for t in tasks {
        within("the appends", t).await.expect("task");
    }
    let after = node.turn_commits();
    let batches = after.batches - before.batches;
    let transactions = after.transactions - before.transactions;
    assert_eq!(batches, TURNS as u64 * BATCHES);
    assert!(
        transactions < batches,
        "{transactions} transactions for {batches} batches: they were grouped"
    );
    for i in 0..TURNS {
        let turn = pg
            .read_turn(&format!("gt{i}"), 0)
            .await
            .expect("read")
            .expect("turn");
        let want: Vec<_> = (1..=BATCHES)
            .map(|seq| text_event(seq, &format!("{i}:{seq}")))
            .collect();
        assert_eq!(turn.events, want);
        assert!(turn.ended);
    }
}

/// An append marks its turn only when it ends it (or the turn's mark is a
/// minute old): the mark is indexed, so touching it per batch was most of
/// an append's writing. Both paths, one batch alone and batches together;
/// a turn that is not there is still an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn appends_mark_their_turn_when_it_ends_not_at_every_batch() {
    use warden_core::store::StoredEvent;
    use warden_pg::low_level::TurnBatch;
    let Some(config) = fresh_db().await else {
        return;
    };
    let pg = store(&config).await;
    let (client, conn) = config.connect(NoTls).await.expect("connect");
    tokio::spawn(conn);
    let ev = |seq: u64| {
        StoredEvent::new(
            seq,
            warden_core::store::TurnEventData::Text(warden_core::store::turn_event::Delta::new(
                "x",
            )),
        )
        .made_at(Some(warden_core::store::EventTime::from_unix_ms(seq)))
    };
    let marks = |id: &'static str| {
        let client = &client;
        async move {
            let row = client
                .query_one(
                    "SELECT ended, updated_at::text FROM warden_turns WHERE id = $1",
                    &[&id],
                )
                .await
                .expect("the turn");
            (row.get::<_, bool>(0), row.get::<_, String>(1))
        }
    };
    let ttl = Duration::from_secs(30);
    let a = pg
        .acquire(&SessionKey::new("a"), "n", ttl)
        .await
        .expect("acquire")
        .expect("free");
    let b = pg
        .acquire(&SessionKey::new("b"), "n", ttl)
        .await
        .expect("acquire")
        .expect("free");
    pg.open_turn(&a, 1, "ta").await.expect("open");
    pg.open_turn(&b, 1, "tb").await.expect("open");
    let (_, a0) = marks("ta").await;
    let (_, b0) = marks("tb").await;

    tokio::time::sleep(Duration::from_millis(20)).await;
    pg.append_turn(&a, "ta", &[ev(1)], false)
        .await
        .expect("append");
    let batch = TurnBatch {
        lease: b.clone(),
        id: "tb".to_owned(),
        events: vec![ev(1)],
        ended: false,
    };
    let done = pg.append_turns(&[&batch]).await.expect("append");
    assert!(done[0].is_ok(), "{done:?}");
    assert_eq!(
        marks("ta").await,
        (false, a0.clone()),
        "not touched mid-turn"
    );
    assert_eq!(
        marks("tb").await,
        (false, b0.clone()),
        "not touched mid-turn"
    );

    pg.append_turn(&a, "ta", &[ev(2)], true)
        .await
        .expect("append");
    let last = TurnBatch {
        events: vec![ev(2)],
        ended: true,
        ..batch
    };
    let done = pg.append_turns(&[&last]).await.expect("append");
    assert!(done[0].is_ok(), "{done:?}");
    let (ended, a1) = marks("ta").await;
    assert!(ended && a1 > a0, "marked at its end: {a1} after {a0}");
    let (ended, b1) = marks("tb").await;
    assert!(ended && b1 > b0, "marked at its end: {b1} after {b0}");

    // A stale mark is refreshed by any batch.
    pg.open_turn(&a, 2, "ta2").await.expect("open");
    client
        .execute(
            "UPDATE warden_turns SET updated_at = now() - interval '2 minutes' WHERE id = 'ta2'",
            &[],
        )
        .await
        .expect("age");
    let (_, stale) = marks("ta2").await;
    pg.append_turn(&a, "ta2", &[ev(1)], false)
        .await
        .expect("append");
    let (ended, fresh) = marks("ta2").await;
    assert!(!ended && fresh > stale, "refreshed: {fresh} after {stale}");

    assert!(pg.append_turn(&a, "none", &[ev(1)], false).await.is_err());
    let ghost = TurnBatch {
        lease: b,
        id: "none".to_owned(),
        events: vec![ev(1)],
        ended: false,
    };
    let done = pg.append_turns(&[&ghost]).await.expect("append");
    assert!(done[0].is_err(), "a turn that is not there: {done:?}");
    let stray: i64 = client
        .query_one(
            "SELECT count(*) FROM warden_turn_events WHERE turn_id = 'none'",
            &[],
        )
        .await
        .expect("count")
        .get(0);
    assert_eq!(stray, 0, "a refused append writes nothing");
}
