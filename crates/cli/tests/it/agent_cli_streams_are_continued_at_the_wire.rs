//! The wire layer under an agent CLI: `warden chat --agent claude-code`
//! runs the real Claude Code with its model traffic through warden's own
//! watched engine (in the same process, on loopback). A stream that stalls
//! mid-reply is continued inside the CLI's own request: the CLI never sees
//! the fault, is not killed or re-run, and the reply is not generated
//! again — the mock's journal shows a continuation request, not a second
//! whole one. With `--no-wire-watch` the same stall costs the process
//! watchdog's kill and a re-run.
//!
//! `warden chat --agent codex` runs the real Codex the same way (its
//! provider `base_url` is the wire): a stall before the first byte is
//! retried unseen inside its request; a stall or a cut mid-text is
//! continued and spliced into the same Responses stream, so Codex never
//! retries it and is never killed.
//!
//! `warden chat --agent opencode` runs the real OpenCode with its
//! provider's `baseURL` at the wire (chat completions): a stall or a cut
//! mid-text is continued and spliced into the same completion, so OpenCode
//! neither re-sends the request (after its own stall timeout) nor loops
//! asking the model to go on. Without the wire, a stream that ends without
//! a finish reason is failed at OpenCode's `step_finish` (reason
//! `unknown`) and retried by warden: the reply once, no loop. Kilo Code,
//! on the same adapter, the same (Kilo alone returns the partial text as
//! the reply). Aider (`WARDEN_AIDER_BIN`, `WARDEN_REQUIRE_AIDER=1`) the
//! same: alone it prints a cut stream's half reply as its answer, exit 0.
//!
//! The CLIs come from `WARDEN_CLAUDE_BIN`, `WARDEN_CODEX_BIN`,
//! `WARDEN_OPENCODE_BIN` and `WARDEN_KILO_BIN` (installed by `.ci/run`);
//! without one its tests print why they are skipped, unless
//! `WARDEN_REQUIRE_CLAUDE=1` / `WARDEN_REQUIRE_CODEX=1` /
//! `WARDEN_REQUIRE_OPENCODE=1` / `WARDEN_REQUIRE_KILO=1`.

use crate::common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::*;
use warden_mock::{MockConfig, MockServer, Scenario};

/// The stream timeout: the process watchdog allows this much silence on
/// the CLI's stdout; the wire layer half of it on the upstream stream.
const TIMEOUT_MS: u64 = 8000;

/// The stream timeout of a test whose fault involves no silence (a 529):
/// the default, so a CLI slow to start on a loaded machine (CI's two
/// cores; Codex once printed nothing for 8 s there) is not killed for
/// it, which the test would read as the wire's fault.
const NO_SILENCE_TIMEOUT_MS: u64 = 45_000;

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
    chat_within(claude, mock, dir, extra, TIMEOUT_MS).await
}

/// [`chat`] at a stream timeout of `timeout_ms`.
async fn chat_within(
    claude: &str,
    mock: &MockServer,
    dir: &Path,
    extra: &[&str],
    timeout_ms: u64,
) -> (std::process::Output, Duration) {
    let timeout = timeout_ms.to_string();
    let base = mock.base_url();
    let agent = [
        "--agent",
        "claude-code",
        "--claude-bin",
        claude,
        "--base-url",
        &base,
    ];
    let env = [
        ("ANTHROPIC_API_KEY", "dummy"),
        ("DISABLE_TELEMETRY", "1"),
        ("DISABLE_AUTOUPDATER", "1"),
        ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1"),
        ("WARDEN_STREAM_TIMEOUT", &timeout),
    ];
    chat_with(&agent, &env, dir, extra).await
}

/// `warden chat` of `hello` with `agent`'s flags and `env` in `dir`'s
/// workspace, with `extra` flags: its output and how long it took.
async fn chat_with(
    agent: &[&str],
    env: &[(&str, &str)],
    dir: &Path,
    extra: &[&str],
) -> (std::process::Output, Duration) {
    let (workspace, data, home) = (dir.join("repo"), dir.join("data"), dir.join("home"));
    for d in [&workspace, &home] {
        std::fs::create_dir_all(d).expect("mkdir");
    }
    let mut args = vec!["chat", "--workspace", arg(&workspace)];
    args.extend(agent);
    args.extend(["--data-dir", arg(&data)]);
    args.extend(extra);
    args.push("hello");
    let mut cmd = command(&args);
    let timeout = TIMEOUT_MS.to_string();
    cmd.env("HOME", arg(&home))
        .env("WARDEN_STREAM_TIMEOUT", &timeout);
    for (key, value) in env {
        cmd.env(key, value);
    }
    let started = Instant::now();
    let out = output(cmd, Duration::from_secs(120)).await;
    (out, started.elapsed())
}

/// The mock's Messages API playing `first`, then a normal reply.
async fn messages_mock(first: Scenario) -> MockServer {
    MockServer::start(MockConfig::default().with_sequence([first, Scenario::Normal]))
        .await
        .expect("mock")
}

/// The Messages requests the mock saw: each one's scenario and, for a
/// continuation of a broken reply, how it continued.
fn messages(mock: &MockServer) -> Vec<(Option<Scenario>, Option<&'static str>)> {
    mock.requests()
        .into_iter()
        .filter(|r| r.path == "/v1/messages")
        .map(|r| (r.scenario, r.continuation))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claude_code_reply_stalled_mid_text_is_continued_at_the_wire_not_rerun() {
    let Some(claude) = claude_bin() else {
        return;
    };
    let mock = messages_mock(Scenario::Stall).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let (out, took) = chat(&claude, &mock, dir.path(), &[]).await;
    assert_one_reply_no_kill(&out);
    assert!(
        stdout(&out).starts_with("Hello from warden-mock."),
        "{}",
        stdout(&out)
    );
    let said = stderr(&out);
    eprintln!("through the wire: {took:?}; stderr: {said}");
    assert!(
        said.contains("wire layer:"),
        "the wire said what it did: {said}"
    );
    assert!(!said.contains("retrying"), "the CLI was not re-run: {said}");
    let requests = messages(&mock);
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
        took < Duration::from_millis(TIMEOUT_MS) + Duration::from_secs(6),
        "within the stream timeout and a few seconds: {took:?}"
    );
    mock.shutdown().await;
}

