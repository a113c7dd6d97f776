//! An orchestrator driving three workspace sessions through warden, with a
//! stream that dies silently and one that thinks for a long time.
//!
//! ```sh
//! cargo run --release --example orchestrator
//! ```
//!
//! The agent here is an in-process scripted source (real LLM sources live in
//! their own crate): `repo-b`'s first attempt sends three frames and then
//! goes silent with the stream held open, as a NAT drop would leave it; the
//! watchdog kills it and the session retries from scratch. `repo-c` thinks
//! for longer than the timeout but sends pings, so it is never killed.
//! `repo-d` has a stored conversation that is too large to resume: the
//! supervisor clears it, starts fresh, re-delivers the message and notifies.
//! Sessions live in a sled database on disk (`WARDEN_DATA_DIR`, else a new
//! temporary directory). The watchdog timeout is shortened to 1.5 s so the
//! demo takes seconds (`WARDEN_STREAM_TIMEOUT` in ms overrides it).

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::future::BoxFuture;
use tokio::time::Instant;
use warden_core::{
    AgentEvent, Durability, EventSource, EventStream, Frame, LifecycleEvent, Notice, SessionKey,
    SessionRecord, SessionStore, StreamError, Supervisor, SupervisorConfig, TurnRequest, Usage,
    WatchdogConfig,
};
use warden_store::SledStore;

/// A scripted agent: what each workspace's stream does.
struct ScriptedAgent {
    key: SessionKey,
    opened: AtomicU32,
}

enum Step {
    Text(&'static str),
    Ping,
    Wait(u64),
    StallForever,
}

impl EventSource for ScriptedAgent {
    fn open(&self, req: TurnRequest) -> BoxFuture<'static, Result<EventStream, StreamError>> {
        let n = self.opened.fetch_add(1, Ordering::Relaxed) + 1;
        if req.resume_id.as_deref() == Some("too-big") {
            return Box::pin(async {
                Err(StreamError::ContextOverflow {
                    reason: "prompt_too_long".into(),
                    message: "Prompt is too long".into(),
                })
            });
        }
        let key = self.key.to_string();
        let script: Vec<Step> = match (self.key.as_str(), n) {
            ("repo-b", 1) => vec![
                Step::Text("Reading "),
                Step::Text("the "),
                Step::Text("code"),
                Step::StallForever,
            ],
            ("repo-c", _) => {
                let mut s = vec![Step::Text("Thinking...")];
                for _ in 0..6 {
                    s.extend([Step::Wait(500), Step::Ping]);
                }
                s.push(Step::Text(" done: 42."));
                s
            }
            _ => "All tests pass in this workspace."
                .split_inclusive(' ')
                .flat_map(|w| [Step::Wait(60), Step::Text(w)])
                .collect(),
        };
        Box::pin(async move {
            let frames = futures_util::stream::iter(script).then(|step| async move {
                match step {
                    Step::Text(t) => Some(Frame::Event(AgentEvent::TextDelta(t.into()))),
                    Step::Ping => Some(Frame::KeepAlive),
                    Step::Wait(ms) => {
                        tokio::time::sleep(Duration::from_millis(ms)).await;
                        None
                    }
                    Step::StallForever => {
                        std::future::pending::<()>().await;
                        None
                    }
                }
            });
            let session = futures_util::stream::once(async move {
                Some(Frame::Event(AgentEvent::SessionStarted {
                    session_id: format!("{key}-conversation"),
                    model: Some("claude-demo".into()),
                }))
            });
            let usage = Usage {
                input_tokens: 12,
                cache_creation_input_tokens: 800,
                cache_read_input_tokens: 40_000 * u64::from(n),
                output_tokens: 30,
            };
            let done = futures_util::stream::iter([
                Some(Frame::Event(AgentEvent::Usage(usage))),
                Some(Frame::Event(AgentEvent::TurnComplete {
                    context_window: None,
                    duration: None,
                })),
            ]);
            let all = session.chain(frames).chain(done);
            Ok(Box::pin(all.filter_map(|f| async { f.map(Ok) })) as EventStream)
        })
    }

