//! The spans of a session — a stall killed by the watchdog, a retry, a
//! resume failure and a fresh fallback — reach a real OTLP/gRPC receiver
//! with the documented names, parents, links and attributes, and no prompt
//! or completion text. The scenario runs on a current-thread runtime and
//! the guard's drop is the only flush.
//!
//! A test binary of its own, as each test calling `warden_telemetry::init`:
//! that installs the process's global subscriber, once per process.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use fake_opentelemetry_collector::{ExportedSpan, FakeCollectorServer};
use warden_core::testing::ChannelSource;
use warden_core::{
    Durability, EventSource, MemoryStore, RetryPolicy, SessionConfig, SessionKey, SessionRecord,
    SessionStore, StreamError, Supervisor, SupervisorConfig, WatchdogConfig,
};
use warden_telemetry::TelemetryConfig;

const PROMPT: &str = "SECRET-PROMPT-TEXT-123";
const COMPLETION: &str = "SECRET-COMPLETION-456";

/// Awaits `fut` for at most 30 s, failing with `what` instead of hanging.
async fn within<T>(what: &str, fut: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(30), fut)
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}

async fn scenario() {
    let store = Arc::new(MemoryStore::new());
    let mut r = SessionRecord::new(&SessionKey::new("resume-ws"), None);
    r.set_agent_session_id("old-id");
    store.save(&r, Durability::Flushed).await.expect("save");
    let (source, ctl) = ChannelSource::new();
    let src = source.clone();
    let factory = move |_: &SessionKey| src.clone() as Arc<dyn EventSource>;
    let config = SupervisorConfig::default()
        .with_watchdog(
            WatchdogConfig::default()
                .with_default_timeout(Duration::from_millis(300))
                .expect("valid"),
        )
        .with_session(
            SessionConfig::default().with_retry(
                RetryPolicy::default()
                    .with_backoff(Duration::from_millis(10), Duration::from_millis(20)),
            ),
        );
    let sup = Supervisor::builder(Arc::new(factory))
        .config(config)
        .store(store)
        .start()
        .await
        .expect("supervisor");

    // Stall → watchdog kill → retry → success.
    let turn = sup.send("stall-ws", PROMPT).await.expect("send");
    let first = within("the next attempt to open", ctl.next_attempt())
        .await
        .expect("attempt");
    first.text(COMPLETION); // then silence
    let second = within("the next attempt to open", ctl.next_attempt())
        .await
        .expect("retry");
    second.text(COMPLETION);
    second.finish();
    within("the turn to finish", turn.finish())
        .await
        .expect("answered");

    // Resume failure → fresh fallback.
    let turn = sup.send("resume-ws", PROMPT).await.expect("send");
    let resumed = within("the next attempt to open", ctl.next_attempt())
        .await
        .expect("attempt");
    resumed.fail(StreamError::UnknownSession {
        session_id: "old-id".into(),
        message: "No conversation found with session ID: old-id".into(),
    });
    let fresh = within("the next attempt to open", ctl.next_attempt())
        .await
        .expect("fresh");
    fresh.text(COMPLETION);
    fresh.finish();
    within("the turn to finish", turn.finish())
        .await
        .expect("answered");
    sup.shutdown().await;
}

/// The value of attribute `k` (the collector renders values as debug text).
fn attr(s: &ExportedSpan, k: &str) -> Option<String> {
    let v = s.attributes.get(k)?;
    let start = v.find("Value(")? + "Value(".len();
    let inner = &v[start..];
    let end = inner.find(')')?;
    Some(inner[..end].trim_matches('"').to_owned())
}

fn by_name<'a>(spans: &'a [ExportedSpan], name: &str, key: &str) -> Vec<&'a ExportedSpan> {
    spans
        .iter()
        .filter(|s| s.name == name && attr(s, "warden.session.key").as_deref() == Some(key))
        .collect()
}

fn one<'a>(spans: &'a [ExportedSpan], name: &str, key: &str) -> &'a ExportedSpan {
    let v = by_name(spans, name, key);
    assert_eq!(v.len(), 1, "expected one {name} for {key}, got {}", v.len());
    v[0]
}

/// The one `session_spawned` anchor of `key` whose `warden.incarnation` is
/// `incarnation`.
fn anchor_of<'a>(spans: &'a [ExportedSpan], incarnation: &str, key: &str) -> &'a ExportedSpan {
    let v: Vec<_> = by_name(spans, "session_spawned", key)
        .into_iter()
        .filter(|s| attr(s, "warden.incarnation").as_deref() == Some(incarnation))
        .collect();
    assert_eq!(
        v.len(),
        1,
        "expected one {incarnation} anchor for {key}, got {}",
        v.len()
    );
    v[0]
}