/// A session's first turn says that the wire layer is on (one line on
/// stderr: where, what it does, how to turn it off); its later turns do
/// not, and with `--no-wire-watch` nothing says it is on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sessions_first_turn_says_the_wire_layer_is_on_and_its_later_turns_do_not() {
    let Some(claude) = claude_bin() else {
        return;
    };
    const ON: &str = "warden: wire layer on: claude-code's model requests go through";
    let mock = MockServer::start(MockConfig::default())
        .await
        .expect("mock");
    let dir = tempfile::tempdir().expect("tempdir");
    let (first, _) = chat(&claude, &mock, dir.path(), &[]).await;
    assert_one_reply_no_kill(&first);
    let said = stderr(&first);
    let on: Vec<&str> = said.lines().filter(|l| l.starts_with(ON)).collect();
    assert_eq!(on.len(), 1, "the first turn says it once: {said}");
    assert!(
        on[0].contains("http://127.0.0.1:") && on[0].contains("--no-wire-watch"),
        "where, and how to turn it off: {}",
        on[0]
    );
    let (second, _) = chat(&claude, &mock, dir.path(), &[]).await;
    assert_one_reply_no_kill(&second);
    assert!(
        !stderr(&second).contains("wire layer on"),
        "a later turn of the session does not: {}",
        stderr(&second)
    );
    let off = tempfile::tempdir().expect("tempdir");
    let (third, _) = chat(&claude, &mock, off.path(), &["--no-wire-watch"]).await;
    assert_eq!(code(&third), 0, "{}", stderr(&third));
    assert!(
        !stderr(&third).contains("wire layer on"),
        "off: nothing says it is on: {}",
        stderr(&third)
    );
    mock.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_wire_the_same_stall_costs_a_kill_and_a_rerun() {
    let Some(claude) = claude_bin() else {
        return;
    };
    let mock = messages_mock(Scenario::Stall).await;
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
        messages(&mock)
            .iter()
            .all(|(_, continued)| continued.is_none()),
        "nothing continued the reply"
    );
    mock.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claude_code_reply_cut_mid_text_is_continued_at_the_wire() {
    let Some(claude) = claude_bin() else {
        return;
    };
    let mock = messages_mock(Scenario::AbruptClose).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let (out, took) = chat(&claude, &mock, dir.path(), &[]).await;
    eprintln!("cut, through the wire: {took:?}");
    assert_one_reply_no_kill(&out);
    let requests = messages(&mock);
    assert_eq!(requests.len(), 2, "the cut request and its continuation");
    assert!(requests[1].1.is_some(), "a continuation, not a re-send");
    mock.shutdown().await;
}

/// When every model request stalls (the upstream takes each one and never
/// finishes it, streamed or not), the turn ends after the process layer's
/// attempts (4 runs, each killed when Claude Code's stdout stayed silent
/// for the stream timeout) and says which layer gave up after what: the
/// wire saw every request stall, none complete; the process layer found
/// the CLI silent on every run. Claude Code alone waits out each stall
/// (300 s, or `CLAUDE_BYTE_STREAM_IDLE_TIMEOUT_MS`), then re-sends without
/// streaming, which stalls too (`docs/agents.md` has what it measured).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_every_stream_stalls_the_turn_ends_and_says_which_layer_gave_up() {
    let Some(claude) = claude_bin() else {
        return;
    };
    let mock = MockServer::start(MockConfig::default().with_default_scenario(Scenario::Stall))
        .await
        .expect("mock");
    let dir = tempfile::tempdir().expect("tempdir");
    let (out, took) = chat(&claude, &mock, dir.path(), &[]).await;
    eprintln!("every stream stalled, through the wire: {took:?}");
    check_no_panic(&out);
    let said = stderr(&out);
    assert_eq!(code(&out), 4, "a stream timeout (exit 4): {said}");
    assert!(
        said.contains("wire layer: the model stream stalled on every request of this turn"),
        "the wire says what it saw: {said}"
    );
    assert!(
        said.contains("the process layer gave up: claude-code printed nothing on stdout"),
        "the error names the layer that gave up: {said}"
    );
    assert!(
        took < Duration::from_millis(4 * TIMEOUT_MS) + Duration::from_secs(24),
        "four runs of the stream timeout and their restarts: {took:?}"
    );
    mock.shutdown().await;
}

/// A model that thinks past the stream timeout (its stream kept live with
/// pings, Claude Code printing nothing meanwhile) is not killed by the
/// process layer: the CLI's silence allowance counts the model stream the
/// wire sends it, so one run and one request answer the turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claude_code_turn_thinking_past_the_stream_timeout_is_not_killed() {
    let Some(claude) = claude_bin() else {
        return;
    };
    let thinking = Duration::from_millis(TIMEOUT_MS + 3000);
    let mock = MockServer::start(
        MockConfig::default()
            .with_default_scenario(Scenario::ThinkingPings)
            .with_thinking_pause(thinking),
    )
    .await
    .expect("mock");
    let dir = tempfile::tempdir().expect("tempdir");
    let (out, took) = chat(&claude, &mock, dir.path(), &[]).await;
    eprintln!("thinking {thinking:?}, through the wire: {took:?}");
    assert_one_reply_no_kill(&out);
    assert_eq!(
        mock.requests_to("/v1/messages"),
        1,
        "one request: the CLI was not killed and re-run"
    );
    assert!(
        took > thinking && took < thinking + Duration::from_secs(6),
        "the thinking and a few seconds: {took:?}"
    );
    mock.shutdown().await;
}

