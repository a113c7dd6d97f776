//! `warden proxy` as a process, in front of clients no one here wrote:
//! the real Claude Code CLI and the official Python SDKs (`anthropic`,
//! `openai`), against `warden-mock` stalling mid-text or before its first
//! byte. Each client must get the whole reply with no error of its own.
//! Beside them, what the docs compare the proxy with: Claude Code alone
//! against the same faults (`claude_code_alone_*`).
//!
//! The clients come from `.ci/run`: `WARDEN_CLAUDE_BIN` (the pinned Claude
//! Code) and `WARDEN_PYTHON` (a venv's python with the pinned SDKs). When
//! one is missing its test says why and passes, unless
//! `WARDEN_REQUIRE_CLAUDE=1` / `WARDEN_REQUIRE_PYTHON_SDKS=1` (CI) makes it
//! fail.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;
use warden_mock::{MockConfig, MockServer, Scenario};

/// What "at once" means for Claude Code alone here: well before its 300 s
/// idle default, with room for its start-up on CI's two loaded cores (the
/// runs measured 0.5-2.0 s; 10.5-11.2 s at its 10 s idle floor).
const ALONE_AT_ONCE: Duration = Duration::from_secs(60);

/// What a stalled turn through the proxy may take beyond a healthy one and
/// the proxy's timeout: the retry policy's first backoff (0.5 s) and room
/// for CI's loaded cores (the healthy turn is measured once; with two more
/// busy loops beside the tests a 1 s margin was missed). Alone, Claude Code
/// takes 300 s.
const STALL_MARGIN: Duration = Duration::from_secs(5);

const PATIENCE: Duration = Duration::from_secs(60);
/// The proxy's watchdog timeout in these tests.
const TIMEOUT_MS: u64 = 1_000;
const REPLY: &str = "The proxy kept this reply whole: alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa quebec romeo sierra tango.";

struct ProxyProcess {
    child: tokio::process::Child,
    base: String,
}

