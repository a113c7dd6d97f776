//! `warden_telemetry::layer` exports warden's spans from a subscriber the
//! user builds (with their own layers), without installing anything
//! globally; spans of the user's own targets reach their layer but are not
//! exported.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use fake_opentelemetry_collector::FakeCollectorServer;
use tracing::Subscriber;
use tracing::span::{Attributes, Id};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt as _};
use warden_core::testing::ChannelSource;
use warden_core::{EventSource, SessionKey, Supervisor};
use warden_telemetry::TelemetryConfig;

/// The user's own layer: the names of the spans it saw.
struct Seen(Arc<Mutex<Vec<String>>>);

impl<S: Subscriber> Layer<S> for Seen {
    fn on_new_span(&self, attrs: &Attributes<'_>, _: &Id, _: Context<'_, S>) {
        self.0
            .lock()
            .expect("not poisoned")
            .push(attrs.metadata().name().to_owned());
    }
}

async fn within<T>(what: &str, fut: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(30), fut)
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}

#[test]
fn warden_spans_are_exported_from_a_users_own_subscriber() {
    let collector_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let mut collector = collector_rt
        .block_on(FakeCollectorServer::start())
        .expect("collector");
    let config = TelemetryConfig::default().with_otlp_endpoint(collector.endpoint());

    let seen = Arc::new(Mutex::new(Vec::new()));
    let (otlp, guard) = warden_telemetry::layer(&config).expect("layer");
    assert!(otlp.is_some() && guard.is_exporting());
    let subscriber = tracing_subscriber::registry()
        .with(Seen(seen.clone()))
        .with(otlp);
    let work = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    tracing::subscriber::with_default(subscriber, || {
        work.block_on(async {
            drop(tracing::info_span!(target: "myapp", "my.own.span"));
            let (source, ctl) = ChannelSource::new();
            let factory = move |_: &SessionKey| source.clone() as Arc<dyn EventSource>;
            let sup = Supervisor::start(Default::default(), Arc::new(factory))
                .await
                .expect("supervisor");
            let turn = sup.send("ws", "hi").await.expect("send");
            let attempt = within("the attempt", ctl.next_attempt())
                .await
                .expect("opened");
            attempt.text("hello");
            attempt.finish();
            within("the turn", turn.finish()).await.expect("answered");
            sup.shutdown().await;
        });
    });
    drop(guard); // flushes

    let spans = collector_rt.block_on(collector.exported_spans(3, Duration::from_secs(10)));
    let names: Vec<&str> = spans.iter().map(|s| s.name.as_str()).collect();
    for expected in ["session_spawned", "turn_started", "attempt_started"] {
        assert!(
            names.contains(&expected),
            "no {expected} exported: {names:?}"
        );
    }
    assert!(
        !names.contains(&"my.own.span"),
        "the user's own spans are theirs, not exported: {names:?}"
    );
    let seen = seen.lock().expect("not poisoned");
    assert!(seen.iter().any(|n| n == "my.own.span"), "{seen:?}");
    assert!(seen.iter().any(|n| n == "turn_started"), "{seen:?}");
}

#[test]
fn without_an_endpoint_the_layer_is_none_and_nothing_is_exported() {
    let (otlp, guard) =
        warden_telemetry::layer::<tracing_subscriber::Registry>(&TelemetryConfig::default())
            .expect("layer");
    assert!(otlp.is_none());
    assert!(!guard.is_exporting());
}
