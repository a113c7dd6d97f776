//! `kill -9` of `warden serve --agent codex|gemini|claude-code|opencode|kilo-code|qwen-code|aider`
//! mid-turn (the real CLI stalled on the mock), then a restart on the same data directory:
//! the pending message is re-delivered once and answered once (the mock's
//! journal counts the stalled request and the re-delivered one, nothing
//! else), and the CLI's process group the dead warden left running is
//! ended by the new one. Measured before that: a Codex or Gemini process
//! has its stdin closed once the prompt is in, so nothing told it warden
//! died; it stayed up (stalled, for up to its 300 s idle timeout × its
//! attempts), and Codex's held its thread, so the re-delivered turn could
//! not resume it ("already has an active writer") and fell back to a fresh
//! thread.
//!
//! Claude Code keeps its stdin open, but a turn under way goes on when it
//! closes: it re-sent the message on its own and wrote the conversation the
//! next warden resumed, losing the turn before it (measured twice); its
//! process is recorded and ended the same way.
//!
//! OpenCode's `run` has its stdin closed too and, stalled, would wait for
//! ever (warden turns its own stall timeout off); it is ended the same way,
//! and so is Kilo Code's (a node wrapper and its native child: the group).
//! Qwen Code's entry script and its `cli.js` child likewise: signalling the
//! entry alone would leave the child holding the model stream. Aider's
//! (one Python process, `WARDEN_AIDER_BIN`, `WARDEN_REQUIRE_AIDER=1`)
//! the same.
//!
//! The CLIs come from `WARDEN_CODEX_BIN` / `WARDEN_GEMINI_BIN` /
//! `WARDEN_CLAUDE_BIN` / `WARDEN_OPENCODE_BIN` / `WARDEN_KILO_BIN` /
//! `WARDEN_QWEN_BIN` (installed by `.ci/run`); without one its test prints
//! why it is skipped, unless `WARDEN_REQUIRE_CODEX=1` /
//! `WARDEN_REQUIRE_GEMINI=1` / `WARDEN_REQUIRE_CLAUDE=1` /
//! `WARDEN_REQUIRE_OPENCODE=1` / `WARDEN_REQUIRE_KILO=1` /
//! `WARDEN_REQUIRE_QWEN=1`.

use crate::common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::*;
use futures_util::StreamExt as _;
use serde_json::Value;
use warden_mock::{MockConfig, MockServer, Scenario};

const PATIENCE: Duration = Duration::from_secs(60);
/// The mock's answer (it counts the characters of the last user message,
/// which Gemini wraps in context of its own).
const ANSWER: &str = "Hello from warden-mock. Your last message had ";

/// The binary in `var`, or `None` with the skip printed.
fn cli_bin(var: &str, require: &str, test: &str) -> Option<String> {
    match std::env::var(var).ok().filter(|v| !v.is_empty()) {
        Some(bin) => Some(bin),
        None => {
            assert_ne!(
                std::env::var(require).as_deref(),
                Ok("1"),
                "{require}=1 but {var} is unset"
            );
            eprintln!("SKIPPED {test}: set {var} to the CLI's binary to run it");
            None
        }
    }
}

/// The processes whose parent is `parent`.
fn children_of(parent: u32) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|p| {
            let pid: u32 = p.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(p.path().join("stat")).ok()?;
            let rest = &stat[stat.rfind(')')? + 1..];
            let ppid: u32 = rest.split_whitespace().nth(1)?.parse().ok()?;
            (ppid == parent).then_some(pid)
        })
        .collect()
}

/// Whether any process is left in the group `pgid`.
fn group_alive(pgid: u32) -> bool {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .any(|p| {
            std::fs::read_to_string(p.path().join("stat"))
                .ok()
                .and_then(|stat| {
                    let rest = &stat[stat.rfind(')')? + 1..];
                    rest.split_whitespace().nth(2)?.parse::<u32>().ok()
                })
                == Some(pgid)
        })
}

/// Kills the group `.0` leads when dropped, so that a failing test leaves
/// no CLI behind (`0`: disarmed, the group is gone).
struct EndOnDrop(u32);

