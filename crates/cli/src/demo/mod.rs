//! `warden demo`: several workspace sessions against the built-in mock LLM
//! server, with faults injected, on the real stack (Anthropic SSE over
//! loopback HTTP, the watchdog, the sled store, transcripts on disk).
//!
//! | workspace | what happens | what must hold |
//! |---|---|---|
//! | `api-server` | the first stream stalls mid-reply with the socket held open | the watchdog kills it at the timeout; the reply is continued where it broke (only the rest is generated) |
//! | `docs-site` | a thinking pause longer than the timeout, kept alive by pings | never killed |
//! | `billing` | HTTP 429 with `retry-after` | the retry waits exactly that long, then answers |
//! | `legacy-app` | its stored conversation's transcript is gone | fresh session, message re-delivered, user told |
//! | `monorepo` | its stored conversation is too long (HTTP 400) | fresh session, message re-delivered, user told |
//! | `mobile-app` | idle longer than the reap timeout between two messages | reaped, then resumed with its history |
//!
//! Every workspace's context indicator climbs as its conversation grows
//! (the demo measures against a 1,000-token window so that it shows within
//! a few turns). All timings derive from the watchdog timeout: 3 s by
//! default, 1 s with `--quick`, `WARDEN_STREAM_TIMEOUT` (ms) overrides.

mod agent;
mod clis;
mod plan;
mod summary;
mod view;

use std::collections::HashMap;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use warden_core::{
    ContextConfig, Durability, Notice, Notifier, RetryPolicy, SessionConfig, SessionKey,
    SessionRecord, SessionStore, Supervisor, SupervisorConfig, TurnError, TurnEvent, TurnSummary,
    WatchdogConfig,
};
use warden_llm::Transcripts;
use warden_mock::{MockConfig, MockServer};
use warden_store::SledStore;

use crate::exit::{CliError, Exit};
use crate::paths;
use agent::{DemoAgents, DemoFactory};
use plan::{Plan, Seed, Timings, plans};
use view::{Mode, Note, Transition, View};

/// The context window the demo measures against.
pub(crate) const DEMO_WINDOW: u64 = 1_000;

/// What the mock answers: long enough that each turn visibly grows the
/// conversation.
const REPLY: &str = "I read the code and the failing output. The problem is in how the \
client waits for the server: it has no deadline, so a dropped connection leaves it \
waiting forever. I added a timeout, a retry with backoff, and a test that cuts the \
connection in the middle of a response to prove the fix. All tests pass now.";

/// Arguments of `warden demo`.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Six workspaces talk to the built-in mock LLM server (in-process, loopback) through the
real stack: a stall killed by the watchdog and the reply continued, pings through a long thinking
pause, a 429 with retry-after, two resume failures that fall back to a fresh session,
an idle reap and resume, and the context indicator climbing. Ends with a summary and
exits 1 if any expected recovery did not happen. Exports spans when
OTEL_EXPORTER_OTLP_ENDPOINT is set.")]
pub(crate) struct DemoArgs {
    /// Where the demo's sessions and transcripts are kept. Default
    /// WARDEN_DATA_DIR, else the user's data directory
    /// (~/.local/share/warden). The demo only touches its own sessions
    /// (workspaces under DIR/demo-workspaces).
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// Short timings (1 s watchdog timeout): a few seconds, for CI.
    #[arg(long)]
    quick: bool,
    /// One JSON object per transition on stdout, then a summary object.
    #[arg(long, conflicts_with = "plain")]
    json: bool,
    /// Plain lines even on a terminal (no live table).
    #[arg(long)]
    plain: bool,
    /// Instead: one session per agent CLI installed here (Claude Code,
    /// Codex, Gemini CLI; WARDEN_CLAUDE_BIN, WARDEN_CODEX_BIN,
    /// WARDEN_GEMINI_BIN or on PATH) against the built-in mock, two turns
    /// each, the second resuming; a CLI that is not installed is skipped
    /// with the reason. Each runs with its own home under
    /// DIR/demo-agents: the user's own configuration is not touched.
    #[arg(long, conflicts_with_all = ["json", "quick"])]
    agents: bool,
}

