//! The real Gemini CLI (`@google/gemini-cli` 0.61.0) driven through warden
//! against warden's mock Gemini endpoint (`streamGenerateContent?alt=sse`):
//! a turn and a resume (history and the last request's context), resume
//! failures and a context overflow falling back fresh with a notice, a
//! broken stream relayed exactly once, a cut stdout line, the CLI killed
//! mid-turn, a stalled upstream (warden's watchdog, not Gemini's 300 s
//! body timeout) and a cancel.
//!
//! The binary comes from `WARDEN_GEMINI_BIN` (CI installs the pinned
//! package with npm, see `.ci/run`). Without it every test prints why it is
//! skipped and passes, unless `WARDEN_REQUIRE_GEMINI=1` makes a missing
//! binary a failure. The CLI runs offline: its settings and sessions live
//! in a per-test `GEMINI_CLI_HOME`, `HOME` is another per-test directory
//! (left empty: nothing of the user's `~/.gemini` is read or written) and
//! `GOOGLE_GEMINI_BASE_URL` is the mock.
//!
//! A binary of its own, not a module of `tests/it`: it drives the real
//! CLI as child processes (seconds each), so it stays out of the fast
//! in-process binary and is run or skipped by its own name.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use futures_util::StreamExt as _;
use tokio::sync::mpsc::UnboundedReceiver;
use warden_claude::{GEMINI_CONTEXT_WINDOW, GeminiOptions, GeminiSource, ProcessSettings};
use warden_core::{
    Durability, EventSource, LifecycleEvent, MemoryStore, Notice, ResumeCause, RetryPolicy,
    SessionConfig, SessionKey, SessionRecord, SessionStore, Supervisor, SupervisorConfig, TextEdit,
    WatchdogConfig, normalize_workspace,
};
use warden_mock::{MockConfig, MockServer, Scenario};

const REPLY: &str = "warden-e2e: the mock answered.";
const MODEL: &str = "gemini-2.5-pro";
const PATH: &str = "/v1beta/models/gemini-2.5-pro:streamGenerateContent";
/// The allowance of a turn that should just work (a real turn takes ~1.5 s).
const TURN: Duration = Duration::from_secs(40);
const RELAXED: Duration = Duration::from_secs(20);

fn gemini_bin(test: &str) -> Option<PathBuf> {
    match std::env::var_os("WARDEN_GEMINI_BIN").filter(|v| !v.is_empty()) {
        Some(bin) => {
            let bin = PathBuf::from(bin);
            assert!(
                bin.is_file(),
                "WARDEN_GEMINI_BIN={} is not a file",
                bin.display()
            );
            Some(bin)
        }
        None if std::env::var("WARDEN_REQUIRE_GEMINI").as_deref() == Ok("1") => {
            panic!("WARDEN_REQUIRE_GEMINI=1 but WARDEN_GEMINI_BIN is unset")
        }
        None => {
            eprintln!(
                "SKIPPED {test}: WARDEN_GEMINI_BIN is unset (point it at the `gemini` binary of \
                 @google/gemini-cli; WARDEN_REQUIRE_GEMINI=1 makes a missing binary a failure)"
            );
            None
        }
    }
}

struct Fixture {
    dir: tempfile::TempDir,
    workspace: PathBuf,
    /// `GEMINI_CLI_HOME`: settings and sessions.
    gemini_home: PathBuf,
    /// `HOME`: must stay without a `.gemini`.
    user_home: PathBuf,
    bin: PathBuf,
    mock: MockServer,
    sources: Arc<Mutex<Vec<Weak<GeminiSource>>>>,
}

