//! A cluster node whose database is away answers over real HTTP with the
//! API's typed error, `503 database_unreachable` with `Retry-After` (the
//! one type of every refusal in an outage) — never the connection pool's
//! raw text (host names, driver messages) — when it lists the sessions and
//! when a client re-attaches to a turn it must read from the store.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use serde_json::Value;
use warden_core::cluster::{Elsewhere, Placement, SessionPlace};
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
    let (source, _ctl) = ChannelSource::new();
    let sup = Supervisor::builder(Arc::new(move |_: &SessionKey| {
        source.clone() as Arc<dyn EventSource>
    }))
    .start()
    .await
    .expect("supervisor");
    let config = ServeConfig::new(TOKEN)
        .with_placement(Arc::new(DatabaseAway))
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
