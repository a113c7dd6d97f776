//! The wire layer under an agent CLI: `warden chat --agent claude-code`
//! runs the real Claude Code with its model traffic through warden's own
//! watched engine (in the same process, on loopback). A stream that stalls
//! mid-reply is continued inside the CLI's own request: the CLI never sees
//! the fault, is not killed or re-run, and the reply is not generated
//! again — the mock's journal shows a continuation request, not a second
//! whole one. With `--no-wire-watch` the same stall costs the process
//! watchdog's kill and a re-run.
//!
//! The CLI comes from `WARDEN_CLAUDE_BIN` (installed by `.ci/run`); without
//! it the test prints why it is skipped, unless `WARDEN_REQUIRE_CLAUDE=1`.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::*;
use warden_mock::{MockConfig, MockServer, Scenario};

/// The stream timeout: the process watchdog allows this much silence on
/// the CLI's stdout; the wire layer half of it on the upstream stream.
const TIMEOUT_MS: u64 = 8000;

fn claude_bin() -> Option<String> {
    match std::env::var("WARDEN_CLAUDE_BIN")
        .ok()
        .filter(|v| !v.is_empty())
    {
        Some(bin) => Some(bin),
        None => {
            assert_ne!(
                std::env::var("WARDEN_REQUIRE_CLAUDE").as_deref(),
                Ok("1"),
                "WARDEN_REQUIRE_CLAUDE=1 but WARDEN_CLAUDE_BIN is unset"
            );
            eprintln!("SKIPPED: set WARDEN_CLAUDE_BIN to the claude binary to run it");
            None
        }
    }
}

