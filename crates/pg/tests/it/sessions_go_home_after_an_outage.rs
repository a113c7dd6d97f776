//! After a database outage a node takes back first the sessions it gave
//! up for it, and the other nodes leave them to it for the return grace,
//! against a real PostgreSQL (`WARDEN_PG_URL`; skipped with a message
//! without it, failed under `WARDEN_REQUIRE_POSTGRES=1`).

use std::sync::Arc;
use std::time::Duration;

use tokio_postgres::NoTls;
use warden_core::testing::{ChannelSource, ChannelSourceControl};
use warden_core::{EventSource, SessionKey, Supervisor};
use warden_pg::cluster::Node;
use warden_pg::low_level::{NodeStore, PgStore, RETAKE_COOLDOWN};

use crate::common::{Outage, admin_url, fresh_db, store, within};

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

/// Runs `sql` on the test's database.
async fn sql(config: &tokio_postgres::Config, sql: &str) {
    let (client, conn) = config.connect(NoTls).await.expect("connect");
    tokio::spawn(conn);
    client.batch_execute(sql).await.expect(sql);
}

/// Session `key` with a message waiting, its turn streaming in
/// `supervisor`: the turn (dropping it cancels it) and its attempt.
async fn waiting_on(
    supervisor: &Supervisor,
    control: &ChannelSourceControl,
    key: &SessionKey,
) -> (
    warden_core::TurnHandle,
    warden_core::testing::AttemptControl,
) {
    let turn = within("send", supervisor.send(key.clone(), "hello"))
        .await
        .expect("accepted");
    let attempt = within("the stream opens", control.next_attempt())
        .await
        .expect("an attempt");
    (turn, attempt)
}

async fn register(pg: &PgStore, node: &str, ttl: Duration) {
    pg.register_node_with_ttl(node, "http://x.invalid", ttl)
        .await
        .expect("register");
}

/// An owner that beat after its lease expired (it lived through an outage
/// and is back) keeps the session for the return grace: another node's
/// take is refused until then, the owner's own is not; an owner that has
/// not beaten since (dead) loses it after the takeover grace, as ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_alive_again_keeps_its_session_for_the_return_grace() {
    let Some(config) = fresh_db().await else {
        return;
    };
    let pg = store(&config).await;
    let ttl = Duration::from_millis(600);
    for node in ["node-a", "node-b", "node-dead"] {
        register(&pg, node, ttl).await;
    }
    let grace = Duration::from_secs(2);
    let a = NodeStore::new(pg.clone(), "node-a", ttl).with_return_grace(grace);
    let b = NodeStore::new(pg.clone(), "node-b", ttl).with_return_grace(grace);
    let dead = NodeStore::new(pg.clone(), "node-dead", ttl);
    let (back, gone) = (SessionKey::new("back"), SessionKey::new("gone"));
    assert!(a.claim(&back).await.expect("claim").is_some());
    assert!(dead.claim(&gone).await.expect("claim").is_some());

    // Both leases expired a second ago; A beats after that, the dead node
    // last beat before.
    sql(
        &config,
        "UPDATE warden_sessions SET lease_until = now() - interval '1 second'; \
         UPDATE warden_nodes SET heartbeat_at = now() - interval '2 seconds' \
           WHERE node_id = 'node-dead'; \
         UPDATE warden_nodes SET heartbeat_at = now() WHERE node_id = 'node-a'",
    )
    .await;
    assert_eq!(b.claim(&back).await.expect("claim"), None, "A is back");
    assert!(
        b.claim(&gone).await.expect("claim").is_some(),
        "dead: taken"
    );

    // Past the return grace, the session is anyone's.
    sql(
        &config,
        "UPDATE warden_sessions SET lease_until = now() - interval '2.1 seconds' \
         WHERE key = 'back'",
    )
    .await;
    let taken = b.claim(&back).await.expect("claim").expect("taken");
    assert_eq!(taken.epoch, 2);

    // Within it, the owner itself takes its session back at once.
    let again = SessionKey::new("again");
    assert!(a.claim(&again).await.expect("claim").is_some());
    sql(
        &config,
        "UPDATE warden_sessions SET lease_until = now() - interval '1 second' \
         WHERE key = 'again'; \
         UPDATE warden_nodes SET heartbeat_at = now() WHERE node_id = 'node-a'",
    )
    .await;
    assert_eq!(b.claim(&again).await.expect("claim"), None);
    assert!(a.claim(&again).await.expect("claim").is_some());
}

