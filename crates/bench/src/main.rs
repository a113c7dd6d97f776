//! warden's benchmarks, each figure printed next to a baseline measured in
//! the same process, with the ratio.
//!
//! ```sh
//! cargo bench -p warden-bench -- --quick          # ~1 min, smaller sizes
//! cargo bench -p warden-bench                     # the full run (minutes)
//! cargo bench -p warden-bench -- frame latency    # only some sections
//! ```
//!
//! Sections:
//! 1. `frame`: CPU per stream frame with warden's StreamTask + WatchdogActor
//!    versus (a) no watchdog, (b) `tokio::time::timeout` around every read,
//!    (c) one `Sleep` per stream `reset` on every frame; 1k/10k/100k
//!    concurrent streams on both cores.
//! 2. `latency`: how late the watchdog kills silent streams among many that
//!    beat once per second, versus per-stream `sleep_until` timers; false
//!    kills counted.
//! 3. `capacity`: watchdog CPU per stream-second and memory per watched
//!    stream (the watchdog runs alone on its own thread so its CPU is
//!    measured exactly); memory per StreamTask versus a plain task.
//! 4. `fallback`: resume failure observed → fresh session ready (durable
//!    write included) versus a bare flushed store write.
//! 5. `telemetry`: turns per second through the supervisor with OTLP export
//!    to a real receiver versus no exporter (each in a child process, since a
//!    global subscriber is set once per process).
//! 6. `sends`: first sends to many workspaces at once through one
//!    supervisor (its mailbox loads each record and spawns each session)
//!    versus as many sessions started directly, concurrently (issue #12);
//!    bare flushed store saves shown for context. `WARDEN_BENCH_RAW=1`
//!    prints every run.
//! 7. `backoff`: requests a rate-limited API sees while it answers 429
//!    `retry-after: 2`, warden's shared backoff versus independent
//!    per-session retries (issue #13); see [`backoff`].
//! 8. `continuation`: a 2,000-token reply killed at 10/50/90 %: output
//!    tokens and time to the whole reply, continuation vs restart (issue
//!    #14); see [`continuation`].
//! 9. `soak`: 1,000 concurrent SSE clients running turns on `warden serve`
//!    for 60 s with 5 % stalls and 5 % client drops: lost turns, errors,
//!    added latency per event against a 10-client baseline, RSS (issue
//!    #15); see [`soak`]. `durable` (9c): the same turns with the turn
//!    logs synced to their write-ahead log before each batch is sent, against the
//!    in-memory log, at 10 and 1,000 clients (issue #25).
//! 10. `proxy`: latency and CPU `warden proxy` adds per streamed event at 1
//!     and 1,000 concurrent streams, against direct, and its memory per
//!     idle stream (issue #16); see [`proxy`].
//! 11. `cluster`: turns/s with the sessions on PostgreSQL through a cluster
//!     node's fenced store (1 and 3 nodes) against sled, and database
//!     transactions per turn (issue #17; needs `WARDEN_PG_URL`); see
//!     [`cluster`]. `served` (also within `cluster`): `warden serve` as a
//!     cluster node storing every event first, each batch its own
//!     transaction against the node's group commit, at 50 and 1,000 turns
//!     (issue #26). `scale` (11b, only when named): 10,000 sessions on
//!     three nodes, the idle load, and the failover of 3,333 of them.
//! 12. `console`: the web console with 1,000 sessions against 10 in a real
//!     headless Chromium (issue #27; needs `chromium` and `chromedriver`);
//!     see [`console`].
//! 13. `jaeger`: CPU per turn and p50/p99 turn latency with every span
//!     exported to a real Jaeger (`.ci/jaeger`'s, `WARDEN_JAEGER_OTLP`)
//!     against no exporter (issue #43); see [`jaeger`].
//! 14. `agents`: per-turn wall time of Claude Code, Codex and Gemini
//!     (and OpenCode, Kilo Code, Qwen Code and Aider, fewer turns: issue
//!     #51) through warden against the mock, each against Claude Code's
//!     (issue #41), and through the wire layer against each CLI straight;
//!     a turn stalled mid-text through the first three with the wire and
//!     without it: time and tokens as ratios (issue #47; the CLIs from
//!     `WARDEN_*_BIN`, skipped with a reason when missing); see [`agents`].
//! 15. `slow_reader`: the peak memory of a real `warden serve` whose client
//!     never reads a turn's event stream, at a 5 MB and a 50 MB reply,
//!     against its idle RSS and a client that reads (issue 52 item 11b;
//!     needs the `warden` binary built); see [`slow_reader`].
#![allow(unsafe_code)] // the counting global allocator below
#![allow(missing_docs, unreachable_pub)]

mod agents;
mod backoff;
mod cluster;
mod console;
mod continuation;
mod events;
mod jaeger;
mod postgres;
mod proxy;
mod slow_reader;
mod soak;

