//! `warden sessions`, `warden mock` and the top-level help.

use crate::common;

use std::time::Duration;

use common::*;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::Value;
use tokio::io::AsyncBufReadExt;
use warden_core::{Durability, SessionKey, SessionRecord, SessionStore};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_lists_what_is_stored_and_reports_corrupt_records() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Nothing stored yet: not an error, and nothing is created.
    let out = run(&["sessions", "--data-dir", arg(&dir.path().join("empty"))]).await;
    assert_eq!(code(&out), 0);
    assert!(stderr(&out).contains("no sessions stored"));
    assert!(!dir.path().join("empty").exists());
    let out = run(&[
        "sessions",
        "--json",
        "--data-dir",
        arg(&dir.path().join("empty")),
    ])
    .await;
    assert_eq!(stdout(&out).trim(), "[]");

    {
        let store = warden_store::SledStore::open(dir.path().join("sessions.db")).expect("open");
        let mut record = SessionRecord::new(&SessionKey::new("bot-channel-42"), None);
        record.set_agent_session_id("3f2c9a1e-0000-4000-8000-000000000001");
        record.restart_count = 2;
        store
            .save(&record, Durability::Flushed)
            .await
            .expect("save");
    }
    let out = run(&["sessions", "--data-dir", arg(dir.path())]).await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let table = stdout(&out);
    let header = table.lines().next().expect("header");
    for column in [
        "KEY",
        "WORKSPACE",
        "AGENT SESSION",
        "STATUS",
        "CTX",
        "LAST ACTIVE",
        "RESTARTS",
    ] {
        assert!(header.contains(column), "{header}");
    }
    assert!(
        table.contains("bot-channel-42") && table.contains("3f2c9a1e-0000-4000-8000-000000000001")
    );

    // A corrupt record is reported, skipped, and the exit code says so.
    {
        let store = warden_store::SledStore::open(dir.path().join("sessions.db")).expect("open");
        store.put_raw("broken", b"\x00\x01garbage").expect("put");
        store.flush().await.expect("flush");
    }
    let out = run(&["sessions", "--json", "--data-dir", arg(dir.path())]).await;
    assert_eq!(code(&out), 1);
    assert!(
        stderr(&out).contains("skipped a record"),
        "{}",
        stderr(&out)
    );
    let list: Vec<Value> = serde_json::from_str(&stdout(&out)).expect("JSON");
    assert_eq!(list.len(), 1);
    assert_eq!(list[0]["restarts"], 2);
    assert_eq!(list[0]["workspace"], Value::Null);

    // Held by another process.
    let _held = warden_store::SledStore::open(dir.path().join("sessions.db")).expect("open");
    let out = run(&["sessions", "--data-dir", arg(dir.path())]).await;
    assert_eq!(code(&out), 1);
    assert_one_line_error(&out, "in use by another warden process");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_serves_its_scenarios_until_sigterm() {
    let help = run(&["mock", "--help"]).await;
    assert_eq!(code(&help), 0);
    for scenario in warden_mock::Scenario::all() {
        assert!(stdout(&help).contains(scenario.name()), "{}", stdout(&help));
    }
    let bad = run(&["mock", "--scenario", "nope"]).await;
    assert_eq!(code(&bad), 2);
    assert!(stderr(&bad).contains("thinking-pings"), "{}", stderr(&bad));

    let mut child = command(&["mock", "--scenario", "rate-limited", "--retry-after", "50"])
        .spawn()
        .expect("spawn");
    let stdout_pipe = child.stdout.take().expect("stdout");
    let mut lines = tokio::io::BufReader::new(stdout_pipe).lines();
    let first = tokio::time::timeout(Duration::from_secs(10), lines.next_line())
        .await
        .expect("in time")
        .expect("read")
        .expect("a line");
    let url = first
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .expect("the URL")
        .to_owned();
    // The port is taken now: a second server on it fails with one line.
    let port = url.rsplit(':').next().expect("port");
    let taken = run(&["mock", "--port", port]).await;
    assert_eq!(code(&taken), 1);
    assert_one_line_error(&taken, "cannot start the mock server");

    // warden's own client against it: the default scenario is a 429 on
    // every request, so retries run out with exit 5.
    let out = run(&["stream", &format!("{url}/v1/messages"), "--retries", "1"]).await;
    assert_eq!(code(&out), 5, "{}", stderr(&out));
    assert_one_line_error(&out, "HTTP 429");
    // A scenario chosen by path.
    let out = run(&["stream", &format!("{url}/scenario/normal/v1/messages")]).await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));

    kill(
        Pid::from_raw(child.id().expect("pid") as i32),
        Signal::SIGTERM,
    )
    .expect("SIGTERM");
    let status = tokio::time::timeout(Duration::from_secs(10), child.wait())
        .await
        .expect("stopped")
        .expect("status");
    assert_eq!(status.code(), Some(0));
}

/// `--scenario a,b`: a script, the first request plays `a` and every later
/// one `b`, so "fails once, then answers" needs nothing but the binary.
#[tokio::test]
async fn mock_plays_a_scripted_sequence_of_scenarios() {
    let bad = run(&["mock", "--scenario", "stall,nope"]).await;
    assert_eq!(code(&bad), 2, "{}", stderr(&bad));
    let mut child = command(&[
        "mock",
        "--scenario",
        "rate-limited,normal",
        "--retry-after",
        "50",
    ])
    .spawn()
    .expect("spawn");
    let stdout_pipe = child.stdout.take().expect("stdout");
    let mut lines = tokio::io::BufReader::new(stdout_pipe).lines();
    let first = tokio::time::timeout(Duration::from_secs(10), lines.next_line())
        .await
        .expect("in time")
        .expect("read")
        .expect("a line");
    assert!(first.contains("rate-limited,normal"), "{first}");
    let url = first
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .expect("the URL")
        .to_owned();
    // The first request is the 429; the retry is answered.
    let out = run(&["stream", &format!("{url}/v1/messages"), "--retries", "1"]).await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    // Every later request too: the script's last scenario repeats.
    let out = run(&["stream", &format!("{url}/v1/messages"), "--retries", "0"]).await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let _ = child.start_kill();
    let _ = tokio::time::timeout(Duration::from_secs(10), child.wait()).await;
}

#[tokio::test]
async fn help_documents_commands_and_exit_codes() {
    let out = run(&["--help"]).await;
    assert_eq!(code(&out), 0);
    let help = stdout(&out);
    for needle in [
        "demo",
        "chat",
        "stream",
        "sessions",
        "mock",
        "Exit codes:",
        "130",
    ] {
        assert!(help.contains(needle), "{needle}: {help}");
    }
    let out = run(&[]).await;
    assert_eq!(code(&out), 2);
}