impl Fixture {
    async fn new(bin: PathBuf, mock: MockConfig) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let workspace = dir.path().join("project");
        let gemini_home = dir.path().join("gemini-home");
        let user_home = dir.path().join("home");
        for d in [&workspace, &gemini_home, &user_home] {
            std::fs::create_dir_all(d).expect("mkdir");
        }
        let mock = MockServer::start(mock.with_reply(REPLY))
            .await
            .expect("mock starts");
        Self {
            dir,
            workspace,
            gemini_home,
            user_home,
            bin,
            mock,
            sources: Arc::default(),
        }
    }

    fn options(&self) -> GeminiOptions {
        let settings = ProcessSettings::default().with_grace_period(Duration::from_secs(2));
        GeminiOptions::default()
            .with_binary(&self.bin)
            .with_model(MODEL)
            .with_base_url(self.mock.base_url())
            .with_gemini_home(&self.gemini_home)
            .with_env("GEMINI_API_KEY", "dummy")
            .with_env("HOME", &self.user_home)
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
        options: GeminiOptions,
    ) -> (Supervisor, UnboundedReceiver<(SessionKey, Notice)>) {
        let sources = self.sources.clone();
        let factory = move |_: &SessionKey| {
            let source = Arc::new(GeminiSource::new(options.clone()));
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

    /// The session ids Gemini wrote session files for (first record).
    fn sessions(&self) -> Vec<String> {
        let mut ids = Vec::new();
        let tmp = self.gemini_home.join(".gemini/tmp");
        for project in std::fs::read_dir(tmp).into_iter().flatten().flatten() {
            let chats = std::fs::read_dir(project.path().join("chats"));
            for file in chats.into_iter().flatten().flatten() {
                let text = std::fs::read_to_string(file.path()).unwrap_or_default();
                let first: serde_json::Value =
                    serde_json::from_str(text.lines().next().unwrap_or("{}")).unwrap_or_default();
                if let Some(id) = first["sessionId"].as_str()
                    && !ids.iter().any(|i| i == id)
                {
                    ids.push(id.to_owned());
                }
            }
        }
        ids
    }

    fn user_home_untouched(&self) -> bool {
        !self.user_home.join(".gemini").exists()
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
    let (_, summary) = tokio::time::timeout(TURN, turn.finish())
        .await
        .expect("the turn ends in time")
        .expect("the turn succeeds");
    // The answer itself, without the context indicator.
    (summary.text.clone(), summary)
}

/// The turn's text as a reader sees it: every edit applied in order, and
/// the number of discards; `Err` when the turn failed.
async fn relayed(
    sup: &Supervisor,
    workspace: &Path,
    message: &str,
) -> (Result<String, String>, usize) {
    let turn = sup
        .send_to_workspace(workspace, message)
        .await
        .expect("send");
    let mut edits = turn.text_stream();
    let (mut text, mut discards) = (String::new(), 0);
    let result = tokio::time::timeout(TURN, async {
        while let Some(edit) = edits.next().await {
            match edit {
                TextEdit::Append(piece) => text.push_str(&piece),
                TextEdit::Discard { chars } => {
                    discards += 1;
                    let keep = text.chars().count().saturating_sub(chars);
                    text = text.chars().take(keep).collect();
                }
                TextEdit::Finished(r) => return r.map(|_| ()).map_err(|e| e.to_string()),
                _ => {}
            }
        }
        Err("no Finished edit".to_owned())
    })
    .await
    .expect("the turn ends in time");
    (result.map(|()| text), discards)
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

/// A turn, then a second one in a new `gemini --resume <id>` process: the
/// same session (the history re-sent: a bigger prompt), the context
/// indicator from the last request's prompt tokens in the session file,
/// over Gemini's 1,048,576-token window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_and_a_resume_keep_one_session_and_report_the_last_requests_context() {
    let Some(bin) = gemini_bin("a_turn_and_a_resume_keep_one_session") else {
        return;
    };
    let fx = Fixture::new(bin, MockConfig::default()).await;
    let store = Arc::new(MemoryStore::new());
    let (sup, mut notices) = fx
        .supervisor(config(RELAXED), store.clone(), fx.options())
        .await;
    let t0 = Instant::now();
    let (text, first) = ask(&sup, &fx.workspace, "hello").await;
    eprintln!("gemini turn 1: {:?}", t0.elapsed());
    assert_eq!(text, REPLY);
    let id = stored(&store, &fx.key())
        .await
        .agent_session_id
        .expect("a session id");
    assert_eq!(fx.sessions(), std::slice::from_ref(&id));
    let t1 = Instant::now();
    let (text, second) = ask(&sup, &fx.workspace, "again").await;
    eprintln!("gemini turn 2 (resume): {:?}", t1.elapsed());
    assert_eq!(text, REPLY);
    assert_eq!(second.attempts, 1);
    assert_eq!(
        stored(&store, &fx.key()).await.agent_session_id,
        Some(id.clone())
    );
    assert_eq!(fx.sessions(), [id], "resumed, not a new session");
    assert_eq!(fx.mock.requests_to(PATH), 2);
    let context = |u: warden_core::Usage| u.input_tokens + u.cache_read_input_tokens;
    let (u1, u2) = (
        first.usage.expect("usage 1"),
        second.usage.expect("usage 2"),
    );
    // The second request carries the first turn: a bigger prompt, yet the
    // context is that one request's, not the turn's sum.
    assert!(context(u2) > context(u1), "{u1:?} {u2:?}");
    assert!(context(u2) < 2 * context(u1), "{u1:?} {u2:?}");
    let report = second.context.expect("a context report");
    assert_eq!(report.window, GEMINI_CONTEXT_WINDOW, "{report:?}");
    assert!(notices.try_recv().is_err(), "no notice on plain turns");
    assert!(fx.user_home_untouched(), "~/.gemini of HOME left alone");
    sup.shutdown().await;
    fx.mock.shutdown().await;
}

/// Stored ids Gemini cannot resume: an unknown UUID when the project has
/// no session ("No previous sessions found", exit 42), an unknown UUID
/// beside another session ("Invalid session identifier", exit 42), and a
/// non-UUID (Gemini would read it as `latest` or an index): each falls
/// back to a fresh session, the message re-delivered, and a notice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unresumable_sessions_fall_back_to_a_fresh_one_with_a_notice() {
    let Some(bin) = gemini_bin("unresumable_sessions_fall_back_to_a_fresh_one") else {
        return;
    };
    let gone = "11111111-2222-4333-8444-555555555555";
    for (case, stored_id, other_session) in [
        ("no session in the project", gone, false),
        ("another session exists", gone, true),
        ("not a uuid", "latest", true),
    ] {
        let fx = Fixture::new(bin.clone(), MockConfig::default()).await;
        if other_session {
            // A session of another key in the same workspace.
            let (sup, _n) = fx
                .supervisor(config(RELAXED), Arc::new(MemoryStore::new()), fx.options())
                .await;
            ask(&sup, &fx.workspace, "first").await;
            sup.shutdown().await;
        }
        let before = fx.mock.requests_to(PATH);
        let store = store_with(&fx, stored_id).await;
        let (sup, mut notices) = fx
            .supervisor(config(RELAXED), store.clone(), fx.options())
            .await;
        let (text, _) = ask(&sup, &fx.workspace, "are you there?").await;
        assert_eq!(text, REPLY, "{case}");
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
                assert_eq!(failed_session_id, stored_id, "{case}");
                assert_eq!(cause, ResumeCause::UnknownSession, "{case}");
            }
            other => panic!("{case}: expected FreshStart, got {other:?}"),
        }
        assert_eq!(
            fx.mock.requests_to(PATH) - before,
            1,
            "{case}: only the fresh run asked"
        );
        let fresh = stored(&store, &fx.key())
            .await
            .agent_session_id
            .expect("an id");
        assert_ne!(fresh, stored_id, "{case}");
        assert!(fx.sessions().contains(&fresh), "{case}");
        sup.shutdown().await;
        fx.mock.shutdown().await;
    }
}

