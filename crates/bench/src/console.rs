//! Section 12, `console`: the web console (`/ui`, issue #27) with 1,000
//! sessions, in a real headless Chromium (Debian's chromium and
//! chromium-driver, over WebDriver), against a real `warden serve` router
//! on a loopback socket with the Anthropic source on the mock.
//!
//! Per run: `n` sessions are created (one answered turn each), the page is
//! opened and signed in, and it records with the User Timing API (its
//! `warden-profile` switch) how long it takes from the sign-in click to the
//! first painted table, then — while turns arrive at 100 per second on
//! random sessions, each one a handful of lifecycle events — how long each
//! frame's painting takes, how long an event waits between its arrival
//! and the frame that shows it, and how busy the page's main thread is
//! (plus any long task, > 50 ms). The baseline is the same page with 10
//! sessions, in the same run.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt as _;
use serde_json::Value;
use tokio::time::Instant;
use warden_browser::Browser;
use warden_core::{EventSource, SessionKey, Supervisor};
use warden_mock::{MockConfig, MockServer};

const TOKEN: &str = "console-bench-token";
/// Turns sent per second during the update phase.
const RATE: u64 = 100;

/// What one run measured.
struct Figures {
    sessions: usize,
    render_ms: f64,
    updates: u64,
    /// How long the turns were being sent.
    sending_secs: f64,
    /// The whole update window (sending, and the last events arriving).
    secs: f64,
    paint: Vec<f64>,
    latency: Vec<f64>,
    busy_ms: f64,
    long_tasks: usize,
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// The durations of the page's User Timing measures named `name`, sorted.
async fn durations(browser: &Browser, name: &str) -> Vec<f64> {
    let v = browser
        .eval(&format!(
            "return performance.getEntriesByName('{name}').map(e => e.duration)"
        ))
        .await;
    let mut out: Vec<f64> = v
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_f64).collect())
        .unwrap_or_default();
    out.sort_by(f64::total_cmp);
    out
}

