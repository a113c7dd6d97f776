//! A database outage about as long as the time left on the nodes' leases
//! leaves no turn hanging (issue 36, item 6). Three `warden serve --store
//! postgres://…` nodes (real processes) stream turns while the database
//! goes away; depending on where the outage ends against each lease, a
//! node renews in time, or gives its leases up and stops its turns
//! (self-fencing: it cannot tell an outage from a partition) while the
//! database is just coming back. It used to happen that the node that gave
//! a lease up took it straight back with the stopping session's last write
//! (epoch 2) and ran nothing under it: that turn never reached the
//! upstream again and its clients saw keep-alives and no end. Here every
//! client follows its turn (re-attaching with `Last-Event-ID` wherever its
//! stream ends early) and every turn must end — `done`, or an `error` with
//! its code — within a bound, over twenty outages.
//!
//! Needs `WARDEN_PG_URL` (an admin URL; `.ci/run` starts a throwaway
//! cluster); without it the test says why and passes, unless
//! `WARDEN_REQUIRE_POSTGRES=1` (CI) makes it fail.

use crate::common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::cluster::{Node, NodeSpec, TOKEN, reattach};
use common::*;
use serde_json::Value;
use warden_mock::{MockConfig, MockServer};

/// The nodes' lease TTL: short, so twenty outages fit in about a minute.
const TTL_SECS: f64 = 1.0;
/// Outages, and turns streaming during each.
const ROUNDS: usize = 20;
const TURNS: usize = 6;
/// How long a turn may take to end after its outage ends: a lease
/// (re-delivery after self-fencing), the takeover grace, a scan and the
/// reply itself, with room for two loaded cores.
const TURN_BOUND: Duration = Duration::from_secs(20);

async fn start(dir: &Path, id: &str, store: &str, mock: &MockServer) -> Node {
    NodeSpec::new(dir, id, store, TTL_SECS)
        .args(&["--grace", "1"])
        .upstream(mock)
        .start()
        .await
}

/// How a client's turn ended: its last event's type and data, or what it
/// saw when the bound ran out.
#[derive(Debug)]
enum Ending {
    Ended(String, Value),
    Hung(String),
}

/// Follows turn `id` (first through `first`, the stream of its `POST`) to
/// its last event: wherever a stream ends without one (its node stopped
/// the turn), re-attaches through the next node with the last event id
/// seen, as a client does. At most until `deadline`.
async fn follow(
    first: reqwest::Response,
    id: String,
    nodes: Vec<String>,
    deadline: tokio::time::Instant,
) -> Ending {
    let http = reqwest::Client::new();
    let mut last = 0u64;
    let mut seen = Vec::new();
    let mut response = Some(first);
    let mut attempt = 0usize;
    loop {
        let r = match response.take() {
            Some(r) => r,
            None => {
                if tokio::time::Instant::now() >= deadline {
                    return Ending::Hung(format!("no node served it to the end: {seen:?}"));
                }
                attempt += 1;
                let base = &nodes[attempt % nodes.len()];
                match reattach(&http, base, &id, last, Duration::from_secs(5)).await {
                    Some(r) => r,
                    // The database still away, or the turn between nodes.
                    None => continue,
                }
            }
        };
        let mut body = r.bytes_stream();
        let mut buf = String::new();
        loop {
            match next_event(&mut body, &mut buf, deadline).await {
                Ok(Some((n, kind, data))) => {
                    last = n;
                    seen.push(kind.clone());
                    if kind == "done" || kind == "error" {
                        return Ending::Ended(kind, data);
                    }
                }
                Ok(None) => break,
                Err(why) => return Ending::Hung(format!("{why}: {seen:?}")),
            }
        }
    }
}