/// A prompt over the model's window (HTTP 400 "The input token count …
/// exceeds …", Gemini's exit 144) on a resumed session: a typed overflow,
/// then a fresh session answers the message, with a notice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_context_overflow_falls_back_to_a_fresh_session() {
    let Some(bin) = gemini_bin("a_context_overflow_falls_back_to_a_fresh_session") else {
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
    let (sup, mut notices) = fx
        .supervisor(config(RELAXED), store.clone(), fx.options())
        .await;
    ask(&sup, &fx.workspace, "hello").await;
    let first = stored(&store, &fx.key()).await.agent_session_id;
    let (text, _) = ask(&sup, &fx.workspace, "a long one").await;
    assert_eq!(text, REPLY);
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
            assert_eq!(Some(failed_session_id), first);
            assert_eq!(cause, ResumeCause::PromptTooLong);
        }
        other => panic!("expected FreshStart, got {other:?}"),
    }
    let fresh = stored(&store, &fx.key()).await.agent_session_id;
    assert!(fresh.is_some() && fresh != first, "{fresh:?} {first:?}");
    assert_eq!(fx.mock.requests_to(PATH), 3, "overflow asked once");
    sup.shutdown().await;
    fx.mock.shutdown().await;
}

/// The upstream ends a reply early. Left to itself (`general.maxAttempts`
/// 4), Gemini retries a stream that ended cleanly without a finish reason
/// (mock `early-end`) and re-sends the partial text as new deltas with no
/// marker, ending with `result.status:"success"`: the relayed text has the
/// partial text twice. With warden's setting (1) Gemini reports
/// `result.status:"error"` (exit 0) for that and for a connection cut
/// mid-body (mock `abrupt-close`, which Gemini never retries), warden
/// retries, the partial text is discarded, and the reply is relayed
/// exactly once. Every attempt cut: the turn fails, never a success.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_stream_is_relayed_exactly_once_and_a_status_error_is_no_success() {
    let Some(bin) = gemini_bin("a_broken_stream_is_relayed_exactly_once") else {
        return;
    };
    let then_ok = |s: Scenario| MockConfig::default().with_sequence([s, Scenario::Normal]);
    // Gemini's own retries: the partial text comes twice.
    let fx = Fixture::new(bin.clone(), then_ok(Scenario::EarlyEnd)).await;
    let (sup, _n) = fx
        .supervisor(
            config(RELAXED),
            Arc::new(MemoryStore::new()),
            fx.options().with_max_attempts(4),
        )
        .await;
    let (text, discards) = relayed(&sup, &fx.workspace, "hello").await;
    let text = text.expect("gemini's retry succeeded");
    assert_eq!(discards, 0, "one warden attempt");
    assert_eq!(fx.mock.requests_to(PATH), 2, "gemini retried by itself");
    assert_ne!(text, REPLY, "gemini's own retry repeats the partial text");
    assert!(
        text.ends_with(REPLY) && text.len() > REPLY.len(),
        "{text:?}"
    );
    sup.shutdown().await;
    fx.mock.shutdown().await;

    // warden's setting: one request per process, warden retries.
    for fault in [Scenario::EarlyEnd, Scenario::AbruptClose] {
        let fx = Fixture::new(bin.clone(), then_ok(fault)).await;
        let (sup, _n) = fx
            .supervisor(config(RELAXED), Arc::new(MemoryStore::new()), fx.options())
            .await;
        let t0 = Instant::now();
        let (text, discards) = relayed(&sup, &fx.workspace, "hello").await;
        eprintln!("{fault}, warden's retry: answered after {:?}", t0.elapsed());
        assert_eq!(
            text.as_deref(),
            Ok(REPLY),
            "{fault}: the reply exactly once"
        );
        assert_eq!(
            discards, 1,
            "{fault}: the partial text shown, then discarded"
        );
        assert_eq!(
            fx.mock.requests_to(PATH),
            2,
            "{fault}: two processes, one request each"
        );
        sup.shutdown().await;
        fx.mock.shutdown().await;
    }

    // Every attempt cut: a failure, whatever Gemini's exit code.
    let fx = Fixture::new(
        bin,
        MockConfig::default().with_sequence([Scenario::EarlyEnd]),
    )
    .await;
    let two_attempts = config(RELAXED).with_session(
        SessionConfig::default().with_retry(
            RetryPolicy::default()
                .with_jitter(0.0)
                .with_max_attempts(2)
                .with_backoff(Duration::from_millis(100), Duration::from_millis(200)),
        ),
    );
    let (sup, _n) = fx
        .supervisor(two_attempts, Arc::new(MemoryStore::new()), fx.options())
        .await;
    let (result, _) = relayed(&sup, &fx.workspace, "hello").await;
    assert!(
        result.is_err(),
        "a status:error result is not a success: {result:?}"
    );
    assert_eq!(fx.mock.requests_to(PATH), 2);
    sup.shutdown().await;
    fx.mock.shutdown().await;
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
            pid.is_some() && fx.mock.requests_to(PATH) == 1
        })
        .await,
        "gemini started and reached the mock"
    );
    (turn, pid.expect("a pid"), t0)
}

