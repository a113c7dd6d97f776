//! Load spreads (issue 39, item 2). Three `warden serve --store
//! postgres://…` nodes (real processes) against `warden mock` hold 300
//! idle sessions, 100 each; one is killed, its sessions are used meanwhile
//! (each gets a turn, so the two others take them: 150 / 150), and it
//! comes back under its name. Within 60 s of its return every node holds
//! within ±20 % of the mean, the sessions handed over idle only: turns run
//! on random sessions through random nodes the whole time, and each ends
//! `done` once, with no `continuing` or `retrying` (nothing moved under a
//! running turn), each reply generated upstream once. Before, nothing ever
//! rebalanced: the returning node stayed at 0.
//!
//! Needs `WARDEN_PG_URL` (an admin URL; `.ci/run` starts a throwaway
//! cluster); without it the test says why and passes, unless
//! `WARDEN_REQUIRE_POSTGRES=1` (CI) makes it fail.

use crate::common;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use common::cluster::{Node, NodeSpec, TOKEN, reattach};
use common::*;
use futures_util::StreamExt as _;
use serde_json::Value;
use warden_mock::{MockConfig, MockServer};

/// The nodes' lease TTL: short, so the killed node's leases run out soon,
/// and not 1 s: a node renews every third of it, and on CI's two loaded
/// cores renewals of 300 leases came late enough at 1 s that 87 of them
/// were given up (the node's own fence) with no node killed yet, so the
/// survivors held 218 of 300 sessions and the test failed.
const TTL: f64 = 2.0;
/// Rounds every second, at most 25 sessions handed over by a node a round.
const REBALANCE: [&str; 4] = ["--rebalance-interval", "1", "--rebalance-limit", "25"];
const SESSIONS: usize = 300;
/// How long after its return the node may wait for its share.
const BALANCED_WITHIN: Duration = Duration::from_secs(60);
/// Clients running turns while the load spreads, each for this long.
const CLIENTS: usize = 8;
const TURNS_FOR: Duration = Duration::from_secs(10);

/// Node `id` on `listen`, handing sessions over per [`REBALANCE`]; its
/// base URL beside it.
async fn start(
    dir: &Path,
    id: &str,
    listen: &str,
    store: &str,
    mock: &MockServer,
    ttl: f64,
) -> (Node, String) {
    let node = NodeSpec::listening(dir, id, store, ttl, listen)
        .args(&["--grace", "1"])
        .args(&REBALANCE)
        .upstream(mock)
        .start()
        .await;
    let base = node.base.clone();
    (node, base)
}

/// The SSE events of `body` (`id`, `event`, `data`) until it ends or
/// `deadline` passes (an `Err`).
async fn events<B: AsRef<[u8]>>(
    body: &mut (impl futures_util::Stream<Item = reqwest::Result<B>> + Unpin),
    buf: &mut String,
    deadline: tokio::time::Instant,
) -> Result<Option<(u64, String, Value)>, String> {
    loop {
        if let Some(end) = buf.find("\n\n") {
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
            let Some(id) = id else { continue };
            let data = serde_json::from_str(&data).map_err(|e| format!("data: {e}"))?;
            return Ok(Some((id, kind, data)));
        }
        match tokio::time::timeout_at(deadline, body.next()).await {
            Err(_) => return Err("no end before the bound".into()),
            Ok(Some(Ok(b))) => buf.push_str(&String::from_utf8_lossy(b.as_ref())),
            Ok(Some(Err(_)) | None) => return Ok(None),
        }
    }
}

/// What one turn did: its id, the events its client saw, and the `503`s
/// (and refused connections) its `POST` met first.
struct Turn {
    id: String,
    seen: Vec<(String, Value)>,
    refused: usize,
}

