//! With no collector listening, the supervised work completes, the guard's
//! flush returns, and the failure is reported once, not once per batch.

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