impl Drop for ProxyProcess {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

async fn start_proxy(mock: &MockServer) -> ProxyProcess {
    let mut cmd = command(&[
        "proxy",
        "--listen",
        "127.0.0.1:0",
        "--anthropic-upstream",
        &mock.base_url(),
        "--openai-upstream",
        &mock.base_url(),
        "--timeout",
        &TIMEOUT_MS.to_string(),
        "--json",
    ]);
    cmd.kill_on_drop(true);
    let (child, base, mut lines) = spawn_listening(cmd, PATIENCE).await;
    // Keep reading the access log so the pipe never fills.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    ProxyProcess { child, base }
}

fn mock_config(sequence: [Scenario; 2], fault_after_frames: usize) -> MockConfig {
    MockConfig::default()
        .with_sequence(sequence)
        .with_reply(REPLY)
        .with_frame_interval(Duration::from_millis(5))
        .with_fault_after_frames(fault_after_frames)
}

/// The client binary named by `var`, or why the test cannot run.
fn client(var: &str, require: &str) -> Option<PathBuf> {
    match std::env::var_os(var).map(PathBuf::from) {
        Some(p) if p.exists() => Some(p),
        other => {
            assert!(
                std::env::var(require).as_deref() != Ok("1"),
                "{require}=1 but {var} is {other:?}"
            );
            eprintln!("skipped: set {var} to run this test ({require}=1 makes it fail instead)");
            None
        }
    }
}

/// One `claude -p` turn through the proxy: the result line and the wall
/// time.
async fn claude_turn(bin: &Path, base: &str, dir: &Path) -> (Value, Duration) {
    let (status, result, took) = claude_run(bin, base, dir).await;
    assert!(status.success(), "claude failed ({status:?}): {result}");
    (result, took)
}

/// One `claude -p` turn at `base`: its exit status, its JSON result line
/// and how long it took (at most [`PATIENCE`], or the test fails).
async fn claude_run(
    bin: &Path,
    base: &str,
    dir: &Path,
) -> (std::process::ExitStatus, Value, Duration) {
    claude_run_with(bin, base, dir, &[]).await
}

/// [`claude_run`] with more environment variables.
async fn claude_run_with(
    bin: &Path,
    base: &str,
    dir: &Path,
    env: &[(&str, &str)],
) -> (std::process::ExitStatus, Value, Duration) {
    let home = dir.join("home");
    let scratch = dir.join("scratch");
    let work = dir.join("work");
    for d in [&home, &scratch, &work] {
        std::fs::create_dir_all(d).expect("mkdir");
    }
    let mut cmd = tokio::process::Command::new(bin);
    cmd.args(["-p", "say the sentence", "--output-format", "json"])
        .current_dir(&work)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", &home)
        .env("ANTHROPIC_BASE_URL", base)
        .env("ANTHROPIC_API_KEY", "dummy")
        .env("DISABLE_TELEMETRY", "1")
        .env("DISABLE_AUTOUPDATER", "1")
        .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
        .env("CLAUDE_CODE_TMPDIR", &scratch)
        .env("XDG_RUNTIME_DIR", &scratch)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .kill_on_drop(true);
    let t0 = Instant::now();
    let out = tokio::time::timeout(PATIENCE, cmd.output())
        .await
        .expect("claude finishes within the bound")
        .expect("claude runs");
    let took = t0.elapsed();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let result: Value = stdout
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| {
            panic!(
                "no JSON result on stdout ({:?}): {stdout}\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            )
        });
    (out.status, result, took)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_code_through_the_proxy_gets_the_whole_reply_when_the_api_stalls_mid_text() {
    let Some(bin) = client("WARDEN_CLAUDE_BIN", "WARDEN_REQUIRE_CLAUDE") else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");

    // The anchor: the same CLI, proxy and reply with nothing broken.
    let healthy = MockServer::start(mock_config([Scenario::Normal, Scenario::Normal], 0))
        .await
        .expect("mock");
    let proxy = start_proxy(&healthy).await;
    let (result, healthy_took) = claude_turn(&bin, &proxy.base, &dir.path().join("a")).await;
    assert_eq!(result["result"], REPLY, "{result}");
    drop(proxy);

    // The API stalls (socket open, no FIN) on the first request: mid-text,
    // and right after the text block's last delta.
    for fault in [6, 12] {
        let stalling = MockServer::start(mock_config([Scenario::Stall, Scenario::Normal], fault))
            .await
            .expect("mock");
        let proxy = start_proxy(&stalling).await;
        let run = dir.path().join(format!("stall-{fault}"));
        let (result, took) = claude_turn(&bin, &proxy.base, &run).await;
        let what = format!("stall after {fault} frames");
        eprintln!("{what}: the turn took {took:?}; a healthy one {healthy_took:?}");
        assert_eq!(result["is_error"], false, "{what}: {result}");
        assert_eq!(
            result["result"], REPLY,
            "{what}: the full intended reply: {result}"
        );
        let bound = healthy_took + Duration::from_millis(TIMEOUT_MS) + STALL_MARGIN;
        assert!(
            took <= bound,
            "{what}: the stalled turn took {took:?}; a healthy one {healthy_took:?} (bound {bound:?})"
        );
        let messages: Vec<_> = stalling
            .requests()
            .into_iter()
            .filter(|r| r.path == "/v1/messages")
            .collect();
        assert!(
            messages.iter().any(|r| r.scenario == Some(Scenario::Stall)),
            "{what}: the first request stalled"
        );
        assert_eq!(
            messages.last().and_then(|r| r.continuation),
            Some("turn"),
            "{what}: the reply was continued, not re-sent: {messages:?}"
        );
    }
}

/// `warden mock` (the binary) with `--scenario`: its base URL and the
/// process.
async fn mock_binary(scenario: &str) -> (tokio::process::Child, String) {
    use tokio::io::AsyncBufReadExt as _;
    let mut cmd = command(&["mock", "--port", "0", "--scenario", scenario]);
    cmd.kill_on_drop(true);
    let mut child = cmd.spawn().expect("warden mock starts");
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    let first = tokio::time::timeout(PATIENCE, lines.next_line())
        .await
        .expect("a first line in time")
        .expect("read")
        .expect("a line");
    let url = first
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .unwrap_or_else(|| panic!("no URL in {first:?}"))
        .to_owned();
    (child, url)
}

/// `warden proxy` (the binary) in front of `upstream`.
async fn proxy_binary(upstream: &str) -> ProxyProcess {
    let mut cmd = command(&[
        "proxy",
        "--listen",
        "127.0.0.1:0",
        "--anthropic-upstream",
        upstream,
        "--openai-upstream",
        upstream,
        "--timeout",
        &TIMEOUT_MS.to_string(),
    ]);
    cmd.kill_on_drop(true);
    let (child, base, mut lines) = spawn_listening(cmd, PATIENCE).await;
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    ProxyProcess { child, base }
}

/// docs/proxy.md's headline, reproduced with the two shipped commands:
/// `warden mock --scenario stall,normal` (the first request stalls, socket
/// open) behind `warden proxy`, and the pinned Claude Code through it. The
/// turn gets the same reply as a healthy one, within the healthy time plus
/// the proxy's timeout plus [`STALL_MARGIN`]. (Without the proxy the same turn takes
/// 300 s: measured by hand, not in CI.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_docs_headline_is_reproduced_with_warden_mock_and_warden_proxy() {
    let Some(bin) = client("WARDEN_CLAUDE_BIN", "WARDEN_REQUIRE_CLAUDE") else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let (_healthy_mock, healthy_url) = mock_binary("normal").await;
    let proxy = proxy_binary(&healthy_url).await;
    let (healthy, healthy_took) = claude_turn(&bin, &proxy.base, &dir.path().join("a")).await;
    drop(proxy);
    let reply = healthy["result"].as_str().unwrap_or_default().to_owned();
    assert!(!reply.is_empty(), "{healthy}");

    let (_stalling_mock, stalling_url) = mock_binary("stall,normal").await;
    let proxy = proxy_binary(&stalling_url).await;
    let (result, took) = claude_turn(&bin, &proxy.base, &dir.path().join("b")).await;
    eprintln!("warden mock stall,normal through warden proxy: {took:?}; healthy {healthy_took:?}");
    assert_eq!(result["is_error"], false, "{result}");
    assert_eq!(
        result["result"],
        reply.as_str(),
        "the whole reply: {result}"
    );
    let bound = healthy_took + Duration::from_millis(TIMEOUT_MS) + STALL_MARGIN;
    assert!(took <= bound, "took {took:?}, bound {bound:?}");
}

/// An upstream that stalls on every request, streaming or not: Claude Code
/// through the proxy ends its turn with a visible error (the proxy's
/// overloaded errors after its attempts, then Claude Code's own retries of
/// them) and never hangs — without the proxy it would wait 300 s per
/// attempt. Measured here: ~18 s with a 500 ms timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_code_through_an_always_stalling_upstream_ends_its_turn_with_an_error() {
    let Some(bin) = client("WARDEN_CLAUDE_BIN", "WARDEN_REQUIRE_CLAUDE") else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let (_mock, url) = mock_binary("stall").await;
    let proxy = proxy_binary(&url).await;
    let (status, result, took) = claude_run(&bin, &proxy.base, dir.path()).await;
    eprintln!("an always-stalling upstream: claude ended after {took:?}: {result}");
    assert!(!status.success(), "{result}");
    assert_eq!(result["is_error"], true, "{result}");
    let message = result["result"].as_str().unwrap_or_default();
    assert!(message.contains("API Error"), "a visible error: {result}");
}