impl Drop for EndOnDrop {
    fn drop(&mut self) {
        if let Ok(pgid) = i32::try_from(self.0)
            && pgid > 0
        {
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(pgid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

async fn eventually(limit: Duration, what: &str, mut check: impl FnMut() -> bool) {
    let until = Instant::now() + limit;
    while !check() {
        assert!(Instant::now() < until, "timed out after {limit:?}: {what}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Reads SSE `response` until a `done` or `error` event: that event's
/// kind and data.
async fn last_event(response: reqwest::Response) -> (String, Value) {
    let mut body = response.bytes_stream();
    let mut buf = String::new();
    loop {
        while let Some(end) = buf.find("\n\n") {
            let block: String = buf.drain(..end + 2).collect();
            let (mut kind, mut data) = ("", String::new());
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("event: ") {
                    kind = if v == "done" || v == "error" { v } else { "" };
                } else if let Some(v) = line.strip_prefix("data: ") {
                    data.push_str(v);
                }
            }
            if !kind.is_empty() {
                return (kind.to_owned(), serde_json::from_str(&data).expect("JSON"));
            }
        }
        let chunk = tokio::time::timeout(PATIENCE, body.next())
            .await
            .expect("events in time")
            .expect("the stream goes on")
            .expect("chunk");
        buf.push_str(&String::from_utf8_lossy(&chunk));
    }
}

/// One agent's run: serve with `agent`, a turn stalled at `path`, kill -9,
/// restart, the answer; returns the test's directory for agent checks.
async fn kill_9_mid_turn(agent: &str, path: &str, env: &[(&str, &str)]) -> tempfile::TempDir {
    let mock =
        MockServer::start(MockConfig::default().with_sequence([Scenario::Stall, Scenario::Normal]))
            .await
            .expect("mock");
    let dir = tempfile::tempdir().expect("tempdir");
    let (data, workspace, home) = test_dirs(dir.path());
    let mut env = env.to_vec();
    env.extend([("HOME", arg(&home)), ("WARDEN_STREAM_TIMEOUT", "60000")]);
    let flags = ["--agent", agent, "--grace", "1"];
    let (mut node, base, token, _) = serve_logged(&data, &mock.base_url(), &flags, &env).await;
    let client = reqwest::Client::new();
    let (response, id) = post_workspace_turn(&client, &base, &token, &workspace, "hello").await;
    eventually(PATIENCE, "the CLI reached the mock", || {
        mock.requests_to(path) == 1
    })
    .await;
    let serve_pid = node.id().expect("a pid");
    let cli = children_of(serve_pid);
    assert_eq!(cli.len(), 1, "one CLI process under warden: {cli:?}");
    let cli = cli[0];
    let mut cleanup = EndOnDrop(cli);

    node.start_kill().expect("SIGKILL");
    let _ = tokio::time::timeout(PATIENCE, node.wait())
        .await
        .expect("dead in time");
    drop(response);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        group_alive(cli),
        "the CLI outlived warden (what the restart must end)"
    );

    let (mut node, base, token, logged) = serve_logged(&data, &mock.base_url(), &flags, &env).await;
    let events = client
        .get(format!("{base}/v1/turns/{id}/events"))
        .bearer_auth(&token)
        .send()
        .await
        .expect("get");
    let (kind, data) = last_event(events).await;
    assert_eq!(kind, "done", "{data}");
    let text = data["text"].as_str().unwrap_or_default();
    assert!(
        text.starts_with(ANSWER) && text.matches(ANSWER).count() == 1,
        "the re-delivered message answered once: {data}"
    );
    eventually(
        Duration::from_secs(10),
        "the orphaned CLI group ended",
        || !group_alive(cli),
    )
    .await;
    cleanup.0 = 0;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        mock.requests_to(path),
        2,
        "the stalled request and the re-delivered one, nothing else"
    );
    assert!(
        logged
            .lock()
            .iter()
            .any(|l| l.contains("ended 1 agent process group")),
        "the restart says what it ended: {:?}",
        logged.lock()
    );
    node.start_kill().expect("SIGKILL");
    let _ = tokio::time::timeout(PATIENCE, node.wait()).await;
    mock.shutdown().await;
    dir
}

/// Codex's session files (one per thread) under `home`.
fn codex_threads(home: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut dirs = vec![home.join(".codex/sessions")];
    while let Some(dir) = dirs.pop() {
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            if e.path().is_dir() {
                dirs.push(e.path());
            } else {
                files.push(e.path());
            }
        }
    }
    files
}

/// Codex: re-delivered on the same thread (the orphan no longer holds
/// it), answered once, the orphan gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_codex_turn_killed_with_warden_is_redelivered_once_on_its_thread_and_its_cli_ended() {
    let Some(bin) = cli_bin(
        "WARDEN_CODEX_BIN",
        "WARDEN_REQUIRE_CODEX",
        "a_codex_turn_killed_with_warden",
    ) else {
        return;
    };
    let env = [
        ("WARDEN_CODEX_BIN", bin.as_str()),
        ("OPENAI_API_KEY", "dummy"),
    ];
    let dir = kill_9_mid_turn("codex", "/v1/responses", &env).await;
    let threads = codex_threads(&dir.path().join("home"));
    assert_eq!(threads.len(), 1, "one thread, resumed: {threads:?}");
}

/// Gemini: re-delivered (fresh: a first turn that failed leaves Gemini
/// nothing to resume), answered once, the orphan gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gemini_turn_killed_with_warden_is_redelivered_once_and_its_cli_ended() {
    let Some(bin) = cli_bin(
        "WARDEN_GEMINI_BIN",
        "WARDEN_REQUIRE_GEMINI",
        "a_gemini_turn_killed_with_warden",
    ) else {
        return;
    };
    let env = [
        ("WARDEN_GEMINI_BIN", bin.as_str()),
        ("GEMINI_API_KEY", "dummy"),
    ];
    kill_9_mid_turn(
        "gemini",
        "/v1beta/models/gemini-2.5-pro:streamGenerateContent",
        &env,
    )
    .await;
}

/// Claude Code: re-delivered once (resumed: the session's id was stored
/// when the CLI announced it), answered once, the orphan gone before it
/// could re-send the message on its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claude_code_turn_killed_with_warden_is_redelivered_once_and_its_cli_ended() {
    let Some(bin) = cli_bin(
        "WARDEN_CLAUDE_BIN",
        "WARDEN_REQUIRE_CLAUDE",
        "a_claude_code_turn_killed_with_warden",
    ) else {
        return;
    };
    let env = [
        ("WARDEN_CLAUDE_BIN", bin.as_str()),
        ("ANTHROPIC_API_KEY", "dummy"),
        ("DISABLE_TELEMETRY", "1"),
        ("DISABLE_AUTOUPDATER", "1"),
        ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1"),
    ];
    kill_9_mid_turn("claude-code", "/v1/messages", &env).await;
}

