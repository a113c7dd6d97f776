//! Section 11 `cluster`: turns per second with the sessions on PostgreSQL
//! (the fenced store of a cluster node: lease on first write, every write
//! carrying its epoch) against sled on local disk (flushed), with one node
//! and with three nodes sharing the database; and how many database
//! transactions a turn costs.
//!
//! Needs `WARDEN_PG_URL` (an admin URL; `source .ci/postgres` starts a
//! throwaway server); without it the section says so and is skipped.
//!
//! The workload is the one of section 5: turns of 20 text deltas from an
//! in-process source to 50 sessions, 200 in flight; the sessions are
//! spread over the nodes by key. Every turn writes its session's record
//! at least twice (message accepted, answer recorded), durably in both
//! stores: sled flushes, PostgreSQL commits.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use warden_core::{EventSource, SessionKey, SessionStore, Supervisor, SupervisorConfig};

const SESSIONS: usize = 50;

/// Turns per second through one supervisor per store in `stores` (the
/// sessions spread over them by key); also section 5's workload.
pub async fn turns_per_sec(stores: Vec<Arc<dyn SessionStore>>, turns: usize) -> f64 {
    let mut sups = Vec::new();
    let mut drivers = Vec::new();
    for store in stores {
        let (source, ctl) = warden_core::testing::ChannelSource::new();
        let factory = move |_: &SessionKey| source.clone() as Arc<dyn EventSource>;
        let sup = Supervisor::builder(Arc::new(factory))
            .config(SupervisorConfig::default())
            .store(store)
            .start()
            .await
            .expect("supervisor");
        sups.push(sup);
        drivers.push(tokio::spawn(async move {
            while let Some(a) = ctl.next_attempt().await {
                for _ in 0..20 {
                    a.text("token ");
                }
                a.finish();
            }
        }));
    }
    let t0 = Instant::now();
    let mut pending = Vec::new();
    for i in 0..turns {
        let s = i % SESSIONS;
        let sup = &sups[s % sups.len()];
        pending.push(sup.send(format!("s{s}"), "hi").await.expect("send"));
        if pending.len() >= 200 {
            for t in pending.drain(..) {
                t.finish().await.expect("turn");
            }
        }
    }
    for t in pending {
        t.finish().await.expect("turn");
    }
    let rate = turns as f64 / t0.elapsed().as_secs_f64();
    for sup in sups {
        sup.shutdown().await;
    }
    for d in drivers {
        d.abort();
    }
    rate
}

/// A new empty database on the server of `admin`; its URL.
pub(crate) async fn fresh_db(admin: &str, tag: &str) -> String {
    let (client, conn) = tokio_postgres::connect(admin, tokio_postgres::NoTls)
        .await
        .expect("connect to WARDEN_PG_URL");
    let conn = tokio::spawn(conn);
    let name = format!("warden_bench_{tag}_{}", std::process::id());
    // One statement each: neither may run inside a transaction block.
    for sql in [
        format!("DROP DATABASE IF EXISTS {name}"),
        format!("CREATE DATABASE {name}"),
    ] {
        client.batch_execute(&sql).await.expect("create database");
    }
    drop(client);
    let _ = conn.await;
    let (base, _) = admin.rsplit_once('/').expect("a URL with a database");
    format!("{base}/{name}")
}

/// Transactions committed in `url`'s database so far (the statistics
/// collector's count; other backends report it within a second).
pub(crate) async fn commits(url: &str) -> i64 {
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    let conn = tokio::spawn(conn);
    let n: i64 = client
        .query_one(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()",
            &[],
        )
        .await
        .expect("pg_stat_database")
        .get(0);
    drop(client);
    let _ = conn.await;
    n
}