/// An upstream that fails every request (it accepts connections and drops
/// them): Claude Code through the proxy ends no later than it does alone
/// against a refused port — its own retries, each answered at once by the
/// proxy's open circuit — with the cause in its message, and the upstream
/// is asked at most once per probe interval once the circuit is open.
/// `CLAUDE_CODE_MAX_RETRIES=3` keeps it short (the default 10 takes
/// minutes either way: docs/proxy.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_code_through_an_unreachable_upstream_ends_no_later_than_alone() {
    use std::sync::Arc;
    let Some(bin) = client("WARDEN_CLAUDE_BIN", "WARDEN_REQUIRE_CLAUDE") else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let env = [("CLAUDE_CODE_MAX_RETRIES", "3")];
    let refused = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        format!("http://{}", l.local_addr().expect("addr"))
    };
    let (status, alone, alone_took) =
        claude_run_with(&bin, &refused, &dir.path().join("alone"), &env).await;
    assert!(!status.success(), "{alone}");

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let failing = format!("http://{}", listener.local_addr().expect("addr"));
    let accepted = Arc::new(std::sync::Mutex::new(Vec::<Instant>::new()));
    let at = accepted.clone();
    let _upstream = tokio_util::task::AbortOnDropHandle::new(tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            at.lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(Instant::now());
            drop(socket);
        }
    }));
    let proxy = proxy_binary(&failing).await;
    let (status, proxied, took) =
        claude_run_with(&bin, &proxy.base, &dir.path().join("proxied"), &env).await;
    let asked = accepted.lock().unwrap_or_else(|p| p.into_inner()).clone();
    eprintln!(
        "an unreachable upstream: alone {alone_took:?} ({}), through the proxy {took:?} ({}); upstream asked {} times",
        alone["result"],
        proxied["result"],
        asked.len()
    );
    assert!(!status.success(), "{proxied}");
    assert_eq!(proxied["is_error"], true, "{proxied}");
    let message = proxied["result"].as_str().unwrap_or_default();
    assert!(
        message.contains("cannot be reached"),
        "the cause in its message: {proxied}"
    );
    // No later than alone: the proxy adds its one backoff (0.5 s) before
    // its circuit opens; Claude Code's own backoff jitters by up to 25 %.
    let bound = alone_took + Duration::from_millis(500) + alone_took / 4;
    assert!(
        took <= bound,
        "through the proxy {took:?}, alone {alone_took:?}"
    );
    // Claude Code's first requests (it sends more than one at start) find
    // the upstream unreachable within a second; after that, at most one
    // probe per 5 s reaches it.
    let first = *asked.first().expect("the upstream was asked at least once");
    let later = asked
        .iter()
        .filter(|t| t.duration_since(first) > Duration::from_secs(1))
        .count();
    let most = 1 + usize::try_from(took.as_secs() / 5).unwrap_or(usize::MAX);
    assert!(
        later <= most,
        "the upstream was asked {later} times after the first second of {took:?}: {:?}",
        asked
            .iter()
            .map(|t| t.duration_since(first))
            .collect::<Vec<_>>()
    );
}

