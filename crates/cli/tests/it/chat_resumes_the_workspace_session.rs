//! `warden chat`: one message per invocation to the session of a
//! workspace, resumed from the store across processes.

use crate::common;

use std::path::Path;
use std::time::Duration;

use common::*;
use serde_json::Value;
use warden_mock::{MockConfig, MockServer};

fn chat<'a>(
    workspace: &'a Path,
    data: &'a Path,
    base_url: &'a str,
    message: &'a str,
) -> Vec<&'a str> {
    vec![
        "chat",
        "--workspace",
        arg(workspace),
        "--agent",
        "anthropic",
        "--base-url",
        base_url,
        "--data-dir",
        arg(data),
        message,
    ]
}

async fn sessions(data: &Path) -> Vec<Value> {
    let out = run(&["sessions", "--json", "--data-dir", arg(data)]).await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    serde_json::from_str(&stdout(&out)).expect("JSON array")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_invocation_continues_the_workspace_conversation() {
    let server = MockServer::start(MockConfig::default())
        .await
        .expect("mock");
    let base = server.base_url();
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let workspace = dir.path().join("repo");
    std::fs::create_dir(&workspace).expect("mkdir");

    let first = run(&chat(&workspace, &data, &base, "What changed?")).await;
    assert_eq!(code(&first), 0, "{}", stderr(&first));
    let text = stdout(&first);
    assert!(text.starts_with("Hello from warden-mock."), "{text}");
    assert!(text.ends_with("[ctx: 0%]\n"), "{text}");
    let stored = sessions(&data).await;
    assert_eq!(stored.len(), 1);
    let id = stored[0]["agent_session_id"]
        .as_str()
        .expect("a conversation")
        .to_owned();
    let tokens_first = stored[0]["context_tokens"].as_u64().expect("tokens");

    // Another spelling of the workspace, the message on stdin.
    let spelled = format!("{}/./", workspace.display());
    let mut cmd = command(&chat(Path::new(&spelled), &data, &base, "-"));
    cmd.stdin(std::process::Stdio::piped());
    let mut child = cmd.spawn().expect("spawn");
    {
        use tokio::io::AsyncWriteExt;
        let mut stdin = child.stdin.take().expect("stdin");
        stdin.write_all(b"And the tests?\n").await.expect("write");
    }
    let second = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .expect("in time")
        .expect("ran");
    check_no_panic(&second);
    assert_eq!(code(&second), 0, "{}", stderr(&second));
    assert!(
        stdout(&second).contains("had 15 characters"),
        "{}",
        stdout(&second)
    );

    let stored = sessions(&data).await;
    assert_eq!(stored.len(), 1, "one session for both spellings");
    assert_eq!(
        stored[0]["agent_session_id"],
        id.as_str(),
        "same conversation"
    );
    assert!(
        stored[0]["context_tokens"].as_u64().expect("tokens") > tokens_first,
        "the history was sent: the context grew"
    );
    let transcript = data.join("transcripts").join(format!("{id}.jsonl"));
    let lines = std::fs::read_to_string(&transcript).expect("transcript");
    assert_eq!(lines.lines().count(), 4);
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&transcript)
            .expect("meta")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    // The transcript is gone: a fresh conversation, the user is told, the
    // message still answered.
    std::fs::remove_file(&transcript).expect("rm");
    let third = run(&chat(&workspace, &data, &base, "Still there?")).await;
    assert_eq!(code(&third), 0, "{}", stderr(&third));
    assert!(
        stderr(&third).contains("The previous conversation could not be found — starting fresh."),
        "{}",
        stderr(&third)
    );
    assert!(stdout(&third).contains("had 12 characters"));
    let stored = sessions(&data).await;
    assert_ne!(stored[0]["agent_session_id"], id.as_str());
    assert_eq!(stored[0]["past_session_ids"][0], id.as_str());
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn user_errors_are_one_line_and_nonzero() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let ws = dir.path();
    // A missing workspace.
    let missing = dir.path().join("nope");
    let out = run(&chat(&missing, &data, "http://127.0.0.1:9", "hi")).await;
    assert_eq!(code(&out), 2);
    assert_one_line_error(&out, "workspace");
    // An empty message.
    let out = run(&chat(ws, &data, "http://127.0.0.1:9", "  ")).await;
    assert_eq!(code(&out), 2);
    assert_one_line_error(&out, "empty");
    // A bad base URL.
    let out = run(&chat(ws, &data, "::nope::", "hi")).await;
    assert_eq!(code(&out), 2);
    assert_one_line_error(&out, "invalid URL");
    // No Claude Code binary.
    let out = run(&[
        "chat",
        "--workspace",
        arg(ws),
        "--data-dir",
        arg(&data),
        "--claude-bin",
        arg(&dir.path().join("no-claude-here")),
        "hi",
    ])
    .await;
    assert_eq!(code(&out), 2);
    assert_one_line_error(&out, "Claude Code CLI");
    // A database another process holds.
    let _held = warden_store::SledStore::open(data.join("sessions.db")).expect("open");
    let out = run(&chat(ws, &data, "http://127.0.0.1:9", "hi")).await;
    assert_eq!(code(&out), 1);
    assert_one_line_error(&out, "in use by another warden process");
    // A data directory that is a file.
    let file = dir.path().join("file");
    std::fs::write(&file, "x").expect("write");
    let out = run(&chat(ws, &file, "http://127.0.0.1:9", "hi")).await;
    assert_eq!(code(&out), 1);
    assert_one_line_error(&out, "");
}