/// `nodes` cluster nodes on a fresh database: turns/s and transactions
/// per turn.
async fn on_postgres(admin: &str, nodes: usize, turns: usize, round: usize) -> (f64, f64) {
    let url = fresh_db(admin, &format!("{nodes}n{round}")).await;
    let mut stores: Vec<Arc<dyn SessionStore>> = Vec::new();
    let mut renewers = Vec::new();
    for n in 0..nodes {
        let pg = warden_pg::PgStore::connect(&url).await.expect("pg");
        let node = warden_pg::NodeStore::new(pg, format!("bench-{n}"), Duration::from_secs(10));
        renewers.push(node.spawn_renewer());
        stores.push(Arc::new(node));
    }
    let before = commits(&url).await;
    let rate = turns_per_sec(stores, turns).await;
    let after = commits(&url).await;
    drop(renewers);
    // The two statistics queries are transactions too.
    let per_turn = (after - before - 1).max(0) as f64 / turns as f64;
    (rate, per_turn)
}

/// A node's store as the database sees the node: once `dead`, it writes
/// nothing more (a `kill -9` leaves no last write and no release).
struct Killable {
    node: warden_pg::NodeStore,
    dead: std::sync::atomic::AtomicBool,
}

impl SessionStore for Killable {
    fn load(
        &self,
        key: &SessionKey,
    ) -> futures_util::future::BoxFuture<
        '_,
        Result<Option<warden_core::SessionRecord>, warden_core::StoreError>,
    > {
        self.node.load(key)
    }

    fn save<'a>(
        &'a self,
        record: &'a warden_core::SessionRecord,
        durability: warden_core::Durability,
    ) -> futures_util::future::BoxFuture<'a, Result<(), warden_core::StoreError>> {
        if self.dead.load(std::sync::atomic::Ordering::SeqCst) {
            return Box::pin(async {
                Err(warden_core::StoreError::Backend {
                    message: "killed".into(),
                })
            });
        }
        self.node.save(record, durability)
    }

    fn list(
        &self,
    ) -> futures_util::future::BoxFuture<
        '_,
        Result<
            Vec<Result<warden_core::SessionRecord, warden_core::StoreError>>,
            warden_core::StoreError,
        >,
    > {
        self.node.list()
    }
}

/// Failover time over `kills` kills at lease TTL `ttl`: a node runs a
/// session's turn (its stream held open) and is killed — its renewals and
/// writes stop at once, as the database sees a `kill -9`, at a random
/// moment between two renewals — while a surviving node scans for orphans
/// every [`scan_interval`](warden_pg::NodeStore::scan_interval), as `warden
/// serve` does. Measured: kill → the session's re-delivered attempt opening on
/// the survivor. Sorted, in seconds.
async fn failovers(admin: &str, kills: usize, ttl: Duration) -> Vec<f64> {
    let url = fresh_db(admin, "failover").await;
    let connect = || async { warden_pg::PgStore::connect(&url).await.expect("pg") };
    // The survivor answers every attempt; it reports which session's
    // attempt opened when.
    let survivor = warden_pg::NodeStore::new(connect().await, "survivor", ttl);
    let _renewing = survivor.spawn_renewer();
    let (source, ctl) = warden_core::testing::ChannelSource::new();
    let factory = move |_: &SessionKey| source.clone() as Arc<dyn EventSource>;
    let sup_b = Supervisor::builder(Arc::new(factory))
        .store(Arc::new(survivor.clone()))
        .start()
        .await
        .expect("supervisor");
    let (opened_tx, mut opened) = tokio::sync::mpsc::unbounded_channel();
    let driver = tokio::spawn(async move {
        while let Some(a) = ctl.next_attempt().await {
            let _ = opened_tx.send((a.request.session_key.clone(), Instant::now()));
            a.text("answered");
            a.finish();
        }
    });
    let scan = {
        let (node, sup) = (survivor.clone(), sup_b.clone());
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(node.scan_interval());
            loop {
                tick.tick().await;
                node.take_over(&sup).await;
            }
        })
    };
    let mut times = Vec::new();
    for i in 0..kills {
        // A fresh incarnation of the victim runs session i's turn, held.
        let node = warden_pg::NodeStore::new(connect().await, "victim", ttl);
        let renewer = node.spawn_renewer();
        let store = Arc::new(Killable {
            node: node.clone(),
            dead: std::sync::atomic::AtomicBool::new(false),
        });
        let (source, ctl) = warden_core::testing::ChannelSource::new();
        let factory = move |_: &SessionKey| source.clone() as Arc<dyn EventSource>;
        let sup_a = Supervisor::builder(Arc::new(factory))
            .store(store.clone())
            .start()
            .await
            .expect("supervisor");
        let key = format!("failover-{i}");
        let _turn = sup_a.send(key.as_str(), "hello").await.expect("send");
        let held = tokio::time::timeout(Duration::from_secs(30), ctl.next_attempt())
            .await
            .expect("the victim's attempt in time")
            .expect("attempt");
        // kill -9 at a random moment between two renewals, as the
        // database sees it.
        let between = ttl.mul_f64(rand::random::<f64>() / 3.0);
        tokio::time::sleep(between).await;
        let t0 = Instant::now();
        store.dead.store(true, std::sync::atomic::Ordering::SeqCst);
        drop(renewer);
        let opened_at = loop {
            let (k, at) = tokio::time::timeout(Duration::from_secs(30), opened.recv())
                .await
                .expect("the survivor's attempt in time")
                .expect("driver");
            if k.as_str() == key {
                break at;
            }
        };
        times.push(opened_at.duration_since(t0).as_secs_f64());
        drop(held);
        sup_a.shutdown().await;
    }
    scan.abort();
    driver.abort();
    sup_b.shutdown().await;
    times.sort_by(f64::total_cmp);
    times
}