/// How long a client takes against an always-529 upstream at `base`, to
/// the error it ends with: Claude Code (`claude`) or an SDK with its
/// default retries (`python`: the venv's python and `anthropic` or
/// `openai`).
async fn overloaded_run(
    claude: Option<&Path>,
    python: Option<(&Path, &str)>,
    base: &str,
    dir: &Path,
) -> Duration {
    if let Some(bin) = claude {
        let (status, result, _) = claude_run(bin, base, dir).await;
        assert!(!status.success(), "{result}");
        assert_eq!(result["api_error_status"], 529, "{result}");
        // The turn's own time (Node's start is not the proxy's).
        let ms = result["duration_ms"].as_u64();
        return Duration::from_millis(ms.unwrap_or_else(|| panic!("duration_ms: {result}")));
    }
    let (python, sdk) = python.expect("a client");
    let mut cmd = tokio::process::Command::new(python);
    cmd.args(["-c", SDK_SCRIPT, &format!("{sdk}-overloaded"), base])
        .stdin(Stdio::null())
        .kill_on_drop(true);
    let out = tokio::time::timeout(PATIENCE, cmd.output())
        .await
        .expect("the SDK call finishes within the bound")
        .expect("python runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Timed by the script from its call to the error it raises (Python's
    // start and the SDK's import are not the proxy's).
    let stdout = String::from_utf8_lossy(&out.stdout);
    let seconds = stdout
        .strip_prefix("529 ")
        .and_then(|s| s.parse::<f64>().ok())
        .unwrap_or_else(|| panic!("the SDK ends with the 529 and its time: {stdout}"));
    Duration::from_secs_f64(seconds)
}

/// An upstream that answers every request `529 overloaded_error`: Claude
/// Code and the official SDKs (their default retries) through the proxy
/// ask it no more often and end no later than alone. The proxy hands a 529
/// before any byte back at once, for the client's own retries, instead of
/// multiplying them with its attempts (measured before: Claude Code 11.8 s
/// and 12 upstream requests through the proxy against 2.0 s and 3 alone;
/// the anthropic SDK 10.5 s and 12 against 1.5 s and 3: docs/proxy.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_overloaded_upstream_is_asked_no_more_and_no_later_through_the_proxy_than_alone() {
    let claude = client("WARDEN_CLAUDE_BIN", "WARDEN_REQUIRE_CLAUDE");
    let python = client("WARDEN_PYTHON", "WARDEN_REQUIRE_PYTHON_SDKS");
    let dir = tempfile::tempdir().expect("tempdir");
    let python = |sdk| python.as_deref().map(|p| (p, sdk));
    let clients = [
        ("claude code", claude.as_deref(), None, "/v1/messages"),
        (
            "the anthropic SDK",
            None,
            python("anthropic"),
            "/v1/messages",
        ),
        (
            "the openai SDK",
            None,
            python("openai"),
            "/v1/chat/completions",
        ),
    ];
    let mut broken = Vec::new();
    for (who, claude, python, path) in clients {
        if claude.is_none() && python.is_none() {
            continue;
        }
        let messages =
            |mock: &MockServer| mock.requests().iter().filter(|r| r.path == path).count();
        let overloaded = || MockServer::start(mock_config([Scenario::Overloaded; 2], 0));
        let mock = overloaded().await.expect("mock");
        let alone_took = overloaded_run(
            claude,
            python,
            &mock.base_url(),
            &dir.path().join(format!("{who} alone")),
        )
        .await;
        let alone = messages(&mock);
        let mock = overloaded().await.expect("mock");
        let proxy = start_proxy(&mock).await;
        let took = overloaded_run(
            claude,
            python,
            &proxy.base,
            &dir.path().join(format!("{who} proxied")),
        )
        .await;
        let through = messages(&mock);
        eprintln!(
            "{who}, an always-529 upstream: alone {alone_took:?} and {alone} upstream requests, through the proxy {took:?} and {through}"
        );
        // The clients' own backoff jitters (by up to 25 %).
        let bound = alone_took + alone_took / 4 + Duration::from_millis(500);
        if through > alone || took > bound {
            broken.push(format!(
                "{who}: through the proxy {took:?} and {through} upstream requests, alone \
                 {alone_took:?} and {alone} (bound {bound:?})"
            ));
        }
    }
    assert!(broken.is_empty(), "{broken:#?}");
}