/// `warden serve` runs many sessions behind one wire, each session's
/// Claude Code on a route of its own: the model stream sent on a route is
/// liveness for that session alone. Three sessions at once: one whose
/// model thinks past the stream timeout (pings only, Claude Code silent)
/// is answered once by one run and one request; a healthy one is answered
/// meanwhile; one whose CLI hangs (it never calls the model) is still
/// killed at the stream timeout while the thinking session's stream runs
/// on the same wire, not kept alive by it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_serve_each_sessions_model_stream_keeps_only_that_session_alive() {
    use futures_util::StreamExt as _;

    let Some(claude) = claude_bin() else {
        return;
    };
    let thinking = Duration::from_millis(TIMEOUT_MS + 6000);
    // The first model request thinks; the rest answer at once.
    let mock = MockServer::start(
        MockConfig::default()
            .with_sequence([Scenario::ThinkingPings, Scenario::Normal])
            .with_thinking_pause(thinking),
    )
    .await
    .expect("mock");
    let dir = tempfile::tempdir().expect("tempdir");
    let (data, home, starts) = (
        dir.path().join("data"),
        dir.path().join("home"),
        dir.path().join("starts"),
    );
    let workspaces = ["thinks", "healthy", "hangs"].map(|name| dir.path().join(name));
    for d in workspaces.iter().chain([&home, &starts]) {
        std::fs::create_dir_all(d).expect("mkdir");
    }
    // Claude Code, each start noted per workspace; in `hangs` a CLI that
    // never says or asks anything.
    let wrapper = dir.path().join("claude");
    std::fs::write(
        &wrapper,
        "#!/bin/sh\n\
         date +%s.%N >> \"$WARDEN_TEST_STARTS/$(basename \"$PWD\")\"\n\
         case \"$PWD\" in *hangs) exec sleep 600;; esac\n\
         exec \"$WARDEN_TEST_CLAUDE\" \"$@\"\n",
    )
    .expect("wrapper");
    std::fs::set_permissions(
        &wrapper,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .expect("chmod");
    let timeout = TIMEOUT_MS.to_string();
    let env = [
        ("HOME", arg(&home)),
        ("WARDEN_STREAM_TIMEOUT", timeout.as_str()),
        ("WARDEN_TEST_STARTS", arg(&starts)),
        ("WARDEN_TEST_CLAUDE", claude.as_str()),
        ("ANTHROPIC_API_KEY", "dummy"),
        ("DISABLE_TELEMETRY", "1"),
        ("DISABLE_AUTOUPDATER", "1"),
        ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1"),
    ];
    let flags = ["--agent", "claude-code", "--claude-bin", arg(&wrapper)];
    let (mut server, base, token, logged) =
        serve_logged(&data, &mock.base_url(), &flags, &env).await;
    let turn = |workspace: &std::path::Path| {
        let body = serde_json::json!({"workspace": arg(workspace), "message": "hello"});
        let (base, token) = (base.clone(), token.clone());
        async move {
            let started = Instant::now();
            let response = reqwest::Client::new()
                .post(format!("{base}/v1/turns"))
                .bearer_auth(token)
                .header("accept", "text/event-stream")
                .header("content-type", "application/json")
                .body(body.to_string())
                .send()
                .await
                .expect("post");
            let status = response.status().as_u16();
            let mut stream = response.bytes_stream();
            let mut text = String::new();
            while let Some(chunk) = tokio::time::timeout(Duration::from_secs(120), stream.next())
                .await
                .expect("the turn's events in time")
            {
                text.push_str(&String::from_utf8_lossy(&chunk.expect("chunk")));
            }
            (status, text, started.elapsed())
        }
    };
    let started = |name: &str| -> Vec<f64> {
        std::fs::read_to_string(starts.join(name))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    };

    let thinks = tokio::spawn(turn(&workspaces[0]));
    // Its request is the mock's first, the thinking one.
    let asked = Instant::now();
    while mock.requests_to("/v1/messages") == 0 {
        assert!(
            asked.elapsed() < Duration::from_secs(60),
            "the thinking session reached the model"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let hangs = tokio::spawn(turn(&workspaces[2]));
    let (status, healthy, took) = turn(&workspaces[1]).await;
    assert_eq!(status, 200, "{healthy}");
    assert_eq!(answered_once(&healthy), Ok(()), "answered: {healthy}");
    assert!(took < thinking, "while the other thinks: {took:?}");

    let (status, answered, took) = tokio::time::timeout(Duration::from_secs(120), thinks)
        .await
        .expect("the thinking turn ends in time")
        .expect("its task");
    eprintln!("thinking {thinking:?} under serve: answered in {took:?}");
    let said = logged.lock().join("\n");
    assert_eq!(status, 200, "{answered}");
    assert_eq!(
        answered_once(&answered),
        Ok(()),
        "the whole reply, once: {answered}\n{said}"
    );
    assert_eq!(started("thinks").len(), 1, "one run of its CLI: {said}");
    assert_eq!(
        said.lines()
            .filter(|l| l.starts_with("warden: wire layer on: session "))
            .count(),
        3,
        "each session's first turn says the wire layer is on, once: {said}"
    );
    assert_eq!(
        mock.requests_to("/v1/messages"),
        2,
        "one request each for the thinking and the healthy session"
    );
    assert!(
        took > thinking && took < thinking + Duration::from_secs(8),
        "the thinking and a few seconds: {took:?}"
    );
    // The hanging CLI's silence was not covered by the thinking stream:
    // killed at the stream timeout (and started again) while it ran.
    let hung = started("hangs");
    assert!(
        hung.len() >= 2 && hung[1] - hung[0] < thinking.as_secs_f64(),
        "the hanging CLI was killed at the stream timeout, not kept alive by another \
         session's stream: started at {hung:?}\n{said}"
    );
    hangs.abort();
    // Stopped as an operator would: its CLIs' groups end with it.
    let pid = nix::unistd::Pid::from_raw(server.id().expect("pid") as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("SIGTERM");
    tokio::time::timeout(Duration::from_secs(60), server.wait())
        .await
        .expect("serve stops in time")
        .expect("wait");
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
    let mock = messages_mock(Scenario::StallInThinking).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let (out, took) = chat(&claude, &mock, dir.path(), &[]).await;
    eprintln!("stalled in thinking, through the wire: {took:?}");
    assert_one_reply_no_kill(&out);
    assert_eq!(
        messages(&mock),
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
    let mock = messages_mock(Scenario::Overloaded).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let (out, took) = chat_within(&claude, &mock, dir.path(), &[], NO_SILENCE_TIMEOUT_MS).await;
    eprintln!("529 then a reply, through the wire: {took:?}");
    assert_one_reply_no_kill(&out);
    assert_eq!(
        mock.requests_to("/v1/messages"),
        2,
        "the 529 and one retry, no more"
    );
    mock.shutdown().await;
}

/// Where only streamed requests stall (a middlebox that buffers SSE, an
/// upstream whose streaming path is broken: the mock's `stall-streamed`),
/// the wire asks for the whole answer without a stream once the first
/// streamed attempt has gone silent before any content, and gives it to
/// Claude Code as the stream it asked for: the whole reply once, the CLI
/// started once, exit 0, well inside the process layer's allowance.
/// Before, the streamed retries stalled too, the process layer killed the
/// CLI on every run and the turn failed (exit 4, 37-39 s), where Claude
/// Code alone answers by its own non-streaming fallback at ~305 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_only_streams_stall_claude_code_gets_the_whole_reply_asked_for_without_a_stream() {
    let Some(claude) = claude_bin() else {
        return;
    };
    let mock =
        MockServer::start(MockConfig::default().with_default_scenario(Scenario::StallStreamed))
            .await
            .expect("mock");
    let dir = tempfile::tempdir().expect("tempdir");
    let (out, took) = chat(&claude, &mock, dir.path(), &[]).await;
    let said = stderr(&out);
    eprintln!("only streams stalled, through the wire: {took:?}; stderr: {said}");
    assert_one_reply_no_kill(&out);
    assert!(stdout(&out).starts_with(REPLY), "{}", stdout(&out));
    assert!(
        said.contains("asking once for the whole answer without a stream"),
        "the wire says what it did: {said}"
    );
    assert!(!said.contains("retrying"), "the CLI was not re-run: {said}");
    let streamed: Vec<bool> = mock
        .requests()
        .into_iter()
        .filter(|r| r.path == "/v1/messages")
        .map(|r| r.stream)
        .collect();
    assert_eq!(
        streamed,
        [true, false],
        "one stalled stream, then one request for the whole answer"
    );
    assert!(
        took < Duration::from_millis(TIMEOUT_MS) + Duration::from_secs(4),
        "before the process layer's allowance and the CLI's start: {took:?}"
    );
    mock.shutdown().await;
}

fn codex_bin() -> Option<String> {
    match std::env::var("WARDEN_CODEX_BIN")
        .ok()
        .filter(|v| !v.is_empty())
    {
        Some(bin) => Some(bin),
        None => {
            assert_ne!(
                std::env::var("WARDEN_REQUIRE_CODEX").as_deref(),
                Ok("1"),
                "WARDEN_REQUIRE_CODEX=1 but WARDEN_CODEX_BIN is unset"
            );
            eprintln!("SKIPPED: set WARDEN_CODEX_BIN to the codex binary to run it");
            None
        }
    }
}

/// `warden chat --agent codex` of `hello` against `mock` (its Responses
/// endpoint), with `extra` flags.
async fn codex_chat(
    codex: &str,
    mock: &MockServer,
    dir: &Path,
    extra: &[&str],
) -> (std::process::Output, Duration) {
    codex_chat_within(codex, mock, dir, extra, TIMEOUT_MS).await
}

/// [`codex_chat`] at a stream timeout of `timeout_ms`.
async fn codex_chat_within(
    codex: &str,
    mock: &MockServer,
    dir: &Path,
    extra: &[&str],
    timeout_ms: u64,
) -> (std::process::Output, Duration) {
    let timeout = timeout_ms.to_string();
    let env = [
        ("WARDEN_CODEX_BIN", codex),
        ("OPENAI_API_KEY", "dummy"),
        ("WARDEN_STREAM_TIMEOUT", &timeout),
    ];
    let base = mock.base_url();
    let agent = ["--agent", "codex", "--base-url", &base];
    chat_with(&agent, &env, dir, extra).await
}

/// The scenarios of the mock's `/v1/responses` requests, in order.
fn responses(mock: &MockServer) -> Vec<Option<Scenario>> {
    mock.requests()
        .into_iter()
        .filter(|r| r.path == "/v1/responses")
        .map(|r| r.scenario)
        .collect()
}

/// The mock's Responses endpoint playing `first`, then a normal reply,
/// with `frames` frames before `first`'s fault.
async fn responses_mock(first: Scenario, frames: usize) -> MockServer {
    MockServer::start(
        MockConfig::default()
            .with_fault_after_frames(frames)
            .with_sequence([first, Scenario::Normal]),
    )
    .await
    .expect("mock")
}

/// What warden chat says when the process watchdog kills a silent CLI to
/// run the turn again (the wire's own lines name the same error, not the
/// retry).
/// The mock's reply.
const REPLY: &str = "Hello from warden-mock.";

/// A turn's events (`warden serve`'s SSE) end with `done`, the reply in
/// its text once and in `done` once.
fn answered_once(events: &str) -> Result<(), String> {
    let (done, replies) = (
        events.matches("event: done").count(),
        events.matches(REPLY).count(),
    );
    match (done, replies) {
        (1, 2) => Ok(()),
        _ => Err(format!("{done} done, the reply {replies} times")),
    }
}

const KILLED: &str = "Connection lost during streaming. Retrying...";

/// The CLI's reply, whole and once, and no process watchdog's kill.
fn assert_one_reply_no_kill(out: &std::process::Output) {
    check_no_panic(out);
    assert_eq!(code(out), 0, "{}", stderr(out));
    let text = stdout(out);
    assert_eq!(
        text.matches("Hello from warden-mock.").count(),
        1,
        "the whole reply, once: {text:?}"
    );
    assert!(
        !stderr(out).contains(KILLED),
        "the CLI was not killed and re-run: {}",
        stderr(out)
    );
}

/// A Codex stream silent before its first byte is retried by the wire
/// inside Codex's own request: Codex sees one late, whole stream, is not
/// killed (its own idle timeout is 300 s; warden's watchdog on its stdout
/// the whole stream timeout) and does not retry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_codex_stream_stalled_before_its_first_byte_is_retried_at_the_wire_unseen() {
    let Some(codex) = codex_bin() else {
        return;
    };
    let mock = responses_mock(Scenario::Stall, 0).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let (out, took) = codex_chat(&codex, &mock, dir.path(), &[]).await;
    eprintln!("Codex, stalled before its first byte, through the wire: {took:?}");
    assert_one_reply_no_kill(&out);
    let said = stderr(&out);
    assert!(
        said.contains("wire layer: openai /v1/responses") && said.contains("retrying"),
        "the wire retried it: {said}"
    );
    assert_eq!(
        responses(&mock),
        [Some(Scenario::Stall), Some(Scenario::Normal)],
        "the stalled request and the wire's retry"
    );
    assert!(
        took < Duration::from_millis(TIMEOUT_MS) + Duration::from_secs(6),
        "within the stream timeout and a few seconds: {took:?}"
    );
    mock.shutdown().await;
}

/// The mock's `/v1/responses` requests: each one's scenario and, for a
/// continuation of a broken reply, how it continued.
fn responses_continued(mock: &MockServer) -> Vec<(Option<Scenario>, Option<&'static str>)> {
    continued(mock, "/v1/responses")
}

/// The mock's requests to `path`: each one's scenario and, for a
/// continuation of a broken reply, how it continued.
fn continued(mock: &MockServer, path: &str) -> Vec<(Option<Scenario>, Option<&'static str>)> {
    mock.requests()
        .into_iter()
        .filter(|r| r.path == path)
        .map(|r| (r.scenario, r.continuation))
        .collect()
}

/// A Codex reply broken by `fault` mid-text (six frames: the response,
/// its item, its part and two text deltas) is continued at the wire with
/// a continuation turn and spliced into the same Responses stream: Codex
/// sees one whole response, so it never retries (no `Reconnecting...`, no
/// second whole request), is not killed, and the mock saw the broken
/// request and one continuation of it.
async fn a_codex_reply_broken_mid_text_is_continued(codex: &str, fault: Scenario) {
    let mock = responses_mock(fault, 6).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let (out, took) = codex_chat(codex, &mock, dir.path(), &[]).await;
    eprintln!("Codex, {fault} mid-text, through the wire: {took:?}");
    assert_one_reply_no_kill(&out);
    let reply = stdout(&out);
    assert!(
        reply.lines().any(
            |l| l.starts_with("Hello from warden-mock. Your last message had ")
                && l.ends_with(" characters.")
        ),
        "the whole reply, its end included: {reply:?}"
    );
    let said = stderr(&out);
    assert!(
        said.contains("wire layer: openai /v1/responses") && said.contains("continuing"),
        "the wire continued it: {said}"
    );
    assert!(!said.contains("gave up"), "{said}");
    assert_eq!(
        responses_continued(&mock),
        [(Some(fault), None), (Some(Scenario::Normal), Some("turn"))],
        "the broken request and one continuation of it, not Codex's own retry"
    );
    assert!(
        took < Duration::from_millis(TIMEOUT_MS) + Duration::from_secs(2),
        "within the stream timeout and 2 s: {took:?}"
    );
    mock.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_codex_reply_stalled_mid_text_is_continued_at_the_wire_not_rerun() {
    let Some(codex) = codex_bin() else {
        return;
    };
    a_codex_reply_broken_mid_text_is_continued(&codex, Scenario::Stall).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_codex_reply_cut_mid_text_is_continued_at_the_wire() {
    let Some(codex) = codex_bin() else {
        return;
    };
    a_codex_reply_broken_mid_text_is_continued(&codex, Scenario::AbruptClose).await;
}

/// A Codex reply that stalls inside a reasoning item (its summary
/// streaming, before any message) is sent again from scratch at the wire:
/// the item was held back (an SSE comment to Codex for each of its
/// events), so Codex saw none of it and gets the whole reply once from the
/// one request it made, not killed. Shown, the item could not be taken
/// back: the wire would give up, ending the stream with the `error` event,
/// and Codex re-send the whole request itself (its `Reconnecting...`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_codex_reply_stalled_in_thinking_is_retried_unseen_at_the_wire() {
    let Some(codex) = codex_bin() else {
        return;
    };
    let mock = responses_mock(Scenario::StallInThinking, 0).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let (out, took) = codex_chat(&codex, &mock, dir.path(), &[]).await;
    eprintln!("Codex, stalled in thinking, through the wire: {took:?}");
    assert_one_reply_no_kill(&out);
    let said = stderr(&out);
    assert!(
        said.contains("wire layer: openai /v1/responses") && said.contains("retrying"),
        "the wire sent it again: {said}"
    );
    assert!(
        !said.contains("gave up"),
        "not handed to Codex to retry: {said}"
    );
    assert_eq!(
        responses_continued(&mock),
        [
            (Some(Scenario::StallInThinking), None),
            (Some(Scenario::Normal), None)
        ],
        "the stalled request, then one whole retry at the wire"
    );
    assert!(
        took < Duration::from_millis(TIMEOUT_MS) + Duration::from_secs(2),
        "within the stream timeout and 2 s: {took:?}"
    );
    mock.shutdown().await;
}

/// Without the wire the same stalls, before and after the first byte, are
/// ended by the process watchdog: Codex killed at the stream timeout and
/// the turn run again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_wire_a_codex_stall_costs_a_kill_and_a_rerun() {
    let Some(codex) = codex_bin() else {
        return;
    };
    for frames in [0, 6] {
        let mock = responses_mock(Scenario::Stall, frames).await;
        let dir = tempfile::tempdir().expect("tempdir");
        let (out, took) = codex_chat(&codex, &mock, dir.path(), &["--no-wire-watch"]).await;
        eprintln!("Codex, stalled after {frames} frames, without the wire: {took:?}");
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        assert!(
            stderr(&out).contains(KILLED),
            "the process watchdog killed the stalled Codex: {}",
            stderr(&out)
        );
        assert!(took >= Duration::from_millis(TIMEOUT_MS), "{took:?}");
        mock.shutdown().await;
    }
}

/// An overloaded answer before any byte goes back to Codex at once, which
/// retries it itself, as it would alone: one more request, not the
/// wire's retries multiplying Codex's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_529_before_any_byte_is_handed_to_codex_which_retries_it_once() {
    let Some(codex) = codex_bin() else {
        return;
    };
    let mock = responses_mock(Scenario::Overloaded, 0).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let (out, took) =
        codex_chat_within(&codex, &mock, dir.path(), &[], NO_SILENCE_TIMEOUT_MS).await;
    eprintln!("Codex, 529 then a reply, through the wire: {took:?}");
    assert_one_reply_no_kill(&out);
    assert!(
        stderr(&out).contains("answered 529 after 1 attempt(s)"),
        "the wire handed the 529 back unretried: {}",
        stderr(&out)
    );
    assert_eq!(
        responses(&mock),
        [Some(Scenario::Overloaded), Some(Scenario::Normal)],
        "the 529 and Codex's one retry, no more"
    );
    mock.shutdown().await;
}

/// Without `--base-url` the wire sits in front of the API Codex would
/// reach itself, `OPENAI_BASE_URL` (which ends in `/v1`), and still
/// retries a stall before the first byte unseen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_codex_reaching_openai_base_url_is_watched_in_front_of_it() {
    let Some(codex) = codex_bin() else {
        return;
    };
    let mock = responses_mock(Scenario::Stall, 0).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let api = format!("{}/v1", mock.base_url());
    let env = [
        ("WARDEN_CODEX_BIN", codex.as_str()),
        ("OPENAI_API_KEY", "dummy"),
        ("OPENAI_BASE_URL", api.as_str()),
    ];
    let (out, took) = chat_with(&["--agent", "codex"], &env, dir.path(), &[]).await;
    eprintln!("Codex on OPENAI_BASE_URL, stalled before its first byte: {took:?}");
    assert_one_reply_no_kill(&out);
    assert!(
        stderr(&out).contains("wire layer: openai /v1/responses"),
        "through the wire: {}",
        stderr(&out)
    );
    assert_eq!(
        responses(&mock),
        [Some(Scenario::Stall), Some(Scenario::Normal)],
        "the stalled request and the wire's retry, at OPENAI_BASE_URL"
    );
    mock.shutdown().await;
}