async fn run(browser: &Browser, sessions: usize, secs: u64) -> Figures {
    let mock = MockServer::start(
        MockConfig::default()
            .with_reply("ok")
            .with_frame_interval(Duration::from_millis(1)),
    )
    .await
    .expect("mock");
    let source: Arc<dyn EventSource> = Arc::new(
        warden_llm::AnthropicSource::new(
            warden_llm::AnthropicOptions::default().with_base_url(mock.base_url()),
        )
        .expect("source"),
    );
    let config = warden_core::SupervisorConfig::default().with_max_sessions(sessions + 16);
    let supervisor = Supervisor::builder(Arc::new(move |_: &SessionKey| source.clone()))
        .config(config)
        .start()
        .await
        .expect("supervisor");
    let app = warden_serve::router(
        supervisor.clone(),
        warden_serve::ServeConfig::new(TOKEN).with_agent(warden_serve::Agent::Anthropic),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let http = reqwest::Client::new();
    let turn = |key: String| {
        let http = http.clone();
        let url = format!("{base}/v1/turns");
        async move {
            let body = serde_json::json!({"key": key, "message": "hi"}).to_string();
            let response = http
                .post(url)
                .bearer_auth(TOKEN)
                .header("content-type", "application/json")
                .header("accept", "text/event-stream")
                .body(body)
                .send()
                .await
                .expect("post");
            // Read to the end: the turn is answered.
            let mut stream = response.bytes_stream();
            while stream.next().await.is_some() {}
        }
    };
    futures_util::stream::iter((0..sessions).map(|i| turn(format!("session-{i:04}"))))
        .buffer_unordered(64)
        .collect::<Vec<()>>()
        .await;

    // The page, profiling, signed in: until its table holds every session.
    browser
        .client
        .goto(&format!("{base}/ui"))
        .await
        .expect("open /ui");
    browser
        .eval("sessionStorage.setItem('warden-profile', '1'); sessionStorage.removeItem('warden-token')")
        .await;
    browser.client.refresh().await.expect("reload");
    browser.wait_visible("#login").await;
    browser.type_into("#token", TOKEN).await;
    browser.click("#login-button").await;
    let deadline = Instant::now() + Duration::from_secs(60);
    // Every session counted, the first page of them (100 rows) drawn.
    let rows = sessions.min(100) as u64;
    let want = Value::from(format!("({sessions}) {rows}"));
    loop {
        let shown = browser
            .eval(
                "return document.getElementById('session-count').textContent + ' ' + \
                 document.querySelectorAll('#sessions-table tbody tr').length",
            )
            .await;
        if shown == want {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the table fills in time: {shown}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let render_ms = durations(browser, "warden.first-table")
        .await
        .first()
        .copied()
        .unwrap_or(f64::NAN);

    // 100 turns a second on random sessions, for `secs`.
    browser
        .eval(
            "performance.clearMeasures(); window.__long = []; \
             new PerformanceObserver(l => window.__long.push(...l.getEntries().map(e => e.duration))) \
               .observe({type: 'longtask'});",
        )
        .await;
    let started = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_millis(1000 / RATE));
    let mut sent = 0u64;
    let mut tasks = Vec::new();
    while started.elapsed() < Duration::from_secs(secs) {
        tick.tick().await;
        let key = format!("session-{:04}", (rand::random::<u64>() % sessions as u64));
        tasks.push(tokio::spawn(turn(key)));
        sent += 1;
    }
    let sending_secs = started.elapsed().as_secs_f64();
    for t in tasks {
        let _ = t.await;
    }
    // The last events reach the page.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let window_secs = started.elapsed().as_secs_f64();
    let paint = durations(browser, "warden.paint").await;
    let apply = durations(browser, "warden.apply").await;
    let refresh = durations(browser, "warden.refresh").await;
    let latency = durations(browser, "warden.latency").await;
    let long_tasks = browser
        .eval("return window.__long.length")
        .await
        .as_u64()
        .unwrap_or(0) as usize;
    let busy_ms = paint.iter().chain(&apply).chain(&refresh).sum();
    server.abort();
    supervisor.shutdown().await;
    Figures {
        sessions,
        render_ms,
        updates: sent,
        sending_secs,
        secs: window_secs,
        paint,
        latency,
        busy_ms,
        long_tasks,
    }
}

/// Section 12: the console's time to render and to apply 100 updates a
/// second, with 1,000 sessions against 10.
pub async fn bench_console(quick: bool) {
    println!("\n## 12. console: 1,000 sessions in a real browser (issue #27)\n");
    let browser = match warden_browser::programs() {
        Ok(_) => Browser::start().await.expect("a headless Chromium"),
        Err(why) => {
            println!("skipped: {why}");
            return;
        }
    };
    let secs = if quick { 5 } else { 15 };
    let base = run(&browser, 10, secs).await;
    let big = run(&browser, 1000, secs).await;
    println!(
        "| sessions | sign-in → table painted (ms) | turns/s sent | frame paint p50 / p99 / max (ms) | event → screen p50 / p99 (ms) | main thread busy | long tasks |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    for f in [&base, &big] {
        println!(
            "| {} | {:.0} | {:.0} | {:.2} / {:.2} / {:.2} | {:.1} / {:.1} | {:.1} % | {} |",
            f.sessions,
            f.render_ms,
            f.updates as f64 / f.sending_secs,
            percentile(&f.paint, 0.5),
            percentile(&f.paint, 0.99),
            f.paint.last().copied().unwrap_or(f64::NAN),
            percentile(&f.latency, 0.5),
            percentile(&f.latency, 0.99),
            100.0 * f.busy_ms / (f.secs * 1000.0),
            f.long_tasks,
        );
    }
    println!(
        "ratios 1,000 / 10: render {:.2}x, paint p99 {:.2}x, event → screen p99 {:.2}x, busy {:.2}x",
        big.render_ms / base.render_ms,
        percentile(&big.paint, 0.99) / percentile(&base.paint, 0.99),
        percentile(&big.latency, 0.99) / percentile(&base.latency, 0.99),
        big.busy_ms / base.busy_ms,
    );
    browser.close().await;
}