const SDK_SCRIPT: &str = r#"
import sys
sdk, base = sys.argv[1], sys.argv[2]
if sdk == "anthropic-overloaded":
    import time, anthropic
    client = anthropic.Anthropic(base_url=base, api_key="sk-test")
    t0 = time.monotonic()
    try:
        with client.messages.stream(model="claude-test", max_tokens=1024,
                                    messages=[{"role": "user", "content": "say the sentence"}]) as s:
            text = "".join(s.text_stream)
    except anthropic.APIStatusError as e:
        text = f"{e.status_code} {time.monotonic() - t0}"
elif sdk == "openai-overloaded":
    import time, openai
    client = openai.OpenAI(base_url=base + "/v1", api_key="sk-test")
    t0 = time.monotonic()
    try:
        stream = client.chat.completions.create(model="gpt-test", stream=True,
                                                messages=[{"role": "user", "content": "say the sentence"}])
        text = "".join((c.choices[0].delta.content or "") for c in stream if c.choices)
    except openai.APIStatusError as e:
        text = f"{e.status_code} {time.monotonic() - t0}"
elif sdk == "anthropic":
    import anthropic
    client = anthropic.Anthropic(base_url=base, api_key="sk-test", max_retries=0)
    with client.messages.stream(model="claude-test", max_tokens=1024,
                                messages=[{"role": "user", "content": "say the sentence"}]) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
        assert final.content[-1].text == text, (final, text)
elif sdk == "anthropic-whole":
    import anthropic
    client = anthropic.Anthropic(base_url=base, api_key="sk-test", max_retries=0)
    message = client.messages.create(model="claude-test", max_tokens=1024,
                                     messages=[{"role": "user", "content": "say the sentence"}])
    assert message.stop_reason == "end_turn", message
    text = message.content[-1].text
elif sdk == "openai-whole":
    import openai
    client = openai.OpenAI(base_url=base + "/v1", api_key="sk-test", max_retries=0)
    completion = client.chat.completions.create(model="gpt-test",
                                                messages=[{"role": "user", "content": "say the sentence"}])
    assert completion.choices[0].finish_reason == "stop", completion
    text = completion.choices[0].message.content
