//! `warden serve` as a process, against the mock: it says where it
//! listens, writes its token 0600, streams a turn over SSE; on SIGTERM with
//! a turn still running it exits 0 after its grace period, and the next
//! start re-sends that turn's message.

use crate::common;

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

/// One SSE event: id, type, data.
#[derive(Debug, Clone)]
struct Event {
    id: u64,
    kind: String,
    data: serde_json::Value,
}

/// Parses complete SSE events out of `buf` (keep-alive comments skipped),
/// leaving a partial one in it.
fn parse_events(buf: &mut String) -> Vec<Event> {
    let mut out = Vec::new();
    while let Some(end) = buf.find("\n\n") {
        let block: String = buf.drain(..end + 2).collect();
        let (mut id, mut kind, mut data) = (None, String::new(), String::new());
        for line in block.lines() {
            if let Some(v) = line.strip_prefix("id: ") {
                id = v.parse().ok();
            } else if let Some(v) = line.strip_prefix("event: ") {
                kind = v.to_owned();
            } else if let Some(v) = line.strip_prefix("data: ") {
                data.push_str(v);
            }
        }
        if let Some(id) = id {
            let data = serde_json::from_str(&data).expect("JSON data");
            out.push(Event { id, kind, data });
        }
    }
    out
}

/// kill -9 of `warden serve` mid-turn: the restarted server re-sends the
/// message under the same turn id (its log is in the data directory), and
/// a client re-attaching with `Last-Event-ID` gets the events after the
/// last one it saw — numbered on, the reply continued where it broke, the
/// intended text exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_survives_kill_9_under_its_id_and_a_client_re_attaches() {
    let mock = MockServer::start(
        MockConfig::default()
            .with_sequence([Scenario::Stall, Scenario::Normal])
            .with_frame_interval(std::time::Duration::from_millis(5))
            .with_fault_after_frames(9),
    )
    .await
    .expect("mock");
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let mut node = start(&data, &mock).await;
    let client = reqwest::Client::new();
    let response = client
        .post(format!("{}/v1/turns", node.base))
        .bearer_auth(&node.token)
        .header("accept", "text/event-stream")
        .header("content-type", "application/json")
        .header("idempotency-key", "client-7f3a")
        .body(r#"{"key": "ws", "message": "hello"}"#)
        .send()
        .await
        .expect("post");
    assert_eq!(response.status(), 200);
    let id = response.headers()["x-warden-turn-id"]
        .to_str()
        .expect("ascii")
        .to_owned();
    let mut body = response.bytes_stream();
    let mut buf = String::new();
    let mut seen = Vec::new();
    // Read until the reply's text has started and the stream has stalled.
    while !seen.iter().any(|e: &Event| e.kind == "text") {
        let chunk = tokio::time::timeout(PATIENCE, body.next())
            .await
            .expect("events in time")
            .expect("the stream goes on")
            .expect("chunk");
        buf.push_str(&String::from_utf8_lossy(&chunk));
        seen.extend(parse_events(&mut buf));
    }
    while let Ok(Some(Ok(chunk))) =
        tokio::time::timeout(std::time::Duration::from_millis(500), body.next()).await
    {
        buf.push_str(&String::from_utf8_lossy(&chunk));
        seen.extend(parse_events(&mut buf));
    }
    let last = seen.last().expect("events").id;

    // kill -9, then a new server on the same data directory.
    node.child.start_kill().expect("SIGKILL");
    let _ = node.child.wait().await;
    drop(body);
    let mut again = start(&data, &mock).await;
    let response = tokio::time::timeout(
        PATIENCE,
        client
            .get(format!("{}/v1/turns/{id}/events", again.base))
            .bearer_auth(&again.token)
            .header("last-event-id", last.to_string())
            .send(),
    )
    .await
    .expect("in time")
    .expect("get");
    assert_eq!(
        response.status(),
        200,
        "the turn is known after the restart"
    );
    let mut body = response.bytes_stream();
    let mut rest = Vec::new();
    while !rest
        .iter()
        .any(|e: &Event| matches!(e.kind.as_str(), "done" | "error"))
    {
        let chunk = tokio::time::timeout(PATIENCE, body.next())
            .await
            .expect("events in time")
            .expect("the stream goes on to its end")
            .expect("chunk");
        buf.push_str(&String::from_utf8_lossy(&chunk));
        rest.extend(parse_events(&mut buf));
    }
    let ids: Vec<u64> = rest.iter().map(|e| e.id).collect();
    assert_eq!(
        ids,
        (last + 1..=last + rest.len() as u64).collect::<Vec<_>>(),
        "numbered on from the last event seen: {rest:?}"
    );
    let done = rest.last().expect("events");
    assert_eq!(done.kind, "done", "{rest:?}");
    let expected = "Hello from warden-mock. Your last message had 5 characters.";
    assert_eq!(done.data["text"], expected, "{rest:?}");
    let mut shown = String::new();
    for e in seen.iter().chain(rest.iter()) {
        match e.kind.as_str() {
            "text" => shown.push_str(e.data["text"].as_str().unwrap_or("")),
            "retrying" | "restarting" if e.data["discard"] == true => shown.clear(),
            _ => {}
        }
    }
    assert_eq!(shown, expected, "the text once: {seen:?} {rest:?}");
    // The session's turns list it, under its id, answered.
    let listed = get_json(&client, &again, "/v1/sessions/ws/turns").await;
    assert_eq!(listed["turns"][0]["id"], id.as_str(), "{listed}");
    assert_eq!(listed["turns"][0]["outcome"], "done", "{listed}");
    assert_eq!(listed["turns"][0]["text"], expected, "{listed}");
    // The client, unsure its first request got through, sends it again
    // with the same key: the same turn, not a second answer.
    let upstream = mock.request_count();
    let retried = client
        .post(format!("{}/v1/turns", again.base))
        .bearer_auth(&again.token)
        .header("content-type", "application/json")
        .header("idempotency-key", "client-7f3a")
        .body(r#"{"key": "ws", "message": "hello"}"#)
        .send()
        .await
        .expect("post");
    assert_eq!(retried.status(), 202);
    assert_eq!(retried.headers()["idempotent-replayed"], "true");
    let body: serde_json::Value =
        serde_json::from_slice(&retried.bytes().await.expect("body")).expect("JSON");
    assert_eq!(body["id"], id.as_str());
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        mock.request_count(),
        upstream,
        "nothing sent upstream again"
    );
    let _ = again.child.start_kill();
}