/// The real Claude Code CLI (`WARDEN_CLAUDE_BIN`, installed by `.ci/run`)
/// against the mock: two invocations, one conversation. Skipped with a
/// printed reason when the binary is not there, unless
/// `WARDEN_REQUIRE_CLAUDE=1`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_code_chats_resume_the_same_conversation() {
    let Some(bin) = std::env::var_os("WARDEN_CLAUDE_BIN") else {
        assert_ne!(
            std::env::var("WARDEN_REQUIRE_CLAUDE").as_deref(),
            Ok("1"),
            "WARDEN_REQUIRE_CLAUDE=1 but WARDEN_CLAUDE_BIN is unset"
        );
        eprintln!("skipped: set WARDEN_CLAUDE_BIN to the claude binary to run this test");
        return;
    };
    let server = MockServer::start(MockConfig::default())
        .await
        .expect("mock");
    let dir = tempfile::tempdir().expect("tempdir");
    let (data, workspace, home) = test_dirs(dir.path());
    let chat = |message: &str| {
        let mut cmd = command(&[
            "chat",
            "--workspace",
            arg(&workspace),
            "--data-dir",
            arg(&data),
            "--claude-bin",
            bin.to_str().expect("utf-8"),
            message,
        ]);
        cmd.env("ANTHROPIC_BASE_URL", server.base_url())
            .env("ANTHROPIC_API_KEY", "dummy")
            .env("HOME", &home)
            .env("DISABLE_TELEMETRY", "1")
            .env("DISABLE_AUTOUPDATER", "1")
            .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1");
        cmd
    };
    let first = output(chat("Say hello."), Duration::from_secs(120)).await;
    assert_eq!(code(&first), 0, "{}", stderr(&first));
    assert!(
        stdout(&first).contains("Hello from warden-mock."),
        "{}",
        stdout(&first)
    );
    assert!(stdout(&first).contains("[ctx: "), "{}", stdout(&first));
    let id = sessions(&data).await[0]["agent_session_id"]
        .as_str()
        .expect("Claude's session id")
        .to_owned();

    let second = output(chat("Again."), Duration::from_secs(120)).await;
    assert_eq!(code(&second), 0, "{}", stderr(&second));
    let stored = sessions(&data).await;
    let now = stored[0]["agent_session_id"].as_str().expect("id");
    // 2.1.x keeps the id on --resume; a fork would move the old one to
    // the past ids. Either way the conversation was resumed, not lost.
    assert!(
        now == id || stored[0]["past_session_ids"][0] == id.as_str(),
        "{stored:#?}"
    );
    assert!(
        !stderr(&second).contains("starting fresh"),
        "{}",
        stderr(&second)
    );
    server.shutdown().await;
}

