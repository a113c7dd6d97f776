//! The figures a node gives `/metrics` about failovers and database
//! outages, on a real PostgreSQL (`WARDEN_PG_URL`; skipped with a message
//! without it): a failover is timed from the dead node's last heartbeat to
//! the session's first event on the node that took it; an outage is
//! counted once and timed from its first failed heartbeat to the next that
//! worked, the one in progress included; and what an outage must leave of
//! a lease's time for nothing to move (the renewal's delay once the
//! database answers again).

use std::sync::Arc;
use std::time::{Duration, Instant};

use warden_core::cluster::MoveCount;
use warden_core::testing::{ChannelSource, ChannelSourceControl};
use warden_core::{Durability, EventSource, SessionKey, SessionRecord, SessionStore, Supervisor};
use warden_pg::cluster::{Node, NodeEvent};
use warden_pg::low_level::{NodeStore, TAKEOVER_GRACE};

use crate::common::{Outage, admin_url, fresh_db, store, within};

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

async fn next_event(
    events: &mut tokio::sync::broadcast::Receiver<NodeEvent>,
    what: &str,
    pick: impl Fn(&NodeEvent) -> bool,
) -> NodeEvent {
    within(what, async {
        loop {
            let event = events.recv().await.expect("the node's events");
            if pick(&event) {
                return event;
            }
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_is_timed_from_the_dead_nodes_last_heartbeat_to_the_sessions_first_event() {
    let Some(config) = fresh_db().await else {
        return;
    };
    let pg = store(&config).await;
    let ttl = Duration::from_millis(900);

    // The survivor first, so its scans are running when the other dies.
    let alive = NodeStore::new(pg.clone(), "alive", ttl);
    let (supervisor, control) = supervisor_on(&alive).await;
    let mut node = Node::new(alive.clone(), "http://alive.invalid");
    let mut events = node.events();
    within("join", node.join(&supervisor)).await.expect("join");

    // A node beats, takes a session with a message waiting, and dies: no
    // more heartbeats, no more renewals.
    pg.register_node_with_ttl("dead", "http://dead.invalid", ttl)
        .await
        .expect("register");
    let killed = Instant::now();
    let dead = NodeStore::new(pg.clone(), "dead", ttl);
    let s1 = SessionKey::new("s1");
    assert!(dead.claim(&s1).await.expect("claim").is_some());
    let mut record = SessionRecord::new(&s1, None);
    record.accept("are you there?");
    dead.save(&record, Durability::Flushed).await.expect("save");
    drop(dead);

    let took = next_event(&mut events, "the takeover", |e| {
        matches!(e, NodeEvent::TookOver { .. })
    })
    .await;
    assert_eq!(
        took,
        NodeEvent::TookOver {
            key: s1.clone(),
            epoch: 2
        },
        "the new epoch"
    );
    let attempt = within("the message is sent again", control.next_attempt())
        .await
        .expect("an attempt");
    let seen = killed.elapsed();
    attempt.text("yes");
    attempt.finish();

    let placement = node.placement();
    let timed = within("the figures", async {
        loop {
            let stats = placement.stats().await.expect("cluster figures");
            if stats.failovers.count > 0 {
                return stats;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    let f = &timed.failovers;
    assert_eq!(f.count, 1, "one failover: {f:?}");
    assert_eq!(f.buckets.iter().map(|(_, n)| n).sum::<u64>(), 1, "{f:?}");
    // No sooner than the dead lease could be taken (a TTL and the grace
    // after the heartbeat), no later than the test saw the attempt (the
    // heartbeat came just before the "kill").
    let took_secs = f.sum_secs;
    let earliest = (ttl + TAKEOVER_GRACE).as_secs_f64() - 0.05;
    let latest = seen.as_secs_f64() + 0.25;
    eprintln!("failover timed {took_secs:.3} s; the test saw the attempt {seen:?} after the kill");
    assert!(
        (earliest..=latest).contains(&took_secs),
        "{took_secs} s, expected {earliest}..={latest}"
    );
    // Counted cluster wide from the database, whichever node asks.
    let counts = placement
        .move_counts(Duration::from_secs(3600))
        .await
        .expect("a placement that counts")
        .expect("the database answers");
    assert_eq!(
        counts,
        [MoveCount::new("dead", "alive", true, 1)],
        "one failover from dead to alive"
    );
    // Nothing of an outage.
    assert_eq!(
        (timed.database_outages, timed.database_outage),
        (0, Duration::ZERO)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_is_counted_once_and_timed_while_it_lasts_and_after() {
    let Some(config) = fresh_db().await else {
        return;
    };
    let Some(admin) = admin_url() else {
        return;
    };
    let db = config.get_dbname().expect("a database").to_owned();
    let pg = store(&config).await;
    let ttl = Duration::from_millis(600);
    let b = NodeStore::new(pg.clone(), "node-b", ttl);
    let (supervisor, _control) = supervisor_on(&b).await;
    let mut node = Node::new(b.clone(), "http://b.invalid");
    let mut events = node.events();
    within("join", node.join(&supervisor)).await.expect("join");
    let placement = node.placement();

    let outage = Outage::begin(&admin, &db).await;
    next_event(&mut events, "the outage noticed", |e| {
        matches!(e, NodeEvent::HeartbeatFailed { .. })
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    // While it lasts, the outage counts up to now.
    let during = placement.stats().await.expect("cluster figures");
    assert_eq!(during.database_outages, 1);
    assert!(
        during.database_outage >= Duration::from_secs(1),
        "{:?}",
        during.database_outage
    );
    outage.end().await;
    let NodeEvent::DatabaseBack { down_for } = next_event(&mut events, "the database back", |e| {
        matches!(e, NodeEvent::DatabaseBack { .. })
    })
    .await
    else {
        unreachable!()
    };
    let after = placement.stats().await.expect("cluster figures");
    tokio::time::sleep(ttl).await;
    let later = placement.stats().await.expect("cluster figures");
    eprintln!(
        "outage timed {:?}; reported {down_for:?}",
        after.database_outage
    );
    assert_eq!(after.database_outages, 1, "one outage");
    assert!(
        after.database_outage.abs_diff(down_for) < Duration::from_millis(50),
        "{:?} is the reported {down_for:?}",
        after.database_outage
    );
    assert_eq!(
        later.database_outage, after.database_outage,
        "it stops counting once over"
    );
}

/// `SELECT extract(epoch FROM …)` of `what` on `client`: seconds by the
/// database's clock.
async fn db_secs(client: &tokio_postgres::Client, what: &str, key: &str) -> Option<f64> {
    let sql =
        format!("SELECT extract(epoch FROM {what})::float8 FROM warden_sessions WHERE key = $1");
    let row = client.query_opt(&sql, &[&key]).await.ok()??;
    row.get(0)
}

/// A plain connection to the test's database (the watcher of the lease:
/// it reads what the node renewed, by the database's clock).
async fn watcher(config: &tokio_postgres::Config) -> tokio_postgres::Client {
    within("connect the watcher", async {
        loop {
            if let Ok((client, conn)) = config.connect(tokio_postgres::NoTls).await {
                tokio::spawn(conn);
                return client;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
}

/// What an outage of a given length costs a node: nothing while it ends
/// early enough for the node's next renewal to land before its lease runs
/// out by its own clock. Past the outage itself that renewal needs the
/// wait for the next retry (at most 100 ms) and the pool's reconnection
/// (a new connection, its statement prepared again). Each round starts
/// the outage just before a renewal is due — the lease has the least time
/// left, about 2/3 of the TTL — and ends it 0.35 s before that time runs
/// out; by the database's clock the round measures how long after the
/// database took connections again the renewal landed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_ending_a_reconnection_before_the_lease_runs_out_gives_nothing_up() {
    let Some(config) = fresh_db().await else {
        return;
    };
    let Some(admin) = admin_url() else {
        return;
    };
    let db = config.get_dbname().expect("a database").to_owned();
    let (clock, conn) = admin
        .parse::<tokio_postgres::Config>()
        .expect("admin URL")
        .connect(tokio_postgres::NoTls)
        .await
        .expect("admin");
    tokio::spawn(conn);
    let now = || async {
        let row = clock
            .query_one("SELECT extract(epoch FROM clock_timestamp())::float8", &[])
            .await
            .expect("the database's clock");
        row.get::<_, f64>(0)
    };
    let pg = store(&config).await;
    let ttl = Duration::from_secs(2);
    let node = NodeStore::new(pg.clone(), "node-a", ttl);
    let key = SessionKey::new("renewed");
    within("claim", node.claim(&key))
        .await
        .expect("claim")
        .expect("taken");
    let _renewer = node.spawn_renewer();
    let margin = 0.35;
    let mut delays = Vec::new();
    for round in 0..5 {
        let mut watch = watcher(&config).await;
        // A renewal lands: the next is due a third of the TTL after it.
        let before = db_secs(&watch, "lease_until", key.as_str()).await;
        let renewed = within("a renewal", async {
            loop {
                let until = db_secs(&watch, "lease_until", key.as_str()).await;
                if until > before {
                    return until.expect("a lease");
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await;
        tokio::time::sleep(ttl / 3 - Duration::from_millis(120)).await;
        let down_at = now().await;
        let left = renewed - down_at;
        let outage = Outage::begin(&admin, &db).await;
        let down = left - margin;
        tokio::time::sleep(
            Duration::from_secs_f64(down - (now().await - down_at)).max(Duration::ZERO),
        )
        .await;
        outage.end().await;
        let back_at = now().await;
        // The renewal after it, by the database's clock.
        let landed = within("the renewal after the outage", async {
            loop {
                watch = watcher(&config).await;
                if let Some(until) = db_secs(&watch, "lease_until", key.as_str()).await
                    && until > renewed
                {
                    return until - ttl.as_secs_f64();
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await;
        let delay = landed - back_at;
        eprintln!(
            "round {round}: {left:.3}s of lease left, the database away {:.3}s, renewed {:.0} ms after it took connections again",
            back_at - down_at,
            delay * 1000.0
        );
        assert!(
            landed > down_at + 0.1,
            "the renewal came after the outage began"
        );
        assert_eq!(node.held().len(), 1, "round {round}: the lease given up");
        // The retry's wait and the reconnection: what an outage must leave
        // of the lease time for nothing to move.
        assert!(
            delay < margin,
            "round {round}: renewed {delay:.3}s after the database was back"
        );
        delays.push(delay);
    }
    delays.sort_by(f64::total_cmp);
    eprintln!(
        "renewal after the outage: {:.0}–{:.0} ms after the database took connections again",
        delays[0] * 1000.0,
        delays[delays.len() - 1] * 1000.0
    );
}
