//! The real Claude Code CLI driven through warden, against warden's mock
//! LLM server: fresh turns, resume through a symlinked workspace, the two
//! resume failures (unknown id, prompt too long) falling back to a fresh
//! conversation, and a stalled API stream killed by the watchdog with the
//! CLI's whole process group.
//!
//! The binary comes from `WARDEN_CLAUDE_BIN` (CI installs the pinned
//! `@anthropic-ai/claude-code` with npm, see `.ci/run`). Without it every
//! test prints why it is skipped and passes, unless `WARDEN_REQUIRE_CLAUDE=1`
//! makes a missing binary a failure. The CLI runs offline: `HOME`, its
//! scratch directories and `ANTHROPIC_BASE_URL` all point at per-test
//! temporary places. It is started through a tiny `sh` wrapper that logs its
//! arguments and `exec`s the CLI (same pid, same process group), so the
//! tests can see which runs used `--resume <id>`.
//!
//! A binary of its own, not a module of `tests/it`: it drives the real
//! CLI as child processes (seconds each), so it stays out of the fast
//! in-process binary and is run or skipped by its own name.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use tokio::sync::mpsc::UnboundedReceiver;
use warden_claude::{ClaudeOptions, ClaudeSource};
use warden_core::{
    Durability, EventSource, LifecycleEvent, MemoryStore, Notice, ResumeCause, RetryPolicy,
    SessionConfig, SessionKey, SessionRecord, SessionStore, Supervisor, SupervisorConfig,
    WatchdogConfig, normalize_workspace,
};
use warden_mock::{MockConfig, MockServer, Scenario, Selection};

/// The mock's fixed reply: what the caller must get back.
const REPLY: &str = "warden-e2e: the mock answered.";
/// The allowance of a turn that should just work (a real turn takes ~1 s).
const TURN: Duration = Duration::from_secs(20);
/// Watchdog allowance for the tests that do not test the watchdog.
const RELAXED: Duration = Duration::from_secs(15);
/// The CLI's grace period between SIGTERM and SIGKILL.
const GRACE: Duration = Duration::from_secs(2);

/// The CLI binary, or `None` (after saying why) when the test is skipped.
fn claude_bin(test: &str) -> Option<PathBuf> {
    match std::env::var_os("WARDEN_CLAUDE_BIN").filter(|v| !v.is_empty()) {
        Some(bin) => {
            let bin = PathBuf::from(bin);
            assert!(
                bin.is_file(),
                "WARDEN_CLAUDE_BIN={} is not a file",
                bin.display()
            );
            Some(bin)
        }
        None if std::env::var("WARDEN_REQUIRE_CLAUDE").as_deref() == Ok("1") => {
            panic!("WARDEN_REQUIRE_CLAUDE=1 but WARDEN_CLAUDE_BIN is unset")
        }
        None => {
            eprintln!(
                "SKIPPED {test}: WARDEN_CLAUDE_BIN is unset (point it at the `claude` binary \
                 of @anthropic-ai/claude-code to run this test; WARDEN_REQUIRE_CLAUDE=1 makes \
                 a missing binary a failure)"
            );
            None
        }
    }
}

/// One wrapper script for the whole test binary, written once before any
/// test spawns it. It appends its arguments, one per line and then `--END--`,
/// to `$WARDEN_E2E_ARGS_LOG`, then `exec`s `$WARDEN_E2E_CLAUDE`.
fn wrapper() -> &'static Path {
    static WRAPPER: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    let (_, path) = WRAPPER.get_or_init(|| {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("claude-wrapper");
        std::fs::write(
            &path,
            "#!/bin/sh\n\
             { for a in \"$@\"; do printf '%s\\n' \"$a\"; done; echo --END--; } \
             >> \"$WARDEN_E2E_ARGS_LOG\"\n\
             for a in \"$@\"; do\n\
             if [ \"$a\" = --resume ] && [ -n \"$WARDEN_E2E_RESUME_HEADERS\" ]; then\n\
             ANTHROPIC_CUSTOM_HEADERS=\"$WARDEN_E2E_RESUME_HEADERS\"; \
             export ANTHROPIC_CUSTOM_HEADERS; fi\n\
             done\n\
             exec \"$WARDEN_E2E_CLAUDE\" \"$@\"\n",
        )
        .expect("write wrapper");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))
            .expect("chmod wrapper");
        (dir, path)
    });
    path
}