else:
    import openai
    client = openai.OpenAI(base_url=base + "/v1", api_key="sk-test", max_retries=0)
    stream = client.chat.completions.create(model="gpt-test", stream=True,
                                            messages=[{"role": "user", "content": "say the sentence"}])
    text = "".join((c.choices[0].delta.content or "") for c in stream if c.choices)
sys.stdout.write(text)
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_python_sdks_get_the_whole_text_through_stalls_with_their_retries_off() {
    let Some(python) = client("WARDEN_PYTHON", "WARDEN_REQUIRE_PYTHON_SDKS") else {
        return;
    };
    // (sdk, frames before the stall): mid-text, and before the first byte;
    // `-whole`: a non-streaming call, which the proxy watches as a stream
    // and answers whole.
    for (sdk, fault) in [
        ("anthropic", 9),
        ("anthropic", 0),
        ("openai", 6),
        ("openai", 0),
        ("anthropic-whole", 9),
        ("openai-whole", 6),
    ] {
        let mock = MockServer::start(mock_config([Scenario::Stall, Scenario::Normal], fault))
            .await
            .expect("mock");
        let proxy = start_proxy(&mock).await;
        let mut cmd = tokio::process::Command::new(&python);
        cmd.args(["-c", SDK_SCRIPT, sdk, &proxy.base])
            .stdin(Stdio::null())
            .kill_on_drop(true);
        let out = tokio::time::timeout(PATIENCE, cmd.output())
            .await
            .expect("the SDK call finishes within the bound")
            .expect("python runs");
        let what = format!("{sdk}, stall after {fault} frames");
        assert!(
            out.status.success(),
            "{what}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(String::from_utf8_lossy(&out.stdout), REPLY, "{what}");
        let requests = mock.requests();
        assert_eq!(requests.len(), 2, "{what}: {requests:?}");
        let expected = if fault == 0 { None } else { Some("turn") };
        assert_eq!(requests[1].continuation, expected, "{what}");
    }
}

/// What the docs compare the proxy with: Claude Code alone against the
/// same faults, so that comparison stays true when the pinned version
/// changes (docs/proxy.md, "Why"; docs/wire-formats.md, "How Claude Code
/// takes a broken stream"). These tests describe the CLI, not warden.
///
/// `CLAUDE_BYTE_STREAM_IDLE_TIMEOUT_MS` is honoured with a custom base URL
/// and raised to 10 s at the least: asked for 5 s, the stalled stream is
/// given up after 10 s, well before the 300 s default, and the whole
/// request is sent again without a stream, which is answered. Measured with
/// 2.1.332: 10.5-11.2 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_code_alone_re_sends_a_stalled_turn_without_a_stream_after_its_idle_timeout() {
    let Some(bin) = client("WARDEN_CLAUDE_BIN", "WARDEN_REQUIRE_CLAUDE") else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let mock = MockServer::start(mock_config([Scenario::Stall, Scenario::Normal], 6))
        .await
        .expect("mock");
    let env = [("CLAUDE_BYTE_STREAM_IDLE_TIMEOUT_MS", "5000")];
    let (status, result, took) = claude_run_with(&bin, &mock.base_url(), dir.path(), &env).await;
    let messages: Vec<_> = mock
        .requests()
        .into_iter()
        .filter(|r| r.path == "/v1/messages")
        .map(|r| (r.scenario, r.stream))
        .collect();
    eprintln!("claude code alone, a stall mid-text at a 5 s idle timeout: {took:?}, {messages:?}");
    assert!(status.success(), "{result}");
    assert_eq!(result["result"], REPLY, "{result}");
    assert_eq!(
        messages,
        [
            (Some(Scenario::Stall), true),
            (Some(Scenario::Normal), false)
        ],
        "the stalled stream, then the whole request again without a stream"
    );
    // The floor: 5 s is raised to 10 s. The margin: Node's start on a
    // loaded machine and the answer.
    let floor = Duration::from_secs(10);
    assert!(
        took >= floor && took < ALONE_AT_ONCE,
        "took {took:?}: the idle timeout is 10 s at the least, not 5 s, nor the 300 s default"
    );
}