/// OpenCode: re-delivered once on its session (`-s`, the id its first
/// line announced), answered once, the orphan gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_opencode_turn_killed_with_warden_is_redelivered_once_and_its_cli_ended() {
    let Some(bin) = cli_bin(
        "WARDEN_OPENCODE_BIN",
        "WARDEN_REQUIRE_OPENCODE",
        "an_opencode_turn_killed_with_warden",
    ) else {
        return;
    };
    let env = [("WARDEN_OPENCODE_BIN", bin.as_str())];
    kill_9_mid_turn("opencode", "/v1/chat/completions", &env).await;
}

/// Kilo Code: the same, its node wrapper's whole group ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kilo_turn_killed_with_warden_is_redelivered_once_and_its_cli_ended() {
    let Some(bin) = cli_bin(
        "WARDEN_KILO_BIN",
        "WARDEN_REQUIRE_KILO",
        "a_kilo_turn_killed_with_warden",
    ) else {
        return;
    };
    let env = [("WARDEN_KILO_BIN", bin.as_str())];
    kill_9_mid_turn("kilo-code", "/v1/chat/completions", &env).await;
}

/// Qwen Code: re-delivered once on its session (`--resume`, the id of its
/// `init` line), answered once, its entry and `cli.js` child (one group)
/// gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_qwen_code_turn_killed_with_warden_is_redelivered_once_and_its_cli_ended() {
    let Some(bin) = cli_bin(
        "WARDEN_QWEN_BIN",
        "WARDEN_REQUIRE_QWEN",
        "a_qwen_code_turn_killed_with_warden",
    ) else {
        return;
    };
    let env = [
        ("WARDEN_QWEN_BIN", bin.as_str()),
        ("OPENAI_API_KEY", "dummy"),
    ];
    kill_9_mid_turn("qwen-code", "/v1/chat/completions", &env).await;
}

/// Aider: one Python process, its stdin closed and `--timeout` a day, so
/// stalled it would wait on; re-delivered once on its conversation (its
/// chat-history file), answered once, its process gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_aider_turn_killed_with_warden_is_redelivered_once_and_its_cli_ended() {
    let Some(bin) = cli_bin(
        "WARDEN_AIDER_BIN",
        "WARDEN_REQUIRE_AIDER",
        "an_aider_turn_killed_with_warden",
    ) else {
        return;
    };
    let env = [
        ("WARDEN_AIDER_BIN", bin.as_str()),
        ("OPENAI_API_KEY", "dummy"),
    ];
    kill_9_mid_turn("aider", "/v1/chat/completions", &env).await;
}