/// A real outage: node A gives up its three streaming sessions (it cannot
/// renew), node B lives through the same outage. When the database is
/// back, B's scans take a dead node's orphan but none of A's; A's first
/// scan past the re-take cooldown takes all three back before anything
/// else, and says they came home.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_takes_back_first_the_sessions_an_outage_made_it_give_up() {
    let Some(config) = fresh_db().await else {
        return;
    };
    let Some(admin) = admin_url() else {
        return;
    };
    let db = config.get_dbname().expect("a database").to_owned();
    let pg = store(&config).await;
    let ttl = Duration::from_millis(600);
    for node in ["node-a", "node-b", "node-dead"] {
        register(&pg, node, ttl).await;
    }
    let a = NodeStore::new(pg.clone(), "node-a", ttl);
    let b = NodeStore::new(pg.clone(), "node-b", ttl);
    let dead = NodeStore::new(pg.clone(), "node-dead", ttl);
    let (sup_a, control_a) = supervisor_on(&a).await;
    let (sup_b, _control_b) = supervisor_on(&b).await;
    let (sup_dead, control_dead) = supervisor_on(&dead).await;
    let homes: Vec<SessionKey> = (0..3).map(|i| SessionKey::new(format!("a{i}"))).collect();
    let mut turns = Vec::new();
    for key in &homes {
        turns.push(waiting_on(&sup_a, &control_a, key).await);
    }
    // Two sessions of a node that died long before the outage (their
    // messages waiting, nothing running them).
    let orphans = [SessionKey::new("dead-1"), SessionKey::new("dead-2")];
    for key in &orphans {
        turns.push(waiting_on(&sup_dead, &control_dead, key).await);
    }
    within("the dead node stops", sup_dead.shutdown()).await;
    sql(
        &config,
        "UPDATE warden_sessions SET lease_until = now() + interval '1 hour' \
           WHERE owner = 'node-dead'; \
         UPDATE warden_nodes SET heartbeat_at = now() - interval '1 hour' \
           WHERE node_id = 'node-dead'",
    )
    .await;

    // The database goes away: A's renewals fail for a TTL and it gives its
    // leases up; B's scans fail.
    let outage = Outage::begin(&admin, &db).await;
    assert!(a.renew_all().await.is_err());
    assert!(
        within("B's scan", Node::headless(b.clone()).take_over(&sup_b))
            .await
            .taken
            .is_empty()
    );
    tokio::time::sleep(ttl).await;
    assert_eq!(a.fence_expired(), 3);
    for key in &homes {
        let _ = within("evict", sup_a.evict(key.clone())).await;
    }
    tokio::time::sleep(ttl * 2).await;
    outage.end().await;
    // One of the dead node's sessions expired long ago, as if before the
    // outage.
    sql(
        &config,
        "UPDATE warden_sessions SET lease_until = now() - interval '1 minute' \
           WHERE key = 'dead-1'",
    )
    .await;

    // B is back first: it takes the dead node's orphan, none of A's.
    // (Its first scans may find the pool's connections cut.)
    let taken_b = within("B takes the dead node's orphan", async {
        let mut taken = Vec::new();
        while taken.is_empty() {
            let done = Node::headless(b.clone()).take_over(&sup_b).await;
            taken.extend(done.taken.into_iter().map(|(k, _)| k));
            tokio::time::sleep(done.next_scan).await;
        }
        taken
    })
    .await;
    assert_eq!(taken_b, [orphans[0].clone()], "B's scan");
    pg.heartbeat("node-a").await.expect("A beats");
    sql(
        &config,
        "UPDATE warden_sessions SET lease_until = now() - interval '1 minute' \
           WHERE key = 'dead-2'",
    )
    .await;
    // B again, A alive: A's sessions stay A's (the other dead one, taken
    // by whoever scans first, is left for A here to show the order).
    for key in &homes {
        assert_eq!(b.claim(key).await.expect("claim"), None, "{key} is A's");
    }

    // A takes its three back first, once its cooldown allows, then the
    // orphan.
    let started = tokio::time::Instant::now();
    let done = within("A takes its sessions back", async {
        loop {
            let done = Node::headless(a.clone()).take_over(&sup_a).await;
            if !done.taken.is_empty() || !done.returned.is_empty() {
                return done;
            }
            tokio::time::sleep(done.next_scan).await;
        }
    })
    .await;
    // Its own three are returns (nothing moved), the orphan a takeover.
    let mut returned: Vec<&SessionKey> = done.returned.iter().map(|(k, _)| k).collect();
    returned.sort();
    assert_eq!(returned, homes.iter().collect::<Vec<_>>(), "home: {done:?}");
    let taken_a: Vec<&SessionKey> = done.taken.iter().map(|(k, _)| k).collect();
    assert_eq!(taken_a, [&orphans[1]], "{done:?}");
    assert!(started.elapsed() < RETAKE_COOLDOWN + Duration::from_secs(1));
    for key in &homes {
        assert_eq!(a.lease_of(key).map(|l| l.epoch), Some(2), "{key}");
        assert!(a.came_home(key), "{key}");
    }
    assert!(!a.came_home(&orphans[1]));
}
