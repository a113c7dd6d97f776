//! The library's wire layer, as a program using `warden-wire` calls it:
//! [`WiredSourceFactory::start`] with an adapter's options, handed to a
//! [`Supervisor`]. With the real Claude Code (`WARDEN_CLAUDE_BIN`, which
//! `.ci/run` installs; without it the test prints why it is skipped,
//! unless `WARDEN_REQUIRE_CLAUDE=1` or `CI` is set) a reply stalled mid-text
//! by `warden mock` is continued at the wire: the whole reply once, the CLI
//! run once, the mock's journal a continuation, not a second whole
//! request; the session's route goes when the session does. And the wire
//! itself: typed errors, the server gone with the last source.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use warden_claude::ClaudeOptions;
use warden_core::{
    RetryPolicy, SessionConfig, SessionKey, SourceFactory, StreamOptions, Supervisor,
    SupervisorConfig,
};
use warden_mock::{MockConfig, MockServer, Scenario};
use warden_wire::{WireError, WireOptions, WiredSourceFactory};

/// The sessions' stream timeout: the process watchdog allows this much
/// silence on the CLI's stdout; the wire layer half of it upstream.
const TIMEOUT: Duration = Duration::from_secs(8);

/// How long a turn may take before the test fails.
const PATIENCE: Duration = Duration::from_secs(90);

fn claude_bin() -> Option<String> {
    match std::env::var("WARDEN_CLAUDE_BIN")
        .ok()
        .filter(|v| !v.is_empty())
    {
        Some(bin) => Some(bin),
        None => {
            let required = std::env::var("WARDEN_REQUIRE_CLAUDE").as_deref() == Ok("1")
                || std::env::var_os("CI").is_some();
            assert!(!required, "WARDEN_CLAUDE_BIN is unset");
            eprintln!("SKIPPED: set WARDEN_CLAUDE_BIN to the claude binary to run it");
            None
        }
    }
}

fn config() -> SupervisorConfig {
    SupervisorConfig::default().with_session(
        SessionConfig::default()
            .with_stream(StreamOptions::default().with_timeout(TIMEOUT))
            .with_retry(
                RetryPolicy::default()
                    .with_jitter(0.0)
                    .with_backoff(Duration::from_millis(10), Duration::from_millis(10)),
            ),
    )
}

/// Claude Code's options as a program would write them, against `mock`,
/// its home and config under `dir`.
fn claude_options(claude: &str, mock: &MockServer, dir: &Path) -> ClaudeOptions {
    let home = dir.join("home");
    std::fs::create_dir_all(&home).expect("home");
    ClaudeOptions::default()
        .with_binary(claude)
        .with_env("ANTHROPIC_BASE_URL", mock.base_url())
        .with_env("ANTHROPIC_API_KEY", "dummy")
        .with_env("HOME", &home)
        .with_env("DISABLE_TELEMETRY", "1")
        .with_env("DISABLE_AUTOUPDATER", "1")
        .with_env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_library_claude_source_has_a_mid_text_stall_continued_at_the_wire_not_rerun() {
    let Some(claude) = claude_bin() else {
        return;
    };
    let mock =
        MockServer::start(MockConfig::default().with_sequence([Scenario::Stall, Scenario::Normal]))
            .await
            .expect("mock");
    let dir = tempfile::tempdir().expect("tempdir");
    let workspace = dir.path().join("repo");
    std::fs::create_dir_all(&workspace).expect("workspace");

    // What the crate docs show: the options, the wire, the supervisor.
    let options = claude_options(&claude, &mock, dir.path());
    let factory = WiredSourceFactory::start(options, WireOptions::new(TIMEOUT))
        .await
        .expect("the wire starts");
    let factory = Arc::new(factory);
    let wire = factory.wire().expect("on by default").clone();
    let supervisor = Supervisor::start(config(), factory.clone())
        .await
        .expect("supervisor");

    let started = Instant::now();
    let turn = supervisor
        .send_to_workspace(&workspace, "hello")
        .await
        .expect("sent");
    let (text, summary) = tokio::time::timeout(PATIENCE, turn.finish())
        .await
        .expect("the turn ends within its patience")
        .expect("the turn succeeds");
    let took = started.elapsed();
    eprintln!("through the library's wire: {took:?}, {summary:?}");

    assert!(text.starts_with("Hello from warden-mock."), "{text:?}");
    assert_eq!(
        text.matches("Hello from warden-mock.").count(),
        1,
        "the reply once: {text:?}"
    );
    assert_eq!(
        summary.attempts, 1,
        "the CLI ran once, not killed and re-run"
    );
    let requests: Vec<_> = mock
        .requests()
        .into_iter()
        .filter(|r| r.path == "/v1/messages")
        .map(|r| (r.scenario, r.continuation))
        .collect();
    assert_eq!(
        requests.len(),
        2,
        "the stalled request and one more: {requests:?}"
    );
    assert!(
        requests[1].1.is_some(),
        "the second request continues the first, not a second whole one: {requests:?}"
    );
    assert!(
        took < TIMEOUT + Duration::from_secs(2),
        "within the stream timeout and 2 s: {took:?}"
    );

    assert_eq!(wire.routes(), 1, "the session's route");
    supervisor.shutdown().await;
    assert_eq!(wire.routes(), 0, "the route went with the session");
    mock.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wire_server_ends_when_its_last_source_is_dropped() {
    let options = ClaudeOptions::default().with_env("ANTHROPIC_BASE_URL", "http://127.0.0.1:9");
    let factory = WiredSourceFactory::start(options, WireOptions::default())
        .await
        .expect("the wire starts");
    let url = factory.wire().expect("on").url().to_owned();
    let addr = url.trim_start_matches("http://").to_owned();
    let source = factory.source_for(&SessionKey::new("/work/a"));
    drop(factory);
    tokio::net::TcpStream::connect(&addr)
        .await
        .expect("a source still holds the wire");
    drop(source);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if tokio::net::TcpStream::connect(&addr).await.is_err() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the wire at {url} still listens 5 s after its last source went"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn the_wire_says_why_it_cannot_start_and_the_off_switch_starts_none() {
    let bad = ClaudeOptions::default().with_env("ANTHROPIC_BASE_URL", "ftp://nowhere");
    let err = WiredSourceFactory::start(bad.clone(), WireOptions::default())
        .await
        .expect_err("not an http(s) upstream");
    assert!(matches!(err, WireError::Config(_)), "{err:?}");
    let off = WiredSourceFactory::start(bad, WireOptions::off())
        .await
        .expect("no wire, nothing to refuse");
    assert!(off.wire().is_none() && off.source().is_none());
}