use std::alloc::{GlobalAlloc, Layout};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::future::BoxFuture;
use futures_util::{Stream, StreamExt};
use mimalloc::MiMalloc;
use tokio::sync::{Notify, watch};
use tokio::time::Instant;
use warden_core::stream::StreamArgs;
use warden_core::stream::StreamReport;
use warden_core::stream::StreamTask;
use warden_core::watchdog::WatchdogHandle;
use warden_core::{
    AgentEvent, AttemptId, EventSource, EventStream, Frame, SessionKey, StreamError, StreamOptions,
    TurnRequest, WatchdogActor, WatchdogConfig,
};

// ---------------------------------------------------------------- allocator

/// Counts live heap bytes, for memory-per-stream figures, on top of the
/// allocator the `warden` binary uses (mimalloc, tuned as in
/// `crates/cli/src/allocator.rs`), so the children's CPU and RSS are what
/// `warden proxy` and `warden serve` pay.
struct Counting;

/// `mi_option_purge_delay` (see `crates/cli/src/allocator.rs`).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// The `warden` binary's allocator tuning: freed memory returned after
/// 10 ms.
fn tune_allocator() {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_some() {
        return;
    }
    // SAFETY: `mi_option_set` stores a number in mimalloc's option table;
    // it may be called at any time from any thread.
    unsafe {
        libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, 10);
    }
}

static LIVE_BYTES: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every method forwards to `MiMalloc` with the arguments it was given,
// so the pointers handed out are `MiMalloc`'s and meet `GlobalAlloc`'s contract
// (alignment, size, ownership) exactly as `MiMalloc` does. The bookkeeping is
// a relaxed atomic add/sub on a static: it neither allocates (no reentry into
// the allocator) nor panics, and it does not touch the memory itself.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE_BYTES.fetch_add(layout.size(), Ordering::Relaxed);
        // SAFETY: our caller upholds `GlobalAlloc::alloc`'s contract for
        // `layout` (non-zero size), which is the contract `MiMalloc.alloc` has.
        unsafe { MiMalloc.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE_BYTES.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: our caller guarantees `ptr` came from this allocator with
        // `layout`; this allocator's pointers all come from `MiMalloc`, so
        // `ptr` was allocated by `MiMalloc` with `layout`.
        unsafe { MiMalloc.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE_BYTES.fetch_add(new_size, Ordering::Relaxed);
        LIVE_BYTES.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: as in `dealloc`, `ptr` was allocated by `MiMalloc` with
        // `layout`; our caller guarantees `new_size` is non-zero and does not
        // overflow when rounded to `layout.align()`, as `MiMalloc.realloc`
        // requires.
        unsafe { MiMalloc.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

fn live_bytes() -> usize {
    LIVE_BYTES.load(Ordering::Relaxed)
}

// ---------------------------------------------------------------- cpu time

const CLK_TCK: f64 = 100.0; // Linux USER_HZ

/// utime + stime of `/proc/<path>/stat`, in seconds.
/// Waits until the live heap stops moving (less than 64 KiB in 100 ms, at
/// most 5 s), so a measurement does not count another phase's frees.
async fn settle_memory() {
    let mut last = live_bytes();
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = live_bytes();
        if now.abs_diff(last) < 64 * 1024 {
            return;
        }
        last = now;
    }
}

fn cpu_seconds(stat_path: &str) -> f64 {
    let Ok(s) = std::fs::read_to_string(stat_path) else {
        return f64::NAN;
    };
    // Fields after the command name (which may contain spaces).
    let Some(rest) = s.rsplit_once(')').map(|(_, r)| r) else {
        return f64::NAN;
    };
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        f.get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(f64::NAN)
    };
    // rest starts at field 3 (state); utime is field 14, stime 15.
    (ticks(11) + ticks(12)) / CLK_TCK
}

fn process_cpu() -> f64 {
    cpu_seconds("/proc/self/stat")
}

// ---------------------------------------------------------------- frames

#[derive(serde::Deserialize)]
struct Delta<'a> {
    #[serde(borrow)]
    delta: TextDelta<'a>,
}

#[derive(serde::Deserialize)]
struct TextDelta<'a> {
    text: &'a str,
}

const DATA: &str = r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hello, world"}}"#;

/// The per-frame work every variant does: parse one SSE data line.
fn parse_frame() -> Result<Frame, StreamError> {
    let d: Delta<'_> = serde_json::from_str(DATA).map_err(|e| StreamError::Malformed {
        message: e.to_string(),
    })?;
    Ok(Frame::Event(AgentEvent::TextDelta(d.delta.text.to_owned())))
}

/// A stream of `remaining` frames that yields to the scheduler before each
/// one, as a network-driven stream would.
struct FrameGen {
    remaining: u64,
    ready: bool,
}

impl Stream for FrameGen {
    type Item = Result<Frame, StreamError>;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.remaining == 0 {
            return Poll::Ready(None);
        }
        if self.ready {
            self.ready = false;
            self.remaining -= 1;
            Poll::Ready(Some(parse_frame()))
        } else {
            self.ready = true;
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    }
}

/// Opens FrameGen streams once `go` flips (so setup is not measured).
struct BenchSource {
    frames: u64,
    go: watch::Receiver<bool>,
}

