//! Section 10, `proxy`: what `warden proxy` adds to a streamed event
//! (issue #16). An Anthropic-format upstream in this process streams text
//! deltas whose text is the time they were sent (ns since a process-local
//! epoch); clients in this process read them directly (the baseline) or
//! through a `warden-proxy` running in a child process (this binary with
//! `--proxy-child`), so the proxy's CPU and memory are its own.
//!
//! Reported at 1 and 50 streams of 50 events/s and 1,000 of 10 events/s:
//! the latency from the upstream's write to the client's parse
//! (p50/p99) direct, and what a plain TCP relay (`--relay-child`, the
//! floor for any proxy, in its own process) and the proxy each add to it;
//! CPU per event of each child; RSS per idle stream of each (200 streams
//! held open mid-reply, against the child with none).

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
        tokio::task::spawn_blocking(serve_stdin).await.ok();
    });
}

/// A child's control channel: each line on stdin is answered on stdout
/// with the live heap in bytes; the child ends when stdin closes.
fn serve_stdin() {
    let mut stdin = std::io::stdin().lock();
    let mut line = String::new();
    while matches!(stdin.read_line(&mut line), Ok(n) if n > 0) {
        line.clear();
        println!("{}", crate::live_bytes());
        let _ = std::io::stdout().flush();
    }
}

/// The child for the floor: a plain TCP relay in front of `upstream`
/// (`http://host:port`), each connection copied both ways as it comes
/// (`tokio::io::copy_bidirectional`) — what any proxy costs at least. Its
/// address on stdout; it runs until its stdin closes.
pub fn relay_child(upstream: &str) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let target = upstream.trim_start_matches("http://").to_owned();
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        println!("http://{}", listener.local_addr().expect("addr"));
        let _ = std::io::stdout().flush();
        tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let target = target.clone();
                tokio::spawn(async move {
                    let _ = inbound.set_nodelay(true);
                    let Ok(mut outbound) = tokio::net::TcpStream::connect(&target).await else {
                        return;
                    };
                    let _ = outbound.set_nodelay(true);
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                });
            }
        });
        tokio::task::spawn_blocking(serve_stdin).await.ok();
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
    stdout: std::io::BufReader<std::process::ChildStdout>,
}

impl Child {
    /// This binary as a child in `mode` (`--proxy-child`, `--relay-child`)
    /// in front of `upstream`.
    fn spawn(mode: &str, upstream: &str) -> Self {
        let exe = std::env::current_exe().expect("exe");
        let mut child = std::process::Command::new(exe)
            .args([mode, upstream])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("proxy child");
        let mut line = String::new();
        let mut stdout = std::io::BufReader::new(child.stdout.take().expect("stdout"));
        stdout.read_line(&mut line).expect("the child's address");
        Self {
            child,
            base: line.trim().to_owned(),
            stdout,
        }
    }