/// `warden chat --agent claude-code` of `message` in `workspace` against
/// `mock`, with `extra` flags.
async fn chat(
    claude: &str,
    mock: &MockServer,
    dir: &Path,
    extra: &[&str],
) -> (std::process::Output, Duration) {
    let (workspace, data, home) = (dir.join("repo"), dir.join("data"), dir.join("home"));
    for d in [&workspace, &home] {
        std::fs::create_dir_all(d).expect("mkdir");
    }
    let base = mock.base_url();
    let mut args = vec![
        "chat",
        "--workspace",
        arg(&workspace),
        "--agent",
        "claude-code",
        "--claude-bin",
        claude,
        "--base-url",
        &base,
        "--data-dir",
        arg(&data),
    ];
    args.extend(extra);
    args.push("hello");
    let mut cmd = command(&args);
    let timeout = TIMEOUT_MS.to_string();
    cmd.env("HOME", arg(&home))
        .env("WARDEN_STREAM_TIMEOUT", &timeout)
        .env("ANTHROPIC_API_KEY", "dummy")
        .env("DISABLE_TELEMETRY", "1")
        .env("DISABLE_AUTOUPDATER", "1")
        .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1");
    let started = Instant::now();
    let out = output(cmd, Duration::from_secs(120)).await;
    (out, started.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claude_code_reply_stalled_mid_text_is_continued_at_the_wire_not_rerun() {
    let Some(claude) = claude_bin() else {
        return;
    };
    let mock =
        MockServer::start(MockConfig::default().with_sequence([Scenario::Stall, Scenario::Normal]))
            .await
            .expect("mock");
    let dir = tempfile::tempdir().expect("tempdir");
    let (out, took) = chat(&claude, &mock, dir.path(), &[]).await;
    check_no_panic(&out);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.starts_with("Hello from warden-mock.")
            && text.matches("Hello from warden-mock.").count() == 1,
        "the whole reply, once: {text:?}"
    );
    let said = stderr(&out);
    eprintln!("through the wire: {took:?}; stderr: {said}");
    assert!(
        said.contains("wire layer:"),
        "the wire said what it did: {said}"
    );
    assert!(
        !said.contains("Connection lost during streaming") && !said.contains("retrying"),
        "the CLI was not killed and re-run: {said}"
    );
    let requests: Vec<_> = mock
        .requests()
        .into_iter()
        .filter(|r| r.path == "/v1/messages")
        .collect();
    let kinds: Vec<_> = requests
        .iter()
        .map(|r| (r.scenario, r.continuation))
        .collect();
    assert_eq!(
        requests.len(),
        2,
        "the stalled request and one more: {kinds:?}"
    );
    assert!(
        requests[1].continuation.is_some(),
        "the second request continues the first, not a second whole one: {kinds:?}"
    );
    assert!(
        took < Duration::from_millis(TIMEOUT_MS) + Duration::from_secs(6),
        "within the stream timeout and a few seconds: {took:?}"
    );
    mock.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_wire_the_same_stall_costs_a_kill_and_a_rerun() {
    let Some(claude) = claude_bin() else {
        return;
    };
    let mock =
        MockServer::start(MockConfig::default().with_sequence([Scenario::Stall, Scenario::Normal]))
            .await
            .expect("mock");
    let dir = tempfile::tempdir().expect("tempdir");
    let (out, took) = chat(&claude, &mock, dir.path(), &["--no-wire-watch"]).await;
    eprintln!("without the wire: {took:?}");
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("Connection lost during streaming"),
        "the process watchdog killed the stalled CLI: {}",
        stderr(&out)
    );
    assert!(
        mock.requests()
            .iter()
            .filter(|r| r.path == "/v1/messages")
            .all(|r| r.continuation.is_none()),
        "nothing continued the reply"
    );
    mock.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claude_code_reply_cut_mid_text_is_continued_at_the_wire() {
    let Some(claude) = claude_bin() else {
        return;
    };
    let mock = MockServer::start(
        MockConfig::default().with_sequence([Scenario::AbruptClose, Scenario::Normal]),
    )
    .await
    .expect("mock");
    let dir = tempfile::tempdir().expect("tempdir");
    let (out, took) = chat(&claude, &mock, dir.path(), &[]).await;
    eprintln!("cut, through the wire: {took:?}");
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let text = stdout(&out);
    assert_eq!(
        text.matches("Hello from warden-mock.").count(),
        1,
        "the whole reply, once: {text:?}"
    );
    let requests: Vec<_> = mock
        .requests()
        .into_iter()
        .filter(|r| r.path == "/v1/messages")
        .collect();
    assert_eq!(requests.len(), 2, "the cut request and its continuation");
    assert!(
        requests[1].continuation.is_some(),
        "a continuation, not a re-send"
    );
    mock.shutdown().await;
}

/// A stall inside a thinking block cannot be continued (only the model can
/// sign a thinking block): the wire holds thinking back, so it retries the
/// request from scratch unseen — the CLI sees one whole answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claude_code_reply_stalled_in_thinking_is_retried_unseen_at_the_wire() {
    let Some(claude) = claude_bin() else {
        return;
    };
    let mock = MockServer::start(
        MockConfig::default().with_sequence([Scenario::StallInThinking, Scenario::Normal]),
    )
    .await
    .expect("mock");
    let dir = tempfile::tempdir().expect("tempdir");
    let (out, took) = chat(&claude, &mock, dir.path(), &[]).await;
    eprintln!("stalled in thinking, through the wire: {took:?}");
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(
        stdout(&out).matches("Hello from warden-mock.").count(),
        1,
        "{}",
        stdout(&out)
    );
    assert!(
        !stderr(&out).contains("Connection lost during streaming"),
        "the CLI was not killed: {}",
        stderr(&out)
    );
    let requests: Vec<_> = mock
        .requests()
        .into_iter()
        .filter(|r| r.path == "/v1/messages")
        .map(|r| (r.scenario, r.continuation))
        .collect();
    assert_eq!(
        requests,
        [
            (Some(Scenario::StallInThinking), None),
            (Some(Scenario::Normal), None)
        ],
        "the stalled request, then one whole retry"
    );
    mock.shutdown().await;
}

/// An overloaded answer before any byte goes back to the CLI at once (its
/// own retry takes it up, as it would alone): one more request, not the
/// wire's retries multiplying the CLI's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_529_before_any_byte_is_retried_by_claude_code_itself_once() {
    let Some(claude) = claude_bin() else {
        return;
    };
    let mock = MockServer::start(
        MockConfig::default().with_sequence([Scenario::Overloaded, Scenario::Normal]),
    )
    .await
    .expect("mock");
    let dir = tempfile::tempdir().expect("tempdir");
    let (out, took) = chat(&claude, &mock, dir.path(), &[]).await;
    eprintln!("529 then a reply, through the wire: {took:?}");
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(
        stdout(&out).matches("Hello from warden-mock.").count(),
        1,
        "{}",
        stdout(&out)
    );
    assert_eq!(
        mock.requests_to("/v1/messages"),
        2,
        "the 529 and one retry, no more"
    );
    mock.shutdown().await;
}
