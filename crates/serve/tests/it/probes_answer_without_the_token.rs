//! What a load balancer or a scraper sees over real HTTP: `/healthz` and
//! `/readyz` answer without the bearer token (many load balancers cannot
//! send a header) and reveal nothing but up or not; `/metrics` needs the
//! token unless the server is told its metrics are public.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use warden_core::testing::ChannelSource;
use warden_core::{EventSource, SessionKey, Supervisor};
use warden_serve::ServeConfig;

const TOKEN: &str = "test-token-0123456789";
const PATIENCE: Duration = Duration::from_secs(20);

/// A server over a channel source; its base URL.
async fn serve(config: ServeConfig) -> String {
    let (source, _ctl) = ChannelSource::new();
    let sup = Supervisor::builder(Arc::new(move |_: &SessionKey| {
        source.clone() as Arc<dyn EventSource>
    }))
    .start()
    .await
    .expect("supervisor");
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

/// `GET base/path` without a token: status and body.
async fn get(base: &str, path: &str) -> (u16, String) {
    let answer = tokio::time::timeout(
        PATIENCE,
        reqwest::Client::new().get(format!("{base}{path}")).send(),
    )
    .await
    .unwrap_or_else(|_| panic!("timed out waiting for {path}"))
    .expect("an answer");
    let status = answer.status().as_u16();
    (status, answer.text().await.expect("body"))
}

/// A placement whose database is gone, with a reason that names the
/// database's host (what must not reach an unauthenticated caller).
struct DatabaseDown;

impl warden_core::cluster::Placement for DatabaseDown {
    fn place<'a>(
        &'a self,
        _: &'a SessionKey,
    ) -> futures_util::future::BoxFuture<'a, Result<(), warden_core::cluster::Elsewhere>> {
        Box::pin(async {
            Err(warden_core::cluster::Elsewhere::store_unreachable(
                "connection refused",
                Duration::from_secs(2),
            ))
        })
    }

    fn node(&self) -> Option<&str> {
        Some("node-a")
    }

    fn ready(&self) -> futures_util::future::BoxFuture<'_, Result<(), String>> {
        Box::pin(async { Err("error connecting to secret-db.internal:5432".into()) })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthz_and_readyz_answer_without_the_token() {
    let base = serve(ServeConfig::new(TOKEN)).await;
    assert_eq!(get(&base, "/healthz").await, (200, "ok".to_owned()));
    assert_eq!(get(&base, "/readyz").await, (200, "ok".to_owned()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unready_node_says_so_without_the_token_and_reveals_nothing() {
    let base = serve(ServeConfig::new(TOKEN).with_placement(Arc::new(DatabaseDown))).await;
    let (status, body) = get(&base, "/readyz").await;
    assert_eq!(status, 503, "{body}");
    let body: Value = serde_json::from_str(&body).expect("a JSON error");
    assert_eq!(body["error"]["type"], "database_unreachable", "{body}");
    assert!(
        !body.to_string().contains("secret-db"),
        "an unauthenticated probe learns nothing of the database: {body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_need_the_token_unless_they_are_public() {
    let private = serve(ServeConfig::new(TOKEN)).await;
    let (status, _) = get(&private, "/metrics").await;
    assert_eq!(status, 401, "metrics are private by default");
    let public = serve(ServeConfig::new(TOKEN).with_public_metrics(true)).await;
    let (status, body) = get(&public, "/metrics").await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("# TYPE"), "Prometheus text: {body}");
    let (status, _) = get(&public, "/v1/sessions").await;
    assert_eq!(status, 401, "public metrics open nothing else");
}