fn gemini_bin() -> Option<String> {
    match std::env::var("WARDEN_GEMINI_BIN")
        .ok()
        .filter(|v| !v.is_empty())
    {
        Some(bin) => Some(bin),
        None => {
            assert_ne!(
                std::env::var("WARDEN_REQUIRE_GEMINI").as_deref(),
                Ok("1"),
                "WARDEN_REQUIRE_GEMINI=1 but WARDEN_GEMINI_BIN is unset"
            );
            eprintln!("SKIPPED: set WARDEN_GEMINI_BIN to the gemini binary to run it");
            None
        }
    }
}

/// The mock's Gemini endpoint playing `first` (after two of its three
/// frames: "Hello from warden-mock. Your last message " and no finish
/// reason), then a normal reply.
async fn gemini_mock(first: Scenario) -> MockServer {
    MockServer::start(
        MockConfig::default()
            .with_fault_after_frames(2)
            .with_sequence([first, Scenario::Normal]),
    )
    .await
    .expect("mock")
}

/// `warden chat --agent gemini` of `hello` against `mock`, with `extra`
/// flags.
async fn gemini_chat(
    gemini: &str,
    mock: &MockServer,
    dir: &Path,
    extra: &[&str],
) -> (std::process::Output, Duration) {
    let env = [("WARDEN_GEMINI_BIN", gemini), ("GEMINI_API_KEY", "dummy")];
    let base = mock.base_url();
    let agent = ["--agent", "gemini", "--base-url", &base];
    chat_with(&agent, &env, dir, extra).await
}