/// Claude Code alone against `abrupt-close` (the connection closed with no
/// `message_stop`), the reply text only: cut mid-text, before its block
/// closed, the same request is sent again at once, streamed, and answered;
/// cut after the text block closed, what came is kept as the whole reply
/// and, as a rule, nothing is sent again. Measured with 2.1.332: 1.2-1.4 s
/// and 0.5-0.9 s. The second case follows timing: in one CI rehearsal with
/// four tests beside it, the cut after the block was sent once more and
/// answered (the reply still whole and once), so it may take one request
/// more there, never two.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_code_alone_re_sends_a_reply_cut_mid_text_at_once_and_keeps_one_cut_after_its_block()
{
    let Some(bin) = client("WARDEN_CLAUDE_BIN", "WARDEN_REQUIRE_CLAUDE") else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    // Frames: message_start, content_block_start, ping, 9 text deltas,
    // content_block_stop, message_delta, message_stop.
    for (fault, sent) in [(6, 2..=2), (13, 1..=2)] {
        let mock = MockServer::start(mock_config(
            [Scenario::AbruptClose, Scenario::Normal],
            fault,
        ))
        .await
        .expect("mock");
        let run = dir.path().join(format!("cut-{fault}"));
        let (status, result, took) = claude_run(&bin, &mock.base_url(), &run).await;
        let messages: Vec<_> = mock
            .requests()
            .into_iter()
            .filter(|r| r.path == "/v1/messages")
            .map(|r| (r.scenario, r.stream))
            .collect();
        let what = format!("cut after {fault} frames");
        eprintln!(
            "claude code alone, {what}: {took:?}, {messages:?}: {}",
            result["result"]
        );
        assert!(status.success(), "{what}: {result}");
        assert_eq!(result["result"], REPLY, "{what}: {result}");
        let expected = [
            (Some(Scenario::AbruptClose), true),
            (Some(Scenario::Normal), true),
        ];
        assert!(
            sent.contains(&messages.len()) && messages == expected[..messages.len()],
            "{what}: {messages:?}"
        );
        assert!(took < ALONE_AT_ONCE, "{what}: at once, took {took:?}");
    }
}

/// An Anthropic upstream whose replies think (a closed thinking block with
/// its signature), then start their text: the first `cut` requests are cut
/// there (the connection closed, no `message_stop`), later ones end whole.
/// Its address and each request's `stream` flag, in order.
async fn thinking_upstream(
    cut: usize,
) -> (
    String,
    std::sync::Arc<std::sync::Mutex<Vec<bool>>>,
    tokio_util::task::AbortOnDropHandle<()>,
) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = seen.clone();
    let task = tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let log = log.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 65536];
                let head_end = loop {
                    if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        break at + 4;
                    }
                    match socket.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                };
                let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
                let length = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .and_then(|v| v.trim().parse::<usize>().ok())
                    .unwrap_or(0);
                while buf.len() < head_end + length {
                    match socket.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
                if !head.starts_with("post /v1/messages") {
                    let _ = socket
                        .write_all(
                            b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
                        )
                        .await;
                    return;
                }
                let body: Value =
                    serde_json::from_slice(&buf[head_end..head_end + length]).unwrap_or_default();
                let nth = {
                    let mut log = log.lock().unwrap_or_else(|p| p.into_inner());
                    log.push(body["stream"] == true);
                    log.len()
                };
                let _ = socket.write_all(&thinking_reply(nth > cut)).await;
                // As `warden mock`'s abrupt-close: the frames out, then the close.
                tokio::time::sleep(Duration::from_millis(50)).await;
            });
        }
    });
    (base, seen, tokio_util::task::AbortOnDropHandle::new(task))
}