/// The real Codex CLI (`WARDEN_CODEX_BIN`, installed by `.ci/run`) with
/// `--agent codex` against the mock's Responses endpoint: two invocations,
/// one thread, the context indicator. Skipped with a printed reason when
/// the binary is not there, unless `WARDEN_REQUIRE_CODEX=1`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_chats_resume_the_same_thread() {
    let Some(bin) = std::env::var_os("WARDEN_CODEX_BIN") else {
        assert_ne!(
            std::env::var("WARDEN_REQUIRE_CODEX").as_deref(),
            Ok("1"),
            "WARDEN_REQUIRE_CODEX=1 but WARDEN_CODEX_BIN is unset"
        );
        eprintln!("skipped: set WARDEN_CODEX_BIN to the codex binary to run this test");
        return;
    };
    let server = MockServer::start(MockConfig::default())
        .await
        .expect("mock");
    let dir = tempfile::tempdir().expect("tempdir");
    let (data, workspace, home) = test_dirs(dir.path());
    let base_url = server.base_url();
    let chat = |message: &str| {
        let mut cmd = command(&[
            "chat",
            "--workspace",
            arg(&workspace),
            "--data-dir",
            arg(&data),
            "--agent",
            "codex",
            "--base-url",
            &base_url,
            message,
        ]);
        cmd.env("WARDEN_CODEX_BIN", &bin)
            .env("OPENAI_API_KEY", "dummy")
            .env("HOME", &home);
        cmd
    };
    let first = output(chat("Say hello."), Duration::from_secs(120)).await;
    assert_eq!(code(&first), 0, "{}", stderr(&first));
    assert!(
        stdout(&first).contains("Hello from warden-mock."),
        "{}",
        stdout(&first)
    );
    assert!(stdout(&first).contains("[ctx: "), "{}", stdout(&first));
    let id = sessions(&data).await[0]["agent_session_id"]
        .as_str()
        .expect("Codex's thread id")
        .to_owned();

    let second = output(chat("Again."), Duration::from_secs(120)).await;
    assert_eq!(code(&second), 0, "{}", stderr(&second));
    assert_eq!(sessions(&data).await[0]["agent_session_id"], id.as_str());
    assert!(
        !stderr(&second).contains("starting fresh"),
        "{}",
        stderr(&second)
    );
    assert_eq!(server.requests_to("/v1/responses"), 2);
    server.shutdown().await;
}

/// An agent's reply with terminal escape sequences (an OSC 52 clipboard
/// write, a screen clear, a window title) reaches a terminal shown, not
/// obeyed: no ESC byte is printed. `script` (util-linux) gives `warden
/// chat` a pseudo-terminal; skipped with a printed reason without it,
/// unless `WARDEN_REQUIRE_PTY=1`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_terminal_an_agents_escape_sequences_are_shown_not_obeyed() {
    let script = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join("script"))
            .find(|p| p.is_file())
    });
    if script.is_none() {
        assert_ne!(
            std::env::var("WARDEN_REQUIRE_PTY").as_deref(),
            Ok("1"),
            "WARDEN_REQUIRE_PTY=1 but `script` is not installed"
        );
        eprintln!("skipped: `script` (util-linux/bsdutils) is not installed");
        return;
    }
    let reply = "Hi\x1b]52;c;cm0gLXJmIH4=\x07 there\x1b[2J\x1b]0;owned\x07\u{9b}31m done.";
    let server = MockServer::start(MockConfig::default().with_reply(reply))
        .await
        .expect("mock");
    let dir = tempfile::tempdir().expect("tempdir");
    let workspace = dir.path().join("repo");
    std::fs::create_dir(&workspace).expect("mkdir");
    let log = dir.path().join("typescript");
    let inner = format!(
        "{WARDEN} chat --workspace {} --agent anthropic --base-url {} --data-dir {} hello 2>{}",
        arg(&workspace),
        server.base_url(),
        arg(&dir.path().join("data")),
        arg(&dir.path().join("stderr")),
    );
    let mut cmd = tokio::process::Command::new("script");
    cmd.args(["-q", "-e", "-c", &inner, arg(&log)])
        .env_remove("RUST_LOG")
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        .env("NO_PROXY", "127.0.0.1,localhost")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let out = output(cmd, Duration::from_secs(60)).await;
    let stderr_file = std::fs::read_to_string(dir.path().join("stderr")).unwrap_or_default();
    assert_eq!(code(&out), 0, "{}{stderr_file}", stderr(&out));
    let printed = std::fs::read(&log).expect("typescript");
    let screen = String::from_utf8_lossy(&printed);
    assert!(screen.contains("Hi"), "{screen:?}");
    assert!(
        !printed.contains(&0x1b),
        "an escape byte reached the terminal: {screen:?}"
    );
    assert!(
        !screen.contains('\u{9b}'),
        "a C1 CSI reached the terminal: {screen:?}"
    );
    assert!(
        screen.contains("␛]52;c;"),
        "the clipboard write is shown: {screen:?}"
    );
}

