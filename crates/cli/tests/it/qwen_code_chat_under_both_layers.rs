//! `warden chat --agent qwen-code`: the real Qwen Code (`WARDEN_QWEN_BIN`,
//! installed by `.ci/run`) against the mock's chat-completions endpoint,
//! through the wire layer. Two invocations, one Qwen Code session
//! (`--resume <uuid>`), one model request and one CLI run per turn (no
//! memory-extraction request), the context indicator, its home under the
//! data directory (never `~/.qwen`); a session Qwen Code no longer has ("No
//! saved session found") falls back to a fresh one with the message
//! re-delivered and a notice.
//!
//! A reply stalled or cut mid-text is continued at the wire (a
//! continuation turn spliced into the same completion): Qwen Code sees one
//! whole stream, never runs its own continuation (which prints the partial
//! text again), is started once and not killed, and the reply is shown
//! once. Without the wire the cut reaches it: its own retry line fails the
//! run and warden's retry answers, once.
//!
//! Skipped with a printed reason when the binary is not there, unless
//! `WARDEN_REQUIRE_QWEN=1`. The kill -9 of warden mid-turn is in
//! `agent_turns_survive_a_kill_9_of_warden.rs`.

use crate::common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::agent_chat::AgentChat;
use common::cancel;
use common::*;
use serde_json::Value;
use warden_mock::{MockConfig, MockServer, Scenario};

const CHAT: &str = "/v1/chat/completions";

fn qwen_bin() -> Option<std::ffi::OsString> {
    let bin = std::env::var_os("WARDEN_QWEN_BIN").filter(|v| !v.is_empty());
    if bin.is_none() {
        assert_ne!(
            std::env::var("WARDEN_REQUIRE_QWEN").as_deref(),
            Ok("1"),
            "WARDEN_REQUIRE_QWEN=1 but WARDEN_QWEN_BIN is unset"
        );
        eprintln!("skipped: set WARDEN_QWEN_BIN to the qwen binary to run this test");
    }
    bin
}

async fn session_id(data: &Path) -> String {
    let out = run(&["sessions", "--json", "--data-dir", arg(data)]).await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let sessions: Vec<Value> = serde_json::from_str(&stdout(&out)).expect("JSON array");
    sessions[0]["agent_session_id"]
        .as_str()
        .expect("the CLI's session id")
        .to_owned()
}

/// A test's mock, directories and `warden chat` of one message.
struct Fixture(AgentChat);

impl std::ops::Deref for Fixture {
    type Target = AgentChat;
    fn deref(&self) -> &AgentChat {
        &self.0
    }
}

impl Fixture {
    async fn new(bin: std::ffi::OsString) -> Self {
        Self(AgentChat::new("qwen-code", "WARDEN_QWEN_BIN", bin).await)
    }

    async fn chat(&self, message: &str) -> std::process::Output {
        self.0
            .chat(message, &[], &[("OPENAI_API_KEY", "dummy")])
            .await
    }

    /// Qwen Code's saved chats of the workspace's project (its one
    /// project under the data directory).
    fn chats(&self) -> std::path::PathBuf {
        let projects = self.path("data/qwen/projects");
        let project: Vec<_> = std::fs::read_dir(&projects)
            .expect("its projects under the data directory")
            .flatten()
            .collect();
        assert_eq!(project.len(), 1, "one project: {project:?}");
        project[0].path().join("chats")
    }
}

/// Two chats: one session, one request and one run per turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qwen_code_chats_resume_the_same_session_one_request_and_one_run_per_turn() {
    let Some(bin) = qwen_bin() else {
        return;
    };
    let fx = Fixture::new(bin).await;
    let first = fx.chat("Say hello.").await;
    let id = session_id(&fx.path("data")).await;
    assert!(warden_claude::is_uuid(&id), "{id}");
    assert!(
        fx.chats().join(format!("{id}.jsonl")).exists(),
        "its session is kept under the data directory"
    );
    assert!(
        !fx.path("home/.qwen").exists(),
        "the user's own ~/.qwen is not used"
    );
    assert_eq!(
        fx.mock.requests_to(CHAT),
        1,
        "one request, no memory extraction"
    );

    let second = fx.chat("Again.").await;
    assert_eq!(session_id(&fx.path("data")).await, id, "the same session");
    for out in [&first, &second] {
        let said = stderr(out);
        assert!(
            !said.contains("starting fresh") && !said.contains("Retrying"),
            "one run per turn: {said}"
        );
    }
    assert_eq!(fx.mock.requests_to(CHAT), 2, "one request per turn");
    let saved = std::fs::read_to_string(fx.chats().join(format!("{id}.jsonl"))).expect("its chat");
    assert!(
        saved.contains("Say hello.") && saved.contains("Again."),
        "both turns in the one session"
    );
    fx.0.mock.shutdown().await;
}

