//! The real Codex CLI (`@openai/codex` 0.169.0) driven through warden
//! against warden's mock Responses endpoint: a turn and a resume, resume
//! failures (an unknown thread, an id Codex would silently not resume)
//! falling back fresh with a notice, the CLI killed mid-turn, a stalled
//! upstream (warden's watchdog against Codex's own idle timeout), and a
//! cancel.
//!
//! The binary comes from `WARDEN_CODEX_BIN` (CI installs the pinned
//! package with npm, see `.ci/run`). Without it every test prints why it is
//! skipped and passes, unless `WARDEN_REQUIRE_CODEX=1` makes a missing
//! binary a failure. The CLI runs offline: `HOME` is a per-test directory
//! and its model provider is the mock (`-c model_providers.warden=…`).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use tokio::sync::mpsc::UnboundedReceiver;
use warden_claude::{CodexOptions, CodexSource, ProcessSettings};
use warden_core::{
    Durability, EventSource, LifecycleEvent, MemoryStore, Notice, ResumeCause, RetryPolicy,
    SessionConfig, SessionKey, SessionRecord, SessionStore, Supervisor, SupervisorConfig,
    WatchdogConfig, normalize_workspace,
};
use warden_mock::{MockConfig, MockServer, Scenario};

const REPLY: &str = "warden-e2e: the mock answered.";
/// The allowance of a turn that should just work (a real turn takes ~0.5 s).
const TURN: Duration = Duration::from_secs(30);
const RELAXED: Duration = Duration::from_secs(20);

fn codex_bin(test: &str) -> Option<PathBuf> {
    match std::env::var_os("WARDEN_CODEX_BIN").filter(|v| !v.is_empty()) {
        Some(bin) => {
            let bin = PathBuf::from(bin);
            assert!(
                bin.is_file(),
                "WARDEN_CODEX_BIN={} is not a file",
                bin.display()
            );
            Some(bin)
        }
        None if std::env::var("WARDEN_REQUIRE_CODEX").as_deref() == Ok("1") => {
            panic!("WARDEN_REQUIRE_CODEX=1 but WARDEN_CODEX_BIN is unset")
        }
        None => {
            eprintln!(
                "SKIPPED {test}: WARDEN_CODEX_BIN is unset (point it at the `codex` binary of \
                 @openai/codex; WARDEN_REQUIRE_CODEX=1 makes a missing binary a failure)"
            );
            None
        }
    }
}

struct Fixture {
    _dir: tempfile::TempDir,
    workspace: PathBuf,
    home: PathBuf,
    bin: PathBuf,
    mock: MockServer,
    sources: Arc<Mutex<Vec<Weak<CodexSource>>>>,
}

impl Fixture {
    async fn new(bin: PathBuf, mock: MockConfig) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let workspace = dir.path().join("project");
        let home = dir.path().join("home");
        for d in [&workspace, &home] {
            std::fs::create_dir_all(d).expect("mkdir");
        }
        let mock = MockServer::start(mock.with_reply(REPLY))
            .await
            .expect("mock starts");
        Self {
            _dir: dir,
            workspace,
            home,
            bin,
            mock,
            sources: Arc::default(),
        }
    }

    fn options(&self) -> CodexOptions {
        let settings = ProcessSettings::default().with_grace_period(Duration::from_secs(2));
        CodexOptions::default()
            .with_binary(&self.bin)
            .with_base_url(self.mock.url("/v1"))
            .with_api_key_env("WARDEN_E2E_KEY")
            .with_env("WARDEN_E2E_KEY", "dummy")
            .with_env("HOME", &self.home)
            .with_settings(settings)
    }

    fn key(&self) -> SessionKey {
        let ws = normalize_workspace(&self.workspace).expect("normalize");
        SessionKey::new(ws.to_string_lossy())
    }

    async fn supervisor(
        &self,
        config: SupervisorConfig,
        store: Arc<MemoryStore>,
        options: CodexOptions,
    ) -> (Supervisor, UnboundedReceiver<(SessionKey, Notice)>) {
        let sources = self.sources.clone();
        let factory = move |_: &SessionKey| {
            let source = Arc::new(CodexSource::new(options.clone()));
            sources.lock().expect("lock").push(Arc::downgrade(&source));
            source as Arc<dyn EventSource>
        };
        let (ntx, nrx) = tokio::sync::mpsc::unbounded_channel();
        let sup = Supervisor::builder(Arc::new(factory))
            .config(config)
            .store(store)
            .notifier(Arc::new(ntx))
            .start()
            .await
            .expect("supervisor starts");
        (sup, nrx)
    }

    fn pid(&self) -> Option<u32> {
        let source = self.sources.lock().expect("lock").last()?.upgrade()?;
        source.pid(&self.key())
    }

    /// The thread ids Codex wrote session files for.
    fn threads(&self) -> Vec<String> {
        let mut ids = Vec::new();
        let mut dirs = vec![self.home.join(".codex/sessions")];
        while let Some(dir) = dirs.pop() {
            for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
                let path = e.path();
                let name = e.file_name().to_string_lossy().into_owned();
                if path.is_dir() {
                    dirs.push(path);
                } else if let Some(rest) = name.strip_suffix(".jsonl") {
                    ids.push(rest[rest.len().saturating_sub(36)..].to_owned());
                }
            }
        }
        ids
    }
}

