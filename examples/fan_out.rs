//! Fan-out: a planner session splits a task, three worker sessions run the
//! parts with at most two streams at once, and the planner merges their raw
//! answers.
//!
//! ```sh
//! cargo run --example fan_out
//! ```
//!
//! The LLM is warden's mock server; its second request stalls with the
//! socket held open (a dropped NAT mapping): the watchdog kills it after
//! 1.5 s and that worker retries under its own policy. A fourth task is
//! cancelled by its turn handle while it waits for a stream slot, so it
//! never reaches the API.

use std::sync::Arc;
use std::time::Duration;

use warden_core::lifecycle::Received;
use warden_core::{
    Admission, AdmissionConfig, EventSource, LifecycleEvent, RetryPolicy, SessionConfig,
    SessionKey, SessionSpec, Supervisor, SupervisorConfig, WatchdogConfig, specs,
};
use warden_llm::{AnthropicOptions, AnthropicSource};
use warden_mock::{MockConfig, MockServer, Scenario};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mock = MockServer::start(MockConfig::default().with_sequence([
        Scenario::Normal,
        Scenario::Stall,
        Scenario::Normal,
    ]))
    .await?;
    let source: Arc<dyn EventSource> = Arc::new(AnthropicSource::new(
        AnthropicOptions::default().with_base_url(mock.base_url()),
    )?);

    // Workers retry fast and give up after three attempts; the planner keeps
    // the supervisor's settings.
    let worker = SessionConfig::default().with_retry(
        RetryPolicy::default()
            .with_max_attempts(3)
            .with_backoff(Duration::from_millis(100), Duration::from_secs(1)),
    );
    let factory = specs(move |key: &SessionKey| {
        let spec = SessionSpec::new(source.clone());
        match key.as_str().starts_with("worker") {
            true => spec.with_config(worker.clone()),
            false => spec,
        }
    });
    let timeout = Duration::from_millis(1500);
    let supervisor = Supervisor::builder(Arc::new(factory))
        .config(
            SupervisorConfig::default()
                .with_watchdog(WatchdogConfig::default().with_default_timeout(timeout)?),
        )
        .admission(Admission::new(
            AdmissionConfig::default().with_max_streams(2),
        ))
        .start()
        .await?;

    // Ends on its own after the shutdown's last event; a gap (a watcher
    // more than 1,024 events behind) is an item, not the end.
    let mut events = supervisor.events();
    let watcher = tokio::spawn(async move {
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
                LifecycleEvent::AttemptQueued { key, .. } => println!("{key}: waits for a slot"),
                LifecycleEvent::StreamTimedOut { key, .. } => println!("{key}: stalled, killed"),
                LifecycleEvent::RetryScheduled { key, delay, .. } => {
                    println!("{key}: retrying in {delay:.1?}")
                }
                _ => {}
            }
        }
    });

    let (_, plan) = supervisor
        .send("planner", "Split 'ship the release' into three tasks.")
        .await?
        .finish()
        .await?;
    println!("planner: {}", plan.text);

    let tasks = [
        "write the changelog",
        "run the test suite",
        "tag the release",
    ];
    let mut turns = Vec::new();
    for (i, task) in tasks.iter().enumerate() {
        turns.push(supervisor.send(format!("worker-{i}"), *task).await?);
    }
    let extra = supervisor.send("worker-3", "benchmark everything").await?;
    if extra.cancel().await? {
        println!("worker-3: cancelled before it reached the API");
    }

    let mut answers = Vec::new();
    for (task, turn) in tasks.iter().zip(turns) {
        match turn.finish().await {
            Ok((_, s)) => answers.push(format!("- {task} ({} attempts): {}", s.attempts, s.text)),
            Err(e) => answers.push(format!("- {task}: failed: {e}")),
        }
    }
    let merge = format!("Merge these results:\n{}", answers.join("\n"));
    println!("{merge}");
    let (reply, _) = supervisor.send("planner", merge).await?.finish().await?;
    println!("planner: {reply}");

    supervisor.shutdown().await;
    watcher.await?;
    mock.shutdown().await;
    Ok(())
}