    /// The child's live heap (bytes), as its allocator counts it.
    fn heap(&mut self) -> u64 {
        let stdin = self.child.stdin.as_mut().expect("stdin");
        writeln!(stdin, "heap").expect("ask the child");
        stdin.flush().expect("ask the child");
        let mut line = String::new();
        self.stdout.read_line(&mut line).expect("the child's heap");
        line.trim().parse().expect("a number")
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

/// RSS and live-heap growth of `child` with `n` streams held open
/// mid-reply (a start, then silence), KiB per stream.
async fn idle_per_stream(child: &mut Child, n: usize) -> (f64, f64) {
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (rss0, heap0) = (child.rss_kib(), child.heap());
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
    let (rss1, heap1) = (child.rss_kib(), child.heap());
    for t in idle {
        t.abort();
    }
    let per = |grew: u64| grew as f64 / n as f64;
    (
        per(rss1.saturating_sub(rss0)),
        per(heap1.saturating_sub(heap0)) / 1024.0,
    )
}

pub async fn bench_proxy(quick: bool) {
    println!("\n## 10. `warden proxy`: latency, CPU and memory it adds per streamed event");
    let base = upstream().await;
    let proxy = Child::spawn("--proxy-child", &base);
    let relay = Child::spawn("--relay-child", &base);
    // Warm every path (connections, allocator).
    for b in [&base, &relay.base, &proxy.base] {
        run(b, 10, INTERVAL).await;
    }
    println!(
        "{EVENTS} text events per stream; latency = upstream write → client parse (µs); CPU from schedstat. \
         Added = against direct; the relay (a plain TCP copy in its own process) is the floor for any proxy.\n"
    );
    println!(
        "| streams | direct p50 / p99 | relay added p50 / p99 | proxy added p50 / p99 | proxy / relay added p99 (target ≤ 1.5x at 1,000) | CPU/event: relay / proxy (µs, the child) | proxy / relay CPU (target ≤ 1.3x) | client side direct / relay / proxy (µs) |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|");
    let high = if quick { 200 } else { 1_000 };
    for (n, interval) in [(1usize, INTERVAL), (50, INTERVAL), (high, LOADED_INTERVAL)] {
        let per = |cpu: f64, events: usize| cpu * 1e6 / events.max(1) as f64;
        let cpu0 = cpu("self");
        let direct = run(&base, n, interval).await;
        let here_direct = per(cpu("self") - cpu0, direct.len());
        let (cpu1, r1) = (cpu("self"), relay.cpu());
        let relayed = run(&relay.base, n, interval).await;
        let here_relay = per(cpu("self") - cpu1, relayed.len());
        let relay_cpu = per(relay.cpu() - r1, relayed.len());
        let (cpu2, p1) = (cpu("self"), proxy.cpu());
        let proxied = run(&proxy.base, n, interval).await;
        let here_proxy = per(cpu("self") - cpu2, proxied.len());
        let proxy_cpu = per(proxy.cpu() - p1, proxied.len());
        let added = |v: &[u64], p: f64| pct(v, p) as i64 - pct(&direct, p) as i64;
        // A negative added p99 is noise (the direct run's tail was the
        // worse one): no ratio is printed from it.
        let ratio = match (added(&proxied, 0.99), added(&relayed, 0.99)) {
            (p, r) if p > 0 && r > 0 => format!("{:.2}x", p as f64 / r as f64),
            _ => "n/a (a tail below direct's: noise)".to_owned(),
        };
        println!(
            "| {n} ({} ev/s) | {} / {} | {} / {} | {} / {} | {ratio} | {relay_cpu:.1} / {proxy_cpu:.1} | {:.2}x | {here_direct:.1} / {here_relay:.1} / {here_proxy:.1} |",
            (n as f64 / interval.as_secs_f64()).round(),
            pct(&direct, 0.5),
            pct(&direct, 0.99),
            added(&relayed, 0.5),
            added(&relayed, 0.99),
            added(&proxied, 0.5),
            added(&proxied, 0.99),
            proxy_cpu / relay_cpu.max(f64::MIN_POSITIVE),
        );
        for (what, v) in [
            ("direct", &direct),
            ("relay", &relayed),
            ("proxy", &proxied),
        ] {
            if v.len() != n * EVENTS {
                println!("(events lost, {what}: {} of {})", v.len(), n * EVENTS);
            }
        }
    }

    // Memory per idle stream (a start, then silence: a stream held open
    // mid-reply), in fresh children (one that served the runs above has
    // memory to reuse), each warmed by one stream first.
    drop(proxy);
    drop(relay);
    let n = 200;
    let mut idle = Vec::new();
    for mode in ["--relay-child", "--proxy-child"] {
        let mut child = Child::spawn(mode, &base);
        run(&child.base, 1, INTERVAL).await;
        idle.push(idle_per_stream(&mut child, n).await);
    }
    let [(relay_rss, relay_heap), (proxy_rss, proxy_heap)] = idle[..] else {
        unreachable!("two children")
    };
    println!(
        "\nPer idle stream ({n} held open mid-reply, fresh children): RSS relay {relay_rss:.1} KiB, proxy {proxy_rss:.1} KiB (target ≤ 16 KB); \
         live heap relay {relay_heap:.1} KiB, proxy {proxy_heap:.1} KiB: proxy / relay heap {:.2}x (target ≤ 2x)",
        proxy_heap / relay_heap.max(f64::MIN_POSITIVE)
    );
}
