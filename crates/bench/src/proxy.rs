//! Section 10, `proxy`: what `warden proxy` adds to a streamed event
//! (issue #16). An Anthropic-format upstream in this process streams text
//! deltas whose text is the time they were sent (ns since a process-local
//! epoch); clients in this process read them directly (the baseline) or
//! through a `warden-proxy` running in a child process (this binary with
//! `--proxy-child`), so the proxy's CPU and memory are its own.
//!
//! Reported at 1 and 1,000 concurrent streams: the latency from the
//! upstream's write to the client's parse (p50/p99), direct and proxied,
//! and the difference; CPU per event (this process, the proxy child, and
//! the total against direct); the proxy's memory per idle stream (RSS of
//! the child with 1,000 open streams that carry nothing, against the child
//! with none).

use std::convert::Infallible;
use std::io::{BufRead as _, Write as _};
use std::time::Duration;

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use futures_util::StreamExt as _;
use tokio::time::Instant;

/// Events per stream in the latency runs, and the pause between them: one
/// stream at 50 events/s (a fast model's deltas), 1,000 at 10 each
/// (10,000 events/s in all, on two cores shared by the upstream, the
/// clients and the proxy).
const EVENTS: usize = 100;
const INTERVAL: Duration = Duration::from_millis(20);
const LOADED_INTERVAL: Duration = Duration::from_millis(100);

fn epoch() -> Instant {
    static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

fn frame(event: &str, data: &str) -> Bytes {
    Bytes::from(format!("event: {event}\ndata: {data}\n\n"))
}

/// `events` timestamped text deltas `interval` apart (or, with `events`
/// zero, a `message_start` and then silence held open for `idle`).
fn upstream_body(events: usize, interval: Duration, idle: Duration) -> Body {
    let head = [
        frame(
            "message_start",
            r#"{"type":"message_start","message":{"id":"msg_b","type":"message","role":"assistant","content":[],"model":"bench","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":10,"output_tokens":1}}}"#,
        ),
        frame(
            "content_block_start",
            r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#,
        ),
    ];
    let tail = [
        frame(
            "content_block_stop",
            r#"{"type":"content_block_stop","index":0}"#,
        ),
        frame(
            "message_delta",
            r#"{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":100}}"#,
        ),
        frame("message_stop", r#"{"type":"message_stop"}"#),
    ];
    // Streams start out of phase, as real ones do (a phase-locked crowd
    // would measure one burst of 1,000 events every interval instead).
    let phase = interval.mul_f64(rand::random::<f64>());
    let deltas = futures_util::stream::unfold(0usize, move |i| async move {
        if events == 0 {
            tokio::time::sleep(idle).await;
            return None;
        }
        if i == events {
            return None;
        }
        tokio::time::sleep(if i == 0 { phase } else { interval }).await;
        let ns = epoch().elapsed().as_nanos();
        let data = format!(
            r#"{{"type":"content_block_delta","index":0,"delta":{{"type":"text_delta","text":"{ns}"}}}}"#
        );
        Some((frame("content_block_delta", &data), i + 1))
    });
    let stream = futures_util::stream::iter(head)
        .chain(deltas)
        .chain(futures_util::stream::iter(tail))
        .map(Ok::<_, Infallible>);
    Body::from_stream(stream)
}

/// The upstream: `POST /v1/messages`; `"max_tokens": 0` asks for an idle
/// stream, held open for a minute.
async fn upstream() -> String {
    let app = axum::Router::new().route(
        "/v1/messages",
        axum::routing::post(|body: Bytes| async move {
            let idle = body.windows(15).any(|w| w == b"\"max_tokens\":0,");
            let slow = body.windows(17).any(|w| w == b"\"max_tokens\":100,");
            let body = if idle {
                upstream_body(0, INTERVAL, Duration::from_secs(60))
            } else if slow {
                upstream_body(EVENTS, LOADED_INTERVAL, Duration::ZERO)
            } else {
                upstream_body(EVENTS, INTERVAL, Duration::ZERO)
            };
            Response::builder()
                .header("content-type", "text/event-stream")
                .body(body)
                .unwrap_or_default()
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    tokio::spawn(async move { axum::serve(listener, app).await });
    base
}

/// The child: a proxy in front of `upstream`, its address on stdout; it
/// runs until its stdin closes.
pub fn proxy_child(upstream: &str) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let proxy = warden_proxy::Proxy::start(
            warden_proxy::ProxyConfig::default()
                .with_anthropic_upstream(upstream)
                .with_timeout(Duration::from_secs(120)),
        )
        .await
        .expect("proxy");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        println!("http://{}", listener.local_addr().expect("addr"));
        let _ = std::io::stdout().flush();
        tokio::spawn(async move { proxy.serve(listener, std::future::pending()).await });
        // Until the parent closes our stdin.
        tokio::task::spawn_blocking(|| {
            let mut line = String::new();
            let _ = std::io::stdin().lock().read_line(&mut line);
        })
        .await
        .ok();
    });
}

/// CPU time of every thread of `pid` (`self` for this process), in
/// seconds, from `/proc/PID/task/*/schedstat` (nanoseconds, unlike the
/// 10 ms ticks of `/proc/PID/stat`). Threads that already exited are not
/// counted: the runtimes here keep theirs.
fn cpu(pid: &str) -> f64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return f64::NAN;
    };
    let ns: u64 = tasks
        .filter_map(Result::ok)
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| {
            s.split_whitespace()
                .next()
                .and_then(|v| v.parse::<u64>().ok())
        })
        .sum();
    ns as f64 / 1e9
}