impl EventSource for BenchSource {
    fn open(&self, _r: TurnRequest) -> BoxFuture<'static, Result<EventStream, StreamError>> {
        let mut go = self.go.clone();
        let frames = self.frames;
        Box::pin(async move {
            let _ = go.wait_for(|g| *g).await;
            Ok(Box::pin(FrameGen {
                remaining: frames,
                ready: false,
            }) as EventStream)
        })
    }
}

struct Done {
    left: AtomicUsize,
    notify: Notify,
}

impl Done {
    fn new(n: usize) -> Arc<Self> {
        Arc::new(Self {
            left: AtomicUsize::new(n),
            notify: Notify::new(),
        })
    }
    fn one(&self) {
        if self.left.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.notify.notify_one();
        }
    }
    async fn wait(&self) {
        while self.left.load(Ordering::Acquire) > 0 {
            let n = self.notify.notified();
            if self.left.load(Ordering::Acquire) == 0 {
                break;
            }
            n.await;
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Variant {
    None,
    Timeout,
    SleepReset,
    Warden,
}

const T45: Duration = Duration::from_secs(45);

/// Runs `streams` concurrent streams of `frames` frames each and returns
/// CPU ns per frame over the frame phase: from the moment every stream may
/// start producing until every stream's last event reached its sink.
/// Every variant reads the same boxed source and hands each event to the
/// same kind of sink; only the liveness mechanism differs.
async fn run_frames(variant: Variant, streams: usize, frames: u64, wd: &WatchdogHandle) -> f64 {
    let (go_tx, go) = watch::channel(false);
    let done = Done::new(streams);
    let ended = Done::new(streams);
    let mut spawned = Vec::with_capacity(streams);
    for i in 0..streams {
        let (done, ended2) = (done.clone(), ended.clone());
        let counter = AtomicU64::new(0);
        let sink: warden_core::stream::ReportSink = Arc::new(move |r: StreamReport| match r {
            StreamReport::Event { .. } => {
                if counter.fetch_add(1, Ordering::Relaxed) + 1 == frames {
                    done.one();
                }
            }
            StreamReport::Ended { .. } => ended2.one(),
        });
        let ended = ended.clone();
        let attempt = AttemptId {
            turn: i as u64,
            attempt: 1,
        };
        let source: Arc<dyn EventSource> = Arc::new(BenchSource {
            frames,
            go: go.clone(),
        });
        let request = TurnRequest::new(SessionKey::new("bench"), i as u64, "");
        if variant == Variant::Warden {
            let args = StreamArgs {
                attempt,
                source,
                request,
                watchdog: wd.clone(),
                options: StreamOptions::default(),
                sink,
                span: tracing::Span::none(),
            };
            spawned.push(
                StreamTask::spawn(args)
                    .map(|_| ())
                    .map_err(|e| e.to_string()),
            );
            continue;
        }
        tokio::spawn(async move {
            let Ok(mut s) = source.open(request).await else {
                return;
            };
            let deliver = |f: Result<Frame, StreamError>| {
                if let Ok(Frame::Event(event)) = f {
                    sink(StreamReport::Event {
                        attempt,
                        event,
                        credit: warden_core::stream::Credit::none(),
                    });
                }
            };
            match variant {
                Variant::None => {
                    while let Some(f) = s.next().await {
                        deliver(f);
                    }
                }
                Variant::Timeout => {
                    while let Ok(Some(f)) = tokio::time::timeout(T45, s.next()).await {
                        deliver(f);
                    }
                }
                Variant::SleepReset => {
                    let sleep = tokio::time::sleep(T45);
                    tokio::pin!(sleep);
                    loop {
                        tokio::select! {
                            biased;
                            f = s.next() => match f {
                                Some(f) => {
                                    sleep.as_mut().reset(Instant::now() + T45);
                                    deliver(f);
                                }
                                None => break,
                            },
                            () = &mut sleep => break,
                        }
                    }
                }
                Variant::Warden => {}
            }
            ended.one();
        });
    }
    if let Some(Err(e)) = spawned.into_iter().find(Result::is_err) {
        panic!("spawn failed: {e}");
    }
    tokio::time::sleep(Duration::from_millis(100)).await; // let setup settle
    let cpu0 = process_cpu();
    let _ = go_tx.send(true);
    done.wait().await;
    let cpu = process_cpu() - cpu0;
    ended.wait().await;
    cpu * 1e9 / (streams as u64 * frames) as f64
}

async fn bench_frames(quick: bool) {
    println!("\n## 1. CPU per stream frame (2 workers busy; every frame parses one SSE data line)");
    let (total, min_per): (u64, u64) = if quick {
        (1_500_000, 10)
    } else {
        (4_000_000, 40)
    };
    let (wd, _) = WatchdogActor::spawn(WatchdogConfig::default())
        .await
        .expect("watchdog");
    println!(
        "| streams | frames | none ns/frame | timeout() | Sleep::reset | warden | warden added ns | warden / none | timeout / none | reset / none |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for streams in [1_000usize, 10_000, 100_000] {
        let per = (total / streams as u64).max(min_per);
        let mut best = std::collections::HashMap::new();
        // Interleave variants and keep the best run to damp noise.
        for _ in 0..if quick { 3 } else { 5 } {
            for v in [
                Variant::None,
                Variant::Timeout,
                Variant::SleepReset,
                Variant::Warden,
            ]
            .into_iter()
            .filter(|v| std::env::var("WARDEN_BENCH_ONLY").map_or(true, |o| o == format!("{v:?}")))
            {
                let ns = run_frames(v, streams, per, &wd).await;
                let e = best.entry(format!("{v:?}")).or_insert(f64::MAX);
                *e = e.min(ns);
            }
        }
        let g = |v: &str| best[v];
        let none = g("None");
        println!(
            "| {streams} | {} | {:.0} | {:.0} | {:.0} | {:.0} | {:+.0} | {:.3}x | {:.3}x | {:.3}x |",
            per * streams as u64,
            none,
            g("Timeout"),
            g("SleepReset"),
            g("Warden"),
            g("Warden") - none,
            g("Warden") / none,
            g("Timeout") / none,
            g("SleepReset") / none,
        );
    }
    let stats = wd.stats().await.expect("stats");
    println!("(false kills during the runs: {})", stats.kills);
}

// ---------------------------------------------------------------- latency

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i]
}