fn config(allowance: Duration) -> SupervisorConfig {
    SupervisorConfig::default()
        .with_watchdog(
            WatchdogConfig::default()
                .with_default_timeout(allowance)
                .expect("valid"),
        )
        .with_session(
            SessionConfig::default().with_retry(
                RetryPolicy::default()
                    .with_jitter(0.0)
                    .with_backoff(Duration::from_millis(100), Duration::from_millis(200)),
            ),
        )
}

async fn stored(store: &MemoryStore, key: &SessionKey) -> SessionRecord {
    store.load(key).await.expect("load").expect("a record")
}

/// Whether `pid` and every process of its group are gone.
fn group_gone(pid: u32) -> bool {
    if Path::new(&format!("/proc/{pid}")).exists() {
        return false;
    }
    !std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .any(|p| {
            std::fs::read_to_string(p.path().join("stat"))
                .ok()
                .and_then(|stat| {
                    let rest = &stat[stat.rfind(')')? + 1..];
                    rest.split_whitespace().nth(2)?.parse::<u32>().ok()
                })
                == Some(pid)
        })
}

async fn eventually(limit: Duration, mut check: impl FnMut() -> bool) -> bool {
    let until = Instant::now() + limit;
    while !check() {
        if Instant::now() >= until {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    true
}

async fn ask(
    sup: &Supervisor,
    workspace: &Path,
    message: &str,
) -> (String, warden_core::TurnSummary) {
    let turn = sup
        .send_to_workspace(workspace, message)
        .await
        .expect("send");
    tokio::time::timeout(TURN, turn.finish())
        .await
        .expect("the turn ends in time")
        .expect("the turn succeeds")
}

/// A stored record whose agent conversation is `id`.
async fn store_with(fx: &Fixture, id: &str) -> Arc<MemoryStore> {
    let store = Arc::new(MemoryStore::new());
    let ws = normalize_workspace(&fx.workspace).expect("normalize");
    let mut record = SessionRecord::new(&fx.key(), Some(ws));
    record.set_agent_session_id(id);
    store
        .save(&record, Durability::Flushed)
        .await
        .expect("save");
    store
}

/// A turn, then a second one in a new `codex exec resume <thread>` process:
/// the same thread, the context indicator from the last request (not the
/// cumulative usage Codex prints).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_and_a_resume_keep_one_thread_and_report_the_last_requests_context() {
    let Some(bin) = codex_bin("a_turn_and_a_resume_keep_one_thread") else {
        return;
    };
    let fx = Fixture::new(bin, MockConfig::default()).await;
    let store = Arc::new(MemoryStore::new());
    let (sup, mut notices) = fx
        .supervisor(config(RELAXED), store.clone(), fx.options())
        .await;
    let t0 = Instant::now();
    let (text, first) = ask(&sup, &fx.workspace, "hello").await;
    eprintln!("codex turn 1: {:?}", t0.elapsed());
    assert!(text.contains(REPLY), "{text}");
    let thread = stored(&store, &fx.key())
        .await
        .agent_session_id
        .expect("a thread id");
    assert_eq!(fx.threads(), std::slice::from_ref(&thread));
    let t1 = Instant::now();
    let (text, second) = ask(&sup, &fx.workspace, "again").await;
    eprintln!("codex turn 2 (resume): {:?}", t1.elapsed());
    assert!(text.contains(REPLY), "{text}");
    assert_eq!(second.attempts, 1);
    assert_eq!(
        stored(&store, &fx.key()).await.agent_session_id,
        Some(thread.clone())
    );
    assert_eq!(fx.threads(), [thread], "resumed, not a new thread");
    let (u1, u2) = (
        first.usage.expect("usage 1"),
        second.usage.expect("usage 2"),
    );
    let context = |u: warden_core::Usage| u.input_tokens + u.cache_read_input_tokens;
    // The second request re-sends the first turn: more context, but far
    // less than the cumulative sum of both requests.
    assert!(context(u2) > context(u1), "{u1:?} {u2:?}");
    assert!(context(u2) < 2 * context(u1), "{u1:?} {u2:?}");
    let report = second.context.expect("a context report");
    assert_eq!(report.window, 258_400, "{report:?}");
    assert!(notices.try_recv().is_err(), "no notice on plain turns");
    sup.shutdown().await;
    fx.mock.shutdown().await;
}

/// Stored thread ids Codex cannot resume: an unknown UUID (exit 1, "no
/// rollout found") and a non-UUID (Codex would silently start a new
/// thread): each falls back to a fresh thread, the message re-delivered
/// and a `FreshStart` notice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unresumable_threads_fall_back_to_a_fresh_one_with_a_notice() {
    let Some(bin) = codex_bin("unresumable_threads_fall_back_to_a_fresh_one_with_a_notice") else {
        return;
    };
    for gone in ["11111111-2222-4333-8444-555555555555", "sess-not-a-uuid"] {
        let fx = Fixture::new(bin.clone(), MockConfig::default()).await;
        let store = store_with(&fx, gone).await;
        let (sup, mut notices) = fx
            .supervisor(config(RELAXED), store.clone(), fx.options())
            .await;
        let (text, _) = ask(&sup, &fx.workspace, "are you there?").await;
        assert!(text.contains(REPLY), "{gone}: {text}");
        let (_, notice) = tokio::time::timeout(Duration::from_secs(5), notices.recv())
            .await
            .expect("a notice in time")
            .expect("notifier open");
        match notice {
            Notice::FreshStart {
                failed_session_id,
                cause,
                ..
            } => {
                assert_eq!(failed_session_id, gone);
                assert_eq!(cause, ResumeCause::UnknownSession);
            }
            other => panic!("expected FreshStart, got {other:?}"),
        }
        assert_eq!(
            fx.mock.requests_to("/v1/responses"),
            1,
            "{gone}: only the fresh run asked"
        );
        let fresh = stored(&store, &fx.key())
            .await
            .agent_session_id
            .expect("an id");
        assert_ne!(fresh, gone);
        assert_eq!(fx.threads(), [fresh]);
        sup.shutdown().await;
        fx.mock.shutdown().await;
    }
}