/// A workspace (and a symlink to it), a HOME, a scratch dir and a mock.
struct Fixture {
    _dir: tempfile::TempDir,
    workspace: PathBuf,
    link: PathBuf,
    home: PathBuf,
    scratch: PathBuf,
    args_log: PathBuf,
    bin: PathBuf,
    mock: MockServer,
    /// The sources the factory made, newest last.
    sources: Arc<Mutex<Vec<Weak<ClaudeSource>>>>,
}

impl Fixture {
    async fn new(bin: PathBuf, mock: MockConfig) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let workspace = dir.path().join("project");
        let link = dir.path().join("project-link");
        let home = dir.path().join("home");
        let scratch = dir.path().join("scratch");
        for d in [&workspace, &home, &scratch] {
            std::fs::create_dir_all(d).expect("mkdir");
        }
        std::os::unix::fs::symlink(&workspace, &link).expect("symlink");
        let mock = MockServer::start(mock.with_reply(REPLY))
            .await
            .expect("mock starts");
        Self {
            args_log: dir.path().join("args.log"),
            _dir: dir,
            workspace,
            link,
            home,
            scratch,
            bin,
            mock,
            sources: Arc::default(),
        }
    }

    fn options(&self) -> ClaudeOptions {
        ClaudeOptions::default()
            .with_binary(wrapper())
            .with_env("WARDEN_E2E_CLAUDE", &self.bin)
            .with_env("WARDEN_E2E_ARGS_LOG", &self.args_log)
            .with_env("ANTHROPIC_BASE_URL", self.mock.base_url())
            .with_env("ANTHROPIC_API_KEY", "dummy")
            .with_env("DISABLE_TELEMETRY", "1")
            .with_env("DISABLE_AUTOUPDATER", "1")
            .with_env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
            .with_env("HOME", &self.home)
            .with_scratch_dir(&self.scratch)
            .with_grace_period(GRACE)
    }

    /// The session key of the workspace.
    fn key(&self) -> SessionKey {
        let ws = normalize_workspace(&self.workspace).expect("normalize");
        SessionKey::new(ws.to_string_lossy())
    }

    /// A supervisor over `store`, each session with its own `ClaudeSource`
    /// (kept here only weakly, so a session's shutdown still ends its
    /// process), and its notices.
    async fn supervisor(
        &self,
        config: SupervisorConfig,
        store: Arc<MemoryStore>,
    ) -> (Supervisor, UnboundedReceiver<(SessionKey, Notice)>) {
        self.supervisor_with(config, store, self.options()).await
    }

    /// [`supervisor`](Self::supervisor) with other CLI options.
    async fn supervisor_with(
        &self,
        config: SupervisorConfig,
        store: Arc<MemoryStore>,
        options: ClaudeOptions,
    ) -> (Supervisor, UnboundedReceiver<(SessionKey, Notice)>) {
        let sources = self.sources.clone();
        let factory = move |_: &SessionKey| {
            let source = Arc::new(ClaudeSource::new(options.clone()));
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

    /// The pid of the newest process of the newest source, if running.
    fn pid(&self) -> Option<u32> {
        let key = self.key();
        let source = self.sources.lock().expect("lock").last()?.upgrade()?;
        source.pid(&key)
    }

    /// The arguments of every CLI run so far, in order.
    fn runs(&self) -> Vec<Vec<String>> {
        let log = std::fs::read_to_string(&self.args_log).unwrap_or_default();
        let mut runs = Vec::new();
        let mut run = Vec::new();
        for line in log.lines() {
            if line == "--END--" {
                runs.push(std::mem::take(&mut run));
            } else {
                run.push(line.to_owned());
            }
        }
        runs
    }

    /// The id a run resumed, if it had `--resume <id>`.
    fn resumed_in(&self, run: usize) -> Option<String> {
        let runs = self.runs();
        let args = runs.get(run).expect("that run happened");
        args.windows(2)
            .find(|w| w[0] == "--resume")
            .map(|w| w[1].clone())
    }

    /// Whether the CLI wrote a transcript for `id` under `$HOME/.claude`.
    fn has_transcript(&self, id: &str) -> bool {
        let projects = self.home.join(".claude/projects");
        let Ok(dirs) = std::fs::read_dir(projects) else {
            return false;
        };
        dirs.flatten()
            .any(|d| d.path().join(format!("{id}.jsonl")).is_file())
    }
}

fn config(allowance: Duration) -> SupervisorConfig {
    SupervisorConfig::default()
        .with_watchdog(
            WatchdogConfig::default()
                .with_default_timeout(allowance)
                .expect("valid allowance"),
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
    store
        .load(key)
        .await
        .expect("load")
        .expect("the session has a record")
}

/// A random, well-formed v4 UUID (no rand dependency needed for one).
fn random_uuid() -> String {
    use std::hash::{BuildHasher, RandomState};
    let a = RandomState::new().hash_one(1u8);
    let b = RandomState::new().hash_one(2u8);
    format!(
        "{:08x}-{:04x}-4{:03x}-a{:03x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        a & 0xfff,
        b >> 52,
        b & 0xffff_ffff_ffff
    )
}

fn is_uuid(id: &str) -> bool {
    id.len() == 36 && id.chars().filter(|c| *c == '-').count() == 4
}

/// Whether `pid` is gone, and so is every process of its group.
fn group_gone(pid: u32) -> bool {
    if Path::new(&format!("/proc/{pid}")).exists() {
        return false;
    }
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return true;
    };
    !procs.flatten().any(|p| {
        std::fs::read_to_string(p.path().join("stat"))
            .ok()
            .and_then(|stat| {
                // Fields after the command's closing paren: state ppid pgrp.
                let rest = &stat[stat.rfind(')')? + 1..];
                rest.split_whitespace().nth(2)?.parse::<u32>().ok()
            })
            == Some(pid)
    })
}

async fn eventually(limit: Duration, mut check: impl FnMut() -> bool) -> bool {
    let until = std::time::Instant::now() + limit;
    loop {
        if check() {
            return true;
        }
        if std::time::Instant::now() >= until {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn ask(sup: &Supervisor, workspace: &Path, message: &str) -> (String, u32) {
    let turn = sup
        .send_to_workspace(workspace, message)
        .await
        .expect("send");
    let (text, summary) = tokio::time::timeout(TURN, turn.finish())
        .await
        .expect("the turn ends in time")
        .expect("the turn succeeds");
    (text, summary.attempts)
}

/// Shuts the supervisor down and waits until the CLI it ran is gone, so the
/// next run never finds the conversation "already in use".
async fn shut(fx: &Fixture, sup: Supervisor) {
    let pid = fx.pid();
    sup.shutdown().await;
    if let Some(pid) = pid {
        assert!(
            eventually(GRACE + Duration::from_secs(3), || group_gone(pid)).await,
            "the supervisor's shutdown ends the CLI (pid {pid})"
        );
    }
}

/// A fresh turn completes with the mock's text; warden stores the id of the
/// CLI's `system/init` line (a real conversation: its transcript exists).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_turn_completes_and_stores_the_cli_session_id() {
    let Some(bin) = claude_bin("a_fresh_turn_completes_and_stores_the_cli_session_id") else {
        return;
    };
    let fx = Fixture::new(bin, MockConfig::default()).await;
    let store = Arc::new(MemoryStore::new());
    let (sup, mut notices) = fx.supervisor(config(RELAXED), store.clone()).await;
    let mut events = sup.subscribe();

    let (text, attempts) = ask(&sup, &fx.workspace, "hello").await;
    assert!(text.contains(REPLY), "{text}");
    assert_eq!(attempts, 1);

    let record = stored(&store, &fx.key()).await;
    let id = record.agent_session_id.clone().expect("an agent id");
    assert!(is_uuid(&id), "{id}");
    assert!(
        fx.has_transcript(&id),
        "the CLI wrote the conversation {id}"
    );
    let mut announced = None;
    while let Ok(ev) = events.try_recv() {
        if let LifecycleEvent::AgentSessionId { session_id, .. } = ev {
            announced = Some(session_id);
        }
    }
    assert_eq!(announced.as_deref(), Some(id.as_str()));
    assert_eq!(fx.runs().len(), 1);
    assert_eq!(fx.resumed_in(0), None, "a fresh run");
    assert!(fx.mock.requests_to("/v1/messages") >= 1);
    assert!(notices.try_recv().is_err(), "no notice on a plain turn");
    shut(&fx, sup).await;
    fx.mock.shutdown().await;
}

/// A second turn through a symlinked spelling of the workspace reaches the
/// same session (and the same idle CLI process); after a supervisor restart
/// the next turn, again through the symlink, starts the CLI with
/// `--resume <stored id>` and answers without any fallback.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_symlinked_workspace_resumes_the_stored_conversation() {
    let Some(bin) = claude_bin("a_symlinked_workspace_resumes_the_stored_conversation") else {
        return;
    };
    let fx = Fixture::new(bin, MockConfig::default()).await;
    let store = Arc::new(MemoryStore::new());
    let (sup, mut notices) = fx.supervisor(config(RELAXED), store.clone()).await;
    let (text, _) = ask(&sup, &fx.workspace, "first").await;
    assert!(text.contains(REPLY), "{text}");
    let first_id = stored(&store, &fx.key())
        .await
        .agent_session_id
        .expect("an agent id");

    // Same supervisor, symlinked spelling: one session, the idle process serves it.
    let (text, attempts) = ask(&sup, &fx.link, "second").await;
    assert!(text.contains(REPLY), "{text}");
    assert_eq!(attempts, 1);
    assert_eq!(sup.sessions().await.expect("alive"), vec![fx.key()]);
    assert_eq!(fx.runs().len(), 1, "the idle CLI served the second turn");
    let live_id = stored(&store, &fx.key())
        .await
        .agent_session_id
        .expect("an agent id");
    shut(&fx, sup).await;

    // A new supervisor over the same store: the CLI is started with --resume.
    let (sup, mut notices2) = fx.supervisor(config(RELAXED), store.clone()).await;
    let mut events = sup.subscribe();
    let (text, attempts) = ask(&sup, &fx.link, "third").await;
    assert!(text.contains(REPLY), "{text}");
    assert_eq!(attempts, 1);
    assert_eq!(fx.runs().len(), 2);
    assert_eq!(fx.resumed_in(1).as_deref(), Some(live_id.as_str()));
    let record = stored(&store, &fx.key()).await;
    let resumed_id = record.agent_session_id.clone().expect("an agent id");
    assert!(fx.has_transcript(&resumed_id));
    if resumed_id != live_id {
        assert!(
            record.past_session_ids.contains(&live_id),
            "{record:?} keeps the forked-from id"
        );
    }
    eprintln!("ids: first {first_id}, live {live_id}, after resume {resumed_id}");
    while let Ok(ev) = events.try_recv() {
        assert!(
            !matches!(
                ev,
                LifecycleEvent::ResumeFailed { .. } | LifecycleEvent::FreshFallback { .. }
            ),
            "{ev:?}"
        );
    }
    assert!(notices.try_recv().is_err());
    assert!(notices2.try_recv().is_err());
    shut(&fx, sup).await;
    fx.mock.shutdown().await;
}

/// A stored id the CLI has never seen: the real CLI fails the resume ("No
/// conversation found"), warden starts it fresh, re-delivers the message
/// (the caller gets the answer) and sends a `FreshStart` notice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_stored_id_falls_back_to_a_fresh_conversation() {
    let Some(bin) = claude_bin("an_unknown_stored_id_falls_back_to_a_fresh_conversation") else {
        return;
    };
    let fx = Fixture::new(bin, MockConfig::default()).await;
    let store = Arc::new(MemoryStore::new());
    let gone = random_uuid();
    let key = fx.key();
    let ws = normalize_workspace(&fx.workspace).expect("normalize");
    let mut record = SessionRecord::new(&key, Some(ws));
    record.set_agent_session_id(&gone);
    store
        .save(&record, Durability::Flushed)
        .await
        .expect("save");

    let (sup, mut notices) = fx.supervisor(config(RELAXED), store.clone()).await;
    let (text, _) = ask(&sup, &fx.workspace, "are you there?").await;
    assert!(text.contains(REPLY), "{text}");

    let (nkey, notice) = tokio::time::timeout(Duration::from_secs(5), notices.recv())
        .await
        .expect("a notice in time")
        .expect("notifier open");
    assert_eq!(nkey, key);
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
    let runs = fx.runs();
    assert_eq!(runs.len(), 2, "{runs:?}");
    assert_eq!(fx.resumed_in(0).as_deref(), Some(gone.as_str()));
    assert_eq!(fx.resumed_in(1), None, "the fallback is fresh");
    // The failed resume never reached the API; the fresh run did.
    assert_eq!(fx.mock.requests_to("/v1/messages"), 1);
    let fresh = stored(&store, &key)
        .await
        .agent_session_id
        .expect("an agent id");
    assert_ne!(fresh, gone);
    assert!(fx.has_transcript(&fresh));
    shut(&fx, sup).await;
    fx.mock.shutdown().await;
}

/// A single 400 prompt-too-long on a resumed run does not reach warden:
/// the real CLI (2.1.332) compacts the conversation by itself (more API
/// requests, all answered normally here) and the turn succeeds in the
/// resumed conversation, with no fallback and no notice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_prompt_too_long_is_compacted_by_the_cli_itself() {
    let Some(bin) = claude_bin("a_single_prompt_too_long_is_compacted_by_the_cli_itself") else {
        return;
    };
    let fx = Fixture::new(
        bin,
        MockConfig::default().with_sequence([
            Scenario::Normal,
            Scenario::PromptTooLong,
            Scenario::Normal,
        ]),
    )
    .await;
    let store = Arc::new(MemoryStore::new());
    let (sup, _) = fx.supervisor(config(RELAXED), store.clone()).await;
    ask(&sup, &fx.workspace, "fill the context").await;
    let old = stored(&store, &fx.key())
        .await
        .agent_session_id
        .expect("an agent id");
    shut(&fx, sup).await;

    let (sup, mut notices) = fx.supervisor(config(RELAXED), store.clone()).await;
    let mut events = sup.subscribe();
    let (text, attempts) = ask(&sup, &fx.workspace, "one more").await;
    assert!(text.contains(REPLY), "{text}");
    assert_eq!(attempts, 1);
    assert_eq!(fx.runs().len(), 2);
    assert_eq!(fx.resumed_in(1).as_deref(), Some(old.as_str()));
    let scenarios: Vec<_> = fx.mock.requests().iter().map(|r| r.scenario).collect();
    assert_eq!(
        scenarios[..2],
        [Some(Scenario::Normal), Some(Scenario::PromptTooLong)]
    );
    assert!(
        scenarios.len() >= 4 && scenarios[2..].iter().all(|s| *s == Some(Scenario::Normal)),
        "the CLI compacted and retried after the 400: {scenarios:?}"
    );
    while let Ok(ev) = events.try_recv() {
        assert!(
            !matches!(
                ev,
                LifecycleEvent::ResumeFailed { .. } | LifecycleEvent::FreshFallback { .. }
            ),
            "{ev:?}"
        );
    }
    assert!(notices.try_recv().is_err(), "no notice");
    shut(&fx, sup).await;
    fx.mock.shutdown().await;
}

