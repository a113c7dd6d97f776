//! `warden_pg::cluster::Node`, the cluster node as a library, against a
//! real PostgreSQL (`WARDEN_PG_URL`; skipped with a message without it,
//! failed under `WARDEN_REQUIRE_POSTGRES=1`): it registers itself, stops a
//! session here the moment its lease moves to another node, takes over a
//! dead node's session and re-sends its message, reports each as a
//! `NodeEvent`, and hands its sessions back when it leaves.

use crate::common;
use std::sync::Arc;
use std::time::Duration;

use tokio_postgres::NoTls;
use warden_core::testing::{ChannelSource, ChannelSourceControl};
use warden_core::{Durability, EventSource, SessionKey, SessionRecord, SessionStore, Supervisor};
use warden_pg::cluster::{Node, NodeEvent};
use warden_pg::low_level::NodeStore;

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

/// The next event that `pick` accepts (others are skipped).
async fn next_event<T>(
    events: &mut tokio::sync::broadcast::Receiver<NodeEvent>,
    what: &str,
    mut pick: impl FnMut(&NodeEvent) -> Option<T>,
) -> T {
    within(what, async {
        loop {
            let event = events.recv().await.expect("the node's events");
            if let Some(found) = pick(&event) {
                return found;
            }
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_joins_evicts_what_it_lost_takes_over_orphans_and_leaves() {
    let Some(config) = fresh_db().await else {
        return;
    };
    let pg = store(&config).await;
    let ttl = Duration::from_millis(900);
    let store = NodeStore::new(pg.clone(), "node-a", ttl);
    let (supervisor, control) = supervisor_on(&store).await;

    // Joining registers the node where the others find it.
    let mut node = Node::new(store.clone(), "http://10.0.0.5:8080");
    let mut events = node.events();
    within("join", node.join(&supervisor))
        .await
        .expect("the node joins");
    let joined = next_event(&mut events, "joined", |e| match e {
        NodeEvent::Joined { node, ttl } => Some((node.clone(), *ttl)),
        _ => None,
    })
    .await;
    assert_eq!(joined, ("node-a".to_owned(), ttl));
    let nodes = pg.nodes().await.expect("nodes");
    assert!(
        nodes
            .iter()
            .any(|n| n.node_id == "node-a" && n.advertise == "http://10.0.0.5:8080"),
        "{nodes:?}"
    );

    // Nodes that stopped beating are removed after the retention, and
    // only those.
    pg.register_node("gone", "http://10.0.0.9:8080")
        .await
        .expect("register");
    tokio::time::sleep(Duration::from_millis(1200)).await;
    pg.heartbeat("node-a").await.expect("beat");
    assert_eq!(
        pg.forget_dead_nodes(Duration::from_secs(1))
            .await
            .expect("forget"),
        1
    );
    let ids: Vec<String> = pg
        .nodes()
        .await
        .expect("nodes")
        .into_iter()
        .map(|n| n.node_id)
        .collect();
    assert_eq!(ids, ["node-a"]);

    // A turn here takes s1's lease; the placement runs s1 here.
    let s1 = SessionKey::new("s1");
    assert!(within("place", node.placement().place(&s1)).await.is_ok());
    let turn = within("send", supervisor.send(s1.clone(), "hello"))
        .await
        .expect("accepted");
    let attempt = within("the stream opens", control.next_attempt())
        .await
        .expect("an attempt");
    attempt.text("hi");
    attempt.finish();
    within("the turn ends", turn.finish())
        .await
        .expect("answered");
    assert_eq!(store.lease_of(&s1).map(|l| l.epoch), Some(1));
    assert!(supervisor.sessions().await.expect("sessions").contains(&s1));

    // Its lease runs out by the database's clock and node-b takes s1: the
    // copy here stops, and the node says so.
    let (client, conn) = config.connect(NoTls).await.expect("connect");
    tokio::spawn(conn);
    client
        .execute(
            "UPDATE warden_sessions SET lease_until = now() - interval '1 second' WHERE key = 's1'",
            &[],
        )
        .await
        .expect("expire");
    // (node-a beats on: with a return grace, node-b would leave it the
    // session for a while, as to a node back from a database outage.)
    let b = NodeStore::new(pg.clone(), "node-b", ttl).with_return_grace(Duration::ZERO);
    assert!(b.claim(&s1).await.expect("claim").is_some());
    let moved = next_event(&mut events, "the session moved", |e| match e {
        NodeEvent::SessionMoved { key, epoch } => Some((key.clone(), *epoch)),
        _ => None,
    })
    .await;
    assert_eq!(moved, (s1.clone(), 1));
    within("evicted", async {
        while supervisor.sessions().await.expect("sessions").contains(&s1) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    // Placing s1 now points at its owner, where node-b is reached.
    pg.register_node("node-b", "http://10.0.0.6:8080")
        .await
        .expect("register");
    let elsewhere = within("place", node.placement().place(&s1))
        .await
        .expect_err("s1 is node-b's");
    assert_eq!(elsewhere.owner.as_deref(), Some("node-b"));
    assert_eq!(elsewhere.advertise.as_deref(), Some("http://10.0.0.6:8080"));

    // A dead node's session with an unanswered message: taken over here,
    // the message re-sent, and reported.
    let orphan = SessionKey::new("orphan");
    let mut record = SessionRecord::new(&orphan, None);
    record.accept("are you there?");
    pg.save(&record, Durability::Flushed).await.expect("save");
    let taken = next_event(&mut events, "the takeover", |e| match e {
        NodeEvent::TookOver { key, epoch } => Some((key.clone(), *epoch)),
        _ => None,
    })
    .await;
    assert_eq!(taken, (orphan.clone(), 1));
    let resent = within("the re-sent message", control.next_attempt())
        .await
        .expect("an attempt");
    assert_eq!(resent.request.session_key, orphan);
    assert_eq!(resent.request.message, "are you there?");
    resent.text("yes");
    resent.finish();

    // Leaving gives the leases back at once: another node may take the
    // session now, not a TTL later.
    supervisor.shutdown().await;
    within("leave", node.leave()).await;
    let info = pg.lease_info(&orphan).await.expect("info");
    assert!(
        info.remaining_secs.is_none_or(|s| s <= 0.0),
        "released: {info:?}"
    );
    assert!(b.claim(&orphan).await.expect("claim").is_some());
}

/// The database goes away under a node (dropped with its connections, as a
/// crash would cut them): the node's placement is not ready and says why,
/// and a session it is asked to place gets "database unreachable", not
/// "another node (unknown)".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_cannot_reach_its_database_is_not_ready() {
    let Some(config) = fresh_db().await else {
        return;
    };
    let pg = store(&config).await;
    let store = NodeStore::new(pg, "node-a", Duration::from_secs(10));
    let node = Node::new(store, "http://10.0.0.5:8080");
    let placement = node.placement();
    within("ready", placement.ready())
        .await
        .expect("ready while the database answers");

    let name = config.get_dbname().expect("a database").to_owned();
    let mut admin = config.clone();
    admin.dbname("postgres");
    let (client, conn) = within("connect", admin.connect(NoTls))
        .await
        .expect("admin connection");
    tokio::spawn(conn);
    within(
        "drop the database",
        client.batch_execute(&format!("DROP DATABASE {name} WITH (FORCE)")),
    )
    .await
    .expect("dropped");

    let why = within("ready", placement.ready())
        .await
        .expect_err("not ready without the database");
    assert!(why.contains("database"), "{why}");
    let elsewhere = within("place", placement.place(&SessionKey::new("s1")))
        .await
        .expect_err("cannot place");
    assert!(elsewhere.store_unreachable.is_some(), "{elsewhere:?}");
    assert_eq!(elsewhere.owner, None);
}

/// An outage of the heartbeat is one report when it starts and one when it
/// ends, not one per tick (the membership table is renamed away and back,
/// which fails every heartbeat in between as an outage would).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_is_reported_once_and_its_end_once() {
    let Some(config) = fresh_db().await else {
        return;
    };
    let pg = store(&config).await;
    let store = NodeStore::new(pg, "node-a", Duration::from_millis(600));
    let (supervisor, _control) = supervisor_on(&store).await;
    let mut node = Node::new(store, "http://10.0.0.5:8080");
    let mut events = node.events();
    within("join", node.join(&supervisor)).await.expect("joins");

    let (client, conn) = config.connect(NoTls).await.expect("connect");
    tokio::spawn(conn);
    client
        .batch_execute("ALTER TABLE warden_nodes RENAME TO warden_nodes_away")
        .await
        .expect("rename away");
    // Five heartbeat ticks (every 200 ms) fail.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    client
        .batch_execute("ALTER TABLE warden_nodes_away RENAME TO warden_nodes")
        .await
        .expect("rename back");
    let mut failures = 0;
    let down_for = next_event(&mut events, "the end of the outage", |e| match e {
        NodeEvent::DatabaseBack { down_for } => Some(*down_for),
        NodeEvent::HeartbeatFailed { .. } => {
            failures += 1;
            None
        }
        _ => None,
    })
    .await;
    assert_eq!(failures, 1, "one report for the whole outage");
    assert!(down_for >= Duration::from_millis(600), "{down_for:?}");
    supervisor.shutdown().await;
    node.leave().await;
}

/// A dead node's session is taken as soon as the database allows (its
/// lease expired plus the grace), not up to a scan interval later: the
/// take-over that finds it not yet takeable says when to look again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_nodes_session_is_taken_as_soon_as_its_lease_can_be() {
    let Some(config) = fresh_db().await else {
        return;
    };
    let pg = store(&config).await;
    let dead = NodeStore::new(pg.clone(), "dead", Duration::from_secs(10));
    let s1 = SessionKey::new("s1");
    assert!(dead.claim(&s1).await.expect("claim").is_some());
    let mut record = SessionRecord::new(&s1, None);
    record.accept("are you there?");
    dead.save(&record, Durability::Flushed).await.expect("save");

    let alive = NodeStore::new(pg.clone(), "alive", Duration::from_secs(10));
    let (supervisor, control) = supervisor_on(&alive).await;
    let quiet = within(
        "a scan",
        Node::headless(alive.clone()).take_over(&supervisor),
    )
    .await;
    assert!(quiet.taken.is_empty());
    assert_eq!(
        quiet.next_scan,
        alive.scan_interval(),
        "a live lease, far off"
    );

    // The dead node's lease ran out 200 ms ago by the database's clock:
    // takeable 300 ms from now (the grace is 500 ms).
    let (client, conn) = config.connect(NoTls).await.expect("connect");
    tokio::spawn(conn);
    client
        .execute(
            "UPDATE warden_sessions SET lease_until = now() - interval '200 milliseconds' WHERE key = 's1'",
            &[],
        )
        .await
        .expect("expire");
    let early = within(
        "a scan",
        Node::headless(alive.clone()).take_over(&supervisor),
    )
    .await;
    assert!(early.taken.is_empty(), "within the grace: {early:?}");
    assert!(
        early.next_scan >= Duration::from_millis(100)
            && early.next_scan <= Duration::from_millis(400),
        "look again when it can be taken: {:?}",
        early.next_scan
    );
    tokio::time::sleep(early.next_scan).await;
    let taken = within(
        "a scan",
        Node::headless(alive.clone()).take_over(&supervisor),
    )
    .await;
    assert_eq!(taken.taken, [(s1.clone(), 2)]);
    let attempt = within("the message is sent again", control.next_attempt())
        .await
        .expect("an attempt");
    assert_eq!(attempt.request.message, "are you there?");
    attempt.text("yes");
    attempt.finish();
}

/// A node with no HTTP front end joins and runs its sessions; another
/// node is told who runs them but given no address to forward to (not an
/// empty one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_headless_node_runs_sessions_and_is_reached_by_no_address() {
    let Some(config) = fresh_db().await else {
        return;
    };
    let pg = store(&config).await;
    let ttl = Duration::from_secs(5);
    let store_a = NodeStore::new(pg.clone(), "node-a", ttl);
    let (supervisor, control) = supervisor_on(&store_a).await;
    let mut node = Node::headless(store_a.clone());
    within("join", node.join(&supervisor))
        .await
        .expect("a headless node joins");

    let s1 = SessionKey::new("s1");
    assert!(within("place", node.placement().place(&s1)).await.is_ok());
    let turn = within("send", supervisor.send(s1.clone(), "hello"))
        .await
        .expect("accepted");
    let attempt = within("the stream opens", control.next_attempt())
        .await
        .expect("an attempt");
    attempt.finish();
    within("the turn ends", turn.finish())
        .await
        .expect("answered");

    let other = Node::new(NodeStore::new(pg.clone(), "node-b", ttl), "http://b:1");
    let elsewhere = within("place on b", other.placement().place(&s1))
        .await
        .expect_err("s1 runs on node-a");
    assert_eq!(elsewhere.owner.as_deref(), Some("node-a"));
    assert_eq!(elsewhere.advertise, None, "no address to forward to");
    within("leave", node.leave()).await;
    supervisor.shutdown().await;
}

/// The way in for a cluster user: `Node::connect` with the database's URL
/// migrates the schema and gives a node whose store writes a session
/// through its own lease, with the TTL, return grace and address asked for;
/// a URL that is not one is a typed error naming it, not a panic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_connects_by_url_and_writes_through_its_own_lease() {
    let Some(config) = fresh_db().await else {
        return;
    };
    let admin = common::admin_url().expect("configured");
    let db = config.get_dbname().expect("a database");
    let (base, _) = admin
        .rsplit_once('/')
        .expect("the admin URL names a database");
    let url = format!("{base}/{db}");
    let ttl = Duration::from_millis(1500);
    let node = within("connect", Node::connect(&url, "node-url", ttl))
        .await
        .expect("the node connects and migrates")
        .with_advertise("http://10.0.0.9:8080")
        .with_return_grace(Duration::from_millis(250));
    assert_eq!(node.store().node(), "node-url");
    assert_eq!(node.store().ttl(), ttl);
    assert_eq!(node.store().return_grace(), Duration::from_millis(250));
    assert_eq!(node.scan_interval(), Duration::from_millis(375));

    let key = SessionKey::new("by-url");
    let record = SessionRecord::new(&key, None);
    within("save", node.store().save(&record, Durability::Flushed))
        .await
        .expect("saved through the node's lease");
    let info = within("lease", store(&config).await.lease_info(&key))
        .await
        .expect("info");
    assert_eq!(info.owner.as_deref(), Some("node-url"), "{info:?}");

    let bad = within(
        "connect",
        Node::connect("postgres://warden@127.0.0.1:notaport/db", "x", ttl),
    )
    .await
    .expect_err("not a URL");
    assert!(
        matches!(bad, warden_pg::PgError::Url(_)),
        "a typed URL error: {bad:?}"
    );
}