/// Sends a turn whose first request stalls and returns its handle, the
/// stalled process's pid and when the turn was sent.
async fn stalled_turn(fx: &Fixture, sup: &Supervisor) -> (warden_core::TurnHandle, u32, Instant) {
    let t0 = Instant::now();
    let turn = sup
        .send_to_workspace(&fx.workspace, "hello")
        .await
        .expect("send");
    let mut pid = None;
    assert!(
        eventually(TURN, || {
            pid = fx.pid();
            pid.is_some() && fx.mock.requests_to("/v1/responses") == 1
        })
        .await,
        "codex started and reached the mock"
    );
    (turn, pid.expect("a pid"), t0)
}

/// Codex killed (SIGKILL) mid-turn: the attempt fails, the retry resumes
/// the thread the killed run announced and answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_killed_mid_turn_is_retried_on_its_thread() {
    let Some(bin) = codex_bin("the_cli_killed_mid_turn_is_retried_on_its_thread") else {
        return;
    };
    let fx = Fixture::new(
        bin,
        MockConfig::default().with_sequence([Scenario::Stall, Scenario::Normal]),
    )
    .await;
    let store = Arc::new(MemoryStore::new());
    let (sup, _notices) = fx
        .supervisor(config(RELAXED), store.clone(), fx.options())
        .await;
    let (turn, pid, _) = stalled_turn(&fx, &sup).await;
    // SIGKILL to the CLI alone (not its group), as an OOM killer would.
    let killed = std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .expect("kill runs");
    assert!(killed.success());
    let (text, summary) = tokio::time::timeout(TURN, turn.finish())
        .await
        .expect("in time")
        .expect("ok");
    assert!(text.contains(REPLY), "{text}");
    assert_eq!(summary.attempts, 2);
    let thread = stored(&store, &fx.key())
        .await
        .agent_session_id
        .expect("an id");
    assert_eq!(
        fx.threads(),
        [thread],
        "the retry resumed the killed run's thread"
    );
    assert!(eventually(Duration::from_secs(5), || group_gone(pid)).await);
    sup.shutdown().await;
    fx.mock.shutdown().await;
}