/// What one workspace's driver saw.
#[derive(Debug, Clone)]
pub(super) struct TurnOutcome {
    pub(super) sent_at: Duration,
    pub(super) finished_at: Duration,
    pub(super) result: Result<TurnSummary, TurnError>,
}

/// Forwards notices into the demo's log.
struct DemoNotifier(mpsc::UnboundedSender<(Duration, SessionKey, Note)>, Instant);

impl Notifier for DemoNotifier {
    fn notify(&self, key: &SessionKey, notice: Notice) {
        let _ = self
            .0
            .send((self.1.elapsed(), key.clone(), Note::Notice(notice)));
    }
}

/// Runs `warden demo`.
pub(crate) async fn run(args: DemoArgs, exporting: bool) -> Result<Exit, CliError> {
    if args.agents {
        return clis::run(&paths::data_dir(args.data_dir)?).await;
    }
    let default_timeout = if args.quick {
        Duration::from_secs(1)
    } else {
        Duration::from_secs(3)
    };
    let timeout = match std::env::var_os(warden_core::config::STREAM_TIMEOUT_ENV) {
        Some(v) if !v.is_empty() => warden_core::config::stream_timeout_from_env()
            .map_err(|e| CliError::usage(e.to_string()))?,
        _ => default_timeout,
    };
    let t = Timings::new(timeout, args.quick);
    let mode = if args.json {
        Mode::Json
    } else if args.plain || !std::io::stdout().is_terminal() {
        Mode::Plain
    } else {
        Mode::Live
    };
    let data_dir = paths::data_dir(args.data_dir)?;
    let plans = plans(&t);

    // State: the store, transcripts and one directory per workspace.
    let store = Arc::new(paths::open_store(&data_dir)?);
    let transcripts_dir = data_dir.join(paths::TRANSCRIPTS);
    let transcripts = Transcripts::open(&transcripts_dir).map_err(|e| {
        CliError::failure(format!("cannot create {}: {e}", transcripts_dir.display()))
    })?;
    // Each plan's workspace directory and session key, in plan order.
    let mut workspaces = Vec::new();
    let mut scripts = HashMap::new();
    for plan in &plans {
        let dir = data_dir.join("demo-workspaces").join(plan.name);
        let key = prepare_workspace(&dir, plan, &store, &transcripts).await?;
        scripts.insert(key.clone(), (plan.name.to_owned(), plan.script.clone()));
        workspaces.push((dir, key));
    }
    let names_by_key: HashMap<String, &'static str> = plans
        .iter()
        .zip(&workspaces)
        .map(|(plan, (_, key))| (key.clone(), plan.name))
        .collect();

    // The LLM: the mock server on a free loopback port.
    let mock = MockServer::start(
        MockConfig::default()
            .with_frame_interval(t.frame)
            .with_thinking_pause(t.thinking)
            .with_ping_interval(t.ping)
            .with_retry_after(t.retry_after)
            // The stall breaks the reply a good way in: its continuation
            // saves most of the tokens a restart would spend again.
            .with_fault_after_frames(14)
            .with_reply(REPLY),
    )
    .await
    .map_err(|e| CliError::failure(format!("cannot start the mock server: {e}")))?;
    let started = Instant::now();
    let agents = Arc::new(DemoAgents::new(&mock, &transcripts, scripts, started)?);

    let (tx, mut rx) = mpsc::unbounded_channel::<(Duration, SessionKey, Note)>();
    let config = SupervisorConfig::default()
        .with_watchdog(
            WatchdogConfig::default()
                .with_default_timeout(t.timeout)
                .map_err(|e| CliError::usage(e.to_string()))?,
        )
        .with_session(
            SessionConfig::default()
                .with_retry(RetryPolicy::default().with_backoff(t.backoff, t.backoff * 8))
                .with_idle_timeout(t.idle)
                .with_context(ContextConfig::default().with_window(DEMO_WINDOW)),
        );
    let supervisor = Supervisor::builder(Arc::new(DemoFactory(agents.clone())))
        .config(config)
        .store(store.clone())
        .notifier(Arc::new(DemoNotifier(tx.clone(), started)))
        .start()
        .await?;

    // Lifecycle events into the same log.
    let mut bus = supervisor.subscribe();
    let bus_tx = tx.clone();
    let forward = tokio::spawn(async move {
        loop {
            match bus.recv().await {
                Ok(event) => {
                    let Some(key) = event.key().cloned() else {
                        continue;
                    };
                    if bus_tx
                        .send((started.elapsed(), key, Note::Life(event)))
                        .is_err()
                    {
                        break;
                    }
                }
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                Err(tokio::sync::broadcast::error::RecvError::Closed) => break,
            }
        }
    });

    let names: Vec<(String, Arc<agent::Liveness>)> = plans
        .iter()
        .map(|p| {
            (
                p.name.to_owned(),
                agents.liveness(p.name).unwrap_or_default(),
            )
        })
        .collect();
    let mut view = View::new(mode, names, t.timeout, started);
    view.say(&format!(
        "warden demo: {} workspaces, mock LLM at {}, watchdog timeout {:.1}s, sessions in {}{}",
        plans.len(),
        mock.base_url(),
        t.timeout.as_secs_f64(),
        data_dir.join(paths::DATABASE).display(),
        if exporting {
            ", exporting spans over OTLP"
        } else {
            ""
        }
    ));

    // One driver per workspace.
    let mut drivers = Vec::new();
    for (plan, (dir, key)) in plans.iter().zip(&workspaces) {
        let driver = drive(
            supervisor.clone(),
            dir.clone(),
            SessionKey::new(key.as_str()),
            plan.messages.clone(),
            tx.clone(),
            started,
        );
        drivers.push((plan.name, tokio::spawn(driver)));
    }
    drop(tx);

    // Show transitions until every driver is done.
    let mut log: Vec<Transition> = Vec::new();
    let mut outcomes: HashMap<&'static str, Vec<TurnOutcome>> = HashMap::new();
    let mut pending = drivers;
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    let mut record = |view: &mut View, (at, key, note): (Duration, SessionKey, Note)| {
        let name = names_by_key.get(key.as_str()).copied().unwrap_or("?");
        let transition = view.apply(at, name, &note);
        view.show(&transition);
        log.push(transition);
    };
    let interrupted = loop {
        if pending.iter().all(|(_, h)| h.is_finished()) {
            break false;
        }
        tokio::select! {
            Some(noted) = rx.recv() => {
                record(&mut view, noted);
                view.draw();
            }
            _ = tick.tick() => view.draw(),
            _ = tokio::signal::ctrl_c() => break true,
        }
    };
    for (name, handle) in pending.drain(..) {
        if interrupted {
            handle.abort();
        }
        if let Ok(turns) = handle.await {
            outcomes.insert(name, turns);
        }
    }
    // Let the last lifecycle events of the turns arrive.
    let settle = tokio::time::sleep(Duration::from_millis(100));
    tokio::pin!(settle);
    loop {
        tokio::select! {
            Some(noted) = rx.recv() => record(&mut view, noted),
            _ = &mut settle => break,
        }
    }
    view.finish();
    let stats = supervisor.watchdog().stats().await.ok();
    let took = started.elapsed();
    supervisor.shutdown().await;
    forward.abort();
    let closed_by_client = mock.closed_by_client();
    mock.shutdown().await;
    if interrupted {
        return Err(CliError::new(Exit::Cancelled, "demo interrupted"));
    }

    let records: HashMap<String, SessionRecord> = store
        .list()
        .await?
        .into_iter()
        .flatten()
        .filter_map(|r| {
            let name = names_by_key.get(&r.key)?;
            Some(((*name).to_owned(), r))
        })
        .collect();
    let pings: HashMap<&'static str, u64> = plans
        .iter()
        .map(|p| {
            (
                p.name,
                agents
                    .liveness(p.name)
                    .map(|l| l.pings.load(std::sync::atomic::Ordering::Relaxed))
                    .unwrap_or(0),
            )
        })
        .collect();
    let report = summary::Report {
        timings: t,
        plans: &plans,
        log: &log,
        outcomes: &outcomes,
        records: &records,
        pings: &pings,
        kills_total: stats.map(|s| s.kills),
        closed_by_client,
        took,
    };
    let checks = report.checks();
    report.print(&mut view, &checks, &data_dir);
    Ok(if checks.iter().all(|c| c.ok) {
        Exit::Ok
    } else {
        Exit::Failure
    })
}