/// Its saved chats lost: a fresh session, the message once, the user told.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_qwen_code_no_longer_has_falls_back_to_a_fresh_one_with_the_message() {
    let Some(bin) = qwen_bin() else {
        return;
    };
    let fx = Fixture::new(bin).await;
    fx.chat("Say hello.").await;
    let id = session_id(&fx.path("data")).await;
    std::fs::remove_dir_all(fx.chats()).expect("rm its chats");

    let out = fx.chat("Still there?").await;
    let said = stderr(&out);
    assert!(
        said.contains("could not be found — starting fresh"),
        "the user is told: {said}"
    );
    let fresh = session_id(&fx.path("data")).await;
    assert!(warden_claude::is_uuid(&fresh) && fresh != id, "{fresh}");
    assert_eq!(
        fx.mock.requests_to(CHAT),
        2,
        "the failed resume sent nothing; the message once, fresh"
    );
    fx.0.mock.shutdown().await;
}

/// The stream timeout of the fault tests, in ms: Qwen Code prints nothing
/// between its `init` line (2-3 s after its start) and the whole reply,
/// so its stdout is silent for the request and the wire's recovery (half
/// this).
const TIMEOUT_MS: u64 = 20_000;

/// What warden chat says when the process watchdog kills a silent CLI to
/// run the turn again.
const KILLED: &str = "Connection lost during streaming. Retrying...";

