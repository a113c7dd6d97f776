//! Section 13, `jaeger`: what exporting every span to a real Jaeger costs a
//! turn (issue #43, item 7).
//!
//! The same supervised workload runs in child processes (a global
//! subscriber is set once per process), alternately with OTLP export to
//! the Jaeger `.ci/jaeger` started (`WARDEN_JAEGER_OTLP`) and with no
//! exporter: 50 sessions, each running its turns one after another (50
//! turns in flight), every attempt answered either with 20 text frames by
//! an in-process source (the floor: a turn costs almost nothing else) or
//! by the real Anthropic source over HTTP from warden's mock (a 300-word
//! reply, one delta per word, parsed frame by frame as a real turn is). Per run: the child's CPU time (user + system, every
//! thread: the exporter's runtime and batch thread included) per turn, and
//! the 50th and 99th percentile of a turn's latency (send → finished).
//! Without `WARDEN_JAEGER_OTLP` the section says it is skipped.

use std::sync::Arc;
use std::time::{Duration, Instant};

use warden_core::{EventSource, SessionKey, Supervisor, SupervisorConfig};

/// A tenth of the HTTP turns' reply: 30 of these are 300 words, about 400
/// tokens, one text delta per word (a typical answer's size).
const REPLY_SENTENCE: &str =
    "The watchdog killed the silent stream and the turn was retried in full. ";

/// Sessions, each running its turns in sequence.
const SESSIONS: usize = 50;

/// The child's CPU time so far (user + system, all threads).
fn cpu_time() -> Duration {
    // /proc reports in USER_HZ, which Linux fixes at 100 for user space.
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name (which may hold spaces) in parentheses.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    // utime and stime are fields 14 and 15 of the line, 12 and 13 here.
    Duration::from_millis((ticks(11) + ticks(12)) * 10)
}

/// Where a turn's reply comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    /// An in-process source: 20 text frames, no I/O (the floor).
    Channel,
    /// The real Anthropic source over HTTP against warden's mock (an SSE
    /// reply parsed frame by frame, as a real turn is).
    Http,
}

/// The workload: `turns` turns; the CPU time and every turn's latency.
async fn workload(turns: usize, from: Source) -> (Duration, Vec<Duration>) {
    let mut driver = None;
    let mut mock = None;
    let source: Arc<dyn EventSource> = match from {
        Source::Channel => {
            let (source, ctl) = warden_core::testing::ChannelSource::new();
            driver = Some(tokio::spawn(async move {
                while let Some(a) = ctl.next_attempt().await {
                    for _ in 0..20 {
                        a.text("token ");
                    }
                    a.finish();
                }
            }));
            source
        }
        Source::Http => {
            let server = warden_mock::MockServer::start(
                warden_mock::MockConfig::default()
                    .with_frame_interval(Duration::ZERO)
                    .with_reply(REPLY_SENTENCE.repeat(30)),
            )
            .await
            .expect("mock");
            let source = warden_llm::AnthropicSource::new(
                warden_llm::AnthropicOptions::default()
                    .with_base_url(server.base_url())
                    .with_api_key("bench"),
            )
            .expect("source");
            mock = Some(server);
            Arc::new(source)
        }
    };
    let factory = move |_: &SessionKey| source.clone();
    let sup = Supervisor::builder(Arc::new(factory))
        .config(SupervisorConfig::default())
        .store(Arc::new(warden_core::MemoryStore::new()))
        .start()
        .await
        .expect("supervisor");
    // One warm-up turn per session (spawns every session first).
    let warm: Vec<_> = (0..SESSIONS)
        .map(|s| {
            let sup = sup.clone();
            tokio::spawn(async move {
                let turn = sup.send(format!("s{s}"), "hi").await.expect("send");
                turn.finish().await.expect("turn");
            })
        })
        .collect();
    for w in warm {
        w.await.expect("warm-up");
    }
    let cpu0 = cpu_time();
    let per_session = turns.div_ceil(SESSIONS);
    let tasks: Vec<_> = (0..SESSIONS)
        .map(|s| {
            let sup = sup.clone();
            tokio::spawn(async move {
                let mut latencies = Vec::with_capacity(per_session);
                for _ in 0..per_session {
                    let t0 = Instant::now();
                    let turn = sup.send(format!("s{s}"), "hi").await.expect("send");
                    turn.finish().await.expect("turn");
                    latencies.push(t0.elapsed());
                }
                latencies
            })
        })
        .collect();
    let mut latencies = Vec::with_capacity(per_session * SESSIONS);
    for t in tasks {
        latencies.extend(t.await.expect("turns"));
    }
    let cpu = cpu_time().saturating_sub(cpu0);
    sup.shutdown().await;
    if let Some(d) = driver {
        d.abort();
    }
    if let Some(m) = mock {
        m.shutdown().await;
    }
    (cpu, latencies)
}