/// Creates the workspace directory and resets its stored session (and the
/// transcripts it referenced) to the plan's starting point. Returns the
/// session key.
async fn prepare_workspace(
    dir: &Path,
    plan: &Plan,
    store: &SledStore,
    transcripts: &Transcripts,
) -> Result<String, CliError> {
    std::fs::create_dir_all(dir)
        .map_err(|e| CliError::failure(format!("cannot create {}: {e}", dir.display())))?;
    let path = warden_core::normalize_workspace(dir)
        .map_err(|e| CliError::failure(format!("workspace {}: {e}", dir.display())))?;
    // The key the supervisor will give it, before it runs.
    let key = SessionKey::for_workspace(&path)
        .map_err(|e| CliError::failure(format!("workspace {}: {e}", dir.display())))?;
    // A previous run's conversations of this workspace are the demo's own.
    if let Ok(Some(old)) = store.load(&key).await {
        for id in old.agent_session_id.iter().chain(&old.past_session_ids) {
            if let Some(file) = transcripts.path_of(id) {
                let _ = std::fs::remove_file(file);
            }
        }
    }
    let mut record = SessionRecord::new(&key, Some(path));
    match plan.seed {
        Seed::Empty => {}
        Seed::MissingTranscript => {
            // Left by an earlier run on another machine: the id is stored,
            // its transcript is not.
            record.set_agent_session_id(&Transcripts::new_id());
        }
        Seed::OversizedTranscript => {
            let id = Transcripts::new_id();
            for i in 0..40 {
                transcripts
                    .append_turn(&id, &format!("Step {i} of the refactor."), REPLY)
                    .map_err(|e| CliError::failure(format!("seeding a transcript: {e}")))?;
            }
            record.set_agent_session_id(&id);
        }
    }
    store.save(&record, Durability::Flushed).await?;
    Ok(key.as_str().to_owned())
}

