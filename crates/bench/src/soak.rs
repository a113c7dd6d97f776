//! Section 9, `soak`: `warden serve` under many concurrent SSE clients
//! (issue #15). One process holds the mock LLM server, a real `warden
//! serve` (the crate's router on a loopback socket, a sled store on disk,
//! the Anthropic source) and the clients (`reqwest`, one connection each).
//! Every client runs turns back to back in its own workspace for the
//! duration; 5 % of first attempts stall mid-text with the socket open
//! (the watchdog kills them and the reply is continued), and 5 % of turns
//! drop their connection after a few events and re-attach with
//! `Last-Event-ID`.
//!
//! Checked per turn: the event ids run 1, 2, 3 … without a gap or a
//! repeat across the re-attach, the text equals the mock's reply exactly
//! once, and the last event is `done`. Reported: turns, lost turns (a turn
//! the client could not finish within 30 s), errors other than the
//! injected faults, the latency each text event gains between the source
//! yielding it and the client parsing it (p50/p99, at full load and with
//! 10 clients as the baseline measured in the same run), and the process's
//! RSS and live heap before, at the end, and once finished turns expire.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;

use futures_util::StreamExt;
use futures_util::future::BoxFuture;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;
use warden_core::{
    AgentEvent, EventSource, EventStream, Frame, RetryPolicy, SessionConfig, SessionKey,
    StreamError, Supervisor, SupervisorConfig, TurnRequest, WatchdogConfig,
};
use warden_llm::sse::{Parsed, SseParser};
use warden_mock::{MockConfig, MockServer, Scenario};

const TOKEN: &str = "soak-token";
/// Watchdog timeout: a stalled attempt is killed this long after its last
/// frame.
const TIMEOUT: Duration = Duration::from_secs(1);
/// Pause between the mock's frames.
const FRAME: Duration = Duration::from_millis(50);
/// How long one turn may take before the client calls it lost.
const TURN_BOUND: Duration = Duration::from_secs(30);
const STALL_RATE: f64 = 0.05;
const DROP_RATE: f64 = 0.05;

