//! The membership tells the operator the truth, on a real PostgreSQL
//! (`WARDEN_PG_URL`; skipped with a message without it): a node that
//! leaves cleanly (a SIGTERM drain) is `left` at once — never `alive` for
//! a while and then `dead`, which fired `WardenNodeSilent` after every
//! planned drain — a node that stops beating is `dead` once its heartbeat
//! is older than its own lease TTL (stored with its heartbeat), not after
//! a fixed 30 s, and the dead and the left are forgotten in one call.

use std::sync::Arc;
use std::time::Duration;

use warden_core::testing::ChannelSource;
use warden_core::{EventSource, SessionKey, Supervisor};
use warden_pg::cluster::Node;
use warden_pg::cluster::NodeState;
use warden_pg::low_level::{NodeStore, PgStore};

use crate::common::{fresh_db, store, within};

/// A node of `ttl` joined on `pg` (its supervisor kept alive with it).
async fn joined(pg: &PgStore, id: &str, ttl: Duration) -> (Node, Supervisor) {
    let store = NodeStore::new(pg.clone(), id, ttl);
    let (source, _control) = ChannelSource::new();
    let factory = move |_: &SessionKey| source.clone() as Arc<dyn EventSource>;
    let supervisor = within(
        "supervisor",
        Supervisor::builder(Arc::new(factory))
            .store(Arc::new(store.clone()))
            .start(),
    )
    .await
    .expect("supervisor starts");
    let mut node = Node::new(store, format!("http://{id}.invalid:8700"));
    within("join", node.join(&supervisor))
        .await
        .expect("the node joins");
    (node, supervisor)
}

/// Each node's state as the database says it, by id.
async fn states(pg: &PgStore) -> Vec<(String, NodeState)> {
    let mut all: Vec<(String, NodeState)> = within("nodes", pg.nodes())
        .await
        .expect("nodes")
        .into_iter()
        .map(|n| (n.node_id, n.state))
        .collect();
    all.sort_by(|a, b| a.0.cmp(&b.0));
    all
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_leaves_is_left_at_once() {
    let Some(config) = fresh_db().await else {
        return;
    };
    let pg = store(&config).await;
    let (node, supervisor) = joined(&pg, "drained", Duration::from_secs(30)).await;
    assert_eq!(
        states(&pg).await,
        [("drained".to_owned(), NodeState::Alive)]
    );
    supervisor.shutdown().await;
    within("leave", node.leave()).await;
    assert_eq!(
        states(&pg).await,
        [("drained".to_owned(), NodeState::Left)],
        "a drained node is left, not alive until it is dead"
    );
    // Starting again under the same id makes it a member again.
    let (_again, _sup) = joined(&pg, "drained", Duration::from_secs(30)).await;
    assert_eq!(
        states(&pg).await,
        [("drained".to_owned(), NodeState::Alive)]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_node_is_dead_once_its_heartbeat_is_older_than_its_own_ttl() {
    let Some(config) = fresh_db().await else {
        return;
    };
    let pg = store(&config).await;
    let ttl = Duration::from_millis(600);
    let (short, _s1) = joined(&pg, "short", ttl).await;
    let (_long, _s2) = joined(&pg, "long", Duration::from_secs(30)).await;
    let nodes = pg.nodes().await.expect("nodes");
    let short_info = nodes.iter().find(|n| n.node_id == "short").expect("short");
    assert_eq!(short_info.ttl, Some(ttl), "the TTL is stored with the node");
    // Beating every third of its TTL, it stays alive.
    tokio::time::sleep(ttl * 2).await;
    assert_eq!(
        states(&pg).await,
        [
            ("long".to_owned(), NodeState::Alive),
            ("short".to_owned(), NodeState::Alive)
        ]
    );
    // Killed (dropped without leaving): it stops beating, and is dead as
    // soon as its last heartbeat is a TTL old — long before 30 s.
    drop(short);
    let dead = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            let now = states(&pg).await;
            if now.contains(&("short".to_owned(), NodeState::Dead)) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    assert!(
        dead.is_ok(),
        "a node silent for 5 s with a {ttl:?} TTL is still not dead: {:?}",
        states(&pg).await
    );
    assert!(
        states(&pg)
            .await
            .contains(&("long".to_owned(), NodeState::Alive)),
        "a node beating within its own TTL stays alive"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dead_and_the_left_are_forgotten_in_one_call_and_the_alive_never() {
    let Some(config) = fresh_db().await else {
        return;
    };
    let pg = store(&config).await;
    let ttl = Duration::from_millis(600);
    let (alive, _s1) = joined(&pg, "alive", ttl).await;
    let (dead, _s2) = joined(&pg, "dead", ttl).await;
    let (left, s3) = joined(&pg, "left", ttl).await;
    s3.shutdown().await;
    left.leave().await;
    drop(dead);
    tokio::time::sleep(ttl * 3).await;

    // One at a time, by state: the left only.
    let forgotten = pg.forget_nodes(false, true).await.expect("forget");
    assert_eq!(forgotten, ["left"]);
    // Both kinds in one call (none left now but the dead one).
    let (left, s4) = joined(&pg, "left-2", ttl).await;
    s4.shutdown().await;
    left.leave().await;
    let mut forgotten = pg.forget_nodes(true, true).await.expect("forget");
    forgotten.sort();
    assert_eq!(forgotten, ["dead", "left-2"]);
    assert_eq!(states(&pg).await, [("alive".to_owned(), NodeState::Alive)]);
    // A live node is not forgotten by name either (it would register
    // again); a left one is, at once.
    assert!(!pg.forget_node("alive", None).await.expect("forget"));
    drop(alive);
}