/// Heartbeat drivers: every heartbeat beats once per `period`, spread evenly.
fn drive(
    heartbeats: Vec<warden_core::watchdog::Heartbeat>,
    period: Duration,
    stop: watch::Receiver<bool>,
) {
    let chunks = 100;
    let size = heartbeats.len().div_ceil(chunks).max(1);
    let shared = Arc::new(heartbeats);
    for c in 0..chunks {
        let hb = shared.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let lo = (c * size).min(hb.len());
            let hi = ((c + 1) * size).min(hb.len());
            let slices = 100usize;
            let mut tick = tokio::time::interval(period / slices as u32);
            let mut k = 0usize;
            while !*stop.borrow() {
                tick.tick().await;
                let span = hi - lo;
                let a = lo + span * (k % slices) / slices;
                let b = lo + span * (k % slices + 1) / slices;
                for h in &hb[a..b] {
                    h.beat();
                }
                k += 1;
            }
        });
    }
}

async fn bench_latency(quick: bool) {
    println!("\n## 2. Detection latency past the deadline (kill − (last frame + timeout))");
    let n: usize = if quick { 20_000 } else { 100_000 };
    let silent: usize = if quick { 200 } else { 1_000 };
    let timeout = Duration::from_secs(2);
    let (wd, _) = WatchdogActor::spawn(
        WatchdogConfig::default()
            .with_default_timeout(timeout)
            .expect("valid"),
    )
    .await
    .expect("watchdog");
    let false_kills = Arc::new(AtomicU64::new(0));
    let mut beating = Vec::with_capacity(n);
    let mut guards = Vec::with_capacity(n);
    for _ in 0..n - silent {
        let fk = false_kills.clone();
        let g = wd
            .watch(None, move |_| {
                fk.fetch_add(1, Ordering::Relaxed);
            })
            .expect("watch");
        beating.push(g.heartbeat());
        guards.push(g);
    }
    let (stop_tx, stop) = watch::channel(false);
    drive(beating, Duration::from_secs(1), stop.clone());
    // Silent streams, registered over one second; lateness recorded on kill.
    let lateness = Arc::new(parking_lot::Mutex::new(Vec::with_capacity(silent)));
    let base_late = Arc::new(parking_lot::Mutex::new(Vec::with_capacity(silent)));
    let done = Done::new(silent * 2);
    for i in 0..silent {
        tokio::time::sleep(Duration::from_secs(1) / silent as u32).await;
        let registered = Instant::now();
        let l = lateness.clone();
        let d = done.clone();
        guards.push(
            wd.watch(None, move |_| {
                let late = Instant::now().saturating_duration_since(registered + timeout);
                l.lock().push(late.as_secs_f64() * 1e3);
                d.one();
            })
            .expect("watch"),
        );
        // Baseline: a per-stream timer for the same deadline.
        let b = base_late.clone();
        let d = done.clone();
        let _ = i;
        tokio::spawn(async move {
            let deadline = registered + timeout;
            tokio::time::sleep_until(deadline).await;
            let late = Instant::now().saturating_duration_since(deadline);
            b.lock().push(late.as_secs_f64() * 1e3);
            d.one();
        });
    }
    done.wait().await;
    let _ = stop_tx.send(true);
    let sorted = |m: &parking_lot::Mutex<Vec<f64>>| {
        let mut v = m.lock().clone();
        v.sort_by(f64::total_cmp);
        v
    };
    let w = sorted(&lateness);
    let b = sorted(&base_late);
    println!(
        "{n} watched streams, {silent} silent, timeout {:?}, the rest beating once per second",
        timeout
    );
    println!("| | p50 ms | p99 ms | max ms |");
    println!("|---|---:|---:|---:|");
    for (name, v) in [
        ("warden watchdog", &w),
        ("per-stream sleep_until (baseline)", &b),
    ] {
        println!(
            "| {name} | {:.3} | {:.3} | {:.3} |",
            percentile(v, 0.5),
            percentile(v, 0.99),
            v.last().copied().unwrap_or(f64::NAN)
        );
    }
    println!(
        "ratio warden/baseline: p50 {:.2}x, p99 {:.2}x; false kills: {}",
        percentile(&w, 0.5) / percentile(&b, 0.5).max(1e-6),
        percentile(&w, 0.99) / percentile(&b, 0.99).max(1e-6),
        false_kills.load(Ordering::Relaxed)
    );
    drop(guards);
}