/// Runs `message` on session `key` as a client does: posts it to
/// `bases[first]` (another node after a `503` or a refused connection),
/// then follows its events to the end, re-attaching with `Last-Event-ID`
/// wherever a stream ends early; at most until `deadline`.
async fn turn(
    bases: &[String],
    first: usize,
    key: &str,
    message: &str,
    deadline: tokio::time::Instant,
) -> Result<Turn, String> {
    let http = reqwest::Client::new();
    let mut refused = 0;
    let mut at = first;
    let (id, mut response) = loop {
        if tokio::time::Instant::now() >= deadline {
            return Err(format!("{key}: not accepted in time ({refused} refusals)"));
        }
        let base = &bases[at % bases.len()];
        let posted = http
            .post(format!("{base}/v1/turns"))
            .bearer_auth(TOKEN)
            .header("accept", "text/event-stream")
            .header("content-type", "application/json")
            // A POST whose answer was lost (its node killed while relaying
            // it) is sent again as the same turn, not a second one.
            .header("idempotency-key", message.replace(' ', "-"))
            .body(serde_json::json!({"key": key, "message": message}).to_string())
            .timeout(Duration::from_secs(10))
            .send()
            .await;
        match posted {
            Ok(r) if r.status() == 200 => {
                let id = r.headers()["x-warden-turn-id"]
                    .to_str()
                    .expect("ascii")
                    .to_owned();
                break (id, Some(r));
            }
            Ok(r) if r.status() == 503 => {}
            // Its first try accepted before its node died, being
            // re-delivered now: ask again.
            Ok(r) if r.status() == 409 && r.headers().contains_key("retry-after") => {}
            Ok(r) => {
                let status = r.status();
                return Err(format!(
                    "{key}: {status} {}",
                    r.text().await.unwrap_or_default()
                ));
            }
            Err(_) => {}
        }
        refused += 1;
        at += 1;
        tokio::time::sleep(Duration::from_millis(150)).await;
    };
    let mut last = 0u64;
    let mut seen = Vec::new();
    let mut attempt = first;
    loop {
        let r = match response.take() {
            Some(r) => r,
            None => {
                if tokio::time::Instant::now() >= deadline {
                    return Err(format!("{key} turn {id}: no end in time: {seen:?}"));
                }
                let base = &bases[attempt % bases.len()];
                attempt += 1;
                match reattach(&http, base, &id, last, Duration::from_secs(10)).await {
                    Some(r) => r,
                    // The database still away, or the turn between nodes.
                    None => continue,
                }
            }
        };
        let mut body = r.bytes_stream();
        let mut buf = String::new();
        while let Some((n, kind, data)) = events(&mut body, &mut buf, deadline).await? {
            if n <= last {
                return Err(format!("{key} turn {id}: event {n} again after {last}"));
            }
            last = n;
            let end = kind == "done" || kind == "error";
            seen.push((kind, data));
            if end {
                return Ok(Turn { id, seen, refused });
            }
        }
    }
}

/// What is wrong with `t`, read again from the start through `base`: it
/// must end `done`, once, with nothing continued or retried but for the
/// codes `allowed` (the turns a kill interrupted: `ENODE_LOST`).
async fn check(base: &str, key: &str, t: &Turn, allowed: &[&str]) -> Option<String> {
    let marked: Vec<String> = t
        .seen
        .iter()
        .filter(|(k, _)| k == "continuing" || k == "retrying")
        .filter(|(_, d)| !allowed.iter().any(|a| d["code"] == *a))
        .map(|(k, d)| format!("{k} {}", d["code"]))
        .collect();
    if !marked.is_empty() {
        return Some(format!("{key} turn {}: interrupted: {marked:?}", t.id));
    }
    let (last, data) = t.seen.last()?;
    if last != "done" {
        return Some(format!("{key} turn {}: ended {last} {data}", t.id));
    }
    let r = reqwest::Client::new()
        .get(format!("{base}/v1/turns/{}/events", t.id))
        .bearer_auth(TOKEN)
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .ok()?;
    let mut body = r.bytes_stream();
    let mut buf = String::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let mut ends = Vec::new();
    while let Ok(Some((_, kind, _))) = events(&mut body, &mut buf, deadline).await {
        if kind == "done" || kind == "error" {
            ends.push(kind);
            break;
        }
    }
    (ends != ["done"]).then(|| format!("{key} turn {}: stored ends {ends:?}", t.id))
}

