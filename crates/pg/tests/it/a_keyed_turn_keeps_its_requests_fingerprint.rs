//! A turn sent with an idempotency key keeps the fingerprint of the request
//! that sent it (its message, model and agent, as `warden serve` digests
//! them) in the cluster's database, so any node refuses the same key with
//! another body: stored with the turn's row in the statement that opens it,
//! read back by every node, kept when another node re-delivers the message
//! (which has none) and never replaced. Turns without one read as unknown.
//! Needs `WARDEN_PG_URL` (see `common`).

use std::time::Duration;

use warden_core::SessionKey;
use warden_core::store::{TurnStore as _, TurnStoreError};
use warden_pg::low_level::{NodeStore, TAKEOVER_GRACE};

use crate::common::{fresh_db, store};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_turn_keeps_the_fingerprint_of_its_first_request_on_every_node() {
    let Some(config) = fresh_db().await else {
        return;
    };
    let pg = store(&config).await;
    let key = SessionKey::new("ws");
    let ttl = Duration::from_millis(600);

    // Node A runs the session; its turn store opens a keyed turn.
    let a = NodeStore::new(pg.clone(), "node-a", ttl);
    a.claim(&key).await.expect("claim").expect("free");
    let asked = warden_core::store::TurnAsked::new("what is in the box?")
        .with_model(Some("m-1".into()))
        .with_trace_id(Some("0af7651916cd43dd8448eb211c80319c".into()));
    let opened = a
        .turns()
        .open(&key, 1, "turn_keyed", Some("fp-first"), &asked)
        .await
        .expect("open");
    assert_eq!(opened.id, "turn_keyed");
    assert_eq!(opened.asked, asked, "what it asked is kept with it");
    let read = pg.read_turn("turn_keyed", 0).await.expect("read");
    assert_eq!(read.expect("known").asked, asked);
    let listed = pg.recent_turns(&key, 1).await.expect("recent");
    assert_eq!(listed[0].asked, asked);
    assert_eq!(opened.fingerprint.as_deref(), Some("fp-first"));
    // A turn without a key: unknown.
    let plain = a
        .turns()
        .open(
            &key,
            2,
            "turn_plain",
            None,
            &warden_core::store::TurnAsked::default(),
        )
        .await
        .expect("open");
    assert_eq!(plain.fingerprint, None);
    // Any node reads it from the database (a retry arriving elsewhere).
    let b = NodeStore::new(pg.clone(), "node-b", ttl);
    let read = b.turns().read("turn_keyed", 0).await.expect("read");
    let read = read.expect("known");
    assert_eq!(read.fingerprint.as_deref(), Some("fp-first"));
    let read = pg.read_turn("turn_plain", 0).await.expect("read");
    assert_eq!(read.expect("known").fingerprint, None);

    // A dies; B takes the session over and re-delivers the message (no
    // fingerprint), then a request with another one reaches it: the first
    // is kept.
    tokio::time::sleep(ttl + TAKEOVER_GRACE + Duration::from_millis(200)).await;
    b.claim(&key).await.expect("claim").expect("expired: taken");
    for given in [None, Some("fp-other")] {
        let again = b
            .turns()
            .open(
                &key,
                1,
                "turn_b",
                given,
                &warden_core::store::TurnAsked::default(),
            )
            .await
            .expect("open");
        assert_eq!(again.id, "turn_keyed", "the re-delivered turn keeps its id");
        assert_eq!(again.fingerprint.as_deref(), Some("fp-first"), "{given:?}");
    }
    let read = pg.read_turn("turn_keyed", 0).await.expect("read");
    assert_eq!(
        read.expect("known").fingerprint.as_deref(),
        Some("fp-first")
    );

    // A, which no longer holds the lease, cannot open a keyed turn: the
    // session moved, and A forgets the lease (as for every write).
    let lost = a
        .turns()
        .open(
            &key,
            3,
            "turn_late",
            Some("fp-late"),
            &warden_core::store::TurnAsked::default(),
        )
        .await;
    assert!(matches!(lost, Err(TurnStoreError::Moved(_))), "{lost:?}");
    assert!(a.lease_of(&key).is_none(), "A forgot the lease it lost");
    assert!(pg.read_turn("turn_late", 0).await.expect("read").is_none());
}

/// A turn row written before the column existed (a node of an older
/// warden, or before the migration) reads as unknown, and opening it again
/// with a fingerprint does not fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_stored_without_a_fingerprint_reads_as_unknown() {
    let Some(config) = fresh_db().await else {
        return;
    };
    let pg = store(&config).await;
    let key = SessionKey::new("old");
    let node = NodeStore::new(pg.clone(), "node-a", Duration::from_secs(30));
    node.claim(&key).await.expect("claim").expect("free");
    // As an older node writes it: no fingerprint column in its INSERT.
    let (client, conn) = config
        .connect(tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(conn);
    client
        .execute(
            "INSERT INTO warden_turns (id, key, message_id, ended) VALUES ('turn_old', 'old', 1, true)",
            &[],
        )
        .await
        .expect("insert");
    let read = pg.read_turn("turn_old", 0).await.expect("read");
    assert_eq!(read.expect("known").fingerprint, None);
    let opened = node
        .turns()
        .open(
            &key,
            1,
            "turn_x",
            Some("fp"),
            &warden_core::store::TurnAsked::default(),
        )
        .await
        .expect("open");
    assert_eq!(opened.id, "turn_old");
    assert!(opened.ended);
}