struct Child {
    child: std::process::Child,
    base: String,
}

impl Child {
    fn spawn(upstream: &str) -> Self {
        let exe = std::env::current_exe().expect("exe");
        let mut child = std::process::Command::new(exe)
            .args(["--proxy-child", upstream])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("proxy child");
        let mut line = String::new();
        let stdout = child.stdout.take().expect("stdout");
        std::io::BufReader::new(stdout)
            .read_line(&mut line)
            .expect("the child's address");
        Self {
            child,
            base: line.trim().to_owned(),
        }
    }

    fn cpu(&self) -> f64 {
        cpu(&self.child.id().to_string())
    }

    fn rss_kib(&self) -> u64 {
        std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("VmRSS:"))
                    .and_then(|l| l.split_whitespace().nth(1))
                    .and_then(|v| v.parse().ok())
            })
            .unwrap_or(0)
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.wait();
    }
}

/// One stream: the latency of each text event, in µs.
async fn stream(http: &reqwest::Client, base: &str, kind: Kind) -> Vec<u64> {
    let body = match kind {
        Kind::Idle => {
            r#"{"model":"bench","max_tokens":0,"stream":true,"messages":[{"role":"user","content":"hi"}]}"#
        }
        Kind::Slow => {
            r#"{"model":"bench","max_tokens":100,"stream":true,"messages":[{"role":"user","content":"hi"}]}"#
        }
        Kind::Fast => {
            r#"{"model":"bench","max_tokens":1024,"stream":true,"messages":[{"role":"user","content":"hi"}]}"#
        }
    };
    let response = http
        .post(format!("{base}/v1/messages"))
        .header("anthropic-version", "2023-06-01")
        .header("x-api-key", "bench")
        .body(body)
        .send()
        .await
        .expect("stream");
    let mut body = response.bytes_stream();
    let mut buf = String::new();
    let mut out = Vec::with_capacity(EVENTS);
    while let Some(chunk) = body.next().await {
        let Ok(chunk) = chunk else { break };
        let now = epoch().elapsed().as_nanos();
        buf.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(end) = buf.find("\n\n") {
            let block: String = buf.drain(..end + 2).collect();
            if let Some(at) = block
                .split("\"text_delta\",\"text\":\"")
                .nth(1)
                .and_then(|r| r.split('"').next())
                .and_then(|v| v.parse::<u128>().ok())
            {
                out.push(u64::try_from(now.saturating_sub(at) / 1000).unwrap_or(u64::MAX));
            }
        }
    }
    out
}