/// The HTTP response of [`thinking_upstream`]: whole, or cut inside its
/// text (no last chunk; the caller drops the connection).
fn thinking_reply(whole: bool) -> Vec<u8> {
    let event = |name: &str, data: Value| format!("event: {name}\ndata: {data}\n\n");
    let mut events = vec![
        event(
            "message_start",
            serde_json::json!({"type": "message_start", "message": {"id": "msg_think",
                "type": "message", "role": "assistant", "content": [], "model": "claude-x",
                "stop_reason": null, "stop_sequence": null,
                "usage": {"input_tokens": 10, "output_tokens": 1}}}),
        ),
        event(
            "content_block_start",
            serde_json::json!({"type": "content_block_start", "index": 0,
                "content_block": {"type": "thinking", "thinking": "", "signature": ""}}),
        ),
        event(
            "content_block_delta",
            serde_json::json!({"type": "content_block_delta", "index": 0,
                "delta": {"type": "thinking_delta", "thinking": "Let me think."}}),
        ),
        event(
            "content_block_delta",
            serde_json::json!({"type": "content_block_delta", "index": 0,
                "delta": {"type": "signature_delta", "signature": "c2lnbmF0dXJl"}}),
        ),
        event(
            "content_block_stop",
            serde_json::json!({"type": "content_block_stop", "index": 0}),
        ),
        event(
            "content_block_start",
            serde_json::json!({"type": "content_block_start", "index": 1,
                "content_block": {"type": "text", "text": ""}}),
        ),
    ];
    let (first, rest) = THOUGHT_REPLY.split_at(THOUGHT_REPLY.len() / 2);
    for text in [first, rest] {
        events.push(event(
            "content_block_delta",
            serde_json::json!({"type": "content_block_delta", "index": 1,
                "delta": {"type": "text_delta", "text": text}}),
        ));
    }
    if whole {
        events.push(event(
            "content_block_stop",
            serde_json::json!({"type": "content_block_stop", "index": 1}),
        ));
        events.push(event(
            "message_delta",
            serde_json::json!({"type": "message_delta",
                "delta": {"stop_reason": "end_turn", "stop_sequence": null},
                "usage": {"output_tokens": 8}}),
        ));
        events.push(event(
            "message_stop",
            serde_json::json!({"type": "message_stop"}),
        ));
    }
    let mut out = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\
        transfer-encoding: chunked\r\nconnection: close\r\n\r\n"
        .to_vec();
    for e in events {
        out.extend_from_slice(format!("{:x}\r\n{e}\r\n", e.len()).as_bytes());
    }
    if whole {
        out.extend_from_slice(b"0\r\n\r\n");
    }
    out
}

const THOUGHT_REPLY: &str = "Thought through, then said whole: one two three four.";

/// Claude Code alone, a reply cut (the connection closed, no
/// `message_stop`) after its thinking block closed, its text under way:
/// 2.1.332 sends the same request again at once, streamed (2.1.197 took the
/// cut as an empty success), and answers when that one is whole; when every
/// try is cut it ends after 4 requests with `API Error: Connection lost
/// mid-response`, exit 1. Measured: 1.2 s either way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_code_alone_re_sends_a_reply_cut_after_its_thinking_and_says_connection_lost_when_every_try_is_cut()
 {
    let Some(bin) = client("WARDEN_CLAUDE_BIN", "WARDEN_REQUIRE_CLAUDE") else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");

    let (base, seen, _upstream) = thinking_upstream(1).await;
    let (status, result, took) = claude_run(&bin, &base, &dir.path().join("once")).await;
    let requests = seen.lock().unwrap_or_else(|p| p.into_inner()).clone();
    eprintln!("claude code alone, the first reply cut after its thinking: {took:?}, {requests:?}");
    assert!(status.success(), "{result}");
    assert_eq!(result["result"], THOUGHT_REPLY, "{result}");
    assert_eq!(
        requests,
        [true, true],
        "the cut request, then the same again, streamed"
    );
    assert!(took < ALONE_AT_ONCE, "at once, took {took:?}");

    let (base, seen, _upstream) = thinking_upstream(usize::MAX).await;
    let (status, result, took) = claude_run(&bin, &base, &dir.path().join("every")).await;
    let requests = seen.lock().unwrap_or_else(|p| p.into_inner()).clone();
    eprintln!(
        "claude code alone, every reply cut after its thinking: {took:?}, {requests:?}: {result}"
    );
    assert!(!status.success(), "{result}");
    assert_eq!(status.code(), Some(1), "{result}");
    assert_eq!(result["is_error"], true, "{result}");
    let message = result["result"].as_str().unwrap_or_default();
    assert!(
        message.starts_with("API Error: Connection lost mid-response"),
        "{result}"
    );
    // 4 here every time with the mock's 50 ms before the close (8 when it
    // closes at once): Claude Code's count depends on timing, so the test
    // pins that it tried again, streamed, a few times, then gave up.
    assert!(
        (2..=8).contains(&requests.len()) && requests.iter().all(|streamed| *streamed),
        "a few tries, each streamed: {requests:?}"
    );
    assert!(took < ALONE_AT_ONCE, "took {took:?}");
}