/// The reply every turn streams: 40 distinct words, about 20 deltas.
fn reply() -> String {
    (0..40)
        .map(|i| format!("w{i:02}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// When the source yielded each text delta, by session: the end offset of
/// the delta in the turn's text, and the instant.
#[derive(Default)]
struct Stamps(Mutex<HashMap<String, Vec<(usize, Instant)>>>);

impl Stamps {
    fn lock(&self) -> parking_lot::MutexGuard<'_, HashMap<String, Vec<(usize, Instant)>>> {
        self.0.lock()
    }

    /// When the delta ending at `end` of `key`'s current turn was yielded.
    fn at(&self, key: &str, end: usize) -> Option<Instant> {
        let map = self.lock();
        let v = map.get(key)?;
        v.iter().rev().find(|(e, _)| *e == end).map(|(_, t)| *t)
    }
}

/// The Anthropic source, stalling 5 % of first attempts (the mock's
/// `stall` scenario, mid-text) and stamping every text delta it yields.
struct Soaked {
    normal: Arc<dyn EventSource>,
    stalling: Arc<dyn EventSource>,
    stamps: Arc<Stamps>,
    stalls: Arc<AtomicU64>,
}

impl EventSource for Soaked {
    fn open(&self, r: TurnRequest) -> BoxFuture<'static, Result<EventStream, StreamError>> {
        let key = r.session_key.to_string();
        let mut end = match &r.continuation {
            Some(c) => c.partial_text.len(),
            None => 0,
        };
        if r.attempt == 1 {
            self.stamps.lock().insert(key.clone(), Vec::new());
        }
        let stall = r.attempt == 1 && rand::rng().random_bool(STALL_RATE);
        let source = if stall {
            self.stalls.fetch_add(1, Ordering::Relaxed);
            &self.stalling
        } else {
            &self.normal
        };
        let opening = source.open(r);
        let stamps = Arc::clone(&self.stamps);
        Box::pin(async move {
            let stream = opening.await?;
            let stamped = stream.inspect(move |item| {
                if let Ok(Frame::Event(AgentEvent::TextDelta(t))) = item {
                    end += t.len();
                    if let Some(v) = stamps.lock().get_mut(&key) {
                        v.push((end, Instant::now()));
                    }
                }
            });
            Ok(Box::pin(stamped) as EventStream)
        })
    }

    fn provider(&self) -> &str {
        self.normal.provider()
    }

    fn continues(&self) -> bool {
        self.normal.continues()
    }
}

/// What the clients saw.
#[derive(Default)]
struct Tally {
    turns: u64,
    dropped: u64,
    lost: u64,
    errors: u64,
    bad_ids: u64,
    bad_text: u64,
    continued: u64,
    unstamped: u64,
    latencies_us: Vec<u64>,
    first_error: Option<String>,
}

impl Tally {
    fn merge(&mut self, o: Tally) {
        self.turns += o.turns;
        self.dropped += o.dropped;
        self.lost += o.lost;
        self.errors += o.errors;
        self.bad_ids += o.bad_ids;
        self.bad_text += o.bad_text;
        self.continued += o.continued;
        self.unstamped += o.unstamped;
        self.latencies_us.extend(o.latencies_us);
        if self.first_error.is_none() {
            self.first_error = o.first_error;
        }
    }

    fn error(&mut self, what: String) {
        self.errors += 1;
        self.first_error.get_or_insert(what);
    }
}

/// One parsed SSE event of a turn.
struct Event {
    id: u64,
    kind: String,
    data: serde_json::Value,
}

/// Largest event a turn's stream may carry here (a text delta).
const MAX_EVENT_BYTES: usize = 1024 * 1024;

/// Moves the events `frames` holds into `out`; an event without a numeric
/// id or with data that is not JSON is an error (serve numbers and encodes
/// every event).
fn collect(frames: &mut VecDeque<Parsed>, out: &mut Vec<Event>) -> Result<(), String> {
    while let Some(frame) = frames.pop_front() {
        let Parsed::Event(ev) = frame else { continue };
        let id = ev
            .id
            .as_deref()
            .and_then(|id| id.parse().ok())
            .ok_or_else(|| format!("`{}` event without a numeric id", ev.event))?;
        let data = serde_json::from_str(&ev.data)
            .map_err(|e| format!("`{}` event {id} is not JSON: {e}", ev.event))?;
        out.push(Event {
            id,
            kind: ev.event,
            data,
        });
    }
    Ok(())
}

struct Client {
    http: reqwest::Client,
    base: String,
    key: String,
    stamps: Arc<Stamps>,
    expected: Arc<String>,
}

/// How a turn's read ended.
enum Read {
    /// The last event (`done` or `error`) arrived.
    Ended,
    /// The client dropped the connection on purpose.
    Dropped,
    /// The body ended or failed before the last event.
    Broken(String),
}

impl Client {
    /// Reads events into `seen`, stamping text latencies; drops the
    /// connection after `drop_after` new events if set.
    async fn read(
        &self,
        response: reqwest::Response,
        seen: &mut Vec<Event>,
        text_len: &mut usize,
        drop_after: Option<usize>,
        tally: &mut Tally,
    ) -> Read {
        let mut body = response.bytes_stream();
        let mut parser = SseParser::new(MAX_EVENT_BYTES);
        let mut frames = VecDeque::new();
        let mut fresh = Vec::new();
        let mut new_events = 0usize;
        while let Some(chunk) = body.next().await {
            let chunk = match chunk {
                Ok(c) => c,
                Err(e) => return Read::Broken(format!("body: {e}")),
            };
            if let Err(e) = parser.feed(&chunk, &mut frames) {
                return Read::Broken(format!("event stream: {e}"));
            }
            if let Err(e) = collect(&mut frames, &mut fresh) {
                return Read::Broken(e);
            }
            let now = Instant::now();
            for ev in fresh.drain(..) {
                if ev.kind == "text" {
                    let t = ev.data["text"].as_str().unwrap_or("");
                    *text_len += t.len();
                    match self.stamps.at(&self.key, *text_len) {
                        Some(at) => tally
                            .latencies_us
                            .push(u64::try_from(now.duration_since(at).as_micros()).unwrap_or(0)),
                        None => tally.unstamped += 1,
                    }
                }
                let last = ev.kind == "done" || ev.kind == "error";
                seen.push(ev);
                new_events += 1;
                if last {
                    return Read::Ended;
                }
                if drop_after.is_some_and(|n| new_events >= n) {
                    return Read::Dropped;
                }
            }
        }
        Read::Broken("the event stream ended before the turn did".into())
    }

    /// One turn, checked; its outcome goes into `tally`.
    async fn turn(&self, n: u64, drop_after: Option<usize>, tally: &mut Tally) {
        tally.turns += 1;
        let body = serde_json::json!({"key": self.key, "message": format!("turn {n}")});
        let response = self
            .http
            .post(format!("{}/v1/turns", self.base))
            .bearer_auth(TOKEN)
            .header("accept", "text/event-stream")
            .json(&body)
            .send()
            .await;
        let response = match response {
            Ok(r) if r.status().is_success() => r,
            Ok(r) => return tally.error(format!("POST /v1/turns: {}", r.status())),
            Err(e) => return tally.error(format!("POST /v1/turns: {e}")),
        };
        let Some(turn_id) = response
            .headers()
            .get("x-warden-turn-id")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
        else {
            return tally.error("no x-warden-turn-id header".into());
        };
        let mut seen = Vec::new();
        let mut text_len = 0;
        let mut read = self
            .read(response, &mut seen, &mut text_len, drop_after, tally)
            .await;
        if matches!(read, Read::Dropped) {
            tally.dropped += 1;
            let last = seen.last().map_or(0, |e| e.id);
            let again = self
                .http
                .get(format!("{}/v1/turns/{turn_id}/events", self.base))
                .bearer_auth(TOKEN)
                .header("last-event-id", last.to_string())
                .send()
                .await;
            read = match again {
                Ok(r) if r.status().is_success() => {
                    self.read(r, &mut seen, &mut text_len, None, tally).await
                }
                Ok(r) => Read::Broken(format!("re-attach: {}", r.status())),
                Err(e) => Read::Broken(format!("re-attach: {e}")),
            };
        }
        if let Read::Broken(why) = read {
            return tally.error(why);
        }
        let ids: Vec<u64> = seen.iter().map(|e| e.id).collect();
        if !ids.iter().copied().eq(1..=ids.len() as u64) {
            tally.bad_ids += 1;
        }
        let Some(last) = seen.last() else {
            return tally.error("no events".into());
        };
        if last.kind != "done" {
            return tally.error(format!("turn ended with {}: {}", last.kind, last.data));
        }
        if seen.iter().any(|e| e.kind == "continuing") {
            tally.continued += 1;
        }
        let text: String = seen
            .iter()
            .filter(|e| e.kind == "text")
            .filter_map(|e| e.data["text"].as_str())
            .collect();
        if text != *self.expected || last.data["text"].as_str() != Some(self.expected.as_str()) {
            tally.bad_text += 1;
        }
    }

    /// Turns back to back until `until`.
    async fn run(self, until: Instant, seed: u64) -> Tally {
        let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
        let mut tally = Tally::default();
        let mut n = 0;
        while Instant::now() < until {
            n += 1;
            let drop_after = rng
                .random_bool(DROP_RATE)
                .then(|| rng.random_range(2..=12usize));
            if tokio::time::timeout(TURN_BOUND, self.turn(n, drop_after, &mut tally))
                .await
                .is_err()
            {
                tally.lost += 1;
            }
        }
        tally
    }
}

pub(crate) fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// Where the served node keeps its sessions and turns.
enum Backing {
    /// sled on local disk; turns in memory (a single node).
    Sled,
    /// sled on local disk with the turn logs in it too (`warden serve` on
    /// one machine: every batch of events flushed before it is sent); the
    /// store is handed back for its flush counts.
    SledTurns(std::sync::Mutex<Option<warden_store::SledStore>>),
    /// A cluster node on this PostgreSQL database (fenced records, and
    /// every turn event stored before it is sent); the node's store is
    /// handed back for its group-commit counts.
    Postgres(
        String,
        bool,
        std::sync::Mutex<Option<warden_pg::low_level::NodeStore>>,
    ),
}

/// A served node (mock + supervisor + HTTP) and `clients` clients for
/// `secs`; the merged tally and the number of stalls injected.
async fn soak(clients: usize, secs: u64, keep: Duration) -> (Tally, u64, Duration) {
    soak_on(&Backing::Sled, clients, secs, keep).await
}

async fn soak_on(
    backing: &Backing,
    clients: usize,
    secs: u64,
    keep: Duration,
) -> (Tally, u64, Duration) {
    let dir = tempfile::tempdir().expect("temp dir");
    let expected = Arc::new(reply());
    let mock = MockServer::start(
        MockConfig::default()
            .with_reply(expected.as_str())
            .with_frame_interval(FRAME)
            // message_start, content_block_start, ping, then ~10 deltas:
            // the stall comes mid-text.
            .with_fault_after_frames(13),
    )
    .await
    .expect("mock");
    let anthropic = |base: String| -> Arc<dyn EventSource> {
        Arc::new(
            warden_llm::AnthropicSource::new(
                warden_llm::AnthropicOptions::default().with_base_url(base),
            )
            .expect("source"),
        )
    };
    let stamps = Arc::new(Stamps::default());
    let stalls = Arc::new(AtomicU64::new(0));
    let source: Arc<dyn EventSource> = Arc::new(Soaked {
        normal: anthropic(mock.base_url()),
        stalling: anthropic(mock.scenario_base_url(Scenario::Stall)),
        stamps: Arc::clone(&stamps),
        stalls: Arc::clone(&stalls),
    });
    let mut serve_config = warden_serve::ServeConfig::new(TOKEN).with_keep_finished(keep);
    let mut renewer = None;
    let (store, recovered): (Arc<dyn warden_core::SessionStore>, _) = match backing {
        Backing::Sled => (
            Arc::new(warden_store::SledStore::open(dir.path().join("db")).expect("sled")),
            None,
        ),
        Backing::SledTurns(out) => {
            let sled = warden_store::SledStore::open(dir.path().join("db")).expect("sled");
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            serve_config = serve_config
                .with_turn_store(Arc::new(sled.turns().expect("turns")))
                .with_recovered_turns(rx);
            *out.lock().unwrap_or_else(|p| p.into_inner()) = Some(sled.clone());
            (Arc::new(sled), Some(tx))
        }
        Backing::Postgres(url, grouped, out) => {
            let pg = warden_pg::low_level::PgStore::connect(url)
                .await
                .expect("pg");
            let node = warden_pg::low_level::NodeStore::new(pg, "soak", Duration::from_secs(10))
                .with_group_commit(*grouped);
            *out.lock().unwrap_or_else(|p| p.into_inner()) = Some(node.clone());
            renewer = Some(node.spawn_renewer());
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            serve_config = serve_config
                .with_turn_store(Arc::new(node.turns()))
                .with_recovered_turns(rx);
            (Arc::new(node), Some(tx))
        }
    };
    let config = SupervisorConfig::default()
        .with_watchdog(
            WatchdogConfig::default()
                .with_default_timeout(TIMEOUT)
                .expect("valid"),
        )
        .with_session(SessionConfig::default().with_retry(
            RetryPolicy::default().with_backoff(Duration::from_millis(50), Duration::from_secs(1)),
        ));
    let mut builder = Supervisor::builder(Arc::new(move |_: &SessionKey| source.clone()))
        .config(config)
        .store(store);
    if let Some(tx) = recovered {
        builder = builder.recovered_turns(tx);
    }
    let supervisor = builder.start().await.expect("supervisor");
    let app = warden_serve::router(supervisor.clone(), serve_config);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    let server = tokio::spawn(async move { axum::serve(listener, app).await });

    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(clients)
        .build()
        .expect("client");
    let t0 = Instant::now();
    let until = t0 + Duration::from_secs(secs);
    let tasks: Vec<_> = (0..clients)
        .map(|i| {
            let client = Client {
                http: http.clone(),
                base: base.clone(),
                key: format!("soak-{i:04}"),
                stamps: Arc::clone(&stamps),
                expected: Arc::clone(&expected),
            };
            tokio::spawn(client.run(until, i as u64))
        })
        .collect();
    let mut tally = Tally::default();
    for t in tasks {
        tally.merge(t.await.expect("client task"));
    }
    let elapsed = t0.elapsed();
    supervisor.shutdown().await;
    server.abort();
    mock.shutdown().await;
    drop(renewer);
    (tally, stalls.load(Ordering::Relaxed), elapsed)
}

/// Section 11's served part: the same node and clients as the soak, on
/// sled (turns in memory) and as a cluster node on PostgreSQL (every
/// event stored before it is sent): turns/s, the latency a text event
/// gains, the checks, and the database transactions per turn.
pub async fn bench_served_on_postgres(admin: &str, quick: bool) {
    let (clients, secs) = if quick { (20, 5) } else { (50, 15) };
    println!(
        "\n{clients} SSE clients on `warden serve` for {secs} s (the soak's turns, 5 % stalls, 5 % drops with re-attach):"
    );
    println!(
        "| node | turns/s | errors | bad ids | bad text | text event latency p50 / p99 (µs) | ratio p50 / p99 | transactions per turn |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    let keep = Duration::from_secs(5);
    let (mut sled, _, sled_t) = soak_on(&Backing::Sled, clients, secs, keep).await;
    sled.latencies_us.sort_unstable();
    let (s50, s99) = (
        percentile(&sled.latencies_us, 0.5),
        percentile(&sled.latencies_us, 0.99),
    );
    println!(
        "| sled, turns in memory (baseline) | {:.0} | {} | {} | {} | {s50} / {s99} | 1.00x / 1.00x | – |",
        sled.turns as f64 / sled_t.as_secs_f64(),
        sled.errors,
        sled.bad_ids,
        sled.bad_text
    );
    let url = crate::postgres::fresh_db(admin, "served").await;
    let commit = commit_latency(&url).await;
    let mut runs = Vec::new();
    for (grouped, what) in [
        (false, "each batch its own transaction"),
        (true, "group commit"),
    ] {
        let url =
            crate::postgres::fresh_db(admin, if grouped { "served_g" } else { "served_1" }).await;
        let before = crate::postgres::commits(&url).await;
        let backing = Backing::Postgres(url.clone(), grouped, std::sync::Mutex::new(None));
        let (mut pg, _, pg_t) = soak_on(&backing, clients, secs, keep).await;
        let after = crate::postgres::commits(&url).await;
        let group = node_of(&backing).turn_commits();
        pg.latencies_us.sort_unstable();
        let (p50, p99) = (
            percentile(&pg.latencies_us, 0.5),
            percentile(&pg.latencies_us, 0.99),
        );
        println!(
            "| PostgreSQL cluster node, events stored first, {what} | {:.0} | {} | {} | {} | {p50} / {p99} | {:.2}x / {:.2}x | {:.1} |",
            pg.turns as f64 / pg_t.as_secs_f64(),
            pg.errors,
            pg.bad_ids,
            pg.bad_text,
            p50 as f64 / s50.max(1) as f64,
            p99 as f64 / s99.max(1) as f64,
            (after - before - 1).max(0) as f64 / pg.turns.max(1) as f64
        );
        if grouped {
            let target = 2 * s50 + commit.as_micros() as u64;
            println!(
                "one commit (a one-row write, median of 50): {} µs; latency target p50 ≤ 2 × {s50} + {} = {target} µs: {} ({p50} µs)",
                commit.as_micros(),
                commit.as_micros(),
                if p50 <= target { "met" } else { "missed" }
            );
            println!(
                "event batches: {} in {} transactions ({:.1} per transaction, {:.1} event transactions per turn)",
                group.batches,
                group.transactions,
                group.batches as f64 / group.transactions.max(1) as f64,
                group.transactions as f64 / pg.turns.max(1) as f64
            );
        }
        runs.push(pg);
    }
    // Many turns at once on one node, each way.
    let many = if quick { 300 } else { 1_000 };
    for grouped in [false, true] {
        let url = crate::postgres::fresh_db(admin, if grouped { "many_g" } else { "many_1" }).await;
        let before = crate::postgres::commits(&url).await;
        let backing = Backing::Postgres(url.clone(), grouped, std::sync::Mutex::new(None));
        let (mut big, _, big_t) = soak_on(&backing, many, secs, keep).await;
        let after = crate::postgres::commits(&url).await;
        let group = node_of(&backing).turn_commits();
        big.latencies_us.sort_unstable();
        let tx = (after - before - 1).max(0) as f64;
        println!(
            "{many} concurrent turns on one node for {secs} s, {}: {:.0} turns/s, errors {}, bad ids {}, bad text {}; \
             text event latency p50 / p99 {} / {} µs; {:.0} transactions/s in all ({:.1} per turn){}",
            if grouped {
                "group commit"
            } else {
                "each batch its own transaction"
            },
            big.turns as f64 / big_t.as_secs_f64(),
            big.errors,
            big.bad_ids,
            big.bad_text,
            percentile(&big.latencies_us, 0.5),
            percentile(&big.latencies_us, 0.99),
            tx / big_t.as_secs_f64(),
            tx / big.turns.max(1) as f64,
            if grouped {
                format!(
                    "; event transactions {:.0}/s carrying {:.1} batches each",
                    group.transactions as f64 / big_t.as_secs_f64(),
                    group.batches as f64 / group.transactions.max(1) as f64
                )
            } else {
                String::new()
            }
        );
        if let Some(e) = &big.first_error {
            println!("first error: {e}");
        }
    }
    let (pg, _) = (&runs[1], &runs[0]);
    for (what, t) in [("sled", &sled), ("PostgreSQL", pg)] {
        if let Some(e) = &t.first_error {
            println!("first error ({what}): {e}");
        }
    }
}

/// The node store a [`Backing::Postgres`] run used.
fn node_of(backing: &Backing) -> warden_pg::low_level::NodeStore {
    let Backing::Postgres(_, _, node) = backing else {
        panic!("a PostgreSQL run");
    };
    node.lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone()
        .expect("the run's node store")
}

/// The median latency of one commit on `url`: a one-row write in its own
/// transaction, as a fenced event batch is at its smallest.
async fn commit_latency(url: &str) -> Duration {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    let conn = tokio::spawn(conn);
    client
        .batch_execute("CREATE TABLE IF NOT EXISTS warden_bench_probe (n int)")
        .await
        .expect("probe table");
    let mut took = Vec::new();
    for n in 0..50 {
        let t = Instant::now();
        client
            .execute("INSERT INTO warden_bench_probe VALUES ($1)", &[&n])
            .await
            .expect("insert");
        took.push(t.elapsed());
    }
    drop(client);
    let _ = conn.await;
    took.sort();
    took[took.len() / 2]
}

pub async fn bench_soak(quick: bool) {
    let (clients, secs) = if quick { (200, 10) } else { (1_000, 60) };
    println!(
        "\n## 9. Soak: {clients} concurrent SSE clients on `warden serve` for {secs} s, 5 % stalls, 5 % client drops"
    );
    // Baseline first: 10 clients, same mock, same server, same checks.
    let (base, _, _) = soak(10, if quick { 3 } else { 10 }, Duration::from_secs(2)).await;
    crate::settle_memory().await;
    let (rss0, heap0) = (rss_kib(), crate::live_bytes());
    let keep = Duration::from_secs(5);
    let cpu0 = crate::process_cpu();
    let (mut tally, stalls, elapsed) = soak(clients, secs, keep).await;
    let busy = (crate::process_cpu() - cpu0) / elapsed.as_secs_f64();
    let (rss1, heap1) = (rss_kib(), crate::live_bytes());
    tokio::time::sleep(keep + Duration::from_secs(1)).await;
    crate::settle_memory().await;
    let (rss2, heap2) = (rss_kib(), crate::live_bytes());

    let mut b = base.latencies_us;
    b.sort_unstable();
    tally.latencies_us.sort_unstable();
    let l = &tally.latencies_us;
    println!(
        "| turns | turns/s | lost | errors | bad ids | bad text | stalls injected | continued | client drops (re-attached) |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    println!(
        "| {} | {:.0} | {} | {} | {} | {} | {stalls} | {} | {} |",
        tally.turns,
        tally.turns as f64 / elapsed.as_secs_f64(),
        tally.lost,
        tally.errors,
        tally.bad_ids,
        tally.bad_text,
        tally.continued,
        tally.dropped
    );
    println!(
        "\nCPU: {busy:.2} of 2 cores busy during the soak (mock, server and clients share them)"
    );
    if let Some(e) = &tally.first_error {
        println!("first error: {e}");
    }
    println!(
        "\nlatency a text event gains from the source to the client (µs; {} events, {} unmatched):",
        l.len(),
        tally.unstamped
    );
    println!("| load | p50 | p99 | p99.9 |");
    println!("|---|---:|---:|---:|");
    println!(
        "| 10 clients (baseline) | {} | {} | {} |",
        percentile(&b, 0.5),
        percentile(&b, 0.99),
        percentile(&b, 0.999)
    );
    println!(
        "| {clients} clients | {} | {} | {} |",
        percentile(l, 0.5),
        percentile(l, 0.99),
        percentile(l, 0.999)
    );
    println!(
        "| ratio | {:.2}x | {:.2}x | |",
        percentile(l, 0.5) as f64 / percentile(&b, 0.5).max(1) as f64,
        percentile(l, 0.99) as f64 / percentile(&b, 0.99).max(1) as f64
    );
    println!("\n| memory | before | end of soak | after finished turns expired |");
    println!("|---|---:|---:|---:|");
    println!(
        "| RSS (MiB) | {:.1} | {:.1} | {:.1} |",
        rss0 as f64 / 1024.0,
        rss1 as f64 / 1024.0,
        rss2 as f64 / 1024.0
    );
    println!(
        "| live heap (MiB) | {:.1} | {:.1} | {:.1} |",
        heap0 as f64 / 1048576.0,
        heap1 as f64 / 1048576.0,
        heap2 as f64 / 1048576.0
    );
}

/// Section 9c: the same soak with the turn logs durable on one machine
/// (sled behind its write-ahead log, every batch of events synced before
/// it is sent) against the in-memory log, at 10 clients and at `clients`,
/// in the same run: the latency a text event gains, and how many batches
/// each sync (fdatasync) of the log carries — the group commit.
pub async fn bench_durable_turns(quick: bool) {
    let (clients, secs) = if quick { (200, 10) } else { (1_000, 30) };
    println!(
        "\n## 9c. Durable turn logs on one machine: sled behind a write-ahead log, every event batch synced before it is sent, against the in-memory log ({secs} s each)"
    );
    println!(
        "| clients | turn log | turns/s | errors | bad ids | bad text | text event latency p50 / p99 (µs) | ratio p50 / p99 | batches per sync |"
    );
    println!("|---:|---|---:|---:|---:|---:|---:|---:|---:|");
    let keep = Duration::from_secs(5);
    for n in [10, clients] {
        let (mut memory, _, memory_t) = soak_on(&Backing::Sled, n, secs, keep).await;
        memory.latencies_us.sort_unstable();
        let (m50, m99) = (
            percentile(&memory.latencies_us, 0.5),
            percentile(&memory.latencies_us, 0.99),
        );
        println!(
            "| {n} | in memory (baseline) | {:.0} | {} | {} | {} | {m50} / {m99} | 1.00x / 1.00x | – |",
            memory.turns as f64 / memory_t.as_secs_f64(),
            memory.errors,
            memory.bad_ids,
            memory.bad_text
        );
        let backing = Backing::SledTurns(std::sync::Mutex::new(None));
        let (mut durable, _, durable_t) = soak_on(&backing, n, secs, keep).await;
        let Backing::SledTurns(store) = &backing else {
            unreachable!("built above")
        };
        let store = store.lock().unwrap_or_else(|p| p.into_inner()).take();
        let (batches, syncs) = store.map_or((0, 0), |s| s.turns().expect("turns").commits());
        durable.latencies_us.sort_unstable();
        let (d50, d99) = (
            percentile(&durable.latencies_us, 0.5),
            percentile(&durable.latencies_us, 0.99),
        );
        println!(
            "| {n} | sled + write-ahead log | {:.0} | {} | {} | {} | {d50} / {d99} | {:.2}x / {:.2}x | {:.1} ({batches} batches, {syncs} syncs) |",
            durable.turns as f64 / durable_t.as_secs_f64(),
            durable.errors,
            durable.bad_ids,
            durable.bad_text,
            d50 as f64 / m50.max(1) as f64,
            d99 as f64 / m99.max(1) as f64,
            batches as f64 / syncs.max(1) as f64
        );
        for (what, t) in [("in memory", &memory), ("durable", &durable)] {
            if let Some(e) = &t.first_error {
                println!("first error ({n} clients, {what}): {e}");
            }
        }
    }
}
