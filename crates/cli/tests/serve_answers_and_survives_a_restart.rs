//! `warden serve` as a process, against the mock: it says where it
//! listens, writes its token 0600, streams a turn over SSE; on SIGTERM with
//! a turn still running it exits 0 after its grace period, and the next
//! start re-sends that turn's message.

mod common;

use std::os::unix::fs::PermissionsExt as _;
use std::time::Duration;

use common::*;
use futures_util::StreamExt as _;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use warden_mock::{MockConfig, MockServer, Scenario};

const PATIENCE: Duration = Duration::from_secs(30);

struct Node {
    child: tokio::process::Child,
    base: String,
    token: String,
}

async fn start(data: &std::path::Path, mock: &MockServer) -> Node {
    let mut cmd = command(&[
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        data.to_str().expect("utf-8 path"),
        "--agent",
        "anthropic",
        "--base-url",
        &mock.base_url(),
        "--grace",
        "1",
    ]);
    cmd.env("WARDEN_STREAM_TIMEOUT", "60000");
    let (child, base, _stdout) = spawn_listening(cmd, PATIENCE).await;
    let token_file = data.join("token");
    let mode = std::fs::metadata(&token_file)
        .expect("token file")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "the token file is private");
    let token = std::fs::read_to_string(&token_file)
        .expect("token")
        .trim()
        .to_owned();
    Node { child, base, token }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_streams_a_turn_then_stops_gracefully_and_resends_on_restart() {
    let mock = MockServer::start(MockConfig::default().with_sequence([
        Scenario::Normal,
        Scenario::Stall,
        Scenario::Normal,
    ]))
    .await
    .expect("mock");
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let mut node = start(&data, &mock).await;
    let client = reqwest::Client::new();

    // A turn streamed as SSE, ending with `done`.
    let response = client
        .post(format!("{}/v1/turns", node.base))
        .bearer_auth(&node.token)
        .header("accept", "text/event-stream")
        .header("content-type", "application/json")
        .body(r#"{"key": "ws", "message": "ping me"}"#)
        .send()
        .await
        .expect("post");
    assert_eq!(response.status(), 200);
    let mut body = response.bytes_stream();
    let mut text = String::new();
    while let Some(chunk) = tokio::time::timeout(PATIENCE, body.next())
        .await
        .expect("events in time")
    {
        text.push_str(&String::from_utf8_lossy(&chunk.expect("chunk")));
    }
    assert!(text.contains("event: done"), "{text}");
    assert!(
        text.contains("Your last message had 7 characters"),
        "{text}"
    );

    // A second turn stalls (the mock holds it); SIGTERM while it runs.
    let created = client
        .post(format!("{}/v1/turns", node.base))
        .bearer_auth(&node.token)
        .header("content-type", "application/json")
        .body(r#"{"key": "ws", "message": "keep me"}"#)
        .send()
        .await
        .expect("post");
    assert_eq!(created.status(), 202);
    assert!(
        tokio::time::timeout(PATIENCE, async {
            while mock.requests().len() < 2 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .is_ok(),
        "the second turn reached the API"
    );
    let pid = Pid::from_raw(node.child.id().expect("pid") as i32);
    kill(pid, Signal::SIGTERM).expect("SIGTERM");
    let status = tokio::time::timeout(PATIENCE, node.child.wait())
        .await
        .expect("exits in time")
        .expect("wait");
    assert_eq!(status.code(), Some(0), "a graceful stop exits 0");

    // The next start re-sends the message the stop left pending.
    let mut again = start(&data, &mock).await;
    assert!(
        tokio::time::timeout(PATIENCE, async {
            while mock.requests().len() < 3 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .is_ok(),
        "the pending message was re-sent after the restart"
    );
    let _ = again.child.start_kill();
    mock.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_and_sessions_talk_to_a_running_node_with_server() {
    let mock = MockServer::start(MockConfig::default())
        .await
        .expect("mock");
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let workspace = dir.path().join("app");
    std::fs::create_dir_all(&workspace).expect("workspace");
    let mut node = start(&data, &mock).await;
    let data_arg = data.to_str().expect("utf-8");
    let ws_arg = workspace.to_str().expect("utf-8");

    // Without --server the store is held by the node: the error says what to do.
    let held = run(&[
        "chat",
        "--workspace",
        ws_arg,
        "--agent",
        "anthropic",
        "--data-dir",
        data_arg,
        "hi",
    ])
    .await;
    assert_ne!(code(&held), 0);
    assert!(stderr(&held).contains("--server"), "{}", stderr(&held));

    let out = run(&[
        "chat",
        "--workspace",
        ws_arg,
        "--server",
        &node.base,
        "--data-dir",
        data_arg,
        "ping me",
    ])
    .await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let printed = stdout(&out);
    assert!(
        printed.starts_with("Hello from warden-mock. Your last message had 7 characters.\n"),
        "{printed}"
    );
    assert!(printed.contains("[ctx: "), "{printed}");

    let listed = run(&[
        "sessions",
        "--server",
        &node.base,
        "--data-dir",
        data_arg,
        "--json",
    ])
    .await;
    assert_eq!(code(&listed), 0, "{}", stderr(&listed));
    let sessions: serde_json::Value = serde_json::from_str(&stdout(&listed)).expect("JSON");
    let canonical = std::fs::canonicalize(&workspace).expect("canonical");
    assert_eq!(
        sessions[0]["key"],
        canonical.to_str().expect("utf-8"),
        "{sessions}"
    );
    assert_eq!(sessions[0]["pending"], 0);

    let wrong = tempfile::NamedTempFile::new().expect("file");
    std::fs::write(wrong.path(), "not-the-token").expect("write");
    let refused = run(&[
        "sessions",
        "--server",
        &node.base,
        "--token-file",
        wrong.path().to_str().expect("utf-8"),
    ])
    .await;
    assert_ne!(code(&refused), 0);
    assert!(stderr(&refused).contains("401"), "{}", stderr(&refused));
    let _ = node.child.start_kill();
    mock.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_serve_on_the_same_data_dir_says_what_to_do() {
    let mock = MockServer::start(MockConfig::default())
        .await
        .expect("mock");
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let mut first = start(&data, &mock).await;
    let out = output(
        command(&[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            data.to_str().expect("utf-8"),
            "--base-url",
            &mock.base_url(),
        ]),
        PATIENCE,
    )
    .await;
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    assert_one_line_error(&out, "its own --data-dir");
    assert!(
        !stderr(&out).contains("--server"),
        "serve has no --server: {}",
        stderr(&out)
    );
    let _ = first.child.start_kill();
}
