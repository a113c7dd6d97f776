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

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::*;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, BufReader};
use warden_core::{SessionKey, SessionStore as _};
use warden_mock::{MockConfig, MockServer, Outcome, Scenario};

const PATIENCE: Duration = Duration::from_secs(30);
const TOKEN: &str = "cluster-test-token";
/// The nodes' lease TTL.
const TTL_SECS: f64 = 1.5;

/// A fresh database's URL, or `None` (with the reason printed).
async fn fresh_db() -> Option<String> {
    let Ok(url) = std::env::var("WARDEN_PG_URL") else {
        assert!(
            std::env::var("WARDEN_REQUIRE_POSTGRES").as_deref() != Ok("1"),
            "WARDEN_REQUIRE_POSTGRES=1 but WARDEN_PG_URL is unset"
        );
        eprintln!("skipped: set WARDEN_PG_URL to a PostgreSQL admin URL to run this test");
        return None;
    };
    let name = format!(
        "warden_c_{}_{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
    );
    let psql = std::process::Command::new("psql")
        .args([url.as_str(), "-qAtc", &format!("CREATE DATABASE {name}")])
        .output()
        .expect("psql runs");
    assert!(
        psql.status.success(),
        "create database: {}",
        String::from_utf8_lossy(&psql.stderr)
    );
    let (base, _) = url.rsplit_once('/').expect("a URL with a database");
    Some(format!("{base}/{name}"))
}

struct Node {
    child: tokio::process::Child,
    base: String,
    stderr: tokio::task::JoinHandle<String>,
}

impl Node {
    fn pid(&self) -> Pid {
        Pid::from_raw(self.child.id().expect("pid") as i32)
    }
}

async fn start(dir: &Path, id: &str, store: &str, mock: &MockServer) -> Node {
    let data = dir.join(id);
    let token = dir.join("token");
    std::fs::write(&token, TOKEN).expect("token");
    let mut cmd = command(&[
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        data.to_str().expect("utf-8"),
        "--token-file",
        token.to_str().expect("utf-8"),
        "--agent",
        "anthropic",
        "--base-url",
        &mock.base_url(),
        "--store",
        store,
        "--node-id",
        id,
        "--lease-ttl",
        &TTL_SECS.to_string(),
        "--grace",
        "1",
    ]);
    // The stalled stream is held, not killed, for as long as a test lasts.
    cmd.env("WARDEN_STREAM_TIMEOUT", "120000");
    let mut child = cmd.spawn().expect("warden serve starts");
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = BufReader::new(stdout).lines();
    let first = tokio::time::timeout(PATIENCE, lines.next_line())
        .await
        .expect("a first line in time")
        .expect("read")
        .expect("a line");
    let base = first
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("first line: {first:?}"))
        .to_owned();
    let mut err = child.stderr.take().expect("stderr");
    let stderr = tokio::spawn(async move {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s).await;
        s
    });
    Node {
        child,
        base,
        stderr,
    }
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

async fn wait_until(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !cond() {
        assert!(t0.elapsed() < limit, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn pending(pg: &warden_pg::PgStore, key: &str) -> usize {
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
    let Some(url) = fresh_db().await else { return };
    let mock = MockServer::start(
        MockConfig::default()
            .with_sequence([Scenario::Stall, Scenario::Normal])
            .with_frame_interval(Duration::from_millis(2)),
    )
    .await
    .expect("mock");
    let (_d, dir) = dir();
    let mut a = start(&dir, "node-a", &url, &mock).await;
    let b = start(&dir, "node-b", &url, &mock).await;

    // A owns k1: its turn streams (and stalls, held open).
    assert_eq!(post(&a, "k1", "hello").await.status(), 202);
    let requests = || mock.requests().len();
    wait_until("A's stream", PATIENCE, || requests() == 1).await;

    // B does not run it: 503, naming the owner, with Retry-After.
    let elsewhere = post(&b, "k1", "me too").await;
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

    // kill -9 A: no goodbye, the lease just stops being renewed.
    let t0 = Instant::now();
    a.child.start_kill().expect("SIGKILL");
    let _ = a.child.wait().await;
    wait_until("B's takeover re-sending the message", PATIENCE, || {
        requests() == 2
    })
    .await;
    let failover = t0.elapsed();
    eprintln!("failover (kill → the next attempt on another node): {failover:?}");
    assert!(
        failover <= Duration::from_secs_f64(TTL_SECS) + Duration::from_secs(2),
        "took {failover:?}"
    );
    let pg = warden_pg::PgStore::connect(&url).await.expect("pg");
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
    drop(b);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_paused_past_its_lease_is_fenced_out_when_it_wakes() {
    let Some(url) = fresh_db().await else { return };
    let mock = MockServer::start(
        MockConfig::default()
            .with_sequence([Scenario::Stall, Scenario::Normal])
            .with_frame_interval(Duration::from_millis(2)),
    )
    .await
    .expect("mock");
    let (_d, dir) = dir();
    let a = start(&dir, "node-a", &url, &mock).await;
    let b = start(&dir, "node-b", &url, &mock).await;
    assert_eq!(post(&a, "k1", "hello").await.status(), 202);
    wait_until("A's stream", PATIENCE, || mock.requests().len() == 1).await;

    // A freezes (GC, VM pause) past its lease; B takes the session over.
    kill(a.pid(), Signal::SIGSTOP).expect("SIGSTOP");
    tokio::time::sleep(Duration::from_secs_f64(TTL_SECS) + Duration::from_millis(500)).await;
    let taken = post(&b, "k1", "after the pause").await;
    assert_eq!(taken.status(), 202, "B runs it now");
    let pg = warden_pg::PgStore::connect(&url).await.expect("pg");
    let info = pg.lease_info(&SessionKey::new("k1")).await.expect("info");
    assert_eq!((info.owner.as_deref(), info.epoch), (Some("node-b"), 2));

    // A wakes: its renewal is refused, it stops its copy (its stalled
    // upstream stream is closed), and writes nothing.
    kill(a.pid(), Signal::SIGCONT).expect("SIGCONT");
    wait_until("A closing its stale stream", PATIENCE, || {
        mock.requests()
            .first()
            .is_some_and(|r| r.outcome == Outcome::ClientClosed)
    })
    .await;
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
        (Some("node-b"), 2),
        "nothing moved back"
    );

    let mut a = a;
    a.child.start_kill().expect("kill");
    let _ = a.child.wait().await;
    let said = tokio::time::timeout(PATIENCE, a.stderr)
        .await
        .expect("stderr")
        .expect("task");
    assert!(said.contains("moved to another node"), "{said}");
    drop(b);
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
