//! Two `warden serve --store postgres://…` nodes (real processes) on one
//! real PostgreSQL: a keyed turn sent through one node runs on the
//! session's owner, and the same key with another message is `422
//! idempotency_key_reused` through either node — and through the survivor
//! after the owner was killed (the fingerprint is read from the database,
//! with the turn) — while the same body is its retry. Nothing more reaches
//! the agent.
//!
//! Needs `WARDEN_PG_URL` (an admin URL; `.ci/run` starts a throwaway
//! cluster); without it the test says why and passes, unless
//! `WARDEN_REQUIRE_POSTGRES=1` (CI) makes it fail.

use crate::common;

use std::path::Path;
use std::time::Duration;

use common::cluster::{Node, NodeSpec, TOKEN};
use common::*;
use futures_util::StreamExt as _;
use serde_json::{Value, json};
use warden_mock::{MockConfig, MockServer};

const PATIENCE: Duration = Duration::from_secs(30);
const KEY: &str = "cluster-order-7";

async fn start(dir: &Path, id: &str, store: &str, mock: &MockServer) -> Node {
    NodeSpec::new(dir, id, store, 1.5)
        .args(&["--grace", "1"])
        .upstream(mock)
        .start()
        .await
}

/// `POST /v1/turns` to `node` with the key and `message`: status, whether
/// replayed, JSON body.
async fn post(node: &Node, message: &str) -> (u16, bool, Value) {
    let r = tokio::time::timeout(
        PATIENCE,
        reqwest::Client::new()
            .post(format!("{}/v1/turns", node.base))
            .bearer_auth(TOKEN)
            .header("content-type", "application/json")
            .header("idempotency-key", KEY)
            .body(json!({"key": "k1", "message": message}).to_string())
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

/// Through `node`: another message is refused naming turn `id`, the same
/// one is its retry.
async fn refuses_another_message(node: &Node, id: &str, what: &str) {
    let (status, replayed, body) = post(node, "another message").await;
    assert_eq!(status, 422, "{what}: {body}");
    assert!(!replayed, "{what}");
    assert_eq!(
        body["error"]["type"], "idempotency_key_reused",
        "{what}: {body}"
    );
    assert_eq!(body["error"]["id"], id, "{what}: {body}");
    let (status, replayed, body) = post(node, "keyed").await;
    assert_eq!(status, 202, "{what}: {body}");
    assert!(replayed, "{what}: Idempotent-Replayed");
    assert_eq!(body["id"], id, "{what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reused_idempotency_key_is_refused_through_any_node_and_after_the_owner_died() {
    let Some(url) = fresh_db("warden_k").await else {
        return;
    };
    let mock =
        MockServer::start(MockConfig::default().with_frame_interval(Duration::from_millis(2)))
            .await
            .expect("mock");
    let dir = tempfile::tempdir().expect("tempdir");
    let mut a = start(dir.path(), "node-a", &url, &mock).await;
    let b = start(dir.path(), "node-b", &url, &mock).await;

    // A takes the session (its first turn runs there).
    let (status, _, body) = post(&a, "keyed").await;
    assert_eq!(status, 202, "{body}");
    let id = body["id"].as_str().expect("id").to_owned();
    // Followed through B (forwarded to A) to its end.
    let events = reqwest::Client::new()
        .get(format!("{}/v1/turns/{id}/events", b.base))
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("get");
    assert_eq!(events.status(), 200);
    let mut stream = events.bytes_stream();
    let mut text = String::new();
    while !text.contains("event: done") && !text.contains("event: error") {
        let chunk = tokio::time::timeout(PATIENCE, stream.next())
            .await
            .expect("events in time")
            .expect("the stream goes on")
            .expect("chunk");
        text.push_str(&String::from_utf8_lossy(&chunk));
    }
    assert!(text.contains("event: done"), "{text}");
    drop(stream);
    let answered = mock.request_count();

    refuses_another_message(&a, &id, "through the owner").await;
    refuses_another_message(&b, &id, "through the other node").await;

    // The owner dies: the survivor answers from the database.
    a.child.start_kill().expect("SIGKILL");
    let _ = a.child.wait().await;
    refuses_another_message(&b, &id, "after the owner died").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        mock.request_count(),
        answered,
        "nothing more reached the agent"
    );
    let mut b = b;
    let _ = b.child.start_kill();
}