// ---------------------------------------------------------------- capacity

/// Spawns a watchdog on its own OS thread (current-thread runtime) so its
/// CPU can be read from that thread's /proc stat.
fn watchdog_on_own_thread(timeout: Duration) -> (WatchdogHandle, String) {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async move {
            let (wd, join) = WatchdogActor::spawn(
                WatchdogConfig::default()
                    .with_default_timeout(timeout)
                    .expect("valid"),
            )
            .await
            .expect("watchdog");
            let tid = std::fs::read_link("/proc/thread-self")
                .map(|p| p.display().to_string())
                .unwrap_or_default();
            let _ = tx.send((wd, format!("/proc/{tid}/stat")));
            let _ = join.await;
        });
    });
    rx.recv().expect("watchdog thread")
}

struct Pending;
impl EventSource for Pending {
    fn open(&self, _r: TurnRequest) -> BoxFuture<'static, Result<EventStream, StreamError>> {
        Box::pin(async { Ok(Box::pin(futures_util::stream::pending()) as EventStream) })
    }
}

async fn bench_capacity(quick: bool) {
    println!("\n## 3. Capacity and memory");
    // Memory per StreamTask vs a plain per-stream task with a timeout.
    let k = if quick { 2_000 } else { 10_000 };
    // Earlier sections free memory in the background (actors stopping);
    // measure from a quiet heap.
    settle_memory().await;
    let before = live_bytes() as i64;
    let mut tasks = Vec::with_capacity(k);
    for _ in 0..k {
        tasks.push(tokio::spawn(async {
            let mut s: EventStream = Box::pin(futures_util::stream::pending());
            let _ = tokio::time::timeout(T45, s.next()).await;
        }));
    }
    settle_memory().await;
    let per_task = (live_bytes() as i64 - before) as f64 / k as f64;
    let (wd2, _) = WatchdogActor::spawn(WatchdogConfig::default())
        .await
        .expect("watchdog");
    settle_memory().await;
    let before = live_bytes() as i64;
    let mut streams = Vec::with_capacity(k);
    for i in 0..k {
        let args = StreamArgs {
            attempt: AttemptId {
                turn: i as u64,
                attempt: 1,
            },
            source: Arc::new(Pending),
            request: TurnRequest::new(SessionKey::new("bench"), i as u64, ""),
            watchdog: wd2.clone(),
            options: StreamOptions::default(),
            sink: Arc::new(|_| {}),
            span: tracing::Span::none(),
        };
        streams.push(StreamTask::spawn(args).expect("spawn"));
    }
    settle_memory().await;
    let per_actor = (live_bytes() as i64 - before) as f64 / k as f64;
    println!(
        "memory per running stream: StreamTask + reader + watch entry {per_actor:.0} B; plain task + timeout (baseline) {per_task:.0} B; ratio {:.2}x",
        per_actor / per_task
    );
    for s in &streams {
        s.cancel();
    }
    for t in tasks {
        t.abort();
    }
    drop(wd2);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let m: usize = if quick { 200_000 } else { 1_000_000 };
    let timeout = if quick {
        Duration::from_secs(2)
    } else {
        Duration::from_secs(10)
    };
    let window = timeout * 2;
    let (wd, stat) = watchdog_on_own_thread(timeout);
    let mut guards = Vec::with_capacity(m);
    let mut hbs = Vec::with_capacity(m);
    let before = live_bytes();
    for i in 0..m {
        guards.push(wd.watch(None, |_| {}).expect("watch"));
        if i % 10_000 == 0 {
            tokio::task::yield_now().await;
        }
    }
    while wd.stats().await.expect("stats").watched < m {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Stream-side handles (the guards' own Vec storage) are excluded: they
    // were allocated up front.
    let per_stream = (live_bytes() - before) as f64 / m as f64;
    for g in &guards {
        hbs.push(g.heartbeat());
    }
    let (stop_tx, stop) = watch::channel(false);
    drive(hbs, Duration::from_secs(1), stop);
    tokio::time::sleep(timeout).await; // reach steady state (re-queues)
    let c0 = cpu_seconds(&stat);
    let t0 = std::time::Instant::now();
    tokio::time::sleep(window).await;
    let cpu = cpu_seconds(&stat) - c0;
    let wall = t0.elapsed().as_secs_f64();
    let _ = stop_tx.send(true);
    let stats = wd.stats().await.expect("stats");
    let core_share = cpu / wall;
    let per_stream_second_ns = cpu * 1e9 / (m as f64 * wall);
    let projected = (0.10 / (per_stream_second_ns * 1e-9)).floor();
    println!(
        "{m} watched streams beating 1/s, timeout {timeout:?}: watchdog thread CPU {:.2}% of one core over {wall:.1}s; {:.1} ns per stream-second; false kills {}",
        core_share * 100.0,
        per_stream_second_ns,
        stats.kills
    );
    println!(
        "projected streams at 10% of one core: {projected:.0} (at timeout {timeout:?}; re-queue work scales with 1/timeout, so 45 s costs ~{:.1}x less)",
        45.0 / timeout.as_secs_f64()
    );
    println!(
        "memory per watched stream inside the watchdog (shared cell + heap item + callback slot): {per_stream:.0} B"
    );
    drop(guards);
}

// ---------------------------------------------------------------- fallback

async fn bench_fallback(quick: bool) {
    use warden_core::{Durability, SessionRecord, SessionStore, Supervisor, SupervisorConfig};
    println!("\n## 4. Fresh-fallback latency (resume failure observed → fresh session streaming)");
    let rounds = if quick { 50 } else { 300 };
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Arc::new(warden_store::SledStore::open(dir.path().join("db")).expect("open"));
    let (source, ctl) = warden_core::testing::ChannelSource::new();
    let factory = move |_: &SessionKey| source.clone() as Arc<dyn EventSource>;
    let sup = Supervisor::builder(Arc::new(factory))
        .config(SupervisorConfig::default())
        .store(store.clone())
        .start()
        .await
        .expect("supervisor");
    let mut fallback = Vec::with_capacity(rounds);
    let mut baseline = Vec::with_capacity(rounds);
    let mut turns = Vec::new();
    for i in 0..rounds {
        let key = SessionKey::new(format!("s{i}"));
        let mut r = SessionRecord::new(&key, None);
        r.set_agent_session_id("old");
        let t = Instant::now();
        store.save(&r, Durability::Flushed).await.expect("save");
        baseline.push(t.elapsed().as_secs_f64() * 1e3);
        turns.push(sup.send(key.clone(), "hi").await.expect("send"));
        let a = ctl.next_attempt().await.expect("attempt");
        let t = Instant::now();
        a.fail(StreamError::UnknownSession {
            session_id: "old".into(),
            message: "No conversation found with session ID: old".into(),
        });
        let fresh = ctl.next_attempt().await.expect("fresh attempt");
        fallback.push(t.elapsed().as_secs_f64() * 1e3);
        fresh.finish();
    }
    for v in [&mut fallback, &mut baseline] {
        v.sort_by(f64::total_cmp);
    }
    println!("| | p50 ms | p99 ms |");
    println!("|---|---:|---:|");
    println!(
        "| fresh fallback (escalate, durable id clear, respawn, re-deliver) | {:.3} | {:.3} |",
        percentile(&fallback, 0.5),
        percentile(&fallback, 0.99)
    );
    println!(
        "| one flushed store write (baseline) | {:.3} | {:.3} |",
        percentile(&baseline, 0.5),
        percentile(&baseline, 0.99)
    );
    println!(
        "ratio: p50 {:.2}x, p99 {:.2}x ({rounds} rounds)",
        percentile(&fallback, 0.5) / percentile(&baseline, 0.5),
        percentile(&fallback, 0.99) / percentile(&baseline, 0.99)
    );
    sup.shutdown().await;
}

// ---------------------------------------------------------------- sends

/// Starts an unsupervised session for `key` as the supervisor does for a
/// key it has no session for: load the record, a new one if there is none,
/// spawn. The one place the bench spawns a session without a supervisor.
async fn spawn_direct(
    key: SessionKey,
    source: Arc<dyn EventSource>,
    watchdog: WatchdogHandle,
    store: Arc<dyn warden_core::SessionStore>,
    config: warden_core::SessionConfig,
) -> warden_core::SessionHandle {
    // What the supervisor does for a new key (load, new record, spawn),
    // without its mailbox.
    warden_core::testing::spawn_session(key, source, watchdog, store, config)
        .await
        .expect("spawn session")
}

const SENDS_BOUND: Duration = Duration::from_secs(60);

fn sled_store(dir: &tempfile::TempDir) -> Arc<warden_store::SledStore> {
    Arc::new(warden_store::SledStore::open(dir.path().join("db")).expect("open"))
}

/// `n` concurrent first sends, each to its own key, through one supervisor
/// on a fresh sled store; ms until every send is acknowledged (flushed).
async fn sends_supervised(n: usize) -> f64 {
    use warden_core::{Supervisor, SupervisorConfig};
    let dir = tempfile::tempdir().expect("tempdir");
    let factory = |_: &SessionKey| Arc::new(Pending) as Arc<dyn EventSource>;
    let sup = Supervisor::builder(Arc::new(factory))
        .config(SupervisorConfig::default())
        .store(sled_store(&dir))
        .start()
        .await
        .expect("supervisor");
    let t = Instant::now();
    let sends = futures_util::future::join_all((0..n).map(|i| sup.send(format!("w{i}"), "msg")));
    let turns = tokio::time::timeout(SENDS_BOUND, sends)
        .await
        .expect("sends within the bound");
    let ms = t.elapsed().as_secs_f64() * 1e3;
    for t in turns {
        t.expect("send").detach();
    }
    sup.shutdown().await;
    ms
}

/// The baseline: `n` sessions started directly and concurrently on a fresh
/// sled store, each submitting one message; ms until every submit is
/// acknowledged (flushed).
async fn sends_direct(n: usize) -> f64 {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = sled_store(&dir);
    let (wd, wd_join) = WatchdogActor::spawn(WatchdogConfig::default())
        .await
        .expect("watchdog");
    let source: Arc<dyn EventSource> = Arc::new(Pending);
    let t = Instant::now();
    let sends = futures_util::future::join_all((0..n).map(|i| {
        let (source, wd, store) = (source.clone(), wd.clone(), store.clone());
        async move {
            let session = spawn_direct(
                SessionKey::new(format!("w{i}")),
                source,
                wd,
                store,
                warden_core::SessionConfig::default(),
            )
            .await;
            let turn = session.submit("msg").await;
            (session, turn)
        }
    }));
    let done = tokio::time::timeout(SENDS_BOUND, sends)
        .await
        .expect("sends within the bound");
    let ms = t.elapsed().as_secs_f64() * 1e3;
    let stops = done.into_iter().map(|(session, turn)| {
        turn.expect("submit").detach();
        async move {
            let _ = session
                .actor()
                .stop_and_wait(None, Some(Duration::from_secs(10)))
                .await;
        }
    });
    futures_util::future::join_all(stops).await;
    wd.actor().stop(None);
    let _ = tokio::time::timeout(Duration::from_secs(10), wd_join).await;
    ms
}

/// Context, not a baseline: `n` concurrent flushed saves of new records
/// straight to a fresh sled store (no actors), the floor both cases sit on.
async fn sends_store_only(n: usize) -> f64 {
    use warden_core::{Durability, SessionRecord, SessionStore};
    let dir = tempfile::tempdir().expect("tempdir");
    let store = sled_store(&dir);
    let records: Vec<_> = (0..n)
        .map(|i| SessionRecord::new(&SessionKey::new(format!("w{i}")), None))
        .collect();
    let t = Instant::now();
    let saves =
        futures_util::future::join_all(records.iter().map(|r| store.save(r, Durability::Flushed)));
    let done = tokio::time::timeout(SENDS_BOUND, saves)
        .await
        .expect("saves within the bound");
    let ms = t.elapsed().as_secs_f64() * 1e3;
    for r in done {
        r.expect("save");
    }
    ms
}

async fn bench_sends(quick: bool) {
    println!(
        "\n## 6. Concurrent first sends to distinct workspaces (sled, flushed): supervisor vs sessions started directly"
    );
    // The runs spread widely (the slowest is often twice the fastest), so
    // a median needs many.
    let runs = if quick { 5 } else { 15 };
    println!(
        "| sends | supervisor ms (median of {runs}) | direct ms (baseline) | ratio | > 1.5x | bare flushed saves ms |"
    );
    println!("|---:|---:|---:|---:|---|---:|");
    for n in [100usize, 1_000] {
        let (mut sup, mut direct, mut bare) = (Vec::new(), Vec::new(), Vec::new());
        // Interleaved, so drift (page cache, disk) hits both alike.
        // Each run settles first: the previous one's store and actors wind
        // down in the background.
        for _ in 0..runs {
            tokio::time::sleep(Duration::from_millis(200)).await;
            sup.push(sends_supervised(n).await);
            tokio::time::sleep(Duration::from_millis(200)).await;
            direct.push(sends_direct(n).await);
            tokio::time::sleep(Duration::from_millis(200)).await;
            bare.push(sends_store_only(n).await);
        }
        let median = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            percentile(v, 0.5)
        };
        let (a, b, floor) = (median(&mut sup), median(&mut direct), median(&mut bare));
        if std::env::var_os("WARDEN_BENCH_RAW").is_some() {
            eprintln!(
                "{n}: supervisor {sup:.1?}\n{n}: direct     {direct:.1?}\n{n}: bare       {bare:.1?}"
            );
        }
        println!(
            "| {n} | {a:.1} | {b:.1} | {:.2}x | {} | {floor:.1} |",
            a / b,
            if a / b > 1.5 { "yes" } else { "no" }
        );
    }
}

// ---------------------------------------------------------------- telemetry

/// The supervised workload: `turns` turns over 50 sessions, 20 frames each.
async fn telemetry_workload(turns: usize) -> f64 {
    // Supervisor::start's default store: in memory.
    let store = Arc::new(warden_core::MemoryStore::new());
    cluster::turns_per_sec(vec![store], turns).await
}

fn telemetry_child(endpoint: Option<String>, turns: usize) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let mut config = warden_telemetry::TelemetryConfig::default().with_console(false);
    if let Some(e) = endpoint {
        config = config.with_otlp_endpoint(e);
    }
    let guard = warden_telemetry::init(config).expect("telemetry");
    let rate = rt.block_on(telemetry_workload(turns));
    drop(guard);
    println!("TURNS_PER_SEC {rate:.1}");
}