/// Gemini killed (SIGKILL) mid-turn, and Gemini's stdout cut in the
/// middle of a JSON line (a wrapper cuts its `result` line): each attempt
/// fails typed, the retry answers, the reply once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_killed_or_its_line_cut_mid_turn_is_retried_and_answers_once() {
    let Some(bin) = gemini_bin("the_cli_killed_or_its_line_cut_mid_turn_is_retried") else {
        return;
    };
    let fx = Fixture::new(
        bin.clone(),
        MockConfig::default().with_sequence([Scenario::Stall, Scenario::Normal]),
    )
    .await;
    let (sup, _notices) = fx
        .supervisor(config(RELAXED), Arc::new(MemoryStore::new()), fx.options())
        .await;
    let (turn, pid, _) = stalled_turn(&fx, &sup).await;
    // SIGKILL to the CLI alone (not its group), as an OOM killer would.
    let killed = std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .expect("kill runs");
    assert!(killed.success());
    let (_, summary) = tokio::time::timeout(TURN, turn.finish())
        .await
        .expect("in time")
        .expect("ok");
    let text = summary.text.clone();
    assert_eq!(text, REPLY);
    assert_eq!(summary.attempts, 2);
    assert!(eventually(Duration::from_secs(5), || group_gone(pid)).await);
    sup.shutdown().await;
    fx.mock.shutdown().await;

    // The first run's last stdout line cut mid-object (then stdout ends).
    let fx = Fixture::new(bin.clone(), MockConfig::default()).await;
    let mark = fx.dir.path().join("cut-once");
    let wrapper = fx.dir.path().join("gemini-cut");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nif [ ! -e '{mark}' ]; then : > '{mark}'; '{bin}' \"$@\" | sed '$ s/^\\(.\\{{25\\}}\\).*/\\1/'; exit 0; fi\nexec '{bin}' \"$@\"\n",
            mark = mark.display(),
            bin = bin.display()
        ),
    )
    .expect("write wrapper");
    std::fs::set_permissions(
        &wrapper,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .expect("chmod");
    let (sup, _n) = fx
        .supervisor(
            config(RELAXED),
            Arc::new(MemoryStore::new()),
            fx.options().with_binary(&wrapper),
        )
        .await;
    let (text, discards) = relayed(&sup, &fx.workspace, "hello").await;
    assert!(mark.exists(), "the cut run happened");
    assert_eq!(text.as_deref(), Ok(REPLY), "nothing lost, nothing twice");
    assert_eq!(discards, 1);
    assert_eq!(fx.mock.requests_to(PATH), 2);
    sup.shutdown().await;
    fx.mock.shutdown().await;
}