/// The mock's Gemini stream requests: each one's scenario and, for a
/// continuation of a broken reply, how it continued.
fn gemini_requests(mock: &MockServer) -> Vec<(Option<Scenario>, Option<&'static str>)> {
    mock.requests()
        .into_iter()
        .filter(|r| r.path.ends_with(":streamGenerateContent"))
        .map(|r| (r.scenario, r.continuation))
        .collect()
}

/// Gemini CLI's reply whole and once, the CLI started once for the turn:
/// no kill, and no turn re-run by warden (whose retries say `warden: …
/// retrying`; the wire's lines say `warden: wire layer:`).
fn assert_one_gemini_reply_not_rerun(out: &std::process::Output) {
    assert_one_reply_no_kill(out);
    let text = stdout(out);
    assert_eq!(
        text.matches("characters.").count(),
        1,
        "the reply's end, once: {text:?}"
    );
    let said = stderr(out);
    assert!(
        !said
            .lines()
            .any(|l| l.contains("retrying") && !l.starts_with("warden: wire layer:")),
        "the turn was not run again: {said}"
    );
}

/// A Gemini reply broken by `fault` mid-text is continued at the wire with
/// a continuation turn (the request's `contents`, the text so far as a
/// `model` turn, the ask to go on) and spliced into the same stream: the
/// CLI sees one whole reply, is neither killed nor run again, and the mock
/// saw the broken request and one continuation of it.
async fn a_gemini_reply_broken_mid_text_is_continued(gemini: &str, fault: Scenario) {
    let mock = gemini_mock(fault).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let (out, took) = gemini_chat(gemini, &mock, dir.path(), &[]).await;
    eprintln!("Gemini CLI, {fault} mid-text, through the wire: {took:?}");
    assert_one_gemini_reply_not_rerun(&out);
    let said = stderr(&out);
    assert!(
        said.contains("wire layer: gemini /v1beta/models/") && said.contains("continuing"),
        "the wire continued it: {said}"
    );
    assert_eq!(
        gemini_requests(&mock),
        [(Some(fault), None), (Some(Scenario::Normal), Some("turn"))],
        "the broken request and one continuation of it, not a second whole one"
    );
    assert!(
        took < Duration::from_millis(TIMEOUT_MS) + Duration::from_secs(2),
        "within the stream timeout and 2 s: {took:?}"
    );
    mock.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gemini_reply_stalled_mid_text_is_continued_at_the_wire_not_rerun() {
    let Some(gemini) = gemini_bin() else {
        return;
    };
    a_gemini_reply_broken_mid_text_is_continued(&gemini, Scenario::Stall).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gemini_reply_cut_mid_text_is_continued_at_the_wire() {
    let Some(gemini) = gemini_bin() else {
        return;
    };
    a_gemini_reply_broken_mid_text_is_continued(&gemini, Scenario::AbruptClose).await;
}

/// A Gemini reply that stalls among its thought parts, before any text, is
/// sent again from scratch at the wire: its thoughts were held back (with
/// a blank line to the CLI for each), so the CLI saw none of them, and
/// gets the whole reply once from the one request it made, neither killed
/// nor run again. Shown, thought text could not be taken back: the wire
/// would have ended the stream with an error and warden re-run the turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gemini_reply_stalled_in_thinking_is_retried_unseen_at_the_wire() {
    let Some(gemini) = gemini_bin() else {
        return;
    };
    let mock = gemini_mock(Scenario::StallInThinking).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let (out, took) = gemini_chat(&gemini, &mock, dir.path(), &[]).await;
    eprintln!("Gemini CLI, stalled in thinking, through the wire: {took:?}");
    assert_one_gemini_reply_not_rerun(&out);
    assert_eq!(
        gemini_requests(&mock),
        [
            (Some(Scenario::StallInThinking), None),
            (Some(Scenario::Normal), None)
        ],
        "the stalled request, then one whole retry at the wire"
    );
    assert!(
        took < Duration::from_millis(TIMEOUT_MS) + Duration::from_secs(2),
        "within the stream timeout and 2 s: {took:?}"
    );
    mock.shutdown().await;
}

/// Without the wire the same stall costs the process watchdog's kill at
/// the stream timeout and a re-run of the turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_wire_a_gemini_stall_costs_a_kill_and_a_rerun() {
    let Some(gemini) = gemini_bin() else {
        return;
    };
    let mock = gemini_mock(Scenario::Stall).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let (out, took) = gemini_chat(&gemini, &mock, dir.path(), &["--no-wire-watch"]).await;
    eprintln!("Gemini CLI, stalled mid-text, without the wire: {took:?}");
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(
        stderr(&out).contains(KILLED),
        "the process watchdog killed the stalled CLI: {}",
        stderr(&out)
    );
    assert_eq!(
        gemini_requests(&mock),
        [
            (Some(Scenario::Stall), None),
            (Some(Scenario::Normal), None)
        ],
        "the stalled request and a second whole one"
    );
    assert!(took >= Duration::from_millis(TIMEOUT_MS), "{took:?}");
    mock.shutdown().await;
}

