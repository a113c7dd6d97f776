//! With no collector listening, the supervised work completes, the guard's
//! flush returns, and the failure is reported once, not once per batch.
//!
//! A test binary of its own, as each test calling `warden_telemetry::init`:
//! that installs the process's global subscriber, once per process.

use std::sync::Arc;
use std::time::Duration;

use warden_core::testing::ChannelSource;
use warden_core::{EventSource, SessionKey, Supervisor, SupervisorConfig};
use warden_telemetry::TelemetryConfig;

/// Awaits `fut` for at most 30 s, failing with `what` instead of hanging.
async fn within<T>(what: &str, fut: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(30), fut)
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}

#[test]
fn work_completes_and_the_failure_is_reported_once() {
    // A port nobody listens on: bind, read the port, close.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("port")
        .port();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let mut config = TelemetryConfig::default()
            .with_otlp_endpoint(format!("http://127.0.0.1:{port}"))
            .with_console(false);
        config.export_timeout = Duration::from_millis(500);
        let guard = warden_telemetry::init(config).expect("init");
        let (source, ctl) = ChannelSource::new();
        let factory = move |_: &SessionKey| source.clone() as Arc<dyn EventSource>;
        let sup = Supervisor::start(SupervisorConfig::default(), Arc::new(factory))
            .await
            .expect("supervisor");
        for round in 0..3 {
            for i in 0..20 {
                let turn = sup.send(format!("ws-{i}"), "hi").await.expect("send");
                let a = within("the next attempt to open", ctl.next_attempt())
                    .await
                    .expect("attempt");
                a.text("ok");
                a.finish();
                within("the turn to finish", turn.finish())
                    .await
                    .expect("answered");
            }
            guard.flush(); // an export attempt per round, each failing
            // Reported at the first failed round, and never again.
            assert_eq!(guard.failures_reported(), 1, "after round {round}");
        }
        sup.shutdown().await;
        assert_eq!(guard.failures_reported(), 1, "reported once per outage");
        drop(guard);
    });
}

/// A collector that accepts connections and never answers (a black hole):
/// dropping the guard returns within the export timeout, the documented
/// bound of the final flush (it took a timeout per queued batch: 9.3–9.8 s
/// for the default 3 s).
#[test]
fn dropping_the_guard_returns_within_the_export_timeout_when_the_collector_never_answers() {
    use tracing_subscriber::layer::SubscriberExt as _;

    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in listener.incoming().flatten() {
            held.push(stream); // never read, never answered
        }
    });
    let config = TelemetryConfig::default()
        .with_otlp_endpoint(format!("http://127.0.0.1:{port}"))
        .with_console(false);
    let bound = config.export_timeout;
    let (layer, guard) =
        warden_telemetry::layer::<tracing_subscriber::Registry>(&config).expect("layer");
    let subscriber = tracing_subscriber::registry().with(layer);
    tracing::subscriber::with_default(subscriber, || {
        // Three export batches' worth (512 spans each): one timeout each.
        for turn in 0..1500 {
            let _span = tracing::info_span!(target: "warden", "turn", turn).entered();
        }
    });
    let started = std::time::Instant::now();
    drop(guard);
    let took = started.elapsed();
    assert!(
        took < bound + Duration::from_millis(500),
        "dropping the guard took {took:?}, the bound is {bound:?}"
    );
}