/// `--jaeger-child TURNS channel|http [ENDPOINT]`: one run, printed as
/// `JAEGER_RUN <cpu µs per turn> <p50 µs> <p99 µs>`.
pub fn jaeger_child(turns: usize, from: &str, endpoint: Option<String>) {
    let from = if from == "http" {
        Source::Http
    } else {
        Source::Channel
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let mut config = warden_telemetry::TelemetryConfig::default()
        .with_console(false)
        .with_service_name("warden-bench");
    if let Some(e) = endpoint {
        config = config.with_otlp_endpoint(e);
    }
    let guard = warden_telemetry::init(config).expect("telemetry");
    let (cpu, mut latencies) = rt.block_on(workload(turns, from));
    // The flush at exit is not a turn's cost; its time is not counted.
    drop(guard);
    latencies.sort();
    let pct = |p: f64| {
        let i = ((latencies.len() as f64 * p).ceil() as usize).clamp(1, latencies.len()) - 1;
        latencies[i].as_micros()
    };
    println!(
        "JAEGER_RUN {} {} {}",
        cpu.as_micros() / latencies.len() as u128,
        pct(0.50),
        pct(0.99)
    );
}

/// One run in a child process: CPU µs per turn, p50 µs, p99 µs.
fn run(turns: usize, from: Source, endpoint: Option<&str>) -> Option<(f64, f64, f64)> {
    let exe = std::env::current_exe().ok()?;
    let mut cmd = std::process::Command::new(exe);
    cmd.arg("--jaeger-child")
        .arg(turns.to_string())
        .arg(if from == Source::Http {
            "http"
        } else {
            "channel"
        });
    if let Some(e) = endpoint {
        cmd.arg(e);
    }
    let out = cmd.output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().find_map(|l| l.strip_prefix("JAEGER_RUN "))?;
    let v: Vec<f64> = line
        .split_whitespace()
        .filter_map(|x| x.parse().ok())
        .collect();
    (v.len() == 3).then(|| (v[0], v[1], v[2]))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Section 13: export to Jaeger on vs off, alternating runs.
pub fn bench_jaeger(quick: bool) {
    println!(
        "\n## 13. Turns with every span exported to a real Jaeger vs no exporter (CPU per turn, turn latency; {SESSIONS} sessions)"
    );
    let Ok(endpoint) = std::env::var("WARDEN_JAEGER_OTLP") else {
        println!("jaeger: skipped, source .ci/jaeger (sets WARDEN_JAEGER_OTLP)");
        return;
    };
    for from in [Source::Channel, Source::Http] {
        compare(quick, from, &endpoint);
    }
}

/// One table: `from`'s turns with export on vs off.
fn compare(quick: bool, from: Source, endpoint: &str) {
    let turns = match (from, quick) {
        (Source::Channel, true) => 5_000,
        (Source::Channel, false) => 20_000,
        (Source::Http, true) => 1_000,
        (Source::Http, false) => 4_000,
    };
    let runs = if quick { 3 } else { 5 };
    let (mut off, mut on) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        off.extend(run(turns, from, None));
        on.extend(run(turns, from, Some(endpoint)));
    }
    if off.is_empty() || on.is_empty() {
        println!("jaeger: a child run failed");
        return;
    }
    let col =
        |v: &[(f64, f64, f64)], f: fn(&(f64, f64, f64)) -> f64| median(v.iter().map(f).collect());
    let row = |name: &str, v: &[(f64, f64, f64)]| {
        println!(
            "| {name} | {:.0} | {:.2} | {:.2} |",
            col(v, |r| r.0),
            col(v, |r| r.1) / 1000.0,
            col(v, |r| r.2) / 1000.0
        );
    };
    let what = match from {
        Source::Channel => "in-process source, 20 frames (the floor)",
        Source::Http => "Anthropic source over HTTP against the mock, 300-word replies",
    };
    println!("\n{what}: {turns} turns per run, median of {runs} runs each, alternating:");
    println!("| export | CPU µs per turn | p50 turn ms | p99 turn ms |");
    println!("|---|---:|---:|---:|");
    row("off (no exporter, baseline)", &off);
    row("on (OTLP/gRPC to Jaeger)", &on);
    println!(
        "ratio on/off: CPU per turn {:.3}x, p99 {:.3}x",
        col(&on, |r| r.0) / col(&off, |r| r.0),
        col(&on, |r| r.2) / col(&off, |r| r.2)
    );
}
