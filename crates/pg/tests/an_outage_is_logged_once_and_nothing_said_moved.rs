//! What a node logs through a database outage, on a real PostgreSQL
//! (`WARDEN_PG_URL`; skipped with a message without it): one warning when
//! it starts, one `info` when it ends, no error for the leases it gives up
//! (self-fencing is expected: it cannot tell an outage from a partition),
//! and nothing saying a session "moved to another node" when none did.
//!
//! A binary of its own, not a module of `tests/it`: it installs the
//! process's global subscriber (the node's tasks run on the runtime's
//! worker threads) and counts every warning logged, which other tests
//! running in the same process would add to.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use warden_core::SessionKey;
use warden_pg::cluster::{Node, NodeEvent};
use warden_pg::low_level::NodeStore;

#[path = "it/common/mod.rs"]
mod common;

use common::{Outage, admin_url, fresh_db, store, within};

/// Every line logged, kept for the test.
#[derive(Clone, Default)]
struct Logged(Arc<Mutex<Vec<u8>>>);

impl Write for Logged {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Logged {
    fn lines(&self) -> Vec<String> {
        let bytes = self.0.lock().unwrap_or_else(|e| e.into_inner()).clone();
        String::from_utf8_lossy(&bytes)
            .lines()
            .map(str::to_owned)
            .collect()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_is_one_warning_and_one_info_and_nothing_moved() {
    let Some(config) = fresh_db().await else {
        return;
    };
    let Some(admin) = admin_url() else {
        return;
    };
    let logged = Logged::default();
    let sink = logged.clone();
    tracing_subscriber::fmt()
        .with_writer(move || sink.clone())
        .with_ansi(false)
        .without_time()
        .with_max_level(tracing::Level::INFO)
        .init();

    let db = config.get_dbname().expect("a database").to_owned();
    let pg = store(&config).await;
    let ttl = Duration::from_millis(600);
    let b = NodeStore::new(pg.clone(), "node-b", ttl);
    let (source, _control) = warden_core::testing::ChannelSource::new();
    let factory = move |_: &SessionKey| source.clone() as Arc<dyn warden_core::EventSource>;
    let supervisor = within(
        "supervisor",
        warden_core::Supervisor::builder(Arc::new(factory))
            .store(Arc::new(b.clone()))
            .start(),
    )
    .await
    .expect("supervisor");
    let mut node = Node::new(b.clone(), "http://b.invalid");
    let mut events = node.events();
    within("join", node.join(&supervisor)).await.expect("join");
    for k in ["s1", "s2", "s3"] {
        assert!(b.claim(&SessionKey::new(k)).await.expect("claim").is_some());
    }
    let before = logged.lines().len();

    // The database goes away for more than a TTL: the node gives its three
    // leases up, then the database comes back.
    let outage = Outage::begin(&admin, &db).await;
    within("the leases given up", async {
        while !b.held().is_empty() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    tokio::time::sleep(ttl).await;
    outage.end().await;

    let mut seen = Vec::new();
    within("the node to say the database is back", async {
        loop {
            match events.recv().await {
                Ok(e @ NodeEvent::DatabaseBack { .. }) => {
                    seen.push(e);
                    return;
                }
                Ok(e) => seen.push(e),
                Err(e) => panic!("events: {e}"),
            }
        }
    })
    .await;
    // What the node does next with the database back.
    tokio::time::sleep(ttl * 2).await;
    drop(node);

    let moved: Vec<&NodeEvent> = seen
        .iter()
        .filter(|e| matches!(e, NodeEvent::SessionMoved { .. }))
        .collect();
    assert!(moved.is_empty(), "nothing moved: {moved:?}");
    let failed = seen
        .iter()
        .filter(|e| matches!(e, NodeEvent::HeartbeatFailed { .. }))
        .count();
    assert_eq!(failed, 1, "{seen:?}");

    // This crate's lines (the connection pool's own warnings are the
    // binary's to filter: `warden serve` shows deadpool's errors only).
    let lines: Vec<String> = logged
        .lines()
        .split_off(before)
        .into_iter()
        .filter(|l| l.contains(" warden_pg"))
        .collect();
    let at = |level: &str| {
        lines
            .iter()
            .filter(|l| l.trim_start().starts_with(level))
            .cloned()
            .collect::<Vec<_>>()
    };
    assert_eq!(
        at("ERROR"),
        Vec::<String>::new(),
        "no error for an expected fence"
    );
    assert_eq!(
        at("WARN").len(),
        1,
        "one warning when it starts: {:#?}",
        at("WARN")
    );
    let ended: Vec<String> = at("INFO")
        .into_iter()
        .filter(|l| l.contains("answers again") || l.contains("renew again"))
        .collect();
    assert_eq!(ended.len(), 1, "one info when it ends: {ended:#?}");
    let said_moved: Vec<&String> = lines
        .iter()
        .filter(|l| l.contains("moved to another node"))
        .collect();
    assert!(said_moved.is_empty(), "nothing moved: {said_moved:#?}");
}