#[test]
fn spans_of_a_stall_a_retry_and_a_fresh_fallback_reach_the_collector() {
    let collector_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let mut collector = collector_rt
        .block_on(FakeCollectorServer::start())
        .expect("collector");
    let endpoint = collector.endpoint();

    // The supervised work on a current-thread runtime, as a small binary's
    // main would run it; the guard is dropped inside it.
    let work = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    work.block_on(async {
        let guard = warden_telemetry::init(
            TelemetryConfig::default()
                .with_otlp_endpoint(endpoint)
                .with_console(false),
        )
        .expect("init");
        assert!(guard.is_exporting());
        scenario().await;
        drop(guard);
    });

    let spans = collector_rt.block_on(collector.exported_spans(13, Duration::from_secs(10)));
    let names: HashMap<&str, usize> = spans.iter().fold(HashMap::new(), |mut m, s| {
        *m.entry(s.name.as_str()).or_default() += 1;
        m
    });
    for expected in [
        "session_spawned",
        "resume_failed",
        "turn_started",
        "attempt_started",
        "stream_timed_out",
        "watchdog_killed",
        "retry_scheduled",
    ] {
        assert!(
            names.contains_key(expected),
            "no {expected} span in {names:?}"
        );
    }
    assert!(
        !spans
            .iter()
            .any(|s| s.name.starts_with("ractor") || s.name.contains("tonic")),
        "foreign spans exported"
    );
    for s in &spans {
        if s.name != "workspace_normalized" {
            assert!(
                s.attributes.contains_key("warden.session.key"),
                "{} lacks the key",
                s.name
            );
        }
        // Nothing a user searches by, and a cost on every span: the
        // emitting file (always the same two), thread, target and busy/idle
        // times are not exported.
        for noise in [
            "code.file.path",
            "code.line.number",
            "code.module.name",
            "thread.id",
            "thread.name",
            "target",
            "busy_ns",
            "idle_ns",
        ] {
            assert!(
                !s.attributes.contains_key(noise),
                "{} carries {noise}",
                s.name
            );
        }
    }

    // The stall: the turn, a trace of its own linked to its incarnation's
    // anchor → two sibling attempts, the retry linked to the killed one;
    // timeout and kill under the killed attempt.
    let anchor = anchor_of(&spans, "spawn", "stall-ws");
    let turn = one(&spans, "turn_started", "stall-ws");
    assert!(turn.parent_span_id.is_empty(), "the turn is a root");
    assert_ne!(
        turn.trace_id, anchor.trace_id,
        "the turn is a trace of its own"
    );
    assert!(
        turn.links.iter().any(|l| l.span_id == anchor.span_id),
        "the turn links to its incarnation's anchor"
    );
    let mut attempts = by_name(&spans, "attempt_started", "stall-ws");
    attempts.sort_by_key(|s| attr(s, "warden.attempt"));
    assert_eq!(attempts.len(), 2);
    for a in &attempts {
        assert_eq!(a.parent_span_id, turn.span_id);
    }
    let (killed, retried) = (attempts[0], attempts[1]);
    assert_eq!(
        attr(killed, "error.type").as_deref(),
        Some("ESTREAM_TIMEOUT")
    );
    assert!(
        killed
            .status
            .as_ref()
            .is_some_and(|s| s.code.contains("ERROR"))
    );
    assert!(
        retried.links.iter().any(|l| l.span_id == killed.span_id),
        "the retry must link to the killed attempt"
    );
    let timeout = one(&spans, "stream_timed_out", "stall-ws");
    assert_eq!(timeout.parent_span_id, killed.span_id);
    assert_eq!(
        attr(timeout, "error.type").as_deref(),
        Some("ESTREAM_TIMEOUT")
    );
    assert!(
        timeout
            .status
            .as_ref()
            .is_some_and(|s| s.code.contains("ERROR"))
    );
    let kill = one(&spans, "watchdog_killed", "stall-ws");
    assert_eq!(kill.parent_span_id, killed.span_id);
    assert_eq!(attr(kill, "error.type").as_deref(), Some("ESTREAM_TIMEOUT"));
    let retry = one(&spans, "retry_scheduled", "stall-ws");
    assert_eq!(retry.parent_span_id, turn.span_id);

    // The resume failure: the failed incarnation and the fresh one, linked.
    let resume = anchor_of(&spans, "resume", "resume-ws");
    assert_eq!(
        attr(resume, "gen_ai.conversation.id").as_deref(),
        Some("old-id")
    );
    let failed = one(&spans, "resume_failed", "resume-ws");
    assert_eq!(failed.parent_span_id, resume.span_id);
    assert_eq!(
        attr(failed, "error.type").as_deref(),
        Some("EUNKNOWN_SESSION")
    );
    let fresh = anchor_of(&spans, "fresh_fallback", "resume-ws");
    assert!(
        fresh.links.iter().any(|l| l.span_id == resume.span_id),
        "fresh incarnation links to the failed one"
    );
    let fresh_turns: Vec<_> = by_name(&spans, "turn_started", "resume-ws")
        .into_iter()
        .filter(|t| t.links.iter().any(|l| l.span_id == fresh.span_id))
        .collect();
    assert_eq!(
        fresh_turns.len(),
        1,
        "the re-delivered turn links to the fresh anchor"
    );
    assert_eq!(
        attr(fresh_turns[0], "gen_ai.operation.name").as_deref(),
        Some("chat")
    );

    // No prompt or completion text anywhere.
    let all = serde_json::to_string(&spans).expect("json");
    assert!(!all.contains(PROMPT), "prompt text exported");
    assert!(!all.contains(COMPLETION), "completion text exported");
}
