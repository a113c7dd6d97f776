//! Produces a trace in Jaeger with a watchdog kill, a retry and a fresh
//! fallback — through the real HTTP path (the Anthropic SSE source against
//! warden's mock server).
//!
//! ```sh
//! docker run --rm -d --name jaeger -p 16686:16686 -p 4317:4317 jaegertracing/jaeger:2.12.0
//! OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4317 OTEL_SERVICE_NAME=warden-demo \
//!     cargo run --example jaeger
//! # then open http://localhost:16686 and search service `warden-demo`,
//! # tag `warden.session.key=repo-a` or `warden.session.key=repo-b`
//! ```
//!
//! Without `OTEL_EXPORTER_OTLP_ENDPOINT` it runs the same scenario and only
//! logs to the console. See `docs/jaeger.md`.

use std::sync::Arc;
use std::time::Duration;

use warden_core::{
    Durability, EventSource, MemoryStore, RetryPolicy, SessionConfig, SessionKey, SessionRecord,
    SessionStore, Supervisor, SupervisorConfig, WatchdogConfig,
};
use warden_llm::{AnthropicOptions, AnthropicSource};
use warden_mock::{MockConfig, MockServer, Scenario};
use warden_telemetry::TelemetryConfig;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let telemetry = warden_telemetry::init(TelemetryConfig::from_env())?;
    if !telemetry.is_exporting() {
        eprintln!("OTEL_EXPORTER_OTLP_ENDPOINT is not set: spans are not exported (console only)");
    }
    // repo-a: the first response stalls (socket held open), the retry works.
    // repo-b: its stored conversation is too long to resume, a fresh one works.
    let mock = MockServer::start(MockConfig::default().with_sequence([
        Scenario::Stall,
        Scenario::Normal,
        Scenario::PromptTooLong,
        Scenario::Normal,
    ]))
    .await?;
    let source = Arc::new(AnthropicSource::new(
        AnthropicOptions::default()
            .with_base_url(mock.base_url())
            .with_api_key("dummy"),
    )?);
    let store = Arc::new(MemoryStore::new());
    let mut stored = SessionRecord::new(&SessionKey::new("repo-b"), None);
    stored.set_agent_session_id("3f2c9a1e-0000-4000-8000-00000000dead");
    store.save(&stored, Durability::Flushed).await?;

    let factory = move |_: &SessionKey| source.clone() as Arc<dyn EventSource>;
    let config = SupervisorConfig::default()
        .with_watchdog(WatchdogConfig::default().with_default_timeout(Duration::from_secs(1))?)
        .with_session(SessionConfig::default().with_retry(
            RetryPolicy::default().with_backoff(Duration::from_millis(200), Duration::from_secs(1)),
        ));
    let supervisor = Supervisor::builder(Arc::new(factory))
        .config(config)
        .store(store)
        .start()
        .await?;
    for key in ["repo-a", "repo-b"] {
        let (text, summary) = supervisor
            .send(key, "What changed?")
            .await?
            .finish()
            .await?;
        println!("{key}: {} attempt(s): {text:?}", summary.attempts);
    }
    supervisor.shutdown().await;
    mock.shutdown().await;
    drop(telemetry); // flushes every span
    Ok(())
}