/// `warden chat --agent qwen-code` of `hello` against a mock playing
/// `fault` after three frames, then normal replies, with `extra` flags:
/// the output, how long it took, and the mock's chat requests (each one's
/// scenario and, for a continuation, how it continued).
async fn chat_through_a_fault(
    bin: &std::ffi::OsStr,
    fault: Scenario,
    extra: &[&str],
) -> (
    std::process::Output,
    Duration,
    Vec<(Option<Scenario>, Option<&'static str>)>,
) {
    chat_through_a_script(bin, &[fault, Scenario::Normal], extra).await
}

/// The same against a mock playing `script`, one scenario per request.
async fn chat_through_a_script(
    bin: &std::ffi::OsStr,
    script: &[Scenario],
    extra: &[&str],
) -> (
    std::process::Output,
    Duration,
    Vec<(Option<Scenario>, Option<&'static str>)>,
) {
    let mock = MockServer::start(
        MockConfig::default()
            .with_fault_after_frames(3)
            .with_sequence(script.iter().copied()),
    )
    .await
    .expect("mock");
    let dir = tempfile::tempdir().expect("tempdir");
    let (workspace, data, home) = (
        dir.path().join("repo"),
        dir.path().join("data"),
        dir.path().join("home"),
    );
    for d in [&workspace, &home] {
        std::fs::create_dir_all(d).expect("mkdir");
    }
    let base_url = mock.base_url();
    let mut args = vec![
        "chat",
        "--workspace",
        arg(&workspace),
        "--data-dir",
        arg(&data),
        "--agent",
        "qwen-code",
        "--base-url",
        &base_url,
    ];
    args.extend(extra);
    args.push("hello");
    let mut cmd = command(&args);
    cmd.env("WARDEN_QWEN_BIN", bin)
        .env("OPENAI_API_KEY", "dummy")
        .env("HOME", &home)
        .env("WARDEN_STREAM_TIMEOUT", TIMEOUT_MS.to_string());
    let started = Instant::now();
    let out = output(cmd, Duration::from_secs(120)).await;
    let took = started.elapsed();
    let requests = mock
        .requests()
        .into_iter()
        .filter(|r| r.path == CHAT)
        .map(|r| (r.scenario, r.continuation))
        .collect();
    mock.shutdown().await;
    (out, took, requests)
}

/// The whole reply, once, exit 0.
fn assert_one_whole_reply(out: &std::process::Output) {
    assert_eq!(code(out), 0, "{}", stderr(out));
    let reply = stdout(out);
    assert_eq!(
        reply.matches("Hello from warden-mock.").count(),
        1,
        "the reply, once: {reply:?}"
    );
    assert!(
        reply.contains(" characters."),
        "the whole reply, its end included: {reply:?}"
    );
}

/// A reply broken by `fault` mid-text is continued at the wire: one
/// continuation, Qwen Code not killed or re-run, the reply once.
async fn a_reply_broken_mid_text_is_continued_at_the_wire(fault: Scenario) {
    let Some(bin) = qwen_bin() else {
        return;
    };
    let (out, took, requests) = chat_through_a_fault(&bin, fault, &[]).await;
    eprintln!("qwen-code, {fault} mid-text, through the wire: {took:?}");
    assert_one_whole_reply(&out);
    let said = stderr(&out);
    assert!(!said.contains(KILLED), "not killed and re-run: {said}");
    assert!(
        said.contains("wire layer: openai /v1/chat/completions") && said.contains("continuing"),
        "the wire continued it: {said}"
    );
    assert_eq!(
        requests,
        [(Some(fault), None), (Some(Scenario::Normal), Some("turn"))],
        "the broken request and one continuation of it, not Qwen Code's own retry or a re-run"
    );
    assert!(
        took < Duration::from_millis(TIMEOUT_MS / 2) + Duration::from_secs(30),
        "the wire's allowance, the CLI's start-up and a few seconds: {took:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_qwen_code_reply_stalled_mid_text_is_continued_at_the_wire_not_rerun() {
    a_reply_broken_mid_text_is_continued_at_the_wire(Scenario::Stall).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_qwen_code_reply_cut_mid_text_is_continued_at_the_wire() {
    a_reply_broken_mid_text_is_continued_at_the_wire(Scenario::AbruptClose).await;
}

/// Without the wire, Qwen Code sees the cut and continues on its own (a
/// `system/retry` line; it would print the partial text again): warden
/// fails that run and retries the turn, which the user sees once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_wire_its_own_retry_of_a_cut_is_replaced_by_wardens_and_the_reply_shown_once() {
    let Some(bin) = qwen_bin() else {
        return;
    };
    let (out, took, requests) =
        chat_through_a_fault(&bin, Scenario::AbruptClose, &["--no-wire-watch"]).await;
    eprintln!("qwen-code, cut mid-text, without the wire: {took:?}, {requests:?}");
    assert_one_whole_reply(&out);
    assert!(
        stderr(&out).contains("retried its model request on its own"),
        "{}",
        stderr(&out)
    );
    assert_eq!(
        requests.first(),
        Some(&(Some(Scenario::AbruptClose), None)),
        "the cut request first"
    );
    assert!(
        (2..=3).contains(&requests.len()),
        "the cut one, maybe the CLI's own continuation, warden's one retry: {requests:?}"
    );
}

/// A 503 storm before any byte (three 503s, then the reply) is retried by
/// the wire itself, per the shared backoff, inside Qwen Code's one
/// request: Qwen Code sees one later, whole stream (none of its three
/// layers of retry — its SDK's re-sends, its silent inner loop, its
/// `retry` line warden would fail the run at — takes part), is started
/// once, exits 0, and the mock saw the three 503s and one request more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_503_storm_under_qwen_code_is_retried_at_the_wire_not_by_qwen_code() {
    let Some(bin) = qwen_bin() else {
        return;
    };
    let script = [
        Scenario::Unavailable,
        Scenario::Unavailable,
        Scenario::Unavailable,
        Scenario::Normal,
    ];
    let (out, took, requests) = chat_through_a_script(&bin, &script, &[]).await;
    eprintln!("qwen-code, three 503s then a reply, through the wire: {took:?}");
    assert_one_whole_reply(&out);
    let said = stderr(&out);
    assert!(!said.contains(KILLED), "not killed and re-run: {said}");
    assert!(
        !said.contains("retried its model request on its own"),
        "Qwen Code did not retry: {said}"
    );
    assert_eq!(
        said.lines()
            .filter(
                |l| l.contains("wire layer: openai /v1/chat/completions") && l.contains("retrying")
            )
            .count(),
        3,
        "the wire retried each 503: {said}"
    );
    assert_eq!(
        requests,
        script.map(|s| (Some(s), None)),
        "the 503s and one request more: the wire's retries, not Qwen Code's or a re-run"
    );
    assert!(
        took < Duration::from_secs(60),
        "the backoff (0.5 + 1 + 2 s, jittered) and the CLI's start-up: {took:?}"
    );
}

/// An outage longer than the wire's attempts (every request `503`):
/// measured before, 28 requests to the wire in warden's 4 runs, 112
/// upstream, exit 5 at 382 s (alone Qwen Code keeps going for hours). Now
/// the wire's give-up after the retry policy's attempts ends the run at
/// once (Qwen Code's whole process group with it, before its own retry)
/// and the turn is not run again: 4 upstream requests, one from Qwen Code,
/// exit 5.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_under_qwen_code_ends_the_turn_after_the_wires_attempts_not_qwen_codes() {
    let Some(bin) = qwen_bin() else {
        return;
    };
    let (out, took, requests) = chat_through_a_script(&bin, &[Scenario::Unavailable], &[]).await;
    eprintln!(
        "qwen-code, every request 503, through the wire: {took:?}, {} upstream requests",
        requests.len()
    );
    assert_the_wire_ended_the_outage(&out, took, requests.len());
}

/// A cancel mid-turn ends the whole group: `SIGTERM` to Qwen Code's entry
/// alone leaves its `cli.js` child holding the model stream (measured), so
/// warden signals the group. Every process of it is gone (those with
/// warden's `QWEN_HOME` for it: its entry and `cli.js`), nothing retried.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_qwen_code_turn_ends_its_whole_process_group_and_nothing_is_retried() {
    let Some(bin) = qwen_bin() else {
        return;
    };
    let bin = bin.to_string_lossy().into_owned();
    cancel::a_cancelled_turn_ends_every_process(cancel::Cancelled {
        name: "qwen-code",
        serve_args: &["--agent", "qwen-code"],
        env: &[
            ("WARDEN_QWEN_BIN", bin.as_str()),
            ("OPENAI_API_KEY", "dummy"),
        ],
        path: CHAT,
        reach_within: Duration::from_secs(60),
        at_least: 2,
        processes: |data, _| {
            cancel::processes_with_env(&format!("QWEN_HOME={}", data.join("qwen").display()))
        },
    })
    .await;
}
