//! A planner and three workers, end to end: the program
//! `docs/orchestrator.md` walks through (the `fan_out` example grown up).
//!
//! ```sh
//! cargo run --example planner_workers
//! ```
//!
//! The LLM is warden's mock server, one script per session: worker-1's
//! first reply stalls mid-text with the socket held open (a dropped NAT
//! mapping), worker-2's first request is rate-limited (429). Warden kills
//! the stall after 1 s and continues the reply, retries the 429 after its
//! `retry-after`, and the planner merges three whole answers. CI runs it;
//! it fails (exit 1) if any of that did not happen.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt as _;
use warden_core::lifecycle::Received;
use warden_core::{
    Admission, AdmissionConfig, EventSource, LifecycleEvent, Restart, RetryPolicy, RetryVerdict,
    SendOptions, SessionConfig, SessionKey, SessionSpec, StreamError, Supervisor, SupervisorConfig,
    TextEdit, WatchdogConfig,
};
use warden_llm::{AnthropicOptions, AnthropicSource};
use warden_mock::{MockConfig, MockServer, Scenario};

const TASKS: [(&str, &str); 3] = [
    ("worker-1", "write the changelog"),
    ("worker-2", "run the test suite"),
    ("worker-3", "tag the release"),
];

/// What the bus showed, counted by the watcher.
#[derive(Debug, Default)]
struct Seen {
    kills: u32,
    continuations: u32,
    retries: u32,
    most_streams: i32,
    streams_left: i32,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // 1. The LLM, one script per session.
    let mock = MockServer::start(
        MockConfig::default()
            .with_script("worker-1", [Scenario::Stall, Scenario::Normal])
            .with_script("worker-2", [Scenario::RateLimited, Scenario::Normal]),
    )
    .await?;
    let source_of = |key: &str| -> anyhow::Result<Arc<dyn EventSource>> {
        let base = format!("{}/session/{key}", mock.base_url());
        Ok(Arc::new(AnthropicSource::new(
            AnthropicOptions::default().with_base_url(base),
        )?))
    };

    // 2. Roles are specs, given with a session's first send. Workers retry
    // fast, three attempts at most, and are never restarted (the planner
    // re-plans instead); the planner waits out a stall a little longer.
    let worker_config = SessionConfig::default().with_retry(
        RetryPolicy::default()
            .with_max_attempts(3)
            .with_backoff(Duration::from_millis(100), Duration::from_secs(1)),
    );
    let planner =
        SessionSpec::new(source_of("planner")?).with_config(SessionConfig::default().with_retry(
            RetryPolicy::default().with_hook(|error, _| match error {
                StreamError::InactivityTimeout { .. } => {
                    RetryVerdict::RetryAfter(Duration::from_millis(300))
                }
                _ => RetryVerdict::Default,
            }),
        ));

    // 3. The supervisor: a 1 s watchdog (45 s by default), two streams at
    // once. Its factory serves keys sent without a spec.
    let fallback = source_of("other")?;
    let supervisor =
        Supervisor::builder(Arc::new(move |_: &SessionKey| fallback.clone()))
            .config(SupervisorConfig::default().with_watchdog(
                WatchdogConfig::default().with_default_timeout(Duration::from_secs(1))?,
            ))
            .admission(Admission::new(
                AdmissionConfig::default().with_max_streams(2),
            ))
            .start()
            .await?;

    // 4. Watch the bus: it ends on its own after the shutdown.
    let mut events = supervisor.events();
    let watcher = tokio::spawn(async move {
        let mut seen = Seen::default();
        while let Some(received) = events.recv().await {
            let event = match received {
                Received::Event(event) => event,
                Received::Lagged(missed) => {
                    println!("(missed {missed} events)");
                    continue;
                }
                _ => continue,
            };
            match event {
                LifecycleEvent::AttemptStarted { .. } => {
                    seen.streams_left += 1;
                    seen.most_streams = seen.most_streams.max(seen.streams_left);
                }
                LifecycleEvent::AttemptEnded { .. } => seen.streams_left -= 1,
                LifecycleEvent::StreamTimedOut { key, .. } => {
                    seen.kills += 1;
                    println!("{key}: silent past the watchdog, killed");
                }
                LifecycleEvent::ContinueScheduled { key, .. } => {
                    seen.continuations += 1;
                    println!("{key}: continuing the reply where it broke");
                }
                LifecycleEvent::RetryScheduled {
                    key, error_code, ..
                } => {
                    seen.retries += 1;
                    println!("{key}: retrying ({error_code})");
                }
                _ => {}
            }
        }
        seen
    });

    // 5. Plan, then fan out with each worker's role.
    let (_, plan) = supervisor
        .send_with_spec(
            "planner",
            planner,
            "Split 'ship the release' into three tasks.",
            SendOptions::default(),
        )
        .await?
        .finish()
        .await?;
    println!("planner: {}", plan.text);
    let mut turns = Vec::new();
    for (key, task) in TASKS {
        let spec = SessionSpec::new(source_of(key)?)
            .with_config(worker_config.clone())
            .with_restart(Restart::Temporary);
        turns.push(
            supervisor
                .send_with_spec(key, spec, task, SendOptions::default())
                .await?,
        );
    }
    // A second message to worker-3, withdrawn while it waits its turn.
    let extra = supervisor.send("worker-3", "benchmark everything").await?;
    let withdrawn = extra.cancel().await?;

    // 6. worker-1's reply as a reader shows it: edits, the stall's kill
    // and continuation included, leave exactly its answer.
    let mut answers = Vec::new();
    let mut turns = turns.into_iter();
    let mut shown = String::new();
    let mut edits = turns.next().expect("worker-1's turn").text_stream();
    while let Some(edit) = edits.next().await {
        match edit {
            TextEdit::Append(text) => shown.push_str(&text),
            TextEdit::Discard { chars } => {
                let keep = shown.chars().count().saturating_sub(chars);
                shown = shown.chars().take(keep).collect();
            }
            TextEdit::Finished(result) => {
                let summary = result?;
                anyhow::ensure!(
                    shown == summary.text,
                    "shown {shown:?}, answered {:?}",
                    summary.text
                );
                answers.push(format!(
                    "- {} ({} attempts): {}",
                    TASKS[0].1, summary.attempts, shown
                ));
            }
            _ => {}
        }
    }
    for ((_, task), turn) in TASKS.iter().skip(1).zip(turns) {
        let (_, summary) = turn.finish().await?;
        answers.push(format!(
            "- {task} ({} attempts): {}",
            summary.attempts, summary.text
        ));
    }

    // 7. The planner merges; then an orderly shutdown.
    let merge = format!("Merge these results:\n{}", answers.join("\n"));
    println!("{merge}");
    let (reply, _) = supervisor.send("planner", merge).await?.finish().await?;
    println!("planner: {reply}");
    supervisor.shutdown().await;
    let seen = watcher.await?;
    mock.shutdown().await;

    println!("{seen:?}");
    anyhow::ensure!(withdrawn, "the extra task was withdrawn before it ran");
    anyhow::ensure!(
        seen.kills >= 1 && seen.continuations >= 1,
        "worker-1's stall"
    );
    anyhow::ensure!(seen.retries >= 1, "worker-2's 429");
    anyhow::ensure!(seen.most_streams <= 2, "two streams at once at most");
    anyhow::ensure!(seen.streams_left == 0, "every stream told ended");
    Ok(())
}