/// Posts `message` to session `key` on `base`, asking for its events: the
/// turn's id and its stream.
async fn stream_turn(base: &str, key: &str, message: &str) -> (String, reqwest::Response) {
    let r = tokio::time::timeout(
        Duration::from_secs(30),
        reqwest::Client::new()
            .post(format!("{base}/v1/turns"))
            .bearer_auth(TOKEN)
            .header("content-type", "application/json")
            .header("accept", "text/event-stream")
            .body(serde_json::json!({"key": key, "message": message}).to_string())
            .send(),
    )
    .await
    .expect("an answer in time")
    .expect("post");
    assert_eq!(r.status(), 200, "{key} on {base}");
    let id = r.headers()["x-warden-turn-id"]
        .to_str()
        .expect("ascii")
        .to_owned();
    (id, r)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_turn_ends_across_twenty_outages_as_long_as_the_lease_time_left() {
    let Some(url) = fresh_db("warden_o").await else {
        return;
    };
    let db = url.rsplit('/').next().expect("a database").to_owned();
    // A reply of about two seconds: streaming when each outage starts.
    let mock = MockServer::start(
        MockConfig::default()
            .with_reply("one two three four five six seven eight nine ten eleven twelve.")
            .with_frame_interval(Duration::from_millis(150)),
    )
    .await
    .expect("mock");
    let dir = tempfile::tempdir().expect("tempdir");
    let mut nodes = Vec::new();
    for id in ["node-a", "node-b", "node-c"] {
        nodes.push(start(dir.path(), id, &url, &mock).await);
    }
    let bases: Vec<String> = nodes.iter().map(|n| n.base.clone()).collect();
    let pg = warden_pg::low_level::PgStore::connect(&url)
        .await
        .expect("pg");
    let t0 = Instant::now();
    let mut hung = Vec::new();
    let mut hung_keys: Vec<String> = Vec::new();
    let mut ends = std::collections::BTreeMap::<String, usize>::new();
    for round in 0..ROUNDS {
        // Turns streaming on every node: new sessions, each owned by the
        // node it was sent to.
        let mut clients = Vec::new();
        for i in 0..TURNS {
            let key = format!("r{round}-s{i}");
            let base = &bases[i % bases.len()];
            let (id, stream) = stream_turn(base, &key, "hello").await;
            let mut others = bases.clone();
            others.rotate_left(i % bases.len());
            clients.push((key, id, stream, others));
        }
        // The outage: from 0.6 to 1.1 TTL, across the rounds — around the
        // time left on a lease renewed every third of it (2/3 to 1 TTL).
        tokio::time::sleep(Duration::from_millis(300)).await;
        let down =
            Duration::from_secs_f64(TTL_SECS * (0.6 + 0.5 * round as f64 / (ROUNDS - 1) as f64));
        let deadline = tokio::time::Instant::now() + down + TURN_BOUND;
        let followed: Vec<_> = clients
            .into_iter()
            .map(|(key, id, stream, others)| {
                let follow = follow(stream, id.clone(), others, deadline);
                (key, id, tokio::spawn(follow))
            })
            .collect();
        database_away_for(&db, down).await;
        let before = hung.len();
        for (key, id, client) in followed {
            match client.await.expect("client") {
                Ending::Ended(kind, data) => {
                    if kind == "error" {
                        assert!(
                            data["code"].as_str().is_some_and(|c| !c.is_empty()),
                            "an error ends a turn with its code: {data}"
                        );
                    }
                    let how = match data["code"].as_str() {
                        Some(code) if kind == "error" => format!("error {code}"),
                        _ => kind,
                    };
                    *ends.entry(how).or_default() += 1;
                }
                Ending::Hung(why) => {
                    let lease = pg.lease_info(&warden_core::SessionKey::new(&key)).await;
                    hung_keys.push(key.clone());
                    hung.push(format!(
                        "round {round} ({:.2}s down): {key} turn {id}: {why}; lease {lease:?}",
                        down.as_secs_f64()
                    ));
                }
            }
        }
        eprintln!(
            "round {round}: {:.2}s down, {} of {TURNS} hung, {:.1}s in",
            down.as_secs_f64(),
            hung.len() - before,
            t0.elapsed().as_secs_f64()
        );
    }
    eprintln!(
        "{ROUNDS} outages, {} turns in {:.1}s: {ends:?}; {} hung",
        ROUNDS * TURNS,
        t0.elapsed().as_secs_f64(),
        hung.len()
    );
    // What the nodes logged about the sessions that hung, if any.
    for mut n in nodes {
        let _ = n.child.kill().await;
        let log = n.stderr.await.unwrap_or_default();
        let about: Vec<&str> = log
            .lines()
            .filter(|l| hung_keys.iter().any(|k| l.contains(k.as_str())))
            .take(60)
            .collect();
        if !about.is_empty() {
            eprintln!("--- {}:\n{}", n.base, about.join("\n"));
        }
    }
    assert!(
        hung.is_empty(),
        "turns that never ended:\n{}",
        hung.join("\n")
    );
}
