//! `warden serve` as a process, against the mock: a turn sent with an
//! `Idempotency-Key` keeps its request's fingerprint in the data
//! directory, so after kill -9 — mid-turn (the restarted server re-delivers
//! the turn) and again after it ended (the turn is read from the store) —
//! the same key with another message or model is `422
//! idempotency_key_reused` and reaches nobody, while the same body is
//! still its retry (`202`, `Idempotent-Replayed: true`, the same turn).

use crate::common;

use std::time::Duration;

use common::*;
use futures_util::StreamExt as _;
use serde_json::Value;
use warden_mock::{MockConfig, MockServer, Scenario};

const PATIENCE: Duration = Duration::from_secs(30);

const KEY: &str = "client-5e1d";
const FIRST: &str = r#"{"key": "ws", "message": "hello"}"#;

struct Node {
    child: tokio::process::Child,
    base: String,
    token: String,
}

async fn start(data: &std::path::Path, mock: &MockServer) -> Node {
    let (child, base, token) = serve_on(
        data,
        &mock.base_url(),
        &["--grace", "1"],
        &[("WARDEN_STREAM_TIMEOUT", "60000")],
    )
    .await;
    Node { child, base, token }
}

impl Node {
    /// kill -9, and wait for the process to be gone.
    async fn kill_9(mut self) {
        self.child.start_kill().expect("SIGKILL");
        let _ = self.child.wait().await;
    }

    /// `POST /v1/turns` with `body` and the key: status, whether replayed,
    /// JSON body.
    async fn post(&self, client: &reqwest::Client, body: &str) -> (u16, bool, Value) {
        let r = tokio::time::timeout(
            PATIENCE,
            client
                .post(format!("{}/v1/turns", self.base))
                .bearer_auth(&self.token)
                .header("content-type", "application/json")
                .header("idempotency-key", KEY)
                .body(body.to_owned())
                .send(),
        )
        .await
        .expect("an answer in time")
        .expect("post");
        let status = r.status().as_u16();
        let replayed = r.headers().get("idempotent-replayed").is_some();
        let body = serde_json::from_slice(&r.bytes().await.expect("body")).expect("JSON");
        (status, replayed, body)
    }

    /// Another body with the key: refused, naming turn `id`; a retry: the
    /// turn.
    async fn refuses_another_body(&self, client: &reqwest::Client, id: &str) {
        for other in [
            r#"{"key": "ws", "message": "goodbye"}"#,
            r#"{"key": "ws", "message": "hello", "model": "claude-other"}"#,
        ] {
            let (status, replayed, body) = self.post(client, other).await;
            assert_eq!(status, 422, "{other}: {body}");
            assert!(!replayed);
            assert_eq!(body["error"]["type"], "idempotency_key_reused", "{body}");
            assert_eq!(body["error"]["id"], id, "{body}");
        }
        let (status, replayed, body) = self.post(client, FIRST).await;
        assert_eq!(status, 202, "{body}");
        assert!(replayed, "Idempotent-Replayed");
        assert_eq!(body["id"], id);
    }
}

/// One SSE event: type and data.
#[derive(Debug)]
struct Event {
    kind: String,
    data: Value,
}

/// Parses complete SSE events out of `buf`, leaving a partial one in it.
fn parse_events(buf: &mut String) -> Vec<Event> {
    let mut out = Vec::new();
    while let Some(end) = buf.find("\n\n") {
        let block: String = buf.drain(..end + 2).collect();
        let (mut kind, mut data) = (String::new(), String::new());
        for line in block.lines() {
            if let Some(v) = line.strip_prefix("event: ") {
                kind = v.to_owned();
            } else if let Some(v) = line.strip_prefix("data: ") {
                data.push_str(v);
            }
        }
        if !kind.is_empty() {
            let data = serde_json::from_str(&data).expect("JSON data");
            out.push(Event { kind, data });
        }
    }
    out
}

/// Reads `response`'s events until one satisfies `stop`.
async fn read_until(response: reqwest::Response, stop: impl Fn(&Event) -> bool) -> Vec<Event> {
    let mut body = response.bytes_stream();
    let (mut buf, mut seen) = (String::new(), Vec::new());
    while !seen.iter().any(&stop) {
        let chunk = tokio::time::timeout(PATIENCE, body.next())
            .await
            .expect("events in time")
            .expect("the stream goes on")
            .expect("chunk");
        buf.push_str(&String::from_utf8_lossy(&chunk));
        seen.extend(parse_events(&mut buf));
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reused_idempotency_key_is_refused_after_kill_9_mid_turn_and_after_its_end() {
    // The first attempt stalls mid-reply (and is killed with the server);
    // the re-delivered one is answered.
    let mock = MockServer::start(
        MockConfig::default()
            .with_sequence([Scenario::Stall, Scenario::Normal])
            .with_frame_interval(Duration::from_millis(5))
            .with_fault_after_frames(9),
    )
    .await
    .expect("mock");
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let client = reqwest::Client::new();
    let node = start(&data, &mock).await;
    let response = client
        .post(format!("{}/v1/turns", node.base))
        .bearer_auth(&node.token)
        .header("accept", "text/event-stream")
        .header("content-type", "application/json")
        .header("idempotency-key", KEY)
        .body(FIRST)
        .send()
        .await
        .expect("post");
    assert_eq!(response.status(), 200);
    let id = response.headers()["x-warden-turn-id"]
        .to_str()
        .expect("ascii")
        .to_owned();
    read_until(response, |e| e.kind == "text").await;

    // kill -9 mid-turn; restarted on the same data directory, the server
    // re-delivers the turn under its id, with its first request's
    // fingerprint.
    node.kill_9().await;
    let node = start(&data, &mock).await;
    node.refuses_another_body(&client, &id).await;
    let events = client
        .get(format!("{}/v1/turns/{id}/events", node.base))
        .bearer_auth(&node.token)
        .send()
        .await
        .expect("get");
    let events = read_until(events, |e| e.kind == "done" || e.kind == "error").await;
    let last = events.last().expect("events");
    assert_eq!(last.kind, "done", "{events:?}");
    let answer = "Hello from warden-mock. Your last message had 5 characters.";
    assert_eq!(last.data["text"], answer, "the first message's turn");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        mock.request_count(),
        2,
        "the stalled attempt and its re-delivery, nothing else"
    );

    // kill -9 after it ended: read from the store, the same.
    node.kill_9().await;
    let node = start(&data, &mock).await;
    node.refuses_another_body(&client, &id).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(mock.request_count(), 2, "nothing sent upstream");
    let r = client
        .get(format!("{}/v1/sessions/ws/turns", node.base))
        .bearer_auth(&node.token)
        .send()
        .await
        .expect("get");
    let listed: Value = serde_json::from_slice(&r.bytes().await.expect("body")).expect("JSON");
    let turns = listed["turns"].as_array().expect("turns");
    assert_eq!(turns.len(), 1, "one turn: {listed}");
    assert_eq!(turns[0]["id"], id.as_str());
    assert_eq!(turns[0]["text"], answer, "{listed}");
    node.kill_9().await;
}