/// A stalled upstream: Gemini's own give-up is Node's 300 s body timeout
/// (× its attempts), so warden's 6 s watchdog on its silent stdout ends
/// it first; the process group goes and the retry answers. (The
/// allowance must cover Gemini's silent start-up, 1–2 s here and more on
/// a loaded machine: a 3 s one sometimes killed the retry too.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stall_is_ended_by_wardens_watchdog_and_retried() {
    let Some(bin) = gemini_bin("a_stall_is_ended_by_wardens_watchdog") else {
        return;
    };
    let fx = Fixture::new(
        bin,
        MockConfig::default().with_sequence([Scenario::Stall, Scenario::Normal]),
    )
    .await;
    let (sup, _notices) = fx
        .supervisor(
            config(Duration::from_secs(6)),
            Arc::new(MemoryStore::new()),
            fx.options(),
        )
        .await;
    let mut events = sup.subscribe();
    let (turn, pid, t0) = stalled_turn(&fx, &sup).await;
    let (_, summary) = tokio::time::timeout(TURN, turn.finish())
        .await
        .expect("in time")
        .expect("ok");
    let text = summary.text.clone();
    eprintln!("stall: answered after {:?}", t0.elapsed());
    assert_eq!(text, REPLY);
    assert_eq!(summary.attempts, 2);
    let mut timed_out = false;
    while let Ok(ev) = events.try_recv() {
        timed_out |= matches!(ev, LifecycleEvent::StreamTimedOut { .. });
    }
    assert!(timed_out, "the watchdog ended the stall");
    assert!(
        eventually(Duration::from_secs(5), || group_gone(pid)).await,
        "group gone"
    );
    sup.shutdown().await;
    fx.mock.shutdown().await;
}

/// Cancelling a stalled turn ends Gemini's whole process group, the turn
/// does not succeed (Gemini exits 0 on SIGTERM with no result line) and
/// nothing is retried (the mock sees one request).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_ends_the_process_group_and_nothing_is_retried() {
    let Some(bin) = gemini_bin("a_cancel_ends_the_process_group") else {
        return;
    };
    let fx = Fixture::new(bin, MockConfig::default().with_sequence([Scenario::Stall])).await;
    let (sup, _notices) = fx
        .supervisor(config(RELAXED), Arc::new(MemoryStore::new()), fx.options())
        .await;
    let (turn, pid, _) = stalled_turn(&fx, &sup).await;
    let t0 = Instant::now();
    assert!(turn.cancel().await.expect("session alive"));
    let result = tokio::time::timeout(TURN, turn.finish())
        .await
        .expect("ends in time");
    assert!(result.is_err(), "a cancelled turn does not succeed");
    assert!(
        eventually(Duration::from_secs(5), || group_gone(pid)).await,
        "gemini's group is gone"
    );
    eprintln!("cancel: group gone after {:?}", t0.elapsed());
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(fx.mock.requests_to(PATH), 1, "nothing retried");
    sup.shutdown().await;
    fx.mock.shutdown().await;
}