/// An overloaded answer (529, `UNAVAILABLE`) before any byte is retried by
/// the wire itself for Gemini CLI, whose own retries warden turns off: the
/// CLI sees one later, whole stream and is not run again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_529_before_any_byte_is_retried_by_the_wire_under_gemini_cli() {
    let Some(gemini) = gemini_bin() else {
        return;
    };
    let mock = gemini_mock(Scenario::Overloaded).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let (out, took) = gemini_chat(&gemini, &mock, dir.path(), &[]).await;
    eprintln!("Gemini CLI, 529 then a reply, through the wire: {took:?}");
    assert_one_gemini_reply_not_rerun(&out);
    assert!(
        stderr(&out).contains("wire layer: gemini /v1beta/models/")
            && stderr(&out).contains("retrying"),
        "the wire retried it: {}",
        stderr(&out)
    );
    assert_eq!(
        gemini_requests(&mock),
        [
            (Some(Scenario::Overloaded), None),
            (Some(Scenario::Normal), None)
        ],
        "the 529 and the wire's one retry"
    );
    assert!(
        took < Duration::from_millis(TIMEOUT_MS) + Duration::from_secs(2),
        "within the stream timeout and 2 s: {took:?}"
    );
    mock.shutdown().await;
}

/// An outage longer than the wire's attempts (every request `503`
/// `UNAVAILABLE`) under Gemini CLI, whose own retries warden turns off:
/// the wire's 4 attempts are the turn's, its run ends when the wire hands
/// the request back and the turn is not run again (4 runs of 4 attempts
/// before): 4 upstream requests, one from the CLI, exit 5.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_under_gemini_cli_ends_the_turn_after_the_wires_attempts() {
    let Some(gemini) = gemini_bin() else {
        return;
    };
    let mock = MockServer::start(MockConfig::scenario(Scenario::Unavailable))
        .await
        .expect("mock");
    let dir = tempfile::tempdir().expect("tempdir");
    let (out, took) = gemini_chat(&gemini, &mock, dir.path(), &[]).await;
    let requests = gemini_requests(&mock).len();
    eprintln!("Gemini CLI, every request 503, through the wire: {took:?}, {requests} requests");
    assert_the_wire_ended_the_outage(&out, took, requests);
    mock.shutdown().await;
}

/// The same outage under `warden serve`: the turn's last event is the
/// typed error with exit class 5, naming the wire's attempts; the upstream
/// was asked the retry policy's 4 times, once per wire attempt of the
/// CLI's one request, and the session's turn was not run again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_serve_an_outage_ends_the_turn_after_the_wires_attempts() {
    let Some(gemini) = gemini_bin() else {
        return;
    };
    let mock = MockServer::start(MockConfig::scenario(Scenario::Unavailable))
        .await
        .expect("mock");
    let dir = tempfile::tempdir().expect("tempdir");
    let (data, workspace, home) = test_dirs(dir.path());
    let timeout = TIMEOUT_MS.to_string();
    let env = [
        ("WARDEN_GEMINI_BIN", gemini.as_str()),
        ("GEMINI_API_KEY", "dummy"),
        ("HOME", arg(&home)),
        ("WARDEN_STREAM_TIMEOUT", timeout.as_str()),
    ];
    let (mut server, base, token, logged) =
        serve_logged(&data, &mock.base_url(), &["--agent", "gemini"], &env).await;
    let started = Instant::now();
    let body = serde_json::json!({"workspace": arg(&workspace), "message": "hello"});
    let response = reqwest::Client::new()
        .post(format!("{base}/v1/turns"))
        .bearer_auth(&token)
        .header("accept", "text/event-stream")
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .expect("post");
    assert_eq!(response.status(), 200);
    let mut events = response.bytes_stream();
    let (mut buf, mut last) = (String::new(), None);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    while let Some((_, kind, data)) = next_event(&mut events, &mut buf, deadline)
        .await
        .expect("the turn's events before the bound")
    {
        let end = kind == "done" || kind == "error";
        last = Some((kind, data));
        if end {
            break;
        }
    }
    let took = started.elapsed();
    let requests = gemini_requests(&mock).len();
    let said = logged.lock().join("\n");
    eprintln!("Gemini CLI under serve, every request 503: {took:?}, {requests} requests");
    let (kind, data) = last.expect("a last event");
    assert_eq!(kind, "error", "the turn failed: {data}");
    assert_eq!(data["exit"], 5, "Unavailable: {data}");
    let message = data["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("the wire layer made 4 attempts at model request #"),
        "the error names the wire's attempts: {data}"
    );
    assert_eq!(
        requests, POLICY_ATTEMPTS,
        "the retry policy's attempts upstream, not the layers' product: {said}"
    );
    assert!(
        took < Duration::from_secs(60),
        "the wire's backoff and one start of the CLI: {took:?}"
    );
    server.start_kill().expect("SIGKILL");
    let _ = tokio::time::timeout(Duration::from_secs(30), server.wait()).await;
    mock.shutdown().await;
}

/// OpenCode or its fork Kilo Code CLI (one adapter).
#[derive(Clone, Copy)]
struct Family {
    /// Its `--agent`.
    agent: &'static str,
    /// The variable naming its binary, and the one requiring it.
    bin: &'static str,
    require: &'static str,
    /// The stream timeout of its tests, in ms: it prints nothing until a
    /// text part is whole, so its stdout is silent for its start-up, the
    /// request and the wire's recovery (half this). OpenCode starts in
    /// 3-4 s idle, up to 15 s seen on a loaded machine's fresh home; Kilo
    /// in about 9 s idle, over 20 s with another Kilo starting beside it.
    timeout_ms: u64,
}

const OPENCODE: Family = Family {
    agent: "opencode",
    bin: "WARDEN_OPENCODE_BIN",
    require: "WARDEN_REQUIRE_OPENCODE",
    timeout_ms: 20_000,
};

const KILO: Family = Family {
    agent: "kilo-code",
    bin: "WARDEN_KILO_BIN",
    require: "WARDEN_REQUIRE_KILO",
    timeout_ms: 45_000,
};

