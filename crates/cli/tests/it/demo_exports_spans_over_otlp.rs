//! With `OTEL_EXPORTER_OTLP_ENDPOINT` set, `warden demo` exports its spans
//! over OTLP/gRPC to a real receiver and flushes them before it exits,
//! without prompt or completion text.

use crate::common;

use std::time::Duration;

use common::*;
use fake_opentelemetry_collector::FakeCollectorServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_story_reaches_the_collector() {
    let mut collector = FakeCollectorServer::start().await.expect("collector");
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cmd = command(&["demo", "--quick", "--json", "--data-dir", arg(dir.path())]);
    cmd.env("OTEL_EXPORTER_OTLP_ENDPOINT", collector.endpoint());
    let out = output(cmd, Duration::from_secs(60)).await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));

    // The process has exited: everything it exported is here.
    let spans = collector
        .exported_spans(100_000, Duration::from_secs(2))
        .await;
    let named = |name: &str| spans.iter().filter(|s| s.name == name).count();
    assert_eq!(named("watchdog_killed"), 1, "the stall's kill");
    let fresh = spans
        .iter()
        .filter(|s| {
            s.name == "session_spawned"
                && s.attributes
                    .get("warden.incarnation")
                    .is_some_and(|v| format!("{v:?}").contains("fresh_fallback"))
        })
        .count();
    assert_eq!(fresh, 2, "the two resume failures");
    assert!(named("session_reaped") >= 1);
    assert!(named("retry_scheduled") >= 1, "the 429");
    assert_eq!(
        named("continue_scheduled"),
        1,
        "the stalled reply, continued"
    );
    let kill = spans
        .iter()
        .find(|s| s.name == "watchdog_killed")
        .expect("kill span");
    let key = format!(
        "{:?}",
        kill.attributes
            .get("warden.session.key")
            .expect("session key attribute")
    );
    assert!(key.contains("demo-workspaces/api-server"), "{key}");
    // No prompt or completion text in any attribute or event.
    for span in &spans {
        let text = format!("{:?} {:?}", span.attributes, span.events);
        for secret in ["Why does the integration test hang?", "I read the code"] {
            assert!(!text.contains(secret), "{} leaks {secret:?}", span.name);
        }
    }
}