    fn provider(&self) -> &str {
        "scripted"
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let timeout = match std::env::var_os(warden_core::config::STREAM_TIMEOUT_ENV) {
        Some(_) => warden_core::config::stream_timeout_from_env()?,
        None => Duration::from_millis(1500),
    };
    let config = SupervisorConfig::default()
        .with_watchdog(WatchdogConfig::default().with_default_timeout(timeout)?);
    let factory = |key: &SessionKey| {
        Arc::new(ScriptedAgent {
            key: key.clone(),
            opened: AtomicU32::new(0),
        }) as Arc<dyn EventSource>
    };
    // A temporary directory (removed at exit) unless WARDEN_DATA_DIR is set.
    let temp = tempfile::tempdir()?;
    let data_dir = match std::env::var_os("WARDEN_DATA_DIR") {
        Some(d) => std::path::PathBuf::from(d),
        None => temp.path().to_path_buf(),
    };
    let store = Arc::new(SledStore::open(data_dir.join("sessions.db"))?);
    // repo-d was used before: its stored conversation no longer fits.
    let mut old = SessionRecord::new(&SessionKey::new("repo-d"), None);
    old.set_agent_session_id("too-big");
    if store.load(&SessionKey::new("repo-d")).await?.is_none() {
        store.save(&old, Durability::Flushed).await?;
    }
    let (notices, mut notice_rx) = tokio::sync::mpsc::unbounded_channel::<(SessionKey, Notice)>();
    let supervisor = Supervisor::builder(Arc::new(factory))
        .config(config)
        .store(store.clone())
        .notifier(Arc::new(notices))
        .start()
        .await?;
    tokio::spawn(async move {
        while let Some((key, notice)) = notice_rx.recv().await {
            if let Notice::FreshStart { message, .. } = notice {
                println!("        {key}: notice to the user: {message}");
            }
        }
    });
    let t0 = Instant::now();
    let mut events = supervisor.subscribe();
    tokio::spawn(async move {
        while let Ok(ev) = events.recv().await {
            let at = t0.elapsed().as_secs_f64();
            match ev {
                LifecycleEvent::StreamTimedOut {
                    key, silent_for, ..
                } => println!(
                    "{at:6.2}s  {key}: watchdog killed a silent stream after {:.2}s (ESTREAM_TIMEOUT)",
                    silent_for.as_secs_f64()
                ),
                LifecycleEvent::RetryScheduled {
                    key,
                    delay,
                    error_code,
                    ..
                } => println!(
                    "{at:6.2}s  {key}: retrying from scratch in {:.2}s after {error_code}",
                    delay.as_secs_f64()
                ),
                LifecycleEvent::AttemptStarted { key, attempt, .. } => {
                    println!("{at:6.2}s  {key}: attempt {} started", attempt.attempt)
                }
                LifecycleEvent::ResumeFailed { key, cause, .. } => {
                    println!("{at:6.2}s  {key}: stored conversation cannot be resumed ({cause})")
                }
                LifecycleEvent::FreshFallback {
                    key, redelivered, ..
                } => println!(
                    "{at:6.2}s  {key}: started fresh, {redelivered} message(s) re-delivered"
                ),
                _ => {}
            }
        }
    });

    println!(
        "watchdog timeout {:.1}s; four workspaces; sessions stored in {}",
        timeout.as_secs_f64(),
        data_dir.display()
    );
    let mut turns = Vec::new();
    for key in ["repo-a", "repo-b", "repo-c", "repo-d"] {
        turns.push((key, supervisor.send(key, "status?").await?));
    }
    for (key, turn) in turns {
        let (text, summary) = turn.finish().await?;
        println!(
            "{:6.2}s  {key}: answered in {} attempt(s): {text:?}",
            t0.elapsed().as_secs_f64(),
            summary.attempts
        );
    }
    let stats = supervisor.watchdog().stats().await?;
    println!(
        "watchdog kills: {}, still watched: {}",
        stats.kills, stats.watched
    );
    supervisor.shutdown().await;
    println!("stored sessions:");
    for record in store.list().await?.into_iter().flatten() {
        println!(
            "  {:8} agent id {:22} past ids {:?} ctx {}%",
            record.key,
            record.agent_session_id.unwrap_or_default(),
            record.past_session_ids,
            record.usage.map(|u| u.context_percent).unwrap_or(0)
        );
    }
    Ok(())
}