/// A stand-in for the `claude` CLI, as a script: its first run streams the
/// start of a reply and dies (no result line), every later run answers
/// whole; each run counted in `runs`.
fn flaky_claude(dir: &Path) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt as _;
    let id = "11111111-1111-4111-8111-111111111111";
    let runs = dir.join("runs");
    let script = format!(
        r#"#!/bin/sh
n=$(cat '{runs}' 2>/dev/null || echo 0); n=$((n+1)); echo $n > '{runs}'
read -r line
echo '{{"type":"system","subtype":"init","session_id":"{id}","model":"claude-x"}}'
if [ "$n" = 1 ]; then
  echo '{{"type":"assistant","message":{{"id":"msg_1","content":[{{"type":"text","text":"PARTIAL-"}}],"usage":{{"input_tokens":1,"output_tokens":1}}}},"session_id":"{id}"}}'
  exit 1
fi
echo '{{"type":"assistant","message":{{"id":"msg_2","content":[{{"type":"text","text":"the whole answer"}}],"usage":{{"input_tokens":1,"output_tokens":3}}}},"session_id":"{id}"}}'
echo '{{"type":"result","subtype":"success","is_error":false,"result":"the whole answer","session_id":"{id}","duration_ms":5}}'
cat > /dev/null
"#,
        runs = runs.display()
    );
    let path = dir.join("claude");
    std::fs::write(&path, script).expect("write the script");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    path
}

/// Read through a pipe (a script, a bot), `warden chat` writes each reply
/// once: what an attempt streamed before it broke and was retried from
/// scratch is never written (it printed "PARTIAL-the whole answer").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_piped_chat_writes_a_retried_reply_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (data, workspace) = (dir.path().join("data"), dir.path().join("repo"));
    std::fs::create_dir(&workspace).expect("mkdir");
    let claude = flaky_claude(dir.path());
    let out = run(&[
        "chat",
        "--workspace",
        arg(&workspace),
        "--agent",
        "claude-code",
        "--claude-bin",
        arg(&claude),
        "--data-dir",
        arg(&data),
        "hello",
    ])
    .await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.starts_with("the whole answer") && !text.contains("PARTIAL"),
        "{text:?}"
    );
    assert_eq!(text.matches("the whole answer").count(), 1, "{text:?}");
    assert!(stderr(&out).contains("retrying"), "{}", stderr(&out));
    assert_eq!(
        std::fs::read_to_string(dir.path().join("runs"))
            .expect("runs")
            .trim(),
        "2",
        "the CLI ran twice: the broken attempt and the retry"
    );
}

/// The same through `warden chat --server`: the node streams the broken
/// attempt's text and a `retrying` with `discard`, and a piped client
/// writes the node's answer once, whole, from its `done` event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_piped_chat_through_a_node_writes_a_retried_reply_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (data, workspace) = (dir.path().join("data"), dir.path().join("repo"));
    std::fs::create_dir(&workspace).expect("mkdir");
    let claude = flaky_claude(dir.path());
    let (mut node, base, _token) = serve_on(
        &data,
        "http://127.0.0.1:9",
        &["--agent", "claude-code", "--claude-bin", arg(&claude)],
        &[],
    )
    .await;
    let out = run(&[
        "chat",
        "--workspace",
        arg(&workspace),
        "--server",
        &base,
        "--data-dir",
        arg(&data),
        "hello",
    ])
    .await;
    let _ = node.start_kill();
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.starts_with("the whole answer") && !text.contains("PARTIAL"),
        "{text:?}"
    );
    assert_eq!(text.matches("the whole answer").count(), 1, "{text:?}");
    assert!(stderr(&out).contains("retrying"), "{}", stderr(&out));
}