/// The stored conversation is too large: every API request of the resumed
/// CLI run gets the API's 400 prompt-too-long (the wrapper adds the mock's
/// `x-mock-scenario` header to runs with `--resume` only), so the CLI's own
/// compaction fails too and its run ends with `prompt_too_long`. warden
/// starts fresh, re-delivers the message (the caller gets the answer) and
/// notifies with cause `prompt_too_long`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prompt_too_long_resume_falls_back_fresh_and_notifies() {
    let Some(bin) = claude_bin("a_prompt_too_long_resume_falls_back_fresh_and_notifies") else {
        return;
    };
    let fx = Fixture::new(bin, MockConfig::default()).await;
    let store = Arc::new(MemoryStore::new());
    let key = fx.key();
    let (sup, _) = fx.supervisor(config(RELAXED), store.clone()).await;
    ask(&sup, &fx.workspace, "fill the context").await;
    let old = stored(&store, &key)
        .await
        .agent_session_id
        .expect("an agent id");
    shut(&fx, sup).await;

    let too_long = format!(
        "{}: {}",
        warden_mock::SCENARIO_HEADER,
        Scenario::PromptTooLong.name()
    );
    let (sup, mut notices) = fx
        .supervisor_with(
            config(RELAXED),
            store.clone(),
            fx.options().with_env("WARDEN_E2E_RESUME_HEADERS", too_long),
        )
        .await;
    let (text, _) = ask(&sup, &fx.workspace, "one more").await;
    assert!(text.contains(REPLY), "{text}");
    let (nkey, notice) = tokio::time::timeout(Duration::from_secs(5), notices.recv())
        .await
        .expect("a notice in time")
        .expect("notifier open");
    assert_eq!(nkey, key);
    match notice {
        Notice::FreshStart {
            failed_session_id,
            cause,
            ..
        } => {
            assert_eq!(failed_session_id, old);
            assert_eq!(cause, ResumeCause::PromptTooLong);
        }
        other => panic!("expected FreshStart, got {other:?}"),
    }
    let runs = fx.runs();
    assert_eq!(runs.len(), 3, "{runs:?}");
    assert_eq!(fx.resumed_in(1).as_deref(), Some(old.as_str()));
    assert_eq!(fx.resumed_in(2), None, "the fallback is fresh");
    let scenarios: Vec<_> = fx.mock.requests().iter().map(|r| r.scenario).collect();
    let too_long_requests = scenarios
        .iter()
        .filter(|s| **s == Some(Scenario::PromptTooLong))
        .count();
    eprintln!("API requests: {scenarios:?}");
    assert!(too_long_requests >= 1, "{scenarios:?}");
    assert!(
        fx.mock
            .requests()
            .iter()
            .filter(|r| r.scenario == Some(Scenario::PromptTooLong))
            .all(|r| r.selection == Some(Selection::Header)),
        "only the resumed run's requests carried the header"
    );
    assert_eq!(scenarios.first(), Some(&Some(Scenario::Normal)));
    assert_eq!(scenarios.last(), Some(&Some(Scenario::Normal)));
    let fresh = stored(&store, &key)
        .await
        .agent_session_id
        .expect("an agent id");
    assert_ne!(fresh, old);
    assert!(fx.has_transcript(&fresh));
    shut(&fx, sup).await;
    fx.mock.shutdown().await;
}

