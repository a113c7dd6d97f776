//! `warden serve --store postgres://…`: nodes (real processes) sharing one
//! real PostgreSQL run each session on exactly one node. A session's
//! owner answers its turns and the other node says where it runs (503,
//! `Retry-After`); when the owner is killed its session is taken over
//! once its lease runs out and the acknowledged message is answered; an
//! owner paused past its lease wakes up fenced out and stops its copy.
//!
//! Needs `WARDEN_PG_URL` (an admin URL; `.ci/run` starts a throwaway
//! cluster); without it the tests say why and pass, unless
//! `WARDEN_REQUIRE_POSTGRES=1` (CI) makes them fail.

use crate::common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::cluster::{Node, NodeSpec, TOKEN};
use common::*;
use nix::sys::signal::{Signal, kill};
use serde_json::Value;
use warden_core::{SessionKey, SessionStore as _};
use warden_mock::{MockConfig, MockServer, Outcome, Scenario};

const PATIENCE: Duration = Duration::from_secs(30);
/// The nodes' lease TTL.
const TTL_SECS: f64 = 1.5;

/// A mock whose first request stalls (held open) and whose others are
/// answered.
async fn stall_then_answer() -> MockServer {
    MockServer::start(
        MockConfig::default()
            .with_sequence([Scenario::Stall, Scenario::Normal])
            .with_frame_interval(Duration::from_millis(2)),
    )
    .await
    .expect("mock")
}

async fn start(dir: &Path, id: &str, store: &str, mock: &MockServer) -> Node {
    start_with_ttl(dir, id, store, mock, TTL_SECS).await
}

async fn start_with_ttl(dir: &Path, id: &str, store: &str, mock: &MockServer, ttl: f64) -> Node {
    spec(dir, id, store, ttl).upstream(mock).start().await
}

/// A node as every test here starts it, its upstream still to name.
fn spec<'a>(dir: &Path, id: &'a str, store: &str, ttl: f64) -> NodeSpec<'a> {
    NodeSpec::new(dir, id, store, ttl)
        .args(&["--grace", "1"])
        // The stalled stream is held, not killed, for as long as a test lasts.
        .env("WARDEN_STREAM_TIMEOUT", "120000")
}

async fn post(node: &Node, key: &str, message: &str) -> reqwest::Response {
    tokio::time::timeout(
        PATIENCE,
        reqwest::Client::new()
            .post(format!("{}/v1/turns", node.base))
            .bearer_auth(TOKEN)
            .header("content-type", "application/json")
            .body(serde_json::json!({"key": key, "message": message}).to_string())
            .send(),
    )
    .await
    .expect("an answer in time")
    .expect("post")
}

