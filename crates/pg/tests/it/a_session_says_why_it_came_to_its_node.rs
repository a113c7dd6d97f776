//! A node that re-delivers a turn says why the session came to it, one
//! code per cause (`Placement::arrival`), on a real PostgreSQL
//! (`WARDEN_PG_URL`; skipped with a message without it): given back by a
//! node that stopped cleanly (`ENODE_DRAINED`), taken after its node died
//! (`ENODE_LOST`), taken from a node that lived on but lost the database,
//! or right after this node's own database outage (`ESTORE_UNREACHABLE`).

use std::time::Duration;

use tokio_postgres::NoTls;
use warden_core::SessionKey;
use warden_core::cluster::Arrival;
use warden_pg::cluster::Node;
use warden_pg::low_level::NodeStore;

use crate::common::{Outage, admin_url, fresh_db, store, within};

/// Expires `key`'s lease by the database's clock (its node stopped
/// renewing it), as if its TTL had run out.
async fn expire(config: &tokio_postgres::Config, key: &str) {
    let (client, conn) = config.connect(NoTls).await.expect("connect");
    tokio::spawn(conn);
    client
        .execute(
            "UPDATE warden_sessions SET lease_until = now() - interval '1 second' WHERE key = $1",
            &[&key],
        )
        .await
        .expect("expire");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handover_a_death_and_a_node_that_lived_each_have_their_code() {
    let Some(config) = fresh_db().await else {
        return;
    };
    let pg = store(&config).await;
    let ttl = Duration::from_millis(600);
    let a = NodeStore::new(pg.clone(), "node-a", ttl);
    // (No return grace: the leases here expire by hand, after A's beats,
    // and B is to take them at once.)
    let b = NodeStore::new(pg.clone(), "node-b", ttl).with_return_grace(Duration::ZERO);
    let placement = Node::new(b.clone(), "http://b.invalid").placement();

    // Given back (a drain): a handover.
    let drained = SessionKey::new("drained");
    assert!(a.claim(&drained).await.expect("claim").is_some());
    a.release(&drained).await.expect("release");
    assert!(b.claim(&drained).await.expect("claim").is_some());
    assert_eq!(
        within("arrival", placement.arrival(&drained)).await,
        Some(Arrival::Handover)
    );

    // Its lease ran out and its node is silent since: a death — even
    // with a heartbeat younger than its TTL when the session is taken (a
    // node killed just after it beat).
    pg.register_node_with_ttl("node-a", "http://a.invalid", ttl)
        .await
        .expect("register");
    let died = SessionKey::new("died");
    assert!(a.claim(&died).await.expect("claim").is_some());
    pg.heartbeat("node-a").await.expect("beat");
    expire(&config, "died").await;
    assert!(b.claim(&died).await.expect("claim").is_some());
    assert_eq!(
        within("arrival", placement.arrival(&died)).await,
        Some(Arrival::NodeLost)
    );

    // Its lease ran out but its node beats again after the take: it lived,
    // and gave the session up because it could not reach the database.
    let lived = SessionKey::new("lived");
    assert!(a.claim(&lived).await.expect("claim").is_some());
    expire(&config, "lived").await;
    assert!(b.claim(&lived).await.expect("claim").is_some());
    tokio::time::sleep(Duration::from_millis(20)).await;
    pg.heartbeat("node-a").await.expect("beat");
    assert_eq!(
        within("arrival", placement.arrival(&lived)).await,
        Some(Arrival::StoreUnreachable)
    );

    // A session never moved: nothing to say.
    let fresh = SessionKey::new("fresh");
    assert!(b.claim(&fresh).await.expect("claim").is_some());
    assert_eq!(within("arrival", placement.arrival(&fresh)).await, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_taken_right_after_this_nodes_outage_says_the_store_was_unreachable() {
    let Some(config) = fresh_db().await else {
        return;
    };
    let Some(admin) = admin_url() else {
        return;
    };
    let db = config.get_dbname().expect("a database").to_owned();
    let pg = store(&config).await;
    let ttl = Duration::from_millis(600);
    let a = NodeStore::new(pg.clone(), "node-a", ttl);
    pg.register_node_with_ttl("node-a", "http://a.invalid", ttl)
        .await
        .expect("register");
    let key = SessionKey::new("k");
    assert!(a.claim(&key).await.expect("claim").is_some());

    // (No return grace: B is to take the session as soon as the database
    // answers, as a node did before sessions went home.)
    let b = NodeStore::new(pg.clone(), "node-b", ttl).with_return_grace(Duration::ZERO);
    let (source, _control) = warden_core::testing::ChannelSource::new();
    let factory =
        move |_: &SessionKey| source.clone() as std::sync::Arc<dyn warden_core::EventSource>;
    let supervisor = within(
        "supervisor",
        warden_core::Supervisor::builder(std::sync::Arc::new(factory))
            .store(std::sync::Arc::new(b.clone()))
            .start(),
    )
    .await
    .expect("supervisor");
    let mut node = Node::new(b.clone(), "http://b.invalid");
    let mut events = node.events();
    within("join", node.join(&supervisor)).await.expect("join");

    // The database goes away (new connections refused, open ones cut) for
    // a few of B's heartbeats, then comes back.
    let outage = Outage::begin(&admin, &db).await;
    within("B's heartbeat to fail", async {
        loop {
            if let Ok(warden_pg::cluster::NodeEvent::HeartbeatFailed { .. }) = events.recv().await {
                return;
            }
        }
    })
    .await;
    tokio::time::sleep(ttl * 2).await;
    outage.end().await;

    // A's lease ran out meanwhile (A is silent, as if dead); B takes the
    // session as the database answers: the outage, not a death, moved it.
    expire(&config, "k").await;
    let taken = within("B takes it", async {
        loop {
            if let Ok(Some(_)) = b.claim(&key).await {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    let () = taken;
    assert_eq!(
        within("arrival", node.placement().arrival(&key)).await,
        Some(Arrival::StoreUnreachable)
    );
    drop(node);
}
