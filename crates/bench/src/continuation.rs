//! Section 8, `continuation`: a 2,000-token reply (about 8,000 bytes,
//! streamed by the mock in deltas of a few words, 1 ms apart) stalls with
//! its socket open at 10 %, 50 % or 90 % of its text; the watchdog (200 ms)
//! kills it. Measured per kill point: output tokens generated in all (the
//! broken attempt's text plus the next attempt's reply, as the mock counts
//! them) and time from send to the whole reply, warden's continuation
//! (`AnthropicSource`, prefill) versus restart from scratch (the same
//! source with continuation withheld: warden before #14). Same run, same
//! mock.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;
use warden_core::{
    AgentEvent, EventSource, EventStream, RetryPolicy, SessionConfig, SessionKey, StreamError,
    Supervisor, SupervisorConfig, TurnEvent, TurnRequest, WatchdogConfig,
};
use warden_mock::{MockConfig, MockServer, Outcome, Scenario};

const TIMEOUT: Duration = Duration::from_millis(200);
const FRAME: Duration = Duration::from_millis(1);
const BOUND: Duration = Duration::from_secs(60);

/// About 2,000 tokens of distinct words (four bytes a token).
fn reply() -> String {
    let mut s = String::new();
    let mut i = 0;
    while s.len() < 8_000 {
        s.push_str(&format!("word{i} "));
        i += 1;
    }
    s.trim_end().to_owned()
}

/// The source with continuation withheld: every retry starts over.
struct Restarting(Arc<dyn EventSource>);

impl EventSource for Restarting {
    fn open(&self, mut r: TurnRequest) -> BoxFuture<'static, Result<EventStream, StreamError>> {
        r.continuation = None;
        self.0.open(r)
    }

    fn provider(&self) -> &str {
        self.0.provider()
    }
}

/// One run: (output tokens generated, seconds to the whole reply).
async fn run(kill_at: f64, continue_: bool) -> (u64, f64) {
    let text = reply();
    // Frames before the text: message_start, content_block_start, ping.
    let deltas = text.len() / 16; // the mock's deltas are ~16+ bytes
    let cut = 3 + ((deltas as f64) * kill_at) as usize;
    let mock = MockServer::start(
        MockConfig::default()
            .with_sequence([Scenario::Stall, Scenario::Normal])
            .with_reply(text.clone())
            .with_frame_interval(FRAME)
            .with_fault_after_frames(cut),
    )
    .await
    .expect("mock");
    let anthropic: Arc<dyn EventSource> = Arc::new(
        warden_llm::AnthropicSource::new(
            warden_llm::AnthropicOptions::default()
                .with_base_url(mock.base_url())
                .with_max_tokens(4096),
        )
        .expect("source"),
    );
    let source: Arc<dyn EventSource> = if continue_ {
        anthropic
    } else {
        Arc::new(Restarting(anthropic))
    };
    let config = SupervisorConfig::default()
        .with_watchdog(
            WatchdogConfig::default()
                .with_default_timeout(TIMEOUT)
                .expect("valid"),
        )
        .with_session(
            SessionConfig::default().with_retry(
                RetryPolicy::default()
                    .with_jitter(0.0)
                    .with_backoff(Duration::from_millis(1), Duration::from_millis(1)),
            ),
        );
    let sup = Supervisor::start(config, Arc::new(move |_: &SessionKey| source.clone()))
        .await
        .expect("supervisor");
    let t0 = Instant::now();
    let mut turn = sup.send("ws", "write at length").await.expect("send");
    let mut broken_bytes = 0usize;
    let mut attempt_bytes = 0usize;
    let got = tokio::time::timeout(BOUND, async {
        while let Some(ev) = turn.recv().await {
            match ev {
                TurnEvent::Event(AgentEvent::TextDelta(t)) => attempt_bytes += t.len(),
                TurnEvent::Retrying { .. } | TurnEvent::Continuing { .. } => {
                    broken_bytes += std::mem::take(&mut attempt_bytes);
                }
                TurnEvent::Finished(r) => return r,
                _ => {}
            }
        }
        panic!("the turn ended without Finished")
    })
    .await
    .expect("bounded")
    .expect("answered");
    let secs = t0.elapsed().as_secs_f64();
    assert_eq!(got.text, text, "the whole reply, once");
    sup.shutdown().await;
    let completed: u64 = mock
        .requests()
        .iter()
        .filter(|r| r.outcome == Outcome::Completed)
        .filter_map(|r| r.output_tokens)
        .sum();
    mock.shutdown().await;
    let broken = (broken_bytes as u64).div_ceil(4);
    (broken + completed, secs)
}

pub async fn bench_continuation(quick: bool) {
    println!("\n## 8. A 2,000-token reply killed mid-text: continuation vs restart from scratch");
    let runs = if quick { 1 } else { 3 };
    println!(
        "| killed at | restart: tokens generated | continuation: tokens | ratio | restart: s to reply | continuation: s | ratio |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    for kill_at in [0.1, 0.5, 0.9] {
        let (mut rt, mut ct, mut rs, mut cs) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for _ in 0..runs {
            let (t, s) = run(kill_at, false).await;
            rt.push(t);
            rs.push(s);
            let (t, s) = run(kill_at, true).await;
            ct.push(t);
            cs.push(s);
        }
        let med_u = |v: &mut Vec<u64>| {
            v.sort_unstable();
            v[v.len() / 2]
        };
        let med_f = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let (rt, ct, rs, cs) = (
            med_u(&mut rt),
            med_u(&mut ct),
            med_f(&mut rs),
            med_f(&mut cs),
        );
        println!(
            "| {:.0} % | {rt} | {ct} | {:.2}x | {rs:.2} | {cs:.2} | {:.2}x |",
            kill_at * 100.0,
            ct as f64 / rt as f64,
            cs / rs
        );
    }
}