fn family_bin(cli: Family) -> Option<String> {
    match std::env::var(cli.bin).ok().filter(|v| !v.is_empty()) {
        Some(bin) => Some(bin),
        None => {
            assert_ne!(
                std::env::var(cli.require).as_deref(),
                Ok("1"),
                "{}=1 but {} is unset",
                cli.require,
                cli.bin
            );
            eprintln!("SKIPPED: set {} to the CLI's binary to run it", cli.bin);
            None
        }
    }
}

/// `warden chat --agent opencode|kilo-code` of `hello` against `mock`
/// (its chat completions endpoint), with `extra` flags.
async fn family_chat(
    cli: Family,
    bin: &str,
    mock: &MockServer,
    dir: &Path,
    extra: &[&str],
) -> (std::process::Output, Duration) {
    let timeout = cli.timeout_ms.to_string();
    let env = [(cli.bin, bin), ("WARDEN_STREAM_TIMEOUT", &timeout)];
    let base = mock.base_url();
    let agent = ["--agent", cli.agent, "--base-url", &base];
    chat_with(&agent, &env, dir, extra).await
}

/// A reply broken by `fault` mid-text is continued at the wire and spliced
/// into the same completion: the CLI sees one whole stream (no re-send of
/// its own, no step without a finish reason), is started once and not
/// killed, and the mock saw the broken request and one continuation.
async fn a_family_reply_broken_mid_text_is_continued(cli: Family, fault: Scenario) {
    let Some(bin) = family_bin(cli) else {
        return;
    };
    let mock = responses_mock(fault, 3).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let (out, took) = family_chat(cli, &bin, &mock, dir.path(), &[]).await;
    eprintln!(
        "{}, {fault} mid-text, through the wire: {took:?}",
        cli.agent
    );
    assert_one_reply_no_kill(&out);
    let reply = stdout(&out);
    assert!(
        reply.contains("Hello from warden-mock. Your last message had ")
            && reply.contains(" characters."),
        "the whole reply, its end included: {reply:?}"
    );
    let said = stderr(&out);
    assert!(
        said.contains("wire layer: openai /v1/chat/completions") && said.contains("continuing"),
        "the wire continued it: {said}"
    );
    assert_eq!(
        continued(&mock, "/v1/chat/completions"),
        [(Some(fault), None), (Some(Scenario::Normal), Some("turn"))],
        "the broken request and one continuation of it, not the CLI's own re-send"
    );
    assert!(
        took < Duration::from_millis(cli.timeout_ms / 2) + Duration::from_secs(45),
        "the wire's allowance, the CLI's start-up and a few seconds: {took:?}"
    );
    mock.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_opencode_reply_stalled_mid_text_is_continued_at_the_wire_not_rerun() {
    a_family_reply_broken_mid_text_is_continued(OPENCODE, Scenario::Stall).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_opencode_reply_cut_mid_text_is_continued_at_the_wire() {
    a_family_reply_broken_mid_text_is_continued(OPENCODE, Scenario::AbruptClose).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kilo_reply_stalled_mid_text_is_continued_at_the_wire_not_rerun() {
    a_family_reply_broken_mid_text_is_continued(KILO, Scenario::Stall).await;
}

/// Kilo alone ends a cut stream with exit 0 and the partial text as the
/// reply (silent truncation): under the wire it never sees the cut.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kilo_reply_cut_mid_text_is_continued_at_the_wire_not_returned_half() {
    a_family_reply_broken_mid_text_is_continued(KILO, Scenario::AbruptClose).await;
}

/// Without the wire, a stream that ends cleanly without a finish reason
/// (mock `early-end`): OpenCode asks the model to go on from the partial
/// text, again and again while it keeps being cut; Kilo ends the turn with
/// the partial text as the reply (exit 0). warden fails the turn at the
/// step that ended so and runs it again on the same session: the whole
/// reply once, two or three requests (the cut one, maybe OpenCode's first
/// go-on, warden's retry), neither a loop nor a truncated reply.
async fn without_the_wire_a_cut_without_a_finish_reason_is_retried(cli: Family) {
    let Some(bin) = family_bin(cli) else {
        return;
    };
    let mock = responses_mock(Scenario::EarlyEnd, 3).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let (out, took) = family_chat(cli, &bin, &mock, dir.path(), &["--no-wire-watch"]).await;
    eprintln!(
        "{}, early end, no wire: {took:?}; stderr: {}",
        cli.agent,
        stderr(&out)
    );
    check_no_panic(&out);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let reply = stdout(&out);
    assert_eq!(
        reply.matches("Hello from").count(),
        1,
        "the whole reply once, the partial one not kept: {reply:?}"
    );
    assert!(reply.contains(" characters."), "{reply:?}");
    let requests = continued(&mock, "/v1/chat/completions");
    assert!(
        (2..=3).contains(&requests.len()) && requests[0].0 == Some(Scenario::EarlyEnd),
        "the cut request, then at most the CLI's one go-on and warden's retry: {requests:?}"
    );
    mock.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_wire_an_opencode_stream_cut_without_a_finish_reason_is_retried_not_looped() {
    without_the_wire_a_cut_without_a_finish_reason_is_retried(OPENCODE).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_wire_a_kilo_stream_cut_without_a_finish_reason_is_retried_not_returned() {
    without_the_wire_a_cut_without_a_finish_reason_is_retried(KILO).await;
}

/// Aider (`WARDEN_AIDER_BIN`): it prints plain text and exits 0 on every
/// fault, a cut stream's half reply as its answer. Its stdout is silent
/// from its banner to the reply, so its stream timeout is OpenCode's.
const AIDER: Family = Family {
    agent: "aider",
    bin: "WARDEN_AIDER_BIN",
    require: "WARDEN_REQUIRE_AIDER",
    timeout_ms: 20_000,
};

/// An Aider reply broken by `fault` mid-text is continued at the wire and
/// spliced into the same completion: Aider sees one whole stream (no
/// `litellm` error, no retry of its own printing the partial text again),
/// is started once and not killed, and the mock saw the broken request and
/// one continuation.
async fn an_aider_reply_broken_mid_text_is_continued(fault: Scenario) {
    let Some(bin) = family_bin(AIDER) else {
        return;
    };
    let mock = responses_mock(fault, 3).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let timeout = AIDER.timeout_ms.to_string();
    let env = [
        (AIDER.bin, bin.as_str()),
        ("WARDEN_STREAM_TIMEOUT", &timeout),
        ("OPENAI_API_KEY", "dummy"),
    ];
    let base = mock.base_url();
    let agent = [
        "--agent",
        "aider",
        "--base-url",
        &base,
        "--model",
        "mock-model",
    ];
    let (out, took) = chat_with(&agent, &env, dir.path(), &[]).await;
    eprintln!("aider, {fault} mid-text, through the wire: {took:?}");
    assert_one_reply_no_kill(&out);
    let reply = stdout(&out);
    assert!(
        reply.contains("Hello from warden-mock. Your last message had ")
            && reply.contains(" characters."),
        "the whole reply, its end included: {reply:?}"
    );
    let said = stderr(&out);
    assert!(
        said.contains("wire layer: openai /v1/chat/completions") && said.contains("continuing"),
        "the wire continued it: {said}"
    );
    assert!(
        !said.contains("litellm") && !said.contains("retrying"),
        "Aider saw no fault and warden ran it once: {said}"
    );
    assert_eq!(
        continued(&mock, "/v1/chat/completions"),
        [(Some(fault), None), (Some(Scenario::Normal), Some("turn"))],
        "the broken request and one continuation of it, not Aider's own re-send"
    );
    mock.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_aider_reply_stalled_mid_text_is_continued_at_the_wire_not_rerun() {
    an_aider_reply_broken_mid_text_is_continued(Scenario::Stall).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_aider_reply_cut_mid_text_is_continued_at_the_wire_not_returned_half() {
    an_aider_reply_broken_mid_text_is_continued(Scenario::AbruptClose).await;
}

/// Without the wire, a connection cut mid-text reaches Aider, which prints
/// the partial text and `litellm.APIConnectionError` on one line, then
/// would retry and print the partial text again, exiting 0 whatever
/// happens. warden fails the run at that line and retries the turn on the
/// same conversation, discarding the text shown: the whole reply once, two
/// requests (the cut one and warden's retry), not Aider's own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_wire_an_aider_cut_is_retried_by_warden_not_returned_half() {
    let Some(bin) = family_bin(AIDER) else {
        return;
    };
    let mock = responses_mock(Scenario::AbruptClose, 3).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let timeout = AIDER.timeout_ms.to_string();
    let env = [
        (AIDER.bin, bin.as_str()),
        ("WARDEN_STREAM_TIMEOUT", &timeout),
        ("OPENAI_API_KEY", "dummy"),
    ];
    let base = mock.base_url();
    let agent = [
        "--agent",
        "aider",
        "--base-url",
        &base,
        "--model",
        "mock-model",
    ];
    let (out, took) = chat_with(&agent, &env, dir.path(), &["--no-wire-watch"]).await;
    eprintln!("aider, a cut mid-text, no wire: {took:?}");
    check_no_panic(&out);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let reply = stdout(&out);
    assert_eq!(
        reply.matches("Hello from").count(),
        1,
        "the whole reply once, the partial one not kept: {reply:?}"
    );
    assert!(reply.contains(" characters."), "{reply:?}");
    assert!(
        stderr(&out).contains("APIConnectionError"),
        "warden saw Aider's error line: {}",
        stderr(&out)
    );
    assert_eq!(
        mock.requests_to("/v1/chat/completions"),
        2,
        "the cut request and warden's retry, not Aider's own"
    );
    mock.shutdown().await;
}

/// The 503s of a storm: the wire's attempts (4) take it up whole.
const STORM: usize = 3;

/// `warden chat` of `hello` with a chat-completions CLI (OpenCode, Kilo
/// Code, Aider) against `mock`, with an API key and, for Aider, a model
/// named (so it downloads no price map). At [`NO_SILENCE_TIMEOUT_MS`]: its
/// callers' faults (503s, an outage) involve no silence, and OpenCode
/// once took over 20 s to start with six tests beside it.
async fn keyed_chat(
    cli: Family,
    bin: &str,
    mock: &MockServer,
    dir: &Path,
) -> (std::process::Output, Duration) {
    let timeout = NO_SILENCE_TIMEOUT_MS.to_string();
    let env = [
        (cli.bin, bin),
        ("WARDEN_STREAM_TIMEOUT", &timeout),
        ("OPENAI_API_KEY", "dummy"),
    ];
    let base = mock.base_url();
    let mut agent = vec!["--agent", cli.agent, "--base-url", &base];
    if cli.agent == AIDER.agent {
        agent.extend(["--model", "mock-model"]);
    }
    chat_with(&agent, &env, dir, &[]).await
}

/// A 503 storm before any byte (the mock answers [`STORM`] requests 503,
/// then replies) is retried by the wire itself, per the shared backoff,
/// inside the CLI's one request: the CLI sees one later, whole stream, is
/// started once and not killed, exits 0, and the mock saw the 503s and
/// one request more — neither the CLI's own retries (OpenCode's silent
/// backoff, Qwen Code's `retry` line, Aider's `Retrying in …`, their SDKs'
/// re-sends) nor warden's re-run of the turn.
async fn a_503_storm_is_retried_at_the_wire(cli: Family) {
    let Some(bin) = family_bin(cli) else {
        return;
    };
    let mut script = vec![Scenario::Unavailable; STORM];
    script.push(Scenario::Normal);
    let mock = MockServer::start(MockConfig::default().with_sequence(script.clone()))
        .await
        .expect("mock");
    let dir = tempfile::tempdir().expect("tempdir");
    let (out, took) = keyed_chat(cli, &bin, &mock, dir.path()).await;
    eprintln!(
        "{}, {STORM} 503s then a reply, through the wire: {took:?}",
        cli.agent
    );
    assert_one_reply_no_kill(&out);
    let reply = stdout(&out);
    assert!(reply.contains(" characters."), "the whole reply: {reply:?}");
    let said = stderr(&out);
    assert_eq!(
        said.lines()
            .filter(
                |l| l.contains("wire layer: openai /v1/chat/completions") && l.contains("retrying")
            )
            .count(),
        STORM,
        "the wire retried each 503: {said}"
    );
    let requests: Vec<_> = continued(&mock, "/v1/chat/completions")
        .into_iter()
        .map(|(scenario, _)| scenario)
        .collect();
    assert_eq!(
        requests,
        script.into_iter().map(Some).collect::<Vec<_>>(),
        "the 503s and one request more: the wire's retries, not the CLI's or a re-run"
    );
    assert!(
        took < Duration::from_secs(60),
        "the backoff (0.5 + 1 + 2 s, jittered) and the CLI's start-up: {took:?}"
    );
    mock.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_503_storm_under_opencode_is_retried_at_the_wire_not_by_opencode() {
    a_503_storm_is_retried_at_the_wire(OPENCODE).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_503_storm_under_kilo_is_retried_at_the_wire_not_by_kilo() {
    a_503_storm_is_retried_at_the_wire(KILO).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_503_storm_under_aider_is_retried_at_the_wire_not_by_aider() {
    a_503_storm_is_retried_at_the_wire(AIDER).await;
}

/// An outage longer than the wire's attempts (every request `503`):
/// measured before, OpenCode's 6 attempts in each of warden's 4 runs, each
/// tried 4 times at the wire, 96 upstream requests and exit 5 at 381 s.
/// Now the wire's give-up after the retry policy's attempts ends the run at
/// once (the CLI's process group with it, before its own retry) and the
/// turn is not run again: 4 upstream requests, one from the CLI, exit 5
/// (Aider too, which alone exits 0 on every fault).
async fn an_outage_is_ended_by_the_wire_after_its_attempts(cli: Family) {
    let Some(bin) = family_bin(cli) else {
        return;
    };
    let mock = MockServer::start(MockConfig::scenario(Scenario::Unavailable))
        .await
        .expect("mock");
    let dir = tempfile::tempdir().expect("tempdir");
    let (out, took) = keyed_chat(cli, &bin, &mock, dir.path()).await;
    let requests = mock.requests_to("/v1/chat/completions");
    eprintln!(
        "{}, every request 503, through the wire: {took:?}, {requests} upstream requests",
        cli.agent
    );
    assert_the_wire_ended_the_outage(&out, took, requests);
    mock.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_under_opencode_ends_the_turn_after_the_wires_attempts_not_opencodes() {
    an_outage_is_ended_by_the_wire_after_its_attempts(OPENCODE).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_under_kilo_ends_the_turn_after_the_wires_attempts_not_kilos() {
    an_outage_is_ended_by_the_wire_after_its_attempts(KILO).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_under_aider_ends_the_turn_after_the_wires_attempts_exit_5_not_0() {
    an_outage_is_ended_by_the_wire_after_its_attempts(AIDER).await;
}