/// A stalled upstream with Codex's defaults (300 s idle timeout): warden's
/// 3 s watchdog ends it first, the process group goes, the retry answers.
/// With the provider's `stream_idle_timeout_ms` at 1 s, Codex's own
/// reconnect ends it first (a `ProviderRetry`, no watchdog kill).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stall_is_ended_by_the_watchdog_or_by_codexs_own_shorter_idle_timeout() {
    let Some(bin) = codex_bin("a_stall_is_ended_by_the_watchdog") else {
        return;
    };
    let allowance = Duration::from_secs(3);
    for own_timeout in [None, Some(1000)] {
        let fx = Fixture::new(
            bin.clone(),
            MockConfig::default().with_sequence([Scenario::Stall, Scenario::Normal]),
        )
        .await;
        let store = Arc::new(MemoryStore::new());
        let mut options = fx.options();
        if let Some(ms) = own_timeout {
            options = options.with_stream_idle_timeout_ms(ms);
        }
        let (sup, _notices) = fx
            .supervisor(config(allowance), store.clone(), options)
            .await;
        let mut events = sup.subscribe();
        let (turn, pid, t0) = stalled_turn(&fx, &sup).await;
        let (text, summary) = tokio::time::timeout(TURN, turn.finish())
            .await
            .expect("in time")
            .expect("ok");
        eprintln!(
            "stall, codex idle timeout {own_timeout:?}: answered after {:?}",
            t0.elapsed()
        );
        assert!(text.contains(REPLY), "{text}");
        let mut timed_out = false;
        while let Ok(ev) = events.try_recv() {
            timed_out |= matches!(ev, LifecycleEvent::StreamTimedOut { .. });
        }
        if own_timeout.is_none() {
            assert!(timed_out, "the watchdog ended the stall");
            assert_eq!(summary.attempts, 2);
            assert!(
                eventually(Duration::from_secs(5), || group_gone(pid)).await,
                "group gone"
            );
        } else {
            assert!(
                !timed_out,
                "codex reconnected by itself before the watchdog fired"
            );
            assert_eq!(summary.attempts, 1);
            assert_eq!(
                fx.mock.requests_to("/v1/responses"),
                2,
                "one codex run, two requests"
            );
        }
        sup.shutdown().await;
        fx.mock.shutdown().await;
    }
}

/// Cancelling a stalled turn ends Codex's whole process group and nothing
/// is retried (the mock sees one request).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_ends_the_process_group_and_nothing_is_retried() {
    let Some(bin) = codex_bin("a_cancel_ends_the_process_group") else {
        return;
    };
    let fx = Fixture::new(bin, MockConfig::default().with_sequence([Scenario::Stall])).await;
    let store = Arc::new(MemoryStore::new());
    let (sup, _notices) = fx
        .supervisor(config(RELAXED), store.clone(), fx.options())
        .await;
    let (turn, pid, _) = stalled_turn(&fx, &sup).await;
    assert!(turn.cancel().await.expect("session alive"));
    let result = tokio::time::timeout(TURN, turn.finish())
        .await
        .expect("ends in time");
    assert!(result.is_err(), "a cancelled turn does not succeed");
    assert!(
        eventually(Duration::from_secs(5), || group_gone(pid)).await,
        "codex's group is gone"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(fx.mock.requests_to("/v1/responses"), 1, "nothing retried");
    sup.shutdown().await;
    fx.mock.shutdown().await;
}