pub async fn bench_cluster(quick: bool) {
    println!(
        "\n## 11. Sessions on PostgreSQL (fenced cluster store) vs sled: turns/s, 20 deltas per turn, {SESSIONS} sessions"
    );
    let Ok(admin) = std::env::var("WARDEN_PG_URL") else {
        println!(
            "skipped: set WARDEN_PG_URL to a PostgreSQL admin URL (`source .ci/postgres` starts one)"
        );
        return;
    };
    let turns = if quick { 1_000 } else { 5_000 };
    let rounds = 3;
    let best = |v: &[f64]| v.iter().copied().fold(f64::NAN, f64::max);
    let mut sled = Vec::new();
    let mut one = Vec::new();
    let mut three = Vec::new();
    let mut tx1 = Vec::new();
    let mut tx3 = Vec::new();
    for round in 0..rounds {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = warden_store::SledStore::open(dir.path().join("db")).expect("sled");
        sled.push(turns_per_sec(vec![Arc::new(store)], turns).await);
        let (r, t) = on_postgres(&admin, 1, turns, round).await;
        one.push(r);
        tx1.push(t);
        let (r, t) = on_postgres(&admin, 3, turns, round).await;
        three.push(r);
        tx3.push(t);
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    println!("| store | turns/s (best of {rounds}) | ratio to sled | transactions per turn |");
    println!("|---|---:|---:|---:|");
    println!(
        "| sled, flushed (baseline) | {:.0} | 1.00x | – |",
        best(&sled)
    );
    println!(
        "| PostgreSQL, 1 node | {:.0} | {:.2}x | {:.2} |",
        best(&one),
        best(&one) / best(&sled),
        mean(&tx1)
    );
    println!(
        "| PostgreSQL, 3 nodes (one process, one pool each) | {:.0} | {:.2}x | {:.2} |",
        best(&three),
        best(&three) / best(&sled),
        mean(&tx3)
    );
    crate::soak::bench_served_on_postgres(&admin, quick).await;

    let kills = if quick { 5 } else { 20 };
    for ttl in [Duration::from_secs(1), Duration::from_secs(10)] {
        if quick && ttl > Duration::from_secs(1) {
            continue;
        }
        let n = if ttl > Duration::from_secs(1) {
            kills / 4
        } else {
            kills
        };
        let t = failovers(&admin, n, ttl).await;
        let at = |p: f64| t[((t.len() as f64 - 1.0) * p).round() as usize];
        println!(
            "\nfailover, lease TTL {:.0} s, {n} kills (kill → the re-delivered attempt on the survivor): min {:.2} s, p50 {:.2} s, p99 {:.2} s, max {:.2} s (target p99 ≤ TTL + 1 s = {:.0} s)",
            ttl.as_secs_f64(),
            at(0.0),
            at(0.5),
            at(0.99),
            at(1.0),
            ttl.as_secs_f64() + 1.0
        );
    }
}