fn bench_telemetry(quick: bool) {
    println!(
        "\n## 5. Throughput with OTLP export on vs off (turns/s, 20 frames per turn, 50 sessions)"
    );
    let turns = if quick { 2_000 } else { 10_000 };
    let collector_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let collector = collector_rt
        .block_on(fake_opentelemetry_collector::FakeCollectorServer::start())
        .expect("collector");
    let run = |endpoint: Option<&str>| -> f64 {
        let exe = std::env::current_exe().expect("exe");
        let mut cmd = std::process::Command::new(exe);
        cmd.arg("--telemetry-child").arg(turns.to_string());
        if let Some(e) = endpoint {
            cmd.arg(e);
        }
        let out = cmd.output().expect("child");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .find_map(|l| {
                l.strip_prefix("TURNS_PER_SEC ")
                    .and_then(|v| v.parse().ok())
            })
            .unwrap_or(f64::NAN)
    };
    let mut off = Vec::new();
    let mut on = Vec::new();
    for _ in 0..3 {
        off.push(run(None));
        on.push(run(Some(&collector.endpoint())));
    }
    let best = |v: &[f64]| v.iter().copied().fold(f64::NAN, f64::max);
    println!("| export | turns/s (best of 3) |");
    println!("|---|---:|");
    println!("| off (no exporter, baseline) | {:.0} |", best(&off));
    println!("| on (OTLP/gRPC to a local receiver) | {:.0} |", best(&on));
    println!("ratio on/off: {:.3}x", best(&on) / best(&off));
}

