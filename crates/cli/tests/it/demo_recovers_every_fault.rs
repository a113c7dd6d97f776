//! `warden demo --quick` end to end: the real binary, the in-process mock
//! LLM server, a sled database on disk. Every injected fault must show up
//! as its transition and recover, and `warden sessions` must then list
//! what the demo stored.

use crate::common;

use std::collections::HashMap;
use std::time::Duration;

use common::*;
use serde_json::Value;

fn events(out: &str) -> Vec<Value> {
    out.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

fn count(events: &[Value], workspace: &str, kind: &str) -> usize {
    events
        .iter()
        .filter(|e| e["workspace"] == workspace && e["event"] == kind)
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_quick_shows_each_fault_and_its_recovery() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = run(&["demo", "--quick", "--json", "--data-dir", arg(dir.path())]).await;
    assert_eq!(
        code(&out),
        0,
        "stderr: {}\nstdout: {}",
        stderr(&out),
        stdout(&out)
    );
    let events = events(&stdout(&out));

    // The stall: one kill mid-reply on the first attempt, then the reply
    // continued (not replayed).
    let kill = events
        .iter()
        .find(|e| e["workspace"] == "api-server" && e["event"] == "stream_timed_out")
        .expect("the watchdog killed the stalled stream");
    assert_eq!(kill["attempt"], 1);
    assert!(kill["silent_ms"].as_u64().expect("silent_ms") >= 1000);
    let continued = events
        .iter()
        .find(|e| e["workspace"] == "api-server" && e["event"] == "continue_scheduled")
        .expect("the broken reply was continued");
    assert!(continued["kept_bytes"].as_u64() > Some(0), "{continued}");
    assert_eq!(count(&events, "api-server", "retry_scheduled"), 0);
    // Pings through the thinking pause: never killed.
    assert_eq!(count(&events, "docs-site", "stream_timed_out"), 0);
    // The 429: retried after retry-after.
    let retry = events
        .iter()
        .find(|e| e["workspace"] == "billing" && e["event"] == "retry_scheduled")
        .expect("the 429 was retried");
    assert_eq!(retry["code"], "EAPI");
    assert!(retry["delay_ms"].as_u64().expect("delay") >= 499);
    // Two resume failures, each a fresh start with a notice.
    for (workspace, cause) in [
        ("legacy-app", "unknown_session"),
        ("monorepo", "prompt_too_long"),
    ] {
        let failed = events
            .iter()
            .find(|e| e["workspace"] == workspace && e["event"] == "resume_failed")
            .unwrap_or_else(|| panic!("{workspace}: no resume failure"));
        assert_eq!(failed["cause"], cause);
        assert_eq!(
            count(&events, workspace, "fresh_fallback"),
            1,
            "{workspace}"
        );
        assert_eq!(count(&events, workspace, "user_notified"), 1, "{workspace}");
    }
    // The idle reap and the resume.
    assert!(count(&events, "mobile-app", "session_reaped") >= 1);
    // Every message answered, and no turn failed.
    for (workspace, messages) in [
        ("api-server", 3),
        ("docs-site", 2),
        ("billing", 2),
        ("legacy-app", 2),
        ("monorepo", 2),
        ("mobile-app", 2),
    ] {
        let finished: Vec<&Value> = events
            .iter()
            .filter(|e| e["workspace"] == workspace && e["event"] == "turn_finished")
            .collect();
        assert_eq!(finished.len(), messages, "{workspace}");
        assert!(
            finished.iter().all(|e| e["code"].is_null()),
            "{workspace}: {finished:?}"
        );
    }
    // The context indicator climbs turn by turn.
    let ctx: Vec<u64> = events
        .iter()
        .filter(|e| e["workspace"] == "api-server" && e["event"] == "context_usage")
        .map(|e| e["percent"].as_u64().expect("percent"))
        .collect();
    assert_eq!(ctx.len(), 3);
    assert!(ctx[0] < ctx[1] && ctx[1] < ctx[2], "{ctx:?}");

    // The summary is the last object and every check holds.
    let summary = events.last().expect("a summary");
    assert_eq!(summary["event"], "summary");
    assert_eq!(summary["ok"], true, "{summary:#}");
    let checks = summary["checks"].as_array().expect("checks");
    assert!(checks.len() >= 8);
    let recovery = checks
        .iter()
        .find(|c| c["name"] == "api-server")
        .and_then(|c| c["metrics"]["recovery_ms"].as_u64())
        .expect("the stall's recovery time");
    assert!(recovery < 5_000, "{recovery}");
    let api = checks
        .iter()
        .find(|c| c["name"] == "api-server")
        .map(|c| &c["metrics"])
        .expect("api-server");
    let (generated, restart) = (
        api["tokens_generated"].as_u64().expect("tokens generated"),
        api["tokens_if_restarted"].as_u64().expect("restart cost"),
    );
    assert!(
        generated < restart,
        "continued {generated} vs restart {restart}"
    );

    // What the demo stored, through `warden sessions`.
    let listed = run(&["sessions", "--json", "--data-dir", arg(dir.path())]).await;
    assert_eq!(code(&listed), 0, "{}", stderr(&listed));
    let list: Vec<Value> = serde_json::from_str(&stdout(&listed)).expect("a JSON array");
    let by_name: HashMap<String, &Value> = list
        .iter()
        .map(|s| {
            let key = s["key"].as_str().expect("key");
            (key.rsplit('/').next().unwrap_or(key).to_owned(), s)
        })
        .collect();
    assert_eq!(by_name.len(), 6, "{list:#?}");
    for session in by_name.values() {
        assert!(
            session["agent_session_id"]
                .as_str()
                .is_some_and(|id| id.starts_with("conv_"))
        );
        assert!(session["context_percent"].as_u64().is_some_and(|p| p > 0));
        assert_eq!(session["pending_messages"], 0);
        assert_eq!(
            session["status"], "idle",
            "stopped with the demo: {session:#}"
        );
    }
    // The two fallbacks kept the failed ids and count as restarts.
    for name in ["legacy-app", "monorepo"] {
        let s = by_name[name];
        assert_eq!(
            s["past_session_ids"].as_array().map(Vec::len),
            Some(1),
            "{s:#}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_prints_plain_lines_and_a_summary_when_not_on_a_terminal_and_can_run_again() {
    let dir = tempfile::tempdir().expect("tempdir");
    for run_no in 1..=2 {
        let mut cmd = command(&["demo", "--quick", "--data-dir", arg(dir.path())]);
        cmd.env("WARDEN_STREAM_TIMEOUT", "800");
        let out = output(cmd, Duration::from_secs(60)).await;
        let text = stdout(&out);
        assert_eq!(code(&out), 0, "run {run_no}: {text}\n{}", stderr(&out));
        assert!(!text.contains('\x1b'), "no terminal escapes when piped");
        assert!(text.contains("watchdog timeout 0.8s"), "{text}");
        assert!(
            text.contains("api-server  watchdog killed attempt 1 after"),
            "{text}"
        );
        assert!(text.contains("Summary: every fault recovered"), "{text}");
        assert!(!text.contains('✗'), "{text}");
        assert_no_debug_shapes(&text);
    }
}

/// Every event is a sentence: no line shows Rust's Debug shape of one
/// (`AttemptEnded { key: SessionKey("…"), … }`).
fn assert_no_debug_shapes(text: &str) {
    for line in text.lines() {
        for shape in [
            "{ key:",
            "SessionKey(",
            "AttemptId {",
            ": None }",
            ": Some(",
        ] {
            assert!(!line.contains(shape), "a Debug shape ({shape}): {line}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_refuses_a_database_another_process_holds() {
    let dir = tempfile::tempdir().expect("tempdir");
    let _held = warden_store::SledStore::open(dir.path().join("sessions.db")).expect("open");
    let out = run(&["demo", "--quick", "--data-dir", arg(dir.path())]).await;
    assert_eq!(code(&out), 1);
    assert_one_line_error(&out, "in use by another warden process");
}

/// On a terminal the demo redraws a live table in place. `script` (from
/// util-linux) gives it a pseudo-terminal 70 columns wide. Skipped with a
/// printed reason without `script`, unless `WARDEN_REQUIRE_PTY=1` (set by
/// `.ci/run`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_on_a_terminal_redraws_a_live_table_that_fits_the_width() {
    if which_script().is_none() {
        assert_ne!(
            std::env::var("WARDEN_REQUIRE_PTY").as_deref(),
            Ok("1"),
            "WARDEN_REQUIRE_PTY=1 but `script` is not installed"
        );
        eprintln!("skipped: `script` (util-linux/bsdutils) is not installed");
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("typescript");
    let inner = format!(
        "stty cols 70 rows 24; {WARDEN} demo --quick --data-dir {}",
        arg(&dir.path().join("data"))
    );
    let mut cmd = tokio::process::Command::new("script");
    cmd.args(["-q", "-e", "-c", &inner, arg(&log)])
        .env_remove("WARDEN_STREAM_TIMEOUT")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let out = output(cmd, Duration::from_secs(60)).await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let screen = String::from_utf8_lossy(&std::fs::read(&log).expect("typescript")).into_owned();
    // Redrawn in place: cursor up and erase to the end of the screen.
    assert!(screen.contains("\x1b[7A\r\x1b[J"), "no in-place redraw");
    assert!(screen.contains("WORKSPACE   STATE"), "{screen}");
    // The phase column: api-server's stream is seen stalled mid-text.
    assert!(screen.contains("PHASE"), "{screen}");
    assert!(
        screen
            .lines()
            .any(|l| l.contains("api-server") && l.contains(" text ")),
        "api-server was never shown streaming text: {screen}"
    );
    // Table rows are cut to the terminal's width (69 columns and the newline).
    for line in screen
        .lines()
        .filter(|l| l.trim_start().starts_with("api-server "))
    {
        let line = line.trim_end_matches('\r');
        let visible = line.rsplit('\x1b').next().unwrap_or(line);
        assert!(visible.chars().count() <= 70, "{visible:?}");
    }
    assert!(
        screen.contains("Summary: every fault recovered"),
        "{screen}"
    );
    assert_no_debug_shapes(&screen);
}

fn which_script() -> Option<std::path::PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join("script"))
            .find(|p| p.is_file())
    })
}