/// Waits until `cond`; on a timeout the failure shows what the mock saw.
async fn wait_until(
    mock: &MockServer,
    what: &str,
    limit: Duration,
    mut cond: impl FnMut() -> bool,
) {
    let t0 = Instant::now();
    while !cond() {
        if t0.elapsed() > limit {
            let seen: Vec<_> = mock
                .requests()
                .iter()
                .map(|r| (r.id, r.status, r.outcome, r.frames))
                .collect();
            panic!("timed out waiting for {what}; the mock saw {seen:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn pending(pg: &warden_pg::low_level::PgStore, key: &str) -> usize {
    pg.load(&SessionKey::new(key))
        .await
        .expect("load")
        .map_or(0, |r| r.pending.len())
}

fn dir() -> (tempfile::TempDir, PathBuf) {
    let d = tempfile::tempdir().expect("tempdir");
    let p = d.path().to_owned();
    (d, p)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_owners_session_is_taken_over_and_its_message_answered() {
    let Some(url) = fresh_db("warden_c").await else {
        return;
    };
    let mock = stall_then_answer().await;
    let (_d, dir) = dir();
    let mut a = start(&dir, "node-a", &url, &mock).await;
    let b = start(&dir, "node-b", &url, &mock).await;

    // A owns k1: its turn streams (and stalls, held open).
    assert_eq!(post(&a, "k1", "hello").await.status(), 202);
    let requests = || mock.requests().len();
    wait_until(&mock, "A's stream", PATIENCE, || requests() == 1).await;

    // B does not run it. Asked directly it forwards the turn to A (see
    // below); a request already forwarded once gets 503, naming the owner,
    // with Retry-After.
    let elsewhere = tokio::time::timeout(
        PATIENCE,
        reqwest::Client::new()
            .post(format!("{}/v1/turns", b.base))
            .bearer_auth(TOKEN)
            .header("content-type", "application/json")
            .header("x-warden-forwarded", "node-z")
            .body(serde_json::json!({"key": "k1", "message": "me too"}).to_string())
            .send(),
    )
    .await
    .expect("an answer in time")
    .expect("post");
    assert_eq!(elsewhere.status(), 503);
    let retry_after: f64 = elsewhere.headers()["retry-after"]
        .to_str()
        .expect("ascii")
        .parse()
        .expect("seconds");
    assert!(
        (1.0..=TTL_SECS.ceil()).contains(&retry_after),
        "{retry_after}"
    );
    let body: Value = elsewhere.json_value().await;
    assert_eq!(body["error"]["type"], "session_elsewhere", "{body}");
    assert_eq!(body["error"]["owner"], "node-a", "{body}");
    assert!(
        body["error"]["advertise"]
            .as_str()
            .is_some_and(|u| u == a.base),
        "{body}"
    );

    // A's conversation id is in the record (announced when its stream began).
    let pg = warden_pg::low_level::PgStore::connect(&url)
        .await
        .expect("pg");
    let conversation_of = |r: Option<warden_core::SessionRecord>| {
        r.and_then(|r| r.agent_session_id.map(|id| (id, r.restart_count)))
    };
    let t1 = Instant::now();
    let (conversation, _) = loop {
        let record = pg.load(&SessionKey::new("k1")).await.expect("load");
        if let Some(c) = conversation_of(record) {
            break c;
        }
        assert!(t1.elapsed() < PATIENCE, "A recorded its conversation id");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };

    // kill -9 A: no goodbye, the lease just stops being renewed.
    let t0 = Instant::now();
    a.child.start_kill().expect("SIGKILL");
    let _ = a.child.wait().await;
    wait_until(
        &mock,
        "B's takeover re-sending the message",
        PATIENCE,
        || requests() == 2,
    )
    .await;
    let failover = t0.elapsed();
    eprintln!("failover (kill → the next attempt on another node): {failover:?}");
    assert!(
        failover <= Duration::from_secs_f64(TTL_SECS) + Duration::from_secs(2),
        "took {failover:?}"
    );
    let t1 = Instant::now();
    while pending(&pg, "k1").await > 0 {
        assert!(
            t1.elapsed() < PATIENCE,
            "the acknowledged message was answered"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let info = pg.lease_info(&SessionKey::new("k1")).await.expect("info");
    assert_eq!((info.owner.as_deref(), info.epoch), (Some("node-b"), 2));
    // B resumed A's conversation from the database: no fresh start, and
    // the answered turn is recorded there.
    let record = pg.load(&SessionKey::new("k1")).await.expect("load");
    assert_eq!(
        conversation_of(record),
        Some((conversation.clone(), 0)),
        "the same conversation, never restarted"
    );
    let turns = {
        use warden_core::store::ConversationStore as _;
        pg.conversations()
            .load(&conversation)
            .await
            .expect("conversation")
    };
    assert_eq!(turns.len(), 2, "hello and its answer: {turns:?}");
    assert_eq!(turns[0].content, "hello");

    // B counts the takeover and holds the lease.
    let metrics = reqwest::Client::new()
        .get(format!("{}/metrics", b.base))
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("get")
        .text()
        .await
        .expect("text");
    assert!(
        metrics
            .lines()
            .any(|l| l == "warden_cluster_takeovers_total 1"),
        "{metrics}"
    );
    assert!(
        metrics.lines().any(|l| l == "warden_cluster_leases_held 1"),
        "{metrics}"
    );
    // And times the failover: from A's last heartbeat (at most a third
    // of the TTL before the kill) to the session's first event on B (just
    // before its attempt reached the upstream).
    let value = |name: &str| -> f64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("{name} in {metrics}"))
    };
    assert_eq!(value("warden_cluster_failover_seconds_count"), 1.0);
    let timed = value("warden_cluster_failover_seconds_sum");
    let seen = failover.as_secs_f64();
    eprintln!("failover timed by B: {timed:.3} s (the test saw {seen:.3} s)");
    assert!(
        (seen - 1.0..=seen + TTL_SECS / 3.0 + 0.25).contains(&timed),
        "timed {timed} s, seen {seen} s"
    );
    assert_eq!(value("warden_cluster_database_outages_total"), 0.0);

    // `warden cluster status` shows it.
    let out = output(
        command(&["cluster", "status", "--store", &url, "--json"]),
        PATIENCE,
    )
    .await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let status: Value = serde_json::from_str(&stdout(&out)).expect("JSON");
    let nodes: Vec<&str> = status["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .filter_map(|n| n["node_id"].as_str())
        .collect();
    assert_eq!(nodes.len(), 2, "{status}");
    assert_eq!(
        status["nodes"][0]["node_id"], "node-b",
        "freshest heartbeat first: {status}"
    );
    assert_eq!(status["sessions"][0]["owner"], "node-b", "{status}");
    assert_eq!(status["nodes"][0]["alive"], true, "{status}");

    // A (killed) is dead once silent past --dead-after; B, beating, is not
    // and cannot be forgotten; A can, and leaves the list.
    let dead_after = ["--dead-after", "3s"];
    tokio::time::sleep(Duration::from_secs(3)).await;
    let status = |extra: &'static [&'static str]| {
        let url = url.clone();
        async move {
            let mut args = vec!["cluster", "status", "--store", url.as_str(), "--json"];
            args.extend_from_slice(extra);
            let out = output(command(&args), PATIENCE).await;
            assert_eq!(code(&out), 0, "{}", stderr(&out));
            serde_json::from_str::<Value>(&stdout(&out)).expect("JSON")
        }
    };
    let now = status(&["--dead-after", "3s"]).await;
    let alive = |s: &Value, id: &str| {
        s["nodes"]
            .as_array()
            .and_then(|n| n.iter().find(|n| n["node_id"] == id))
            .map(|n| n["alive"].clone())
    };
    assert_eq!(alive(&now, "node-a"), Some(Value::Bool(false)), "{now}");
    assert_eq!(alive(&now, "node-b"), Some(Value::Bool(true)), "{now}");
    let mut args = vec!["cluster", "forget", "node-b", "--store", url.as_str()];
    args.extend_from_slice(&dead_after);
    let refused = output(command(&args), PATIENCE).await;
    assert_eq!(code(&refused), 1, "{}", stderr(&refused));
    assert_one_line_error(&refused, "it is alive");
    let mut args = vec!["cluster", "forget", "node-a", "--store", url.as_str()];
    args.extend_from_slice(&dead_after);
    let forgot = output(command(&args), PATIENCE).await;
    assert_eq!(code(&forgot), 0, "{}", stderr(&forgot));
    let after = status(&[]).await;
    assert_eq!(alive(&after, "node-a"), None, "forgotten: {after}");
    assert!(alive(&after, "node-b").is_some(), "{after}");
    drop(b);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_paused_past_its_lease_is_fenced_out_when_it_wakes() {
    let Some(url) = fresh_db("warden_c").await else {
        return;
    };
    let mock = stall_then_answer().await;
    let (_d, dir) = dir();
    let a = start(&dir, "node-a", &url, &mock).await;
    let b = start(&dir, "node-b", &url, &mock).await;
    assert_eq!(post(&a, "k1", "hello").await.status(), 202);
    wait_until(&mock, "A's stream", PATIENCE, || mock.requests().len() == 1).await;

    // A freezes (GC, VM pause) past its lease; B takes the session over.
    kill(a.pid(), Signal::SIGSTOP).expect("SIGSTOP");
    // A renewal A sent just before it froze may land after it, so its
    // lease can run a TTL (and the take-over grace) from the freeze; until
    // then B answers 503 with Retry-After, and a client asks again.
    tokio::time::sleep(Duration::from_secs_f64(TTL_SECS) + Duration::from_millis(500)).await;
    let t0 = Instant::now();
    let taken = loop {
        let answer = post(&b, "k1", "after the pause").await;
        if answer.status() != 503 || t0.elapsed() > PATIENCE {
            break answer;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(taken.status(), 202, "B runs it now");
    let pg = warden_pg::low_level::PgStore::connect(&url)
        .await
        .expect("pg");
    let info = pg.lease_info(&SessionKey::new("k1")).await.expect("info");
    // B's orphan scan and the turn placed on B may each take the lease
    // (the later one at the higher epoch); only A's epoch 1 is stale.
    assert_eq!(info.owner.as_deref(), Some("node-b"), "{info:?}");
    assert!(info.epoch >= 2, "{info:?}");
    let b_epoch = info.epoch;

    // A wakes: its renewal is refused, it stops its copy (its stalled
    // upstream stream is closed), and writes nothing.
    kill(a.pid(), Signal::SIGCONT).expect("SIGCONT");
    let t0 = Instant::now();
    while !mock
        .requests()
        .first()
        .is_some_and(|r| r.outcome == Outcome::ClientClosed)
    {
        if t0.elapsed() > PATIENCE {
            let mut a = a;
            let _ = a.child.start_kill();
            let said = tokio::time::timeout(PATIENCE, a.stderr).await;
            panic!(
                "A did not close its stale stream; the mock saw {:?}; A said {said:?}",
                mock.requests()
                    .iter()
                    .map(|r| (r.id, r.outcome))
                    .collect::<Vec<_>>()
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let t1 = Instant::now();
    while pending(&pg, "k1").await > 0 {
        assert!(t1.elapsed() < PATIENCE, "B answered both messages");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let record = pg
        .load(&SessionKey::new("k1"))
        .await
        .expect("the record decodes")
        .expect("record");
    assert_eq!(
        record.next_message_id, 3,
        "two messages (ids 1 and 2), each accepted once: {record:?}"
    );
    let info = pg.lease_info(&SessionKey::new("k1")).await.expect("info");
    assert_eq!(
        (info.owner.as_deref(), info.epoch),
        (Some("node-b"), b_epoch),
        "nothing moved back"
    );

    let mut a = a;
    a.child.start_kill().expect("kill");
    let _ = a.child.wait().await;
    let said = tokio::time::timeout(PATIENCE, a.stderr)
        .await
        .expect("stderr")
        .expect("task");
    // A says it stopped the session because it lost the lease; it cannot
    // tell a pause from an outage, so it does not claim the session moved.
    assert!(said.contains("k1 stopped here"), "{said}");
    drop(b);
}

async fn text_in_time(r: reqwest::Response) -> String {
    tokio::time::timeout(PATIENCE, r.text())
        .await
        .expect("a whole body in time")
        .expect("body")
}

/// One SSE event: its id, type and data.
#[derive(Debug, Clone, PartialEq)]
struct Sse {
    id: u64,
    kind: String,
    data: Value,
}

/// Reads SSE events off a response as they come.
struct SseReader {
    body: futures_util::stream::BoxStream<'static, reqwest::Result<Vec<u8>>>,
    buf: String,
}

impl SseReader {
    fn new(r: reqwest::Response) -> Self {
        use futures_util::StreamExt as _;
        Self {
            body: r.bytes_stream().map(|c| c.map(|b| b.to_vec())).boxed(),
            buf: String::new(),
        }
    }

    /// The next event; `None` when the stream ends (bounded: panics after
    /// `PATIENCE`).
    async fn next(&mut self) -> Option<Sse> {
        use futures_util::StreamExt as _;
        loop {
            if let Some(end) = self.buf.find("\n\n") {
                let block: String = self.buf.drain(..end + 2).collect();
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
                let Some(id) = id else { continue }; // a keep-alive comment
                let data = serde_json::from_str(&data).expect("JSON data");
                return Some(Sse { id, kind, data });
            }
            let chunk = tokio::time::timeout(PATIENCE, self.body.next())
                .await
                .expect("an event in time");
            match chunk {
                Some(Ok(b)) => self.buf.push_str(&String::from_utf8_lossy(&b)),
                Some(Err(_)) | None => return None,
            }
        }
    }

    /// Events up to and including the first `text` one (A's events: the
    /// reply is under way).
    async fn until_text(&mut self) -> Vec<Sse> {
        let mut seen = Vec::new();
        while !seen.iter().any(|e: &Sse| e.kind == "text") {
            seen.push(self.next().await.expect("A's events"));
        }
        seen
    }

    /// Every event to the end of the stream.
    async fn rest(&mut self) -> Vec<Sse> {
        let mut all = Vec::new();
        while let Some(e) = self.next().await {
            all.push(e);
        }
        all
    }
}

/// Re-attaches to turn `id` through `node` after event `last`: every later
/// event, to the end of the stream.
async fn reattach(node: &Node, id: &str, last: u64) -> Vec<Sse> {
    let again = tokio::time::timeout(
        PATIENCE,
        reqwest::Client::new()
            .get(format!("{}/v1/turns/{id}/events", node.base))
            .bearer_auth(TOKEN)
            .header("last-event-id", last.to_string())
            .send(),
    )
    .await
    .expect("in time")
    .expect("get");
    assert_eq!(again.status(), 200, "{} serves turn {id}", node.id);
    SseReader::new(again).rest().await
}

/// Posts `message` to session `key` on `node` asking for its events: the
/// turn's id and its event stream.
async fn stream_turn(node: &Node, key: &str, message: &str) -> (String, SseReader) {
    let streamed = tokio::time::timeout(
        PATIENCE,
        reqwest::Client::new()
            .post(format!("{}/v1/turns", node.base))
            .bearer_auth(TOKEN)
            .header("content-type", "application/json")
            .header("accept", "text/event-stream")
            .body(serde_json::json!({"key": key, "message": message}).to_string())
            .send(),
    )
    .await
    .expect("in time")
    .expect("post");
    assert_eq!(streamed.status(), 200);
    let id = streamed.headers()["x-warden-turn-id"]
        .to_str()
        .expect("ascii")
        .to_owned();
    (id, SseReader::new(streamed))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_re_attaches_on_another_node_to_a_turn_whose_node_died() {
    let Some(url) = fresh_db("warden_c").await else {
        return;
    };
    let mock = stall_then_answer().await;
    let (_d, dir) = dir();
    let mut a = start(&dir, "node-a", &url, &mock).await;
    let b = start(&dir, "node-b", &url, &mock).await;
    let http = reqwest::Client::new();

    // A runs the turn; the client reads its text until the stream stalls.
    let (id, mut first) = stream_turn(&a, "k1", "hello").await;
    let mut seen = first.until_text().await;
    // What the mock sent before it stalled has all arrived.
    tokio::time::sleep(Duration::from_millis(300)).await;
    while let Ok(Some(e)) = tokio::time::timeout(Duration::from_millis(200), first.next()).await {
        seen.push(e);
    }
    let ids: Vec<u64> = seen.iter().map(|e| e.id).collect();
    assert_eq!(ids, (1..=seen.len() as u64).collect::<Vec<_>>(), "{seen:?}");
    let last_seen = seen.last().expect("some").id;

    // kill -9 A. The client re-attaches to B with the last id it saw.
    a.child.start_kill().expect("SIGKILL");
    let _ = a.child.wait().await;
    drop(first);
    let rest = reattach(&b, &id, last_seen).await;

    // Nothing missed, nothing repeated: the ids go on from the last one
    // seen, one by one, to the end.
    let ids: Vec<u64> = rest.iter().map(|e| e.id).collect();
    assert_eq!(
        ids,
        (last_seen + 1..=last_seen + rest.len() as u64).collect::<Vec<_>>(),
        "{rest:?}"
    );
    // First: the attempt that died with A is continued — the client keeps
    // the text it has (discard: false), B's attempt streams only the rest.
    let marker = &rest[0];
    assert_eq!(marker.kind, "continuing", "{rest:?}");
    assert_eq!(marker.data["code"], "ENODE_LOST", "{marker:?}");
    assert_eq!(marker.data["discard"], false, "{marker:?}");
    assert_eq!(marker.data["node"], "node-b", "{marker:?}");
    let done = rest.last().expect("events");
    assert_eq!(done.kind, "done", "{rest:?}");
    let text_of = |events: &[Sse]| -> String {
        events
            .iter()
            .filter(|e| e.kind == "text")
            .filter_map(|e| e.data["text"].as_str())
            .collect()
    };
    let kept = text_of(&seen);
    assert!(!kept.is_empty(), "A streamed some text: {seen:?}");
    let shown = format!("{kept}{}", text_of(&rest));
    assert_eq!(
        done.data["text"], "Hello from warden-mock. Your last message had 5 characters.",
        "{rest:?}"
    );
    assert_eq!(
        done.data["text"],
        shown.as_str(),
        "nothing repeated, nothing missing"
    );
    assert_eq!(done.data["continuations"], 1, "{done:?}");
    // Attempts are counted across nodes: A's, then B's numbered on.
    let started = rest
        .iter()
        .find(|e| e.kind == "started")
        .expect("B started an attempt");
    assert_eq!(started.data["attempt"], 2, "{rest:?}");
    assert_eq!(done.data["attempts"], 2, "A's attempt and B's: {done:?}");
    assert_eq!(mock.requests().len(), 2, "one attempt on A, one on B");

    // From the start, through B: the same events A sent first, then B's.
    let whole = tokio::time::timeout(
        PATIENCE,
        http.get(format!("{}/v1/turns/{id}/events", b.base))
            .bearer_auth(TOKEN)
            .send(),
    )
    .await
    .expect("in time")
    .expect("get");
    let whole = SseReader::new(whole).rest().await;
    assert_eq!(&whole[..seen.len()], &seen[..], "A's events as A sent them");
    assert_eq!(&whole[seen.len()..], &rest[..], "then B's");
    drop(b);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_stopped_gracefully_mid_turn_hands_the_turn_to_another_node_to_finish() {
    let Some(url) = fresh_db("warden_c").await else {
        return;
    };
    let mock = stall_then_answer().await;
    let (_d, dir) = dir();
    let mut a = start(&dir, "node-a", &url, &mock).await;
    let b = start(&dir, "node-b", &url, &mock).await;
    let (id, mut reading) = stream_turn(&a, "k1", "hello").await;
    let mut seen = reading.until_text().await;

    // SIGTERM: A's turn does not finish within its grace; A stops it with
    // its message pending and gives the lease up. A's stream ends without
    // a last event: the turn is not over, it moves.
    kill(a.pid(), Signal::SIGTERM).expect("SIGTERM");
    let on_a = reading.rest().await;
    seen.extend(on_a);
    assert!(
        !seen.iter().any(|e| e.kind == "error" || e.kind == "done"),
        "A did not end the turn: {seen:?}"
    );
    let status = tokio::time::timeout(PATIENCE, a.child.wait())
        .await
        .expect("A exits in time")
        .expect("wait");
    assert!(status.success(), "{status:?}");

    // B takes it over at once (released, not expired) and continues it;
    // the client re-attaches there and keeps what it has. The marker says
    // why: a drain (A handed it over), not a lost node.
    let last = seen.last().expect("seen").id;
    let rest = reattach(&b, &id, last).await;
    assert_eq!(rest[0].id, last + 1, "{rest:?}");
    assert_eq!(
        (rest[0].kind.as_str(), &rest[0].data["code"]),
        ("continuing", &serde_json::json!("ENODE_DRAINED")),
        "{rest:?}"
    );
    let done = rest.last().expect("events");
    assert_eq!(done.kind, "done", "{rest:?}");
    let text: String = seen
        .iter()
        .chain(&rest)
        .filter(|e| e.kind == "text")
        .filter_map(|e| e.data["text"].as_str())
        .collect();
    assert_eq!(done.data["text"], text.as_str(), "{seen:?} {rest:?}");
    let pg = warden_pg::low_level::PgStore::connect(&url)
        .await
        .expect("pg");
    let info = pg.lease_info(&SessionKey::new("k1")).await.expect("info");
    assert_eq!((info.owner.as_deref(), info.epoch), (Some("node-b"), 2));
    // B's metrics say A left (a drain), so an alert on dead members stays
    // quiet.
    let metrics = reqwest::Client::new()
        .get(format!("{}/metrics", b.base))
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("get")
        .text()
        .await
        .expect("text");
    assert!(
        metrics
            .contains("warden_cluster_node_heartbeat_age_seconds{node=\"node-a\",state=\"left\"}"),
        "{metrics}"
    );
    assert!(!metrics.contains("state=\"dead\""), "{metrics}");
    let cluster = reqwest::Client::new()
        .get(format!("{}/v1/cluster", b.base))
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("get")
        .json_value()
        .await;
    let state_of = |id: &str| {
        cluster["nodes"]
            .as_array()
            .and_then(|n| n.iter().find(|n| n["node"] == id))
            .map(|n| n["state"].clone())
    };
    assert_eq!(
        state_of("node-a"),
        Some(serde_json::json!("left")),
        "{cluster}"
    );
    assert_eq!(
        state_of("node-b"),
        Some(serde_json::json!("alive")),
        "{cluster}"
    );
    drop(b);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_whose_node_died_is_cancelled_through_any_node() {
    let Some(url) = fresh_db("warden_c").await else {
        return;
    };
    // Every attempt stalls (held open): the turn runs until cancelled.
    let mock = MockServer::start(
        MockConfig::default()
            .with_sequence([Scenario::Stall, Scenario::Stall])
            .with_frame_interval(Duration::from_millis(2)),
    )
    .await
    .expect("mock");
    let (_d, dir) = dir();
    let mut a = start(&dir, "node-a", &url, &mock).await;
    let b = start(&dir, "node-b", &url, &mock).await;
    let c = start(&dir, "node-c", &url, &mock).await;
    let http = reqwest::Client::new();
    let posted = post(&a, "k1", "hello").await;
    assert_eq!(posted.status(), 202);
    let id = posted.json_value().await["id"]
        .as_str()
        .expect("id")
        .to_owned();
    wait_until(&mock, "A's stream", PATIENCE, || mock.requests().len() == 1).await;
    a.child.start_kill().expect("SIGKILL");
    let _ = a.child.wait().await;
    // B or C takes the session over and runs the turn again (stalled).
    wait_until(&mock, "the re-delivery", PATIENCE, || {
        mock.requests().len() == 2
    })
    .await;

    // Cancelled through the node that does not run it now: the request
    // reaches the turn on its new node.
    let pg = warden_pg::low_level::PgStore::connect(&url)
        .await
        .expect("pg");
    let info = pg.lease_info(&SessionKey::new("k1")).await.expect("info");
    let owner = info.owner.expect("a new owner");
    assert_ne!(owner, "node-a");
    let other = if owner == b.id { &c } else { &b };
    let mut cancelled = Value::Null;
    let t0 = Instant::now();
    for node in std::iter::repeat(other) {
        let answer = http
            .delete(format!("{}/v1/turns/{id}", node.base))
            .bearer_auth(TOKEN)
            .send()
            .await
            .expect("delete");
        if answer.status() == 200 {
            cancelled = answer.json_value().await;
            break;
        }
        // The new owner may not have relayed the re-delivered turn yet.
        assert_eq!(answer.status(), 503, "{}", node.id);
        assert!(t0.elapsed() < PATIENCE, "a cancel in time");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(cancelled["cancelled"], true, "{cancelled}");
    assert_eq!(cancelled["key"], "k1", "{cancelled}");
    // The turn ends cancelled, seen from either node.
    for node in [&b, &c] {
        let events = http
            .get(format!("{}/v1/turns/{id}/events", node.base))
            .bearer_auth(TOKEN)
            .send()
            .await
            .expect("get");
        let events = SseReader::new(events).rest().await;
        let last = events.last().expect("events");
        assert_eq!(
            (last.kind.as_str(), &last.data["exit"]),
            ("error", &serde_json::json!(130)),
            "{}: {events:?}",
            node.id
        );
    }
    drop((b, c));
}

/// The pinned Claude Code CLI (`WARDEN_CLAUDE_BIN`), or `None` with the
/// reason printed; a failure when `WARDEN_REQUIRE_CLAUDE=1` (CI).
fn claude_bin() -> Option<String> {
    match std::env::var("WARDEN_CLAUDE_BIN") {
        Ok(bin) if !bin.is_empty() => Some(bin),
        _ => {
            assert!(
                std::env::var("WARDEN_REQUIRE_CLAUDE").as_deref() != Ok("1"),
                "WARDEN_REQUIRE_CLAUDE=1 but WARDEN_CLAUDE_BIN is unset"
            );
            eprintln!("skipped: set WARDEN_CLAUDE_BIN to the Claude Code binary to run this test");
            None
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claude_code_session_fails_over_through_a_fresh_start_where_its_workspace_is() {
    let Some(url) = fresh_db("warden_c").await else {
        return;
    };
    let Some(bin) = claude_bin() else { return };
    // Slow frames: a reply takes seconds, so a turn can be caught mid-text.
    let mock =
        MockServer::start(MockConfig::default().with_frame_interval(Duration::from_millis(150)))
            .await
            .expect("mock");
    let (_d, dir) = dir();
    // One workspace path both nodes have; each node its own HOME, so the
    // CLI's transcripts of one are not on the other (as on two machines).
    let ws = dir.join("project");
    std::fs::create_dir(&ws).expect("workspace");
    let ws = ws.canonicalize().expect("canonical");
    let node = |id: &'static str| {
        let home = dir.join(format!("home-{id}"));
        std::fs::create_dir_all(&home).expect("home");
        (id, home)
    };
    let base = mock.base_url();
    let claude = [
        "--agent",
        "claude-code",
        "--claude-bin",
        bin.as_str(),
        "--base-url",
        base.as_str(),
    ];
    let mut nodes = Vec::new();
    for (id, home) in [node("node-a"), node("node-b")] {
        let home = home.to_str().expect("utf-8").to_owned();
        let env = [
            ("HOME", home.as_str()),
            ("ANTHROPIC_API_KEY", "dummy"),
            ("DISABLE_TELEMETRY", "1"),
            ("DISABLE_AUTOUPDATER", "1"),
            ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1"),
        ];
        let node = env
            .iter()
            .fold(spec(&dir, id, &url, TTL_SECS).args(&claude), |n, (k, v)| {
                n.env(k, v)
            });
        nodes.push(node.start().await);
    }
    let b = nodes.pop().expect("b");
    let mut a = nodes.pop().expect("a");
    let http = reqwest::Client::new();
    let turn = |node: &Node, message: &str| {
        http.post(format!("{}/v1/turns", node.base))
            .bearer_auth(TOKEN)
            .header("content-type", "application/json")
            .header("accept", "text/event-stream")
            .body(serde_json::json!({"workspace": ws, "message": message}).to_string())
            .send()
    };

    // A answers a first message: the conversation is A's CLI's.
    let first = tokio::time::timeout(PATIENCE, turn(&a, "hello"))
        .await
        .expect("in time")
        .expect("post");
    let first = SseReader::new(first).rest().await;
    assert_eq!(
        first.last().map(|e| e.kind.as_str()),
        Some("done"),
        "{first:?}"
    );
    let pg = warden_pg::low_level::PgStore::connect(&url)
        .await
        .expect("pg");
    let key = SessionKey::new(ws.to_str().expect("utf-8"));
    let record = pg.load(&key).await.expect("load").expect("record");
    let conversation = record.agent_session_id.expect("A's conversation id");

    // The second is cut by kill -9 of A, mid-text.
    let second = tokio::time::timeout(PATIENCE, turn(&a, "and then?"))
        .await
        .expect("in time")
        .expect("post");
    let id = second.headers()["x-warden-turn-id"]
        .to_str()
        .expect("ascii")
        .to_owned();
    let mut reading = SseReader::new(second);
    let seen = reading.until_text().await;
    a.child.start_kill().expect("SIGKILL");
    let _ = a.child.wait().await;
    drop(reading);

    // B has the workspace: it takes the session over. The conversation is
    // not on B (its transcript was A's), so the resume fails and the turn
    // moves to a fresh conversation — and the client is told.
    let last = seen.last().expect("seen").id;
    let rest = reattach(&b, &id, last).await;
    let kinds: Vec<&str> = rest.iter().map(|e| e.kind.as_str()).collect();
    assert_eq!(rest[0].id, last + 1, "{rest:?}");
    assert_eq!(
        (kinds[0], &rest[0].data["code"]),
        ("retrying", &serde_json::json!("ENODE_LOST")),
        "{rest:?}"
    );
    let restarting = rest
        .iter()
        .find(|e| e.kind == "restarting")
        .unwrap_or_else(|| panic!("the client is told of the fresh start: {kinds:?}"));
    assert_eq!(
        restarting.data["cause"], "unknown_session",
        "{restarting:?}"
    );
    let done = rest.last().expect("events");
    assert_eq!(done.kind, "done", "{rest:?}");
    assert!(
        done.data["text"].as_str().is_some_and(|t| !t.is_empty()),
        "{done:?}"
    );
    // B's run starts over and is numbered on from A's attempts.
    let on_a = seen
        .iter()
        .filter(|e| e.kind == "started")
        .filter_map(|e| e.data["attempt"].as_u64())
        .max()
        .expect("A started an attempt");
    let first_on_b = rest
        .iter()
        .find(|e| e.kind == "started")
        .and_then(|e| e.data["attempt"].as_u64());
    assert_eq!(first_on_b, Some(on_a + 1), "{rest:?}");
    assert!(done.data["attempts"].as_u64() > Some(on_a), "{done:?}");
    let record = pg.load(&key).await.expect("load").expect("record");
    assert_eq!(record.restart_count, 0, "a fresh start is not a restart");
    assert_eq!(record.past_session_ids.len(), 1, "one fresh start");
    assert!(
        record
            .agent_session_id
            .as_ref()
            .is_some_and(|c| *c != conversation),
        "a new conversation: {record:?}"
    );
    assert!(record.pending.is_empty(), "answered: {record:?}");
    let info = pg.lease_info(&key).await.expect("info");
    assert_eq!(info.owner.as_deref(), Some("node-b"));
    drop(b);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_node_takes_a_turn_and_forwards_it_to_the_sessions_owner() {
    let Some(url) = fresh_db("warden_c").await else {
        return;
    };
    let mock =
        MockServer::start(MockConfig::default().with_frame_interval(Duration::from_millis(2)))
            .await
            .expect("mock");
    let (_d, dir) = dir();
    let mut a = start(&dir, "node-a", &url, &mock).await;
    let b = start(&dir, "node-b", &url, &mock).await;
    let http = reqwest::Client::new();
    let pg = warden_pg::low_level::PgStore::connect(&url)
        .await
        .expect("pg");

    assert_eq!(post(&a, "k1", "hello").await.status(), 202);
    let t0 = Instant::now();
    while mock.requests().is_empty() || pending(&pg, "k1").await > 0 {
        assert!(t0.elapsed() < PATIENCE, "A answered the first message");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // B takes the next turn and relays A's stream of it.
    let streamed = tokio::time::timeout(
        PATIENCE,
        http.post(format!("{}/v1/turns", b.base))
            .bearer_auth(TOKEN)
            .header("content-type", "application/json")
            .header("accept", "text/event-stream")
            .body(serde_json::json!({"key": "k1", "message": "through B"}).to_string())
            .send(),
    )
    .await
    .expect("in time")
    .expect("post");
    assert_eq!(streamed.status(), 200);
    let id = streamed.headers()["x-warden-turn-id"]
        .to_str()
        .expect("ascii")
        .to_owned();
    let a_hex: String = "node-a".bytes().map(|b| format!("{b:02x}")).collect();
    assert!(
        id.starts_with(&format!("turn_{a_hex}_")),
        "A's turn id: {id}"
    );
    let events = text_in_time(streamed).await;
    assert!(events.contains("event: done"), "{events}");
    assert!(events.contains("Hello from warden-mock"), "{events}");
    assert_eq!(mock.requests().len(), 2, "one more request, from A");
    let info = pg.lease_info(&SessionKey::new("k1")).await.expect("info");
    assert_eq!(
        (info.owner.as_deref(), info.epoch),
        (Some("node-a"), 1),
        "the session never moved"
    );

    // Re-attach through B: A's events after the first, from A.
    let again = http
        .get(format!("{}/v1/turns/{id}/events", b.base))
        .bearer_auth(TOKEN)
        .header("last-event-id", "1")
        .send()
        .await
        .expect("get");
    assert_eq!(again.status(), 200);
    let replay = text_in_time(again).await;
    assert!(
        !replay.contains("id: 1\n") && replay.contains("id: 2\n"),
        "{replay}"
    );
    assert!(replay.contains("event: done"), "{replay}");
    // Cancel through B reaches A (the turn is over: nothing to cancel).
    let cancelled: Value = http
        .delete(format!("{}/v1/turns/{id}", b.base))
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("delete")
        .json_value()
        .await;
    assert_eq!(cancelled["id"], id.as_str(), "{cancelled}");
    assert_eq!(cancelled["key"], "k1", "{cancelled}");
    assert_eq!(cancelled["cancelled"], false, "{cancelled}");
    // Without the token B forwards nothing.
    let anonymous = http
        .get(format!("{}/v1/turns/{id}/events", b.base))
        .send()
        .await
        .expect("get");
    assert_eq!(anonymous.status(), 401);

    // B's metrics: three requests forwarded and answered (the turn, its
    // re-attach, its cancel), none unreachable; A holds the lease; both
    // members beat; the database answers.
    let metrics = http
        .get(format!("{}/metrics", b.base))
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("get")
        .text()
        .await
        .expect("text");
    let sample = |name: &str| -> Option<f64> {
        metrics
            .lines()
            .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
    };
    assert_eq!(
        sample("warden_cluster_forwarded_total{outcome=\"answered\"}"),
        Some(3.0),
        "{metrics}"
    );
    assert_eq!(
        sample("warden_cluster_forwarded_total{outcome=\"unreachable\"}"),
        Some(0.0),
        "{metrics}"
    );
    assert_eq!(sample("warden_cluster_leases_held"), Some(0.0), "{metrics}");
    assert_eq!(sample("warden_cluster_database_up"), Some(1.0), "{metrics}");
    assert_eq!(
        sample("warden_cluster_node_sessions{node=\"node-a\"}"),
        Some(1.0),
        "{metrics}"
    );
    assert!(
        sample("warden_cluster_node_heartbeat_age_seconds{node=\"node-b\",state=\"alive\"}")
            .is_some_and(|age| age < 10.0),
        "{metrics}"
    );

    // Any node lists the whole cluster.
    for (node, here) in [(&a, true), (&b, false)] {
        let list: Value = http
            .get(format!("{}/v1/sessions", node.base))
            .bearer_auth(TOKEN)
            .send()
            .await
            .expect("get")
            .json_value()
            .await;
        let k1 = &list["sessions"][0];
        assert_eq!(k1["key"], "k1", "{list}");
        assert_eq!(k1["owner"], "node-a", "{list}");
        assert_eq!(k1["advertise"], a.base.as_str(), "{list}");
        assert_eq!(k1["here"], here, "{list}");
    }

    // A keyed turn through B runs on A; the same key through either node
    // is that turn again, not a second one.
    let keyed = |node: &Node| {
        http.post(format!("{}/v1/turns", node.base))
            .bearer_auth(TOKEN)
            .header("content-type", "application/json")
            .header("idempotency-key", "cluster-key-1")
            .body(serde_json::json!({"key": "k1", "message": "keyed"}).to_string())
            .send()
    };
    let first = keyed(&b).await.expect("post");
    assert_eq!(first.status(), 202);
    let keyed_id = first.json_value().await["id"]
        .as_str()
        .expect("id")
        .to_owned();
    let t0 = Instant::now();
    while mock.requests().len() < 3 || pending(&pg, "k1").await > 0 {
        assert!(t0.elapsed() < PATIENCE, "A answered the keyed message");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for node in [&a, &b] {
        let again = keyed(node).await.expect("post");
        assert_eq!(again.status(), 202);
        assert_eq!(again.headers()["idempotent-replayed"], "true");
        assert_eq!(again.json_value().await["id"], keyed_id.as_str());
    }

    // A dies: its turn is still served, by B from the database (the same
    // events A sent), and until A's lease runs out B says where the
    // session was (B could not forward).
    a.child.start_kill().expect("SIGKILL");
    let _ = a.child.wait().await;
    let kept = http
        .get(format!("{}/v1/turns/{id}/events", b.base))
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("get");
    assert_eq!(kept.status(), 200);
    assert_eq!(
        text_in_time(kept).await,
        events,
        "A's events, from the database"
    );
    let unknown = http
        .get(format!(
            "{}/v1/turns/turn_6e6f64652d61_0000000000000000/events",
            b.base
        ))
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("get");
    assert_eq!(unknown.status(), 503, "neither A nor the database has it");
    assert_eq!(
        unknown.json_value().await["error"]["type"],
        "node_unreachable"
    );
    let refused = post(&b, "k1", "while A's lease lasts").await;
    assert_eq!(refused.status(), 503);
    assert_eq!(
        refused.json_value().await["error"]["type"],
        "session_elsewhere"
    );
    // A retry of the keyed turn is still answered, by B from the database.
    let retried = keyed(&b).await.expect("post");
    assert_eq!(retried.status(), 202);
    assert_eq!(retried.json_value().await["id"], keyed_id.as_str());
    assert_eq!(mock.requests().len(), 3, "nothing more was sent upstream");
    drop(b);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_bound_to_a_workspace_is_taken_over_only_where_that_directory_exists() {
    let Some(url) = fresh_db("warden_c").await else {
        return;
    };
    let mock = stall_then_answer().await;
    let (_d, dir) = dir();
    let ws = dir.join("workspace");
    std::fs::create_dir(&ws).expect("workspace");
    let ws = ws.canonicalize().expect("canonical");
    let mut a = start(&dir, "node-a", &url, &mock).await;
    let b = start(&dir, "node-b", &url, &mock).await;
    let http = reqwest::Client::new();
    let posted = http
        .post(format!("{}/v1/turns", a.base))
        .bearer_auth(TOKEN)
        .header("content-type", "application/json")
        .body(serde_json::json!({"workspace": ws, "message": "hello"}).to_string())
        .send()
        .await
        .expect("post");
    assert_eq!(posted.status(), 202);
    let key = posted.json_value().await["key"]
        .as_str()
        .expect("key")
        .to_owned();
    wait_until(&mock, "A's stream", PATIENCE, || mock.requests().len() == 1).await;

    // A dies, and its workspace is not on the node that is left.
    std::fs::remove_dir(&ws).expect("remove the workspace");
    a.child.start_kill().expect("SIGKILL");
    let _ = a.child.wait().await;
    tokio::time::sleep(Duration::from_secs_f64(TTL_SECS * 2.5)).await;
    // Asked for it, by its workspace or its key, B says why it waits, and
    // does not take it.
    let by_workspace = serde_json::json!({"workspace": ws, "message": "still there?"});
    let by_key = serde_json::json!({"key": key, "message": "still there?"});
    for body in [by_workspace, by_key] {
        let refused = http
            .post(format!("{}/v1/turns", b.base))
            .bearer_auth(TOKEN)
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .await
            .expect("post");
        assert_eq!(refused.status(), 503, "{body}");
        assert!(refused.headers().contains_key("retry-after"));
        let error = refused.json_value().await;
        assert_eq!(error["error"]["type"], "workspace_unavailable", "{error}");
        assert_eq!(
            error["error"]["workspace"],
            ws.to_str().expect("utf-8"),
            "{error}"
        );
        assert_eq!(error["error"]["owner"], "node-a", "{error}");
    }
    let pg = warden_pg::low_level::PgStore::connect(&url)
        .await
        .expect("pg");
    assert_eq!(
        mock.requests().len(),
        1,
        "B did not run it without its workspace"
    );
    assert_eq!(pending(&pg, &key).await, 1, "the message waits");
    let info = pg.lease_info(&SessionKey::new(&key)).await.expect("info");
    assert_eq!(info.owner.as_deref(), Some("node-a"), "nobody took it");

    // The workspace is here again: B takes the session and answers.
    std::fs::create_dir(&ws).expect("workspace again");
    let t0 = Instant::now();
    while pending(&pg, &key).await > 0 {
        assert!(
            t0.elapsed() < PATIENCE,
            "B took the session over and answered"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let info = pg.lease_info(&SessionKey::new(&key)).await.expect("info");
    assert_eq!((info.owner.as_deref(), info.epoch), (Some("node-b"), 2));
    drop(b);
}

/// A tiny deterministic generator (xorshift), seeded and printed so a
/// failing run can be replayed.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }
    fn millis(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(lo + self.below(hi - lo))
    }
}

/// The soak's shared view: nodes' addresses by slot (`None` while dead),
/// which session each prompt belongs to, what was acknowledged and
/// answered, and what went wrong.
#[derive(Default)]
struct Soak {
    nodes: Mutex<Vec<Option<String>>>,
    session_of: Mutex<HashMap<u64, usize>>,
    acked: Mutex<Vec<u64>>,
    answered: Mutex<HashMap<u64, usize>>,
    failures: Mutex<Vec<String>>,
    stop: AtomicBool,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Soak {
    fn alive(&self) -> Vec<String> {
        lock(&self.nodes).iter().flatten().cloned().collect()
    }

    fn is_answered(&self, digest: u64) -> bool {
        lock(&self.answered).contains_key(&digest)
    }
}

/// Posts `text` to `key` through any live node until one acknowledges it
/// (202), following `503 session_elsewhere` to the owner it names.
async fn deliver(
    soak: &Soak,
    http: &reqwest::Client,
    key: &str,
    text: &str,
    rng: &mut Rng,
) -> Result<(), String> {
    let t0 = Instant::now();
    let mut target: Option<String> = None;
    loop {
        if t0.elapsed() > PATIENCE {
            return Err(format!(
                "{key}: {text:?} not acknowledged within {PATIENCE:?}"
            ));
        }
        let alive = soak.alive();
        let base = match target.take() {
            Some(t) if alive.contains(&t) => t,
            _ if alive.is_empty() => {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
            _ => alive[rng.below(alive.len() as u64) as usize].clone(),
        };
        let sent = http
            .post(format!("{base}/v1/turns"))
            .bearer_auth(TOKEN)
            .header("content-type", "application/json")
            .body(serde_json::json!({"key": key, "message": text}).to_string())
            .timeout(Duration::from_secs(5))
            .send()
            .await;
        let Ok(answer) = sent else {
            // A node killed or not up yet: ask another.
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        match answer.status().as_u16() {
            202 => return Ok(()),
            503 => {
                let wait: f64 = answer
                    .headers()
                    .get("retry-after")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(1.0);
                let body: Value = answer.json_value().await;
                match body["error"]["advertise"].as_str() {
                    Some(owner) if owner != base && soak.alive().iter().any(|a| a == owner) => {
                        target = Some(owner.to_owned());
                    }
                    // The owner is dead and its lease not yet expired.
                    _ => tokio::time::sleep(Duration::from_secs_f64(wait.min(0.25))).await,
                }
            }
            status => {
                let body = answer.text().await.unwrap_or_default();
                return Err(format!("{key}: {text:?} got {status}: {body}"));
            }
        }
    }
}

/// One session's client: keeps up to two messages in flight, each posted
/// to a random live node.
async fn soak_client(soak: Arc<Soak>, session: usize, seed: u64) {
    let http = reqwest::Client::new();
    let key = format!("soak-{session}");
    let mut rng = Rng(seed);
    let mut in_flight: Vec<u64> = Vec::new();
    let mut n = 0;
    while !soak.stop.load(Ordering::SeqCst) {
        in_flight.retain(|d| !soak.is_answered(*d));
        if in_flight.len() >= 2 {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        }
        n += 1;
        let text = format!("session {session}, message {n}");
        let digest = warden_mock::prompt_digest(&text);
        lock(&soak.session_of).insert(digest, session);
        match deliver(&soak, &http, &key, &text, &mut rng).await {
            Ok(()) => {
                lock(&soak.acked).push(digest);
                in_flight.push(digest);
            }
            Err(e) => lock(&soak.failures).push(e),
        }
        tokio::time::sleep(rng.millis(50, 400)).await;
    }
}

/// Three nodes, six sessions whose clients keep up to two messages each in
/// flight through random nodes, and twenty times the owner of a live
/// stream killed with SIGKILL and a new node started in its place: every
/// acknowledged message is answered, no session ever has two upstream
/// streams open at once (counted by the mock over the whole run), and the
/// failover times (kill → the session's next request reaching the API)
/// are printed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_killed_twenty_times_lose_no_message_and_never_stream_a_session_twice() {
    const SESSIONS: usize = 6;
    const KILLS: usize = 20;
    const SOAK_TTL: f64 = 1.0;
    let Some(url) = fresh_db("warden_c").await else {
        return;
    };
    let mock = Arc::new(
        MockServer::start(
            MockConfig::default()
                .with_reply("a reply long enough to be cut ".repeat(12))
                .with_frame_interval(Duration::from_millis(30)),
        )
        .await
        .expect("mock"),
    );
    let (_d, dir) = dir();
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64)
        | 1;
    eprintln!("soak seed {seed}");
    let mut rng = Rng(seed);

    let soak = Arc::new(Soak::default());
    let mut nodes = Vec::new();
    for slot in 0..3 {
        let node = start_with_ttl(&dir, &format!("n{slot}-0"), &url, &mock, SOAK_TTL).await;
        lock(&soak.nodes).push(Some(node.base.clone()));
        nodes.push(node);
    }

    // What the API answered, from the mock's log.
    let watcher = {
        let (soak, mock) = (soak.clone(), mock.clone());
        tokio::spawn(async move {
            loop {
                let done: Vec<u64> = mock
                    .requests()
                    .iter()
                    .filter(|r| r.outcome == Outcome::Completed)
                    .filter_map(|r| r.prompt_digest)
                    .collect();
                {
                    let mut answered = lock(&soak.answered);
                    answered.clear();
                    for d in done {
                        *answered.entry(d).or_insert(0) += 1;
                    }
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };
    let clients: Vec<_> = (0..SESSIONS)
        .map(|s| {
            tokio::spawn(soak_client(
                soak.clone(),
                s,
                seed.wrapping_add(s as u64 * 7919) | 1,
            ))
        })
        .collect();

    let pg = warden_pg::low_level::PgStore::connect(&url)
        .await
        .expect("pg");
    let session_of = |soak: &Soak, r: &warden_mock::RequestRecord| {
        r.prompt_digest
            .and_then(|d| lock(&soak.session_of).get(&d).copied())
    };
    let mut failovers = Vec::new();
    // Killed nodes, for what they said if the run fails.
    let mut graveyard: Vec<Node> = Vec::new();
    for round in 1..=KILLS {
        tokio::time::sleep(rng.millis(200, 700)).await;
        // The owner of a session streaming right now.
        let t0 = Instant::now();
        let (session, slot) = loop {
            assert!(
                t0.elapsed() < PATIENCE,
                "round {round}: no live stream to cut"
            );
            let live = mock
                .requests()
                .into_iter()
                .filter(|r| r.outcome == Outcome::InProgress)
                .find_map(|r| session_of(&soak, &r));
            if let Some(session) = live {
                let info = pg
                    .lease_info(&SessionKey::new(format!("soak-{session}")))
                    .await
                    .expect("lease info");
                let slot = info
                    .owner
                    .as_deref()
                    .and_then(|o| nodes.iter().position(|n| n.id == o));
                if let Some(slot) = slot {
                    break (session, slot);
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let killed_at = Instant::now();
        nodes[slot].child.start_kill().expect("SIGKILL");
        let _ = nodes[slot].child.wait().await;
        lock(&soak.nodes)[slot] = None;

        // A new node in its place (a new name: a restarted host).
        let id = format!("n{slot}-{round}");
        let dead = std::mem::replace(
            &mut nodes[slot],
            start_with_ttl(&dir, &id, &url, &mock, SOAK_TTL).await,
        );
        graveyard.push(dead);
        lock(&soak.nodes)[slot] = Some(nodes[slot].base.clone());

        let t1 = Instant::now();
        let next = loop {
            assert!(
                t1.elapsed() < PATIENCE,
                "round {round}: session {session} never reached the API again"
            );
            let next = mock
                .requests()
                .into_iter()
                .filter(|r| r.received_at > killed_at)
                .find(|r| session_of(&soak, r) == Some(session));
            if let Some(r) = next {
                break r.received_at;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        failovers.push(next - killed_at);
    }

    // Stop the clients; everything acknowledged gets its answer.
    soak.stop.store(true, Ordering::SeqCst);
    for c in clients {
        tokio::time::timeout(PATIENCE, c)
            .await
            .expect("clients stop")
            .expect("client task");
    }
    let failures = lock(&soak.failures).clone();
    assert!(failures.is_empty(), "{failures:#?}");
    let acked = lock(&soak.acked).clone();
    let t2 = Instant::now();
    loop {
        let unanswered: Vec<u64> = acked
            .iter()
            .copied()
            .filter(|d| !soak.is_answered(*d))
            .collect();
        if unanswered.is_empty() {
            break;
        }
        if t2.elapsed() > PATIENCE * 2 {
            let mut report = String::new();
            let sessions: std::collections::BTreeSet<usize> = unanswered
                .iter()
                .filter_map(|d| lock(&soak.session_of).get(d).copied())
                .collect();
            for s in sessions {
                let key = SessionKey::new(format!("soak-{s}"));
                let record = pg.load(&key).await;
                let info = pg.lease_info(&key).await;
                report += &format!("\nsoak-{s}: {info:?}\n  {record:?}");
            }
            for node in nodes.into_iter().chain(graveyard) {
                let mut node = node;
                let _ = node.child.start_kill();
                let said = tokio::time::timeout(PATIENCE, node.stderr).await;
                report += &format!("\n{} said {said:?}", node.id);
            }
            panic!(
                "{} of {} acknowledged messages never answered:{report}",
                unanswered.len(),
                acked.len()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for s in 0..SESSIONS {
        let key = format!("soak-{s}");
        let t3 = Instant::now();
        while pending(&pg, &key).await > 0 {
            assert!(t3.elapsed() < PATIENCE, "{key} keeps a pending message");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    watcher.abort();

    // Never two streams of one session at once.
    let requests = mock.requests();
    let api: Vec<_> = requests.iter().filter(|r| r.endpoint.is_api()).collect();
    assert!(
        api.iter().all(|r| session_of(&soak, r).is_some()),
        "every request to the API answered a known message"
    );
    let peak = mock.peak_concurrency(|r| session_of(&soak, r));
    assert_eq!(peak.len(), SESSIONS, "{peak:?}");
    assert!(
        peak.values().all(|&n| n == 1),
        "a session streamed twice at once: {peak:?}"
    );

    let answered = lock(&soak.answered).clone();
    let twice = acked
        .iter()
        .filter(|d| answered.get(d).copied().unwrap_or(0) > 1)
        .count();
    failovers.sort();
    let pct = |p: f64| {
        failovers[((failovers.len() as f64 * p).ceil() as usize).clamp(1, failovers.len()) - 1]
    };
    eprintln!(
        "soak: {} messages acknowledged, all answered ({twice} twice: at-least-once after a kill), \
         {} API requests, {KILLS} kills; failover p50 {:?}, p99 {:?}, max {:?} (lease TTL {SOAK_TTL} s)",
        acked.len(),
        api.len(),
        pct(0.5),
        pct(0.99),
        failovers[failovers.len() - 1]
    );
    drop((nodes, graveyard));
}

trait JsonValue {
    async fn json_value(self) -> Value;
}

impl JsonValue for reqwest::Response {
    async fn json_value(self) -> Value {
        let bytes = tokio::time::timeout(PATIENCE, self.bytes())
            .await
            .expect("a body in time")
            .expect("body");
        serde_json::from_slice(&bytes).expect("a JSON body")
    }
}

/// An idle node stops at once on SIGTERM: nothing runs, so nothing to
/// drain; its leases and membership go in a few statements. (Measured here:
/// ~12 ms; the bound leaves room for a loaded CI machine.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_node_exits_at_once_on_sigterm() {
    let Some(url) = fresh_db("warden_c").await else {
        return;
    };
    let mock = stall_then_answer().await;
    let (_d, dir) = dir();
    let mut a = start(&dir, "node-a", &url, &mock).await;
    let t0 = std::time::Instant::now();
    kill(a.pid(), Signal::SIGTERM).expect("SIGTERM");
    let status = tokio::time::timeout(PATIENCE, a.child.wait())
        .await
        .expect("A exits in time")
        .expect("wait");
    let took = t0.elapsed();
    eprintln!("an idle node exited {took:?} after SIGTERM");
    assert!(status.success(), "{status:?}");
    assert!(took < Duration::from_secs(2), "{took:?}");
}

/// The reply text a client shows from `events`: `text` adds to it,
/// `retrying` / `restarting` with `discard` drop it, `continuing` keeps it.
fn shown<'a>(events: impl IntoIterator<Item = &'a Sse>) -> String {
    let mut text = String::new();
    for e in events {
        match e.kind.as_str() {
            "text" => text.push_str(e.data["text"].as_str().unwrap_or("")),
            "retrying" | "restarting" if e.data["discard"] == true => text.clear(),
            _ => {}
        }
    }
    text
}

/// A database outage shorter than the lease TTL moves nothing: the node
/// running a turn renews as soon as the database answers again and the
/// turn finishes there, run once. (The outage: the database refuses
/// connections and its open ones are cut, as a restart would.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_restart_within_the_lease_moves_no_session() {
    let Some(url) = fresh_db("warden_c").await else {
        return;
    };
    let db = url.rsplit('/').next().expect("a database").to_owned();
    let mock =
        MockServer::start(MockConfig::default().with_frame_interval(Duration::from_millis(400)))
            .await
            .expect("mock");
    let (_d, dir) = dir();
    let ttl = 3.0;
    let a = start_with_ttl(&dir, "node-a", &url, &mock, ttl).await;
    let b = start_with_ttl(&dir, "node-b", &url, &mock, ttl).await;
    let (_id, mut reading) = stream_turn(&a, "k1", "hello").await;
    let mut seen = reading.until_text().await;

    // The database goes away for a third of the TTL.
    database_away(&db);
    tokio::time::sleep(Duration::from_secs_f64(ttl / 3.0)).await;
    database_back(&db);

    // The turn ends on A, whole, with no retry, restart or node-lost marker.
    seen.extend(reading.rest().await);
    let kinds: Vec<&str> = seen.iter().map(|e| e.kind.as_str()).collect();
    assert_eq!(kinds.last(), Some(&"done"), "{seen:?}");
    assert!(
        !kinds
            .iter()
            .any(|k| matches!(*k, "retrying" | "continuing" | "restarting")),
        "{seen:?}"
    );
    let done = seen.last().expect("done");
    assert_eq!(done.data["attempts"], 1, "{done:?}");
    assert_eq!(
        done.data["text"], "Hello from warden-mock. Your last message had 5 characters.",
        "{done:?}"
    );
    assert_eq!(mock.requests().len(), 1, "the LLM was called once");
    let pg = warden_pg::low_level::PgStore::connect(&url)
        .await
        .expect("pg");
    let info = pg.lease_info(&SessionKey::new("k1")).await.expect("info");
    assert_eq!(
        (info.owner.as_deref(), info.epoch),
        (Some("node-a"), 1),
        "the session never moved"
    );
    drop((a, b));
}

/// A database outage longer than the lease TTL: no node can tell it from
/// a partition, so the node running a turn stops it when its lease runs
/// out by its own clock (its upstream stream closed), and once the
/// database is back a node re-delivers it — the client, re-attached with
/// `Last-Event-ID`, gets the reply whole and once; one message, answered
/// once; never two upstream streams at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_outage_longer_than_the_lease_stops_the_turn_and_it_is_re_delivered() {
    let Some(url) = fresh_db("warden_c").await else {
        return;
    };
    let db = url.rsplit('/').next().expect("a database").to_owned();
    let mock =
        MockServer::start(MockConfig::default().with_frame_interval(Duration::from_millis(400)))
            .await
            .expect("mock");
    let (_d, dir) = dir();
    let ttl = 1.5;
    let a = start_with_ttl(&dir, "node-a", &url, &mock, ttl).await;
    let b = start_with_ttl(&dir, "node-b", &url, &mock, ttl).await;
    let (id, mut reading) = stream_turn(&a, "k1", "hello").await;
    let mut seen = reading.until_text().await;

    // The database goes away for twice the TTL.
    database_away(&db);
    tokio::time::sleep(Duration::from_secs_f64(ttl * 2.0)).await;
    // A stopped its stream at its lease's end, with the database away.
    assert_eq!(
        mock.requests()[0].outcome,
        Outcome::ClientClosed,
        "{:?}",
        mock.requests()
    );
    database_back(&db);

    // A's stream of the turn ends without a last event (the turn left
    // it); the client re-attaches through B where it left off.
    seen.extend(reading.rest().await);
    assert!(
        !seen
            .iter()
            .any(|e| matches!(e.kind.as_str(), "done" | "error")),
        "{seen:?}"
    );
    let last = seen.last().expect("events").id;
    let rest = reattach(&b, &id, last).await;
    let done = rest.last().expect("events");
    assert_eq!(done.kind, "done", "{rest:?}");
    let expected = "Hello from warden-mock. Your last message had 5 characters.";
    assert_eq!(done.data["text"], expected, "{rest:?}");
    let shown = shown(seen.iter().chain(rest.iter()));
    assert_eq!(
        shown, expected,
        "the client's text, once: {seen:?} {rest:?}"
    );
    assert_eq!(mock.requests().len(), 2, "A's attempt and the re-delivery");
    assert_eq!(
        mock.peak_concurrency(|_| Some(())).get(&()).copied(),
        Some(1),
        "never two upstream streams at once: {:?}",
        mock.events()
    );
    let pg = warden_pg::low_level::PgStore::connect(&url)
        .await
        .expect("pg");
    let record = pg
        .load(&SessionKey::new("k1"))
        .await
        .expect("the record decodes")
        .expect("record");
    assert!(record.pending.is_empty(), "{record:?}");
    assert_eq!(record.next_message_id, 2, "one message, accepted once");
    drop((a, b));
}

/// Runs `nft` with `args`; its error output on failure.
fn nft(args: &[&str]) -> Result<(), String> {
    let out = std::process::Command::new("nft")
        .args(args)
        .output()
        .map_err(|e| format!("nft: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "nft {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Why the partition test cannot run here (it needs root and nftables),
/// or `None`.
fn cannot_partition() -> Option<String> {
    let root = std::process::Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
    if !root {
        return Some("needs root".into());
    }
    if std::process::Command::new("nft")
        .arg("-v")
        .output()
        .is_err()
    {
        return Some("`nft` is not installed".into());
    }
    None
}

/// A firewall rule dropping every packet a process of group `gid` sends
/// to `port` on this host: that process is partitioned from the service
/// there (no FIN, no RST, connects hang), everyone else still reaches it.
/// Removed when dropped (the partition heals).
struct Partition {
    table: String,
}

impl Partition {
    fn cut(gid: u32, port: u16) -> Result<Self, String> {
        let table = format!("warden_partition_{}", std::process::id());
        nft(&["add", "table", "inet", &table])?;
        let partition = Self { table };
        let t = partition.table.as_str();
        nft(&[
            "add",
            "chain",
            "inet",
            t,
            "out",
            "{ type filter hook output priority 0 ; policy accept ; }",
        ])?;
        nft(&[
            "add",
            "rule",
            "inet",
            t,
            "out",
            "meta",
            "skgid",
            &gid.to_string(),
            "tcp",
            "dport",
            &port.to_string(),
            "drop",
        ])?;
        Ok(partition)
    }
}

impl Drop for Partition {
    fn drop(&mut self) {
        let _ = nft(&["delete", "table", "inet", &self.table]);
    }
}

/// A node cut off from PostgreSQL (a firewall drops its packets; the
/// other node still reaches the database) for three times its lease, then
/// healed: it stops its upstream stream before its lease can be taken, the
/// other node takes the session over and finishes the acknowledged turn —
/// the client re-attached there sees it whole, once — there are never two
/// upstream streams for the session at once, and once healed the cut-off
/// node writes nothing as owner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_partitioned_from_the_database_past_its_lease_stops_before_it_is_replaced() {
    if let Some(why) = cannot_partition() {
        assert!(
            std::env::var("WARDEN_REQUIRE_NETNS").as_deref() != Ok("1"),
            "WARDEN_REQUIRE_NETNS=1 but {why}"
        );
        eprintln!("skipped: {why}");
        return;
    }
    let Some(url) = fresh_db("warden_c").await else {
        return;
    };
    let port: u16 = url
        .rsplit_once(':')
        .and_then(|(_, rest)| rest.split('/').next())
        .and_then(|p| p.parse().ok())
        .expect("a port in WARDEN_PG_URL");
    // A slow reply (about 12 s): it is still streaming when the partition
    // starts, and would be long after B takes over.
    let expected = "one two three four five six seven eight nine ten eleven twelve \
                    thirteen fourteen fifteen sixteen seventeen eighteen nineteen twenty \
                    twenty-one twenty-two twenty-three twenty-four twenty-five twenty-six \
                    twenty-seven twenty-eight twenty-nine thirty thirty-one thirty-two \
                    thirty-three thirty-four thirty-five thirty-six thirty-seven thirty-eight \
                    thirty-nine forty.";
    let mock = MockServer::start(
        MockConfig::default()
            .with_reply(expected)
            .with_frame_interval(Duration::from_millis(300)),
    )
    .await
    .expect("mock");
    let (_d, dir) = dir();
    let ttl = 1.5;
    const GID: u32 = 48_111;
    let agent = ["--agent", "anthropic", "--base-url", &mock.base_url()];
    let a = spec(&dir, "node-a", &url, ttl)
        .args(&agent)
        .gid(GID)
        .start()
        .await;
    let b = start_with_ttl(&dir, "node-b", &url, &mock, ttl).await;

    let (id, mut reading) = stream_turn(&a, "k1", "hello").await;
    let seen = reading.until_text().await;

    // A is cut off from the database for three times its lease.
    let partition = Partition::cut(GID, port).expect("the firewall rule");
    tokio::time::sleep(Duration::from_secs_f64(ttl * 3.0)).await;
    // B has taken the session over by now and re-delivered the turn.
    wait_until(&mock, "B's attempt", PATIENCE, || {
        mock.requests().len() >= 2
    })
    .await;
    let first = mock.requests()[0].clone();
    assert_eq!(
        first.outcome,
        Outcome::ClientClosed,
        "A stopped its stream: {:?}",
        mock.requests()
    );
    let peak = mock.peak_concurrency(|_| Some(()));
    assert_eq!(
        peak.get(&()).copied(),
        Some(1),
        "never two upstream streams for the session at once: {:?}",
        mock.events()
    );

    // The client re-attaches through B where it left off: the turn ends
    // whole, the text once.
    let last = seen.last().expect("events").id;
    drop(reading);
    let rest = reattach(&b, &id, last).await;
    let done = rest.last().expect("events");
    assert_eq!(done.kind, "done", "{rest:?}");
    assert_eq!(done.data["text"], expected, "{rest:?}");
    let shown = shown(seen.iter().chain(rest.iter()));
    assert_eq!(
        shown, expected,
        "the client's text, once: {seen:?} {rest:?}"
    );

    // Healed: A writes nothing as owner; the session stays with B, its one
    // message answered.
    drop(partition);
    tokio::time::sleep(Duration::from_secs_f64(ttl * 2.0)).await;
    let pg = warden_pg::low_level::PgStore::connect(&url)
        .await
        .expect("pg");
    let info = pg.lease_info(&SessionKey::new("k1")).await.expect("info");
    assert_eq!((info.owner.as_deref(), info.epoch), (Some("node-b"), 2));
    let record = pg
        .load(&SessionKey::new("k1"))
        .await
        .expect("the record decodes")
        .expect("record");
    assert!(record.pending.is_empty(), "{record:?}");
    assert_eq!(record.next_message_id, 2, "one message, accepted once");
    assert_eq!(mock.requests().len(), 2, "A's attempt and B's, no more");
    drop((a, b));
}
