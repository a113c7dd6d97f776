//! A cluster node whose database is away answers over real HTTP with the
//! API's typed error, `503 database_unreachable` with `Retry-After` (the
//! one type of every refusal in an outage) — never the connection pool's
//! raw text (host names, driver messages) — when it lists the sessions and
//! when a client re-attaches to a turn it must read from the store. `GET
//! /v1/cluster` is the exception: it answers `200` with what the node
//! knows (its outage counters, its failover timings, the members and the
//! moves as it last read them), marked `stale`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures_util::future::BoxFuture;
use serde_json::Value;
use warden_core::cluster::{
    ClusterStats, Elsewhere, MoveCount, NodeStats, Placement, SessionMove, SessionPlace, Timings,
};
use warden_core::store::{StoredEvent, StoredTurn, TurnAsked, TurnStore, TurnStoreError};
use warden_core::testing::ChannelSource;
use warden_core::{EventSource, SessionKey, Supervisor};
use warden_serve::ServeConfig;

const TOKEN: &str = "test-token-0123456789";
const PATIENCE: Duration = Duration::from_secs(20);
/// What the pool says in an outage: not for clients.
const POOL_TEXT: &str =
    "db error: error connecting to server db-7.internal:5432: Connection refused";

/// A placement whose database is away.
struct DatabaseAway;

impl Placement for DatabaseAway {
    fn place<'a>(&'a self, _: &'a SessionKey) -> BoxFuture<'a, Result<(), Elsewhere>> {
        Box::pin(async {
            Err(Elsewhere::store_unreachable(
                POOL_TEXT,
                Duration::from_secs(2),
            ))
        })
    }

    fn node(&self) -> Option<&str> {
        Some("node-a")
    }

    fn sessions(&self) -> BoxFuture<'_, Option<Result<Vec<SessionPlace>, String>>> {
        Box::pin(async { Some(Err(POOL_TEXT.to_owned())) })
    }

    fn ready(&self) -> BoxFuture<'_, Result<(), String>> {
        Box::pin(async { Err(POOL_TEXT.to_owned()) })
    }
}

/// A turn store whose database is away.
struct StoreAway;

impl TurnStore for StoreAway {
    fn open<'a>(
        &'a self,
        _: &'a SessionKey,
        _: u64,
        _: &'a str,
        _: Option<&'a str>,
        _: &'a TurnAsked,
    ) -> BoxFuture<'a, Result<StoredTurn, TurnStoreError>> {
        Box::pin(async { Err(TurnStoreError::Failed(POOL_TEXT.into())) })
    }

    fn append<'a>(
        &'a self,
        _: &'a SessionKey,
        _: &'a str,
        _: &'a [StoredEvent],
        _: bool,
    ) -> BoxFuture<'a, Result<(), TurnStoreError>> {
        Box::pin(async { Err(TurnStoreError::Failed(POOL_TEXT.into())) })
    }

    fn recent<'a>(
        &'a self,
        _: &'a SessionKey,
        _: usize,
    ) -> BoxFuture<'a, Result<Vec<StoredTurn>, TurnStoreError>> {
        Box::pin(async { Err(TurnStoreError::Failed(POOL_TEXT.into())) })
    }

    fn read<'a>(
        &'a self,
        _: &'a str,
        _: u64,
    ) -> BoxFuture<'a, Result<Option<StoredTurn>, TurnStoreError>> {
        Box::pin(async { Err(TurnStoreError::Failed(POOL_TEXT.into())) })
    }
}

async fn serve() -> String {
    serve_with(Arc::new(DatabaseAway)).await
}

async fn serve_with(placement: Arc<dyn Placement>) -> String {
    let (source, _ctl) = ChannelSource::new();
    let sup = Supervisor::builder(Arc::new(move |_: &SessionKey| {
        source.clone() as Arc<dyn EventSource>
    }))
    .start()
    .await
    .expect("supervisor");
    let config = ServeConfig::new(TOKEN)
        .with_placement(placement)
        .with_turn_store(Arc::new(StoreAway));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    let app = warden_serve::router(sup, config);
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    base
}