fn main() {
    tune_allocator();
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Some(i) = args.iter().position(|a| a == "--telemetry-child") {
        let turns = args
            .get(i + 1)
            .and_then(|t| t.parse().ok())
            .unwrap_or(2_000);
        telemetry_child(args.get(i + 2).cloned(), turns);
        return;
    }
    if let Some(i) = args.iter().position(|a| a == "--jaeger-child") {
        let turns = args
            .get(i + 1)
            .and_then(|t| t.parse().ok())
            .unwrap_or(5_000);
        let from = args.get(i + 2).map_or("channel", String::as_str);
        jaeger::jaeger_child(turns, from, args.get(i + 3).cloned());
        return;
    }
    if let Some(i) = args.iter().position(|a| a == "--proxy-child") {
        proxy::proxy_child(args.get(i + 1).map_or("", String::as_str));
        return;
    }
    if let Some(i) = args.iter().position(|a| a == "--relay-child") {
        proxy::relay_child(args.get(i + 1).map_or("", String::as_str));
        return;
    }
    let quick = args.iter().any(|a| a == "--quick");
    let picked: Vec<&str> = args
        .iter()
        .map(String::as_str)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let want = |s: &str| picked.is_empty() || picked.contains(&s);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    println!(
        "# warden benchmarks ({} mode; {} CPUs; {})",
        if quick { "quick" } else { "full" },
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0),
        std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(
                |c| c.lines().find(|l| l.starts_with("model name")).map(|l| l
                    .split(':')
                    .nth(1)
                    .unwrap_or("")
                    .trim()
                    .to_owned())
            )
            .unwrap_or_default()
    );
    rt.block_on(async {
        if want("frame") {
            bench_frames(quick).await;
        }
        if want("latency") {
            bench_latency(quick).await;
        }
        if want("capacity") {
            bench_capacity(quick).await;
        }
        if want("fallback") {
            bench_fallback(quick).await;
        }
        if want("sends") {
            bench_sends(quick).await;
        }
        if want("backoff") {
            backoff::bench_backoff(quick).await;
        }
        if want("continuation") {
            continuation::bench_continuation(quick).await;
        }
        if want("events") {
            events::bench_events(quick);
        }
        if want("soak") {
            soak::bench_soak(quick).await;
        }
        if want("durable") {
            soak::bench_durable_turns(quick).await;
        }
        if want("proxy") {
            proxy::bench_proxy(quick).await;
        }
        if want("cluster") {
            cluster::bench_cluster(quick).await;
        }
        // Section 11's served part alone (it also runs within `cluster`).
        if picked.contains(&"served") {
            match std::env::var("WARDEN_PG_URL") {
                Ok(admin) => soak::bench_served_on_postgres(&admin, quick).await,
                Err(_) => println!("served: skipped, set WARDEN_PG_URL"),
            }
        }
        // 10,000 sessions on three nodes and a failover of a third of them
        // (section 11b; minutes, so only when asked for).
        if picked.contains(&"scale") {
            cluster::bench_scale(quick).await;
        }
        if want("console") {
            console::bench_console(quick).await;
        }
        if want("agents") {
            agents::bench_agents(quick).await;
        }
        if want("slow_reader") {
            slow_reader::bench_slow_reader(quick).await;
        }
    });
    if want("telemetry") {
        bench_telemetry(quick);
    }
    if want("jaeger") {
        jaeger::bench_jaeger(quick);
    }
}