/// The sessions each live node holds now, by node.
async fn held(pg: &warden_pg::low_level::PgStore) -> BTreeMap<String, u64> {
    pg.nodes()
        .await
        .expect("nodes")
        .into_iter()
        .filter(|n| n.state == warden_pg::cluster::NodeState::Alive)
        .map(|n| (n.node_id, n.sessions))
        .collect()
}

/// Whether every one of `nodes` live members holds within ±20 % of their
/// mean.
fn balanced(counts: &BTreeMap<String, u64>, nodes: usize) -> bool {
    let total: u64 = counts.values().sum();
    let mean = total as f64 / nodes as f64;
    counts.len() == nodes
        && total > 0
        && counts
            .values()
            .all(|&c| (c as f64 - mean).abs() <= 0.2 * mean)
}

/// Runs one turn on each of `keys` (24 at a time), the `i`th posted to
/// `bases[route(i)]`: the turns, or what went wrong.
async fn turns_on(
    bases: &[String],
    keys: &[String],
    route: impl Fn(usize) -> usize,
    tag: &str,
) -> Vec<(String, String, Result<Turn, String>)> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    futures_util::stream::iter(keys.iter().enumerate().map(|(i, key)| {
        let message = format!("{tag} for {key}");
        let first = route(i);
        async move {
            let t = turn(bases, first, key, &message, deadline).await;
            (key.clone(), message, t)
        }
    }))
    .buffer_unordered(24)
    .collect()
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_returning_node_gets_its_share_of_idle_sessions_and_no_turn_is_moved() {
    let Some(url) = fresh_db("warden_spread").await else {
        return;
    };
    let reply: Vec<String> = (0..12).map(|i| format!("w{i:02}")).collect();
    let mock = MockServer::start(
        MockConfig::default()
            .with_reply(reply.join(" ") + ".")
            .with_frame_interval(Duration::from_millis(50)),
    )
    .await
    .expect("mock");
    let dir = tempfile::tempdir().expect("tempdir");
    let ids = ["node-a", "node-b", "node-c"];
    let mut nodes = Vec::new();
    let mut bases = Vec::new();
    for id in ids {
        let (node, base) = start(dir.path(), id, "127.0.0.1:0", &url, &mock, TTL).await;
        nodes.push(node);
        bases.push(base);
    }
    let pg = warden_pg::low_level::PgStore::connect(&url)
        .await
        .expect("pg");
    let keys: Vec<String> = (0..SESSIONS).map(|i| format!("spread-{i:03}")).collect();
    let mut failures = Vec::new();
    let mut all_turns = Vec::new();

    // 300 sessions, a turn each, 100 started on each node; idle since.
    let made = turns_on(&bases, &keys, |i| i % 3, "hello").await;
    all_turns.extend(made);
    let before = held(&pg).await;
    eprintln!("sessions per node at the start: {before:?}");

    // node-b dies; its sessions are used meanwhile, so the others take them.
    let b_keys: Vec<String> = keys.iter().skip(1).step_by(3).cloned().collect();
    let _ = nodes[1].child.kill().await;
    let dead_by = Instant::now() + Duration::from_secs(10);
    while held(&pg).await.contains_key("node-b") {
        assert!(
            Instant::now() < dead_by,
            "node-b still alive 10 s after its kill"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let used = turns_on(
        &bases,
        &b_keys,
        |i| if i % 2 == 0 { 0 } else { 2 },
        "meanwhile",
    )
    .await;
    for (_, _, t) in &used {
        if let Err(why) = t {
            eprintln!("meanwhile: {why}");
        }
    }
    let without_b = held(&pg).await;
    eprintln!("sessions per node with node-b dead: {without_b:?}");
    all_turns.extend(used);
    assert_eq!(
        without_b.values().sum::<u64>(),
        SESSIONS as u64,
        "node-a and node-c hold every session: {without_b:?}"
    );

    // node-b comes back under its name, on its address.
    let listen = bases[1].trim_start_matches("http://").to_owned();
    let (node, _) = start(dir.path(), "node-b", &listen, &url, &mock, TTL).await;
    nodes[1] = node;
    let back = Instant::now();
    // Turns on random sessions through random nodes while the load spreads.
    let clients: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let (bases, keys) = (bases.clone(), keys.clone());
            tokio::spawn(async move {
                let mut done = Vec::new();
                let until = tokio::time::Instant::now() + TURNS_FOR;
                let mut n = 0usize;
                while tokio::time::Instant::now() < until {
                    let pick = rand::random::<u64>() as usize;
                    let key = keys[pick % keys.len()].clone();
                    let message = format!("during {c} {n} for {key}");
                    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
                    let t = turn(&bases, pick % 3, &key, &message, deadline).await;
                    done.push((key, message, t));
                    n += 1;
                }
                done
            })
        })
        .collect();
    // Sessions per node over time, until balanced (or the bound).
    let mut timeline = Vec::new();
    let mut balanced_after = None;
    while back.elapsed() < BALANCED_WITHIN {
        let now = held(&pg).await;
        timeline.push((back.elapsed().as_secs_f64(), now.clone()));
        if balanced(&now, 3) {
            balanced_after = Some(back.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let (mut during, mut refused_during) = (0, 0);
    for client in clients {
        let done = client.await.expect("client");
        during += done.len();
        refused_during += done
            .iter()
            .filter_map(|(_, _, t)| t.as_ref().ok())
            .map(|t| t.refused)
            .sum::<usize>();
        all_turns.extend(done);
    }
    // Settled: still balanced once the turns are over.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = held(&pg).await;
    let shown: Vec<String> = timeline
        .iter()
        .step_by(2)
        .map(|(t, c)| format!("{t:.1}s {:?}", c.values().collect::<Vec<_>>()))
        .collect();
    eprintln!("after node-b's return (a, b, c): {}", shown.join(" | "));
    let moves = pg.moves(10_000).await.expect("moves");
    let handovers = moves
        .iter()
        .filter(|m| m.kind == "handover" && m.to == "node-b")
        .count();
    eprintln!(
        "balanced {:?} after node-b's return; {after:?} 3 s after the last turn; {handovers} sessions handed to node-b; {during} turns ran meanwhile ({refused_during} POSTs answered 503 first, followed)",
        balanced_after.map(|d| format!("{:.1}s", d.as_secs_f64()))
    );
    match balanced_after {
        Some(_) if balanced(&after, 3) => {}
        Some(_) => failures.push(format!("balanced, then not: {after:?}")),
        None => failures.push(format!(
            "not within ±20 % of the mean {BALANCED_WITHIN:?} after node-b's return: {after:?}"
        )),
    }

    // Every turn ended `done` once, nothing continued or retried, and each
    // reply was generated upstream once, never continued.
    let requests = mock.requests();
    for (key, message, t) in &all_turns {
        let t = match t {
            Ok(t) => t,
            Err(why) => {
                failures.push(why.clone());
                continue;
            }
        };
        if let Some(wrong) = check(&bases[0], key, t, &[]).await {
            failures.push(wrong);
        }
        let digest = warden_mock::prompt_digest(message);
        let of: Vec<_> = requests
            .iter()
            .filter(|r| r.prompt_digest == Some(digest))
            .collect();
        if of.len() != 1 || of[0].continuation.is_some() {
            failures.push(format!("{message:?} asked upstream {} times", of.len()));
        }
    }
    eprintln!("{} turns, {} failures", all_turns.len(), failures.len());

    // `warden cluster status` shows the balance.
    let status = run(&["cluster", "status", "--store", &url]).await;
    let text = stdout(&status);
    if !text.contains("BALANCE: 300 sessions on 3 live nodes, mean 100.0") {
        failures.push(format!("cluster status: {text}"));
    }
    for mut n in nodes {
        let _ = n.child.kill().await;
        let log = n.stderr.await.unwrap_or_default();
        if !failures.is_empty() {
            let tail: Vec<&str> = log.lines().rev().take(60).collect();
            eprintln!(
                "---\n{}",
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The busy-spread test's lease TTL: short, and still safe from the
/// self-fencing a 1 s TTL met on two loaded shared cores (a node stalled
/// past 2/3 of it gave leases up, ending answered turns `ETURN_END_LOST`).
const BUSY_TTL: f64 = 2.0;
/// Sessions under back-to-back load in the busy-spread test.
const BUSY_SESSIONS: usize = 30;
/// How long one turn of the busy-spread test may take (about a second
/// alone; a failover, a move at a turn boundary and a loaded machine add
/// seconds).
const BUSY_TURN_WITHIN: Duration = Duration::from_secs(12);
/// How long after a kill or a return every node must be within ±20 % of
/// the mean (issue 50 item 3).
const BUSY_BALANCED_WITHIN: Duration = Duration::from_secs(30);

/// Polls the live members' counts every 250 ms until `nodes` of them hold
/// all `sessions`, each within ±20 % of their mean, or `within` passes:
/// how long it took (or `None`), and the counts seen on the way.
async fn until_balanced(
    pg: &warden_pg::low_level::PgStore,
    nodes: usize,
    sessions: u64,
    within: Duration,
) -> (Option<Duration>, Vec<(f64, BTreeMap<String, u64>)>) {
    let from = Instant::now();
    let mut timeline = Vec::new();
    while from.elapsed() < within {
        let now = held(pg).await;
        timeline.push((from.elapsed().as_secs_f64(), now.clone()));
        if balanced(&now, nodes) && now.values().sum::<u64>() == sessions {
            return (Some(from.elapsed()), timeline);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    (None, timeline)
}

/// `timeline` in one line: seconds, then each node's count.
fn shown(timeline: &[(f64, BTreeMap<String, u64>)]) -> String {
    let shown: Vec<String> = timeline
        .iter()
        .step_by(2)
        .map(|(t, c)| format!("{t:.1}s {:?}", c.values().collect::<Vec<_>>()))
        .collect();
    shown.join(" | ")
}

/// The last hour's moves `GET /v1/cluster` counts on `base`: (from, to,
/// kind) → sessions.
async fn moved(base: &str) -> BTreeMap<(String, String, String), u64> {
    let cluster = reqwest::Client::new()
        .get(format!("{base}/v1/cluster"))
        .bearer_auth(TOKEN)
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .expect("GET /v1/cluster")
        .text()
        .await
        .expect("GET /v1/cluster's body");
    let cluster: Value = serde_json::from_str(&cluster).expect("cluster json");
    let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    cluster["moved_last_hour"]
        .as_array()
        .expect("moved_last_hour")
        .iter()
        .map(|m| {
            (
                (text(&m["from"]), text(&m["to"]), text(&m["kind"])),
                m["sessions"].as_u64().unwrap_or(0),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_sessions_spread_after_a_kill_and_a_return_and_no_turn_is_moved() {
    let Some(url) = fresh_db("warden_busy_spread").await else {
        return;
    };
    let reply: Vec<String> = (0..8).map(|i| format!("b{i:02}")).collect();
    let mock = MockServer::start(
        MockConfig::default()
            .with_reply(reply.join(" ") + ".")
            .with_frame_interval(Duration::from_millis(80)),
    )
    .await
    .expect("mock");
    let dir = tempfile::tempdir().expect("tempdir");
    let ids = ["node-a", "node-b", "node-c"];
    let mut nodes = Vec::new();
    let mut bases = Vec::new();
    for id in ids {
        let (node, base) = start(dir.path(), id, "127.0.0.1:0", &url, &mock, BUSY_TTL).await;
        nodes.push(node);
        bases.push(base);
    }
    let pg = warden_pg::low_level::PgStore::connect(&url)
        .await
        .expect("pg");
    let keys: Vec<String> = (0..BUSY_SESSIONS).map(|i| format!("busy-{i:02}")).collect();
    let mut failures = Vec::new();
    let mut all_turns = turns_on(&bases, &keys, |i| i % 3, "hello").await;
    eprintln!("sessions per node at the start: {:?}", held(&pg).await);

    // Every session runs turns back to back with the next one always
    // queued: two clients each post its next turn as soon as their last is
    // done, each through a random node, until `stop`. So a session is
    // never idle, and only a move at a turn boundary can spread them.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let clients: Vec<_> = keys
        .iter()
        .flat_map(|key| (0..2).map(move |c| (key.clone(), c)))
        .map(|(key, c)| {
            let (bases, stop) = (bases.clone(), stop.clone());
            tokio::spawn(async move {
                let mut done = Vec::new();
                let mut n = 0usize;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let first = rand::random::<u64>() as usize % 3;
                    let message = format!("busy {c} {n} for {key}");
                    // Bounded, so a turn the kill stranded (answered, its
                    // end lost with its node: ended by a sweep up to a
                    // minute later) does not stop the load.
                    let deadline = tokio::time::Instant::now() + BUSY_TURN_WITHIN;
                    let began = Instant::now();
                    let t = turn(&bases, first, &key, &message, deadline).await;
                    done.push(((key.clone(), message, t), (began, Instant::now())));
                    n += 1;
                }
                done
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(2)).await;

    // node-b dies under load: the two others split its sessions.
    let at_kill = held(&pg).await;
    let _ = nodes[1].child.kill().await;
    let killed = Instant::now();
    let (after_kill, timeline) =
        until_balanced(&pg, 2, BUSY_SESSIONS as u64, BUSY_BALANCED_WITHIN).await;
    let counts = timeline.last().map(|(_, c)| c.clone()).unwrap_or_default();
    eprintln!(
        "node-b killed at {at_kill:?}; balanced {:?} after: {}",
        after_kill.map(|d| format!("{:.1}s", d.as_secs_f64())),
        shown(&timeline)
    );
    if after_kill.is_none() {
        failures.push(format!(
            "not within ±20 % of the mean {BUSY_BALANCED_WITHIN:?} after node-b's kill: {counts:?}"
        ));
    }
    // Its sessions went to both survivors, not all to the first to look.
    let took: BTreeMap<String, u64> = moved(&bases[0])
        .await
        .into_iter()
        .filter(|((from, _, kind), _)| from == "node-b" && kind == "failover")
        .map(|((_, to, _), n)| (to, n))
        .collect();
    let total: u64 = took.values().sum();
    eprintln!(
        "node-b's sessions taken over {:.1}s after its kill: {took:?}",
        killed.elapsed().as_secs_f64()
    );
    let fewest = ["node-a", "node-c"].map(|n| took.get(n).copied().unwrap_or(0));
    if total == 0 || fewest.iter().any(|&n| (n as f64) < 0.25 * total as f64) {
        failures.push(format!(
            "node-b's sessions were not split over the survivors: {took:?}"
        ));
    }

    // node-b comes back under its name, on its address, with nothing: the
    // others hand it busy sessions between their turns.
    let listen = bases[1].trim_start_matches("http://").to_owned();
    let (node, _) = start(dir.path(), "node-b", &listen, &url, &mock, BUSY_TTL).await;
    nodes[1] = node;
    let (after_return, timeline) =
        until_balanced(&pg, 3, BUSY_SESSIONS as u64, BUSY_BALANCED_WITHIN).await;
    let counts = timeline.last().map(|(_, c)| c.clone()).unwrap_or_default();
    eprintln!(
        "node-b back; balanced {:?} after: {}",
        after_return.map(|d| format!("{:.1}s", d.as_secs_f64())),
        shown(&timeline)
    );
    if after_return.is_none() {
        failures.push(format!(
            "not within ±20 % of the mean {BUSY_BALANCED_WITHIN:?} after node-b's return: {counts:?}"
        ));
    }
    // The load goes on a little once balanced, then stops.
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut busy = Vec::new();
    let mut spans = BTreeMap::new();
    for client in clients {
        for (t, span) in client.await.expect("client") {
            spans.insert(t.1.clone(), span);
            busy.push(t);
        }
    }
    let handed_back = moved(&bases[0])
        .await
        .into_iter()
        .filter(|((_, to, kind), _)| to == "node-b" && kind == "handover")
        .map(|(_, n)| n)
        .sum::<u64>();

    // Every turn ended `done` once; none was interrupted but by the kill
    // (`ENODE_LOST`): a hand-over moved no running turn (`ENODE_DRAINED`),
    // and each turn not running at the kill was generated upstream once
    // (one running then may have been asked before its node died).
    let requests = mock.requests();
    let mut interrupted = 0;
    let at_the_kill = |message: &str| {
        spans
            .get(message)
            .is_some_and(|&(b, e)| b <= killed && e >= killed)
    };
    all_turns.extend(busy);
    let mut stranded = Vec::new();
    for (key, message, t) in &all_turns {
        // A turn running at the kill may have been answered with its end
        // lost with the node (`ETURN_END_LOST`, or no end yet): the kill's,
        // not a hand-over's.
        let lost = |t: &Result<Turn, String>| match t {
            Err(_) => true,
            Ok(t) => t
                .seen
                .last()
                .is_some_and(|(k, d)| k == "error" && d["code"] == "ETURN_END_LOST"),
        };
        if at_the_kill(message) && lost(t) {
            stranded.push(key.clone());
            continue;
        }
        let t = match t {
            Ok(t) => t,
            Err(why) => {
                failures.push(why.clone());
                continue;
            }
        };
        // Only a turn running at the kill may have been continued: its node
        // died (`ENODE_LOST`; `ESTORE_UNREACHABLE` when node-b, back within
        // a moment, beat before the turn was re-delivered). A hand-over's
        // (`ENODE_DRAINED`) is never allowed.
        let allowed: &[&str] = if at_the_kill(message) {
            &["ENODE_LOST", "ESTORE_UNREACHABLE"]
        } else {
            &[]
        };
        if let Some(wrong) = check(&bases[0], key, t, allowed).await {
            failures.push(wrong);
        }
        if at_the_kill(message) {
            interrupted += 1;
            continue;
        }
        let digest = warden_mock::prompt_digest(message);
        let of: Vec<_> = requests
            .iter()
            .filter(|r| r.prompt_digest == Some(digest))
            .collect();
        if of.len() != 1 || of[0].continuation.is_some() {
            failures.push(format!(
                "{message:?} asked upstream {} times (turn {}, {} POSTs refused first)",
                of.len(),
                t.id,
                t.refused
            ));
        }
    }
    eprintln!(
        "{} turns ({interrupted} running at the kill ended `done`, {stranded:?} stranded by it), {handed_back} sessions handed to node-b, {} failures",
        all_turns.len(),
        failures.len()
    );
    for mut n in nodes {
        let _ = n.child.kill().await;
        let log = n.stderr.await.unwrap_or_default();
        if !failures.is_empty() {
            let tail: Vec<&str> = log.lines().rev().take(40).collect();
            eprintln!(
                "---\n{}",
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