/// The answer to `GET base/path` (with the token, and `Last-Event-ID`
/// when given) must be the typed outage error.
async fn assert_database_unreachable(base: &str, path: &str, last_event_id: Option<&str>) {
    let mut request = reqwest::Client::new()
        .get(format!("{base}{path}"))
        .bearer_auth(TOKEN);
    if let Some(id) = last_event_id {
        request = request.header("last-event-id", id);
    }
    let answer = tokio::time::timeout(PATIENCE, request.send())
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {path}"))
        .expect("an answer");
    let status = answer.status().as_u16();
    let retry_after = answer
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let text = answer.text().await.expect("a body");
    let body: Value =
        serde_json::from_str(&text).unwrap_or_else(|_| panic!("{path}: not JSON: {text}"));
    assert_eq!(status, 503, "{path}: {body}");
    assert_eq!(
        body["error"]["type"], "database_unreachable",
        "{path}: {body}"
    );
    assert!(
        retry_after.is_some_and(|s| s >= 1),
        "{path}: Retry-After {retry_after:?}"
    );
    assert!(
        !body.to_string().contains("db-7.internal"),
        "{path}: the pool's text reached the client: {body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listing_the_sessions_in_an_outage_is_database_unreachable() {
    let base = serve().await;
    assert_database_unreachable(&base, "/v1/sessions", None).await;
    assert_database_unreachable(&base, "/v1/sessions?detail=full", None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn re_attaching_to_a_turn_in_an_outage_is_database_unreachable() {
    let base = serve().await;
    assert_database_unreachable(&base, "/v1/turns/turn_0123/events", Some("7")).await;
    assert_database_unreachable(&base, "/v1/turns/turn_0123", None).await;
}

/// A placement whose database goes away when told: its figures are its
/// own, the members are as last read (as `warden_pg`'s placement keeps
/// them), the moves cannot be read.
#[derive(Default)]
struct GoesAway {
    away: AtomicBool,
}

impl Placement for GoesAway {
    fn place<'a>(&'a self, _: &'a SessionKey) -> BoxFuture<'a, Result<(), Elsewhere>> {
        Box::pin(async { Ok(()) })
    }

    fn node(&self) -> Option<&str> {
        Some("node-a")
    }

    fn advertise_of<'a>(&'a self, node: &'a str) -> BoxFuture<'a, Option<String>> {
        let away = self.away.load(Ordering::SeqCst);
        Box::pin(async move { (!away).then(|| format!("http://{node}.internal:8700")) })
    }

    fn stats(&self) -> BoxFuture<'_, Option<ClusterStats>> {
        let away = self.away.load(Ordering::SeqCst);
        Box::pin(async move {
            let mut stats = ClusterStats::default();
            stats.leases_held = 2;
            stats.takeovers = 1;
            stats.lease_ttl = Some(Duration::from_secs(3));
            let mut failovers = Timings::new(&[1.0, 5.0, 10.0]);
            failovers.observe(Duration::from_millis(3500));
            stats.failovers = failovers;
            stats.nodes = vec![
                NodeStats::new("node-a", 0.4, 2).with_state("alive"),
                NodeStats::new("node-b", 30.0, 0).with_state("dead"),
            ];
            if away {
                stats.database_outages = 1;
                stats.database_outage = Duration::from_millis(4200);
            } else {
                stats.database_round_trip = Some(Duration::from_millis(1));
            }
            Some(stats)
        })
    }

    fn moves(&self, _: usize) -> BoxFuture<'_, Option<Result<Vec<SessionMove>, String>>> {
        let away = self.away.load(Ordering::SeqCst);
        Box::pin(async move {
            Some(match away {
                true => Err(POOL_TEXT.to_owned()),
                false => Ok(vec![SessionMove::new(
                    "s1",
                    "node-b",
                    "node-a",
                    2,
                    true,
                    1_700_000_000_000,
                )]),
            })
        })
    }

    fn move_counts(&self, _: Duration) -> BoxFuture<'_, Option<Result<Vec<MoveCount>, String>>> {
        let away = self.away.load(Ordering::SeqCst);
        Box::pin(async move {
            Some(match away {
                true => Err(POOL_TEXT.to_owned()),
                false => Ok(vec![MoveCount::new("node-b", "node-a", true, 1)]),
            })
        })
    }
}

/// `GET base/v1/cluster`: its status and body.
async fn cluster_view(base: &str) -> (u16, Value) {
    let answer = tokio::time::timeout(
        PATIENCE,
        reqwest::Client::new()
            .get(format!("{base}/v1/cluster"))
            .bearer_auth(TOKEN)
            .send(),
    )
    .await
    .expect("an answer in time")
    .expect("an answer");
    let status = answer.status().as_u16();
    let text = answer.text().await.expect("a body");
    assert!(
        !text.contains("db-7.internal"),
        "the pool's text reached the client: {text}"
    );
    (status, serde_json::from_str(&text).expect("JSON"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_view_in_an_outage_is_what_the_node_knows_marked_stale() {
    let placement = Arc::new(GoesAway::default());
    let base = serve_with(placement.clone()).await;
    let (status, fresh) = cluster_view(&base).await;
    assert_eq!(status, 200, "{fresh}");
    assert_eq!(fresh["stale"], false, "{fresh}");
    assert_eq!(fresh["failovers_last_hour"], 1, "{fresh}");

    placement.away.store(true, Ordering::SeqCst);
    let (status, view) = cluster_view(&base).await;
    assert_eq!(status, 200, "mid-outage: {view}");
    assert_eq!(view["stale"], true, "{view}");
    // Its own figures, current.
    assert_eq!(view["database_outages"], 1, "{view}");
    assert_eq!(view["database_outage_secs"], 4.2, "{view}");
    assert_eq!(view["failover_seconds"]["count"], 1, "{view}");
    assert_eq!(view["takeovers"], 1, "{view}");
    assert_eq!(view["database_round_trip_ms"], Value::Null, "{view}");
    // The members and the moves as last read.
    assert_eq!(view["nodes"], fresh["nodes"], "{view}");
    assert_eq!(view["nodes"][1]["advertise"], "http://node-b.internal:8700");
    assert_eq!(view["moves"], fresh["moves"], "{view}");
    assert_eq!(view["moved_last_hour"], fresh["moved_last_hour"], "{view}");
    assert_eq!(view["failovers_last_hour"], 1, "{view}");

    // A node that never read them mid-outage: the members its placement
    // knows, no moves, still stale.
    let base = serve_with(placement).await;
    let (status, view) = cluster_view(&base).await;
    assert_eq!(status, 200, "{view}");
    assert_eq!(view["stale"], true, "{view}");
    assert_eq!(view["nodes"].as_array().map(Vec::len), Some(2), "{view}");
    assert_eq!(view["nodes"][1]["advertise"], Value::Null, "{view}");
    assert_eq!(view["moves"], serde_json::json!([]), "{view}");
    assert_eq!(view["database_outages"], 1, "{view}");
}