/// The API stream stalls after a few frames (socket held open). The CLI
/// itself would wait 300 s; warden's 3 s watchdog kills the stream: the
/// CLI's whole process group is gone, the mock sees the connection closed,
/// and the retry succeeds in a new CLI run that resumes the id the killed
/// run announced (the CLI had already saved the conversation).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_api_stream_is_killed_with_the_cli_process_group_and_retried() {
    let Some(bin) =
        claude_bin("a_stalled_api_stream_is_killed_with_the_cli_process_group_and_retried")
    else {
        return;
    };
    let allowance = Duration::from_secs(3);
    let fx = Fixture::new(
        bin,
        MockConfig::default().with_sequence([Scenario::Stall, Scenario::Normal]),
    )
    .await;
    let store = Arc::new(MemoryStore::new());
    let (sup, mut notices) = fx.supervisor(config(allowance), store.clone()).await;
    let mut events = sup.subscribe();
    let t0 = std::time::Instant::now();
    let turn = sup
        .send_to_workspace(&fx.workspace, "hello")
        .await
        .expect("send");

    let mut stalled_pid = None;
    assert!(
        eventually(TURN, || {
            stalled_pid = fx.pid();
            stalled_pid.is_some()
        })
        .await,
        "the CLI started"
    );
    let stalled_pid = stalled_pid.expect("a pid");
    let mut announced = None;
    let ev = tokio::time::timeout(TURN, async {
        loop {
            match events.recv().await.expect("event bus open") {
                ev @ LifecycleEvent::StreamTimedOut { .. } => return ev,
                LifecycleEvent::AgentSessionId { session_id, .. } => announced = Some(session_id),
                _ => continue,
            }
        }
    })
    .await
    .expect("the watchdog fires in time");
    if let LifecycleEvent::StreamTimedOut { silent_for, .. } = ev {
        assert!(silent_for >= allowance, "{silent_for:?}");
    }
    assert!(
        eventually(GRACE + Duration::from_secs(3), || group_gone(stalled_pid)).await,
        "the stalled CLI (pid {stalled_pid}) and its process group are gone"
    );

    // What the killed CLI left: its transcript has the user's message but
    // no assistant message — the partial reply it had streamed is not
    // persisted (2.1.332, killed with SIGTERM mid-text). So there is
    // nothing to continue: warden resumes the session with the same
    // message (ClaudeSource does not `continue`). Should a later CLI keep
    // the partial reply, this fails and continuation becomes possible.
    let transcripts = jsonl_files(&fx.home);
    assert!(!transcripts.is_empty(), "the CLI wrote a transcript");
    for path in &transcripts {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            text.contains("\"type\":\"user\""),
            "the user's message is in {}",
            path.display()
        );
        assert!(
            !text.contains("\"type\":\"assistant\""),
            "the killed run persisted an assistant message in {}: continuation via \
             --resume would now be possible",
            path.display()
        );
    }
    let (text, summary) = tokio::time::timeout(TURN, turn.finish())
        .await
        .expect("the retry ends in time")
        .expect("the retry succeeds");
    assert!(text.contains(REPLY), "{text}");
    assert_eq!(summary.attempts, 2);
    assert!(t0.elapsed() >= allowance);
    let stall = fx
        .mock
        .requests()
        .into_iter()
        .find(|r| r.scenario == Some(Scenario::Stall))
        .expect("the stalled request");
    assert!(
        fx.mock
            .wait_for_client_close(stall.id, Duration::from_secs(5))
            .await,
        "the mock saw the stalled connection closed"
    );
    let runs = fx.runs();
    assert_eq!(runs.len(), 2, "{runs:?}");
    assert_ne!(fx.pid(), Some(stalled_pid));
    assert_eq!(
        fx.resumed_in(1),
        announced,
        "the retry resumes the id the killed run announced"
    );
    assert!(notices.try_recv().is_err(), "no fallback, no notice");
    shut(&fx, sup).await;
    fx.mock.shutdown().await;
}

/// Every `*.jsonl` file under `dir` (the CLI's transcripts under HOME).
fn jsonl_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                out.extend(jsonl_files(&path));
            } else if path.extension().is_some_and(|e| e == "jsonl") {
                out.push(path);
            }
        }
    }
    out
}
