//! `warden cluster` against a real PostgreSQL (`WARDEN_PG_URL`; skipped
//! with a message without it): `status` says each node is alive, dead (its
//! heartbeat older than its own lease TTL) or left (it stopped cleanly);
//! `forget --dead --left` removes both kinds in one command and never a
//! live node; and `status | head -1` ends quietly when its reader goes
//! away (no panic, no "internal error … please report").

use crate::common;

use std::time::Duration;

use serde_json::Value;
use tokio::io::AsyncBufReadExt as _;

use common::{code, command, fresh_db, run, stderr, stdout};

/// Each node's `(id, state)` as `warden cluster status --json` says it.
async fn states(url: &str) -> Vec<(String, String)> {
    let out = run(&["cluster", "status", "--json", "--store", url]).await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let status: Value = serde_json::from_str(&stdout(&out)).expect("JSON");
    let mut all: Vec<(String, String)> = status["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .map(|n| {
            (
                n["node_id"].as_str().expect("id").to_owned(),
                n["state"].as_str().unwrap_or("(none)").to_owned(),
            )
        })
        .collect();
    all.sort();
    all
}

fn pairs(all: &[(&str, &str)]) -> Vec<(String, String)> {
    all.iter()
        .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forget_takes_the_dead_and_the_left_in_one_command() {
    let Some(url) = fresh_db("warden_forget").await else {
        return;
    };
    let pg = warden_pg::low_level::PgStore::connect(&url)
        .await
        .expect("connect");
    pg.register_node_with_ttl("alive", "http://a.invalid", Duration::from_secs(60))
        .await
        .expect("register");
    pg.register_node_with_ttl("dead", "http://d.invalid", Duration::from_millis(200))
        .await
        .expect("register");
    pg.register_node_with_ttl("left", "http://l.invalid", Duration::from_secs(60))
        .await
        .expect("register");
    pg.mark_node_left("left").await.expect("leave");
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(
        states(&url).await,
        pairs(&[("alive", "alive"), ("dead", "dead"), ("left", "left")])
    );

    let out = run(&["cluster", "forget", "--dead", "--left", "--store", &url]).await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let said = stdout(&out);
    let mut said: Vec<&str> = said.lines().collect();
    said.sort();
    assert_eq!(said, ["forgot node dead", "forgot node left"]);
    assert_eq!(states(&url).await, pairs(&[("alive", "alive")]));

    // A live node is refused by name, and --dead leaves it too.
    let out = run(&["cluster", "forget", "alive", "--dead", "--store", &url]).await;
    assert_ne!(code(&out), 0, "a live node is not forgotten");
    assert!(stderr(&out).contains("it is alive"), "{}", stderr(&out));
    assert_eq!(states(&url).await, pairs(&[("alive", "alive")]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_status_piped_into_head_exits_quietly() {
    let Some(url) = fresh_db("warden_head").await else {
        return;
    };
    let pg = warden_pg::low_level::PgStore::connect(&url)
        .await
        .expect("connect");
    pg.register_node_with_ttl("node-a", "http://a.invalid", Duration::from_secs(60))
        .await
        .expect("register");
    // Far more than a pipe holds (64 KiB): the command is still writing
    // when its reader goes away.
    let psql = std::process::Command::new("psql")
        .args([
            url.as_str(),
            "-qAtc",
            "INSERT INTO warden_sessions (key, owner, epoch, lease_until) \
             SELECT 'session-' || g, 'node-a', 1, now() + interval '1 hour' \
             FROM generate_series(1, 5000) g",
        ])
        .output()
        .expect("psql runs");
    assert!(
        psql.status.success(),
        "{}",
        String::from_utf8_lossy(&psql.stderr)
    );

    let mut child = command(&["cluster", "status", "--store", &url])
        .spawn()
        .expect("spawn");
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    let first = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .expect("a first line in time")
        .expect("read")
        .expect("a line");
    assert!(first.starts_with("NODE"), "{first}");
    // `head -1` exits: the pipe's read end closes.
    drop(lines);
    let out = tokio::time::timeout(Duration::from_secs(30), child.wait_with_output())
        .await
        .expect("warden ends in time")
        .expect("warden ran");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !err.contains("panicked") && !err.contains("internal error") && err.trim().is_empty(),
        "a closed pipe is not an error to report: {err}"
    );
    assert_eq!(out.status.code(), Some(0), "{err}");
}