/// What a stream request asks the upstream for.
#[derive(Clone, Copy)]
enum Kind {
    /// Events [`INTERVAL`] apart.
    Fast,
    /// Events [`LOADED_INTERVAL`] apart.
    Slow,
    /// A start, then nothing for a minute.
    Idle,
}

/// `n` concurrent streams against `base`: every event's latency (µs,
/// sorted).
async fn run(base: &str, n: usize, interval: Duration) -> Vec<u64> {
    let kind = if interval == INTERVAL {
        Kind::Fast
    } else {
        Kind::Slow
    };
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(n)
        .build()
        .expect("client");
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let http = http.clone();
            let base = base.to_owned();
            tokio::spawn(async move { stream(&http, &base, kind).await })
        })
        .collect();
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.expect("stream task"));
    }
    all.sort_unstable();
    all
}

fn pct(v: &[u64], p: f64) -> u64 {
    if v.is_empty() {
        return 0;
    }
    v[(((v.len() - 1) as f64) * p).round() as usize]
}

pub async fn bench_proxy(quick: bool) {
    println!("\n## 10. `warden proxy`: latency, CPU and memory it adds per streamed event");
    let base = upstream().await;
    let child = Child::spawn(&base);
    // Warm both paths (connections, allocator).
    run(&base, 10, INTERVAL).await;
    run(&child.base, 10, INTERVAL).await;
    println!(
        "{EVENTS} text events per stream; latency = upstream write → client parse (µs); CPU from schedstat\n"
    );
    println!(
        "| streams | direct p50 | direct p99 | proxied p50 | proxied p99 | added p50 | added p99 | CPU/event direct (µs) | CPU/event proxied: this process + proxy (µs) | CPU ratio |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for n in [1usize, if quick { 200 } else { 1_000 }] {
        let interval = if n == 1 { INTERVAL } else { LOADED_INTERVAL };
        let cpu0 = cpu("self");
        let direct = run(&base, n, interval).await;
        let cpu_direct = cpu("self") - cpu0;
        let (cpu1, child1) = (cpu("self"), child.cpu());
        let proxied = run(&child.base, n, interval).await;
        let cpu_here = cpu("self") - cpu1;
        let cpu_child = child.cpu() - child1;
        let per = |cpu: f64, events: usize| cpu * 1e6 / events.max(1) as f64;
        let d = per(cpu_direct, direct.len());
        let p_here = per(cpu_here, proxied.len());
        let p_child = per(cpu_child, proxied.len());
        println!(
            "| {n} ({} ev/s) | {} | {} | {} | {} | {} | {} | {d:.1} | {p_here:.1} + {p_child:.1} | {:.2}x |",
            (n as f64 / interval.as_secs_f64()).round(),
            pct(&direct, 0.5),
            pct(&direct, 0.99),
            pct(&proxied, 0.5),
            pct(&proxied, 0.99),
            pct(&proxied, 0.5) as i64 - pct(&direct, 0.5) as i64,
            pct(&proxied, 0.99) as i64 - pct(&direct, 0.99) as i64,
            (p_here + p_child) / d
        );
        if direct.len() != n * EVENTS || proxied.len() != n * EVENTS {
            println!(
                "(events lost: direct {} of {}, proxied {} of {})",
                direct.len(),
                n * EVENTS,
                proxied.len(),
                n * EVENTS
            );
        }
    }

    // Memory per idle stream, in the proxy child.
    let n = if quick { 200 } else { 1_000 };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = child.rss_kib();
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(n)
        .build()
        .expect("client");
    let idle: Vec<_> = (0..n)
        .map(|_| {
            let http = http.clone();
            let base = child.base.clone();
            tokio::spawn(async move { stream(&http, &base, Kind::Idle).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let during = child.rss_kib();
    println!(
        "\nproxy child RSS: {:.1} MiB with no stream, {:.1} MiB with {n} idle streams open: {:.1} KiB per idle stream",
        before as f64 / 1024.0,
        during as f64 / 1024.0,
        (during.saturating_sub(before)) as f64 / n as f64
    );
    for t in idle {
        t.abort();
    }
    drop(child);
}