/// Sends a workspace's messages one after the other.
async fn drive(
    supervisor: Supervisor,
    dir: PathBuf,
    key: SessionKey,
    messages: Vec<(Duration, &'static str)>,
    tx: mpsc::UnboundedSender<(Duration, SessionKey, Note)>,
    started: Instant,
) -> Vec<TurnOutcome> {
    let mut outcomes = Vec::new();
    let of = messages.len();
    for (i, (pause, message)) in messages.into_iter().enumerate() {
        tokio::time::sleep(pause).await;
        let sent_at = started.elapsed();
        let _ = tx.send((sent_at, key.clone(), Note::Sent { turn: i + 1, of }));
        let result = match supervisor.send_to_workspace(&dir, message).await {
            Ok(mut turn) => {
                let mut result = Err(TurnError::SessionStopped {
                    reason: "no answer".into(),
                });
                while let Some(event) = turn.recv().await {
                    if let TurnEvent::Finished(r) = event {
                        result = r;
                    }
                }
                result
            }
            Err(e) => Err(TurnError::SessionStopped {
                reason: e.to_string(),
            }),
        };
        let failed = result.is_err();
        outcomes.push(TurnOutcome {
            sent_at,
            finished_at: started.elapsed(),
            result,
        });
        if failed {
            break;
        }
    }
    outcomes
}
