//! The library API behind `warden demo`, in one page: a supervisor over a
//! sled store, Anthropic SSE sources that keep their conversations in
//! transcripts, and the mock LLM server playing a stall and a resume
//! failure.
//!
//! ```sh
//! cargo run --example orchestrator
//! ```
//!
//! `repo-a`'s first stream stalls with its socket held open: the watchdog
//! kills it after the timeout (1.5 s here; `WARDEN_STREAM_TIMEOUT` in ms
//! overrides) and the session retries. `repo-b` has a stored conversation
//! whose transcript is gone: the supervisor starts it fresh, re-delivers
//! the message and tells the user. State lives in `WARDEN_DATA_DIR`, else a
//! temporary directory.

use std::sync::Arc;
use std::time::Duration;

use warden_core::lifecycle::Received;
use warden_core::{
    Durability, EventSource, LifecycleEvent, Notice, SessionKey, SessionRecord, SessionStore,
    Supervisor, SupervisorConfig, WatchdogConfig,
};
use warden_llm::{AnthropicOptions, AnthropicSource, HttpOptions, Transcripts};
use warden_mock::{MockConfig, MockServer, Scenario};
use warden_store::SledStore;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // Where state lives: a sled database and the transcripts.
    let temp = tempfile::tempdir()?;
    let dir = std::env::var_os("WARDEN_DATA_DIR").map_or(temp.path().to_path_buf(), Into::into);
    let store = Arc::new(SledStore::open(dir.join("sessions.db"))?);
    let transcripts = Transcripts::open(dir.join("transcripts"))?;

    // The LLM: the first request stalls, every later one answers.
    let mock =
        MockServer::start(MockConfig::default().with_sequence([Scenario::Stall, Scenario::Normal]))
            .await?;
    let source = Arc::new(AnthropicSource::new(
        AnthropicOptions::default()
            .with_base_url(mock.base_url())
            .with_http(HttpOptions::default().with_transcripts(transcripts)),
    )?);

    // repo-b was used before; its conversation's transcript is gone.
    let mut stale = SessionRecord::new(&SessionKey::new("repo-b"), None);
    stale.set_agent_session_id(&Transcripts::new_id());
    store.save(&stale, Durability::Flushed).await?;

    // The supervisor: a shorter watchdog timeout than the 45 s default,
    // notices on a channel (a chat bridge would post them to the user).
    let timeout = match std::env::var_os(warden_core::config::STREAM_TIMEOUT_ENV) {
        Some(_) => warden_core::config::stream_timeout_from_env()?,
        None => Duration::from_millis(1500),
    };
    let (notices, mut notice_rx) = tokio::sync::mpsc::unbounded_channel::<(SessionKey, Notice)>();
    let factory = move |_: &SessionKey| source.clone() as Arc<dyn EventSource>;
    let supervisor = Supervisor::builder(Arc::new(factory))
        .config(
            SupervisorConfig::default()
                .with_watchdog(WatchdogConfig::default().with_default_timeout(timeout)?),
        )
        .store(store.clone())
        .notifier(Arc::new(notices))
        .start()
        .await?;

    // Watch what happens.
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
                LifecycleEvent::StreamTimedOut {
                    key, silent_for, ..
                } => println!("{key}: watchdog killed a stream silent for {silent_for:.2?}"),
                LifecycleEvent::RetryScheduled { key, delay, .. } => {
                    println!("{key}: retrying in {delay:.2?}")
                }
                LifecycleEvent::FreshFallback { key, failed_id, .. } => {
                    println!("{key}: {failed_id} cannot be resumed, started fresh")
                }
                _ => {}
            }
        }
    });
    tokio::spawn(async move {
        while let Some((key, notice)) = notice_rx.recv().await {
            if let Notice::FreshStart { message, .. } = notice {
                println!("{key}: told the user: {message}");
            }
        }
    });

    // Send, wait for the answers (with the context indicator).
    let a = supervisor.send("repo-a", "Why does the test hang?").await?;
    let b = supervisor.send("repo-b", "Where were we?").await?;
    for (key, turn) in [("repo-a", a), ("repo-b", b)] {
        let (text, summary) = turn.finish().await?;
        println!("{key}: answered in {} attempt(s): {text}", summary.attempts);
    }
    supervisor.shutdown().await;
    watcher.await?;
    mock.shutdown().await;
    for record in store.list().await?.into_iter().flatten() {
        println!(
            "stored {}: conversation {:?}, earlier {:?}",
            record.key, record.agent_session_id, record.past_session_ids
        );
    }
    Ok(())
}