/// The narrowest crash: a message accepted (stored, acknowledged) whose
/// turn was not yet relayed when the process died. Restarted, the server
/// re-delivers it under the id its idempotency key names, and a client
/// retrying the request — even while the restart is still re-delivering —
/// never gets a second turn: the same id, or a 409 `turn_recovering` to
/// ask again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_accepted_before_a_crash_is_found_by_its_idempotency_key() {
    let mock = MockServer::start(MockConfig::default())
        .await
        .expect("mock");
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    // A first run creates the data directory and the session.
    let mut node = start(&data, &mock).await;
    let client = reqwest::Client::new();
    let post = |base: &str, token: &str| {
        client
            .post(format!("{base}/v1/turns"))
            .bearer_auth(token)
            .header("content-type", "application/json")
            .header("idempotency-key", "retry-me")
            .body(r#"{"key": "crashy", "message": "hello"}"#)
            .send()
    };
    let warm = client
        .post(format!("{}/v1/turns", node.base))
        .bearer_auth(&node.token)
        .header("content-type", "application/json")
        .body(r#"{"key": "crashy", "message": "warm up"}"#)
        .send()
        .await
        .expect("post");
    assert_eq!(warm.status(), 202);
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while mock.request_count() < 1 || session_pending(&client, &node, "crashy").await != 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the first turn ends in time"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    node.child.start_kill().expect("SIGKILL");
    let _ = node.child.wait().await;
    // What the crash left: the message stored with its key, no turn log.
    {
        use warden_core::SessionStore as _;
        let store = warden_store::SledStore::open(data.join("sessions.db")).expect("open");
        let key = warden_core::SessionKey::new("crashy");
        let mut record = store.load(&key).await.expect("load").expect("record");
        let options = warden_core::SendOptions::default().with_idempotency_key("retry-me");
        record.accept_with("hello", options);
        store
            .save(&record, warden_core::Durability::Flushed)
            .await
            .expect("save");
    }
    let before = mock.request_count();
    let again = start(&data, &mock).await;
    // Retried at once and until it names the turn.
    let mut id = None;
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while id.is_none() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the turn is named in time"
        );
        let r = post(&again.base, &again.token).await.expect("post");
        let status = r.status();
        let body: serde_json::Value =
            serde_json::from_slice(&r.bytes().await.expect("body")).expect("JSON");
        match status.as_u16() {
            202 => id = Some(body["id"].as_str().expect("id").to_owned()),
            409 => {
                assert_eq!(body["error"]["type"], "turn_recovering", "{body}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            other => panic!("{other}: {body}"),
        }
    }
    let id = id.expect("id");
    // Its events are the re-delivered turn's, to the answer.
    let events = client
        .get(format!("{}/v1/turns/{id}/events", again.base))
        .bearer_auth(&again.token)
        .send()
        .await
        .expect("get");
    let mut body = events.bytes_stream();
    let (mut buf, mut seen) = (String::new(), Vec::new());
    while !seen.iter().any(|e: &Event| e.kind == "done") {
        let chunk = tokio::time::timeout(PATIENCE, body.next())
            .await
            .expect("events in time")
            .expect("the stream goes on")
            .expect("chunk");
        buf.push_str(&String::from_utf8_lossy(&chunk));
        seen.extend(parse_events(&mut buf));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        mock.request_count(),
        before + 1,
        "the message was answered once"
    );
    let listed = get_json(&client, &again, "/v1/sessions/crashy/turns").await;
    let ids: Vec<&str> = listed["turns"]
        .as_array()
        .expect("turns")
        .iter()
        .filter_map(|t| t["id"].as_str())
        .collect();
    assert_eq!(ids.iter().filter(|i| **i == id).count(), 1, "{listed}");
    assert_eq!(ids.len(), 2, "the warm-up turn and this one: {listed}");
    let mut again = again;
    let _ = again.child.start_kill();
}

/// `GET path` on `node` with its token: the JSON answer.
async fn get_json(client: &reqwest::Client, node: &Node, path: &str) -> serde_json::Value {
    let r = client
        .get(format!("{}{path}", node.base))
        .bearer_auth(&node.token)
        .send()
        .await
        .expect("get");
    serde_json::from_slice(&r.bytes().await.expect("body")).expect("JSON")
}

/// The session's `pending` count as `GET /v1/sessions/{key}` shows it.
async fn session_pending(client: &reqwest::Client, node: &Node, key: &str) -> u64 {
    let body = get_json(client, node, &format!("/v1/sessions/{key}")).await;
    body["pending"].as_u64().unwrap_or(u64::MAX)
}

/// Per-turn `model` and `agent`: a turn's model reaches the API (the next
/// turn of the same session may ask for another, and one that asks for
/// none gets the server's); a turn asking for another agent kind than the
/// session's is a typed 409 and sends nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_picks_its_model_and_cannot_switch_the_agent() {
    let mock = MockServer::start(MockConfig::default())
        .await
        .expect("mock");
    let dir = tempfile::tempdir().expect("tempdir");
    let mut node = start(&dir.path().join("data"), &mock).await;
    let client = reqwest::Client::new();
    let turn = |body: serde_json::Value| {
        client
            .post(format!("{}/v1/turns", node.base))
            .bearer_auth(&node.token)
            .header("accept", "text/event-stream")
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
    };
    for (i, model) in [Some("claude-opus-x"), Some("claude-haiku-y"), None]
        .into_iter()
        .enumerate()
    {
        let mut body = serde_json::json!({"key": "ws", "message": "hello"});
        if let Some(m) = model {
            body["model"] = serde_json::json!(m);
        }
        let response = tokio::time::timeout(PATIENCE, turn(body))
            .await
            .expect("in time")
            .expect("post");
        assert_eq!(response.status(), 200);
        let text = tokio::time::timeout(PATIENCE, response.text())
            .await
            .expect("the whole stream in time")
            .expect("body");
        assert!(text.contains("event: done"), "{text}");
        let seen = mock.requests();
        assert_eq!(seen.len(), i + 1);
        let used = seen[i].model.as_deref();
        match model {
            Some(m) => assert_eq!(used, Some(m), "turn {i} used its model"),
            None => assert!(
                used.is_some_and(|u| u != "claude-opus-x" && u != "claude-haiku-y"),
                "a turn without a model gets the server's: {used:?}"
            ),
        }
    }
    let response = tokio::time::timeout(
        PATIENCE,
        turn(serde_json::json!({"key": "ws", "message": "hi", "agent": "openai"})),
    )
    .await
    .expect("in time")
    .expect("post");
    assert_eq!(response.status(), 409);
    let body: serde_json::Value =
        serde_json::from_slice(&response.bytes().await.expect("body")).expect("JSON");
    assert_eq!(body["error"]["type"], "agent_mismatch", "{body}");
    assert_eq!(body["error"]["agent"], "anthropic", "{body}");
    assert_eq!(body["error"]["requested"], "openai", "{body}");
    assert_eq!(mock.requests().len(), 3, "nothing was sent");
    // The same agent is fine.
    let response = tokio::time::timeout(
        PATIENCE,
        turn(serde_json::json!({"key": "ws", "message": "hi", "agent": "anthropic"})),
    )
    .await
    .expect("in time")
    .expect("post");
    assert_eq!(response.status(), 200);
    let _ = response.text().await;
    let _ = node.child.start_kill();
}
