//! The real Codex CLI (`@openai/codex` 0.169.0) against warden's mock
//! Responses endpoint: the fixture shared by `real_codex_through_warden.rs`
//! and `codex_faults_through_warden.rs` (each includes this file as a
//! module of its own; it is not part of `common`).
//!
//! The binary comes from `WARDEN_CODEX_BIN` (CI installs the pinned
//! package with npm, see `.ci/run`). Without it every test prints why it is
//! skipped and passes, unless `WARDEN_REQUIRE_CODEX=1` makes a missing
//! binary a failure. The CLI runs offline: `HOME` is a per-test directory
//! and its model provider is the mock (`-c model_providers.warden=…`).
#![allow(dead_code, unreachable_pub, missing_docs)]

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use futures_util::StreamExt as _;
use tokio::sync::mpsc::UnboundedReceiver;
use warden_claude::{CodexOptions, CodexSource, ProcessSettings};
use warden_core::{
    Durability, EventSource, MemoryStore, Notice, RetryPolicy, SessionConfig, SessionKey,
    SessionRecord, SessionStore, Supervisor, SupervisorConfig, TextEdit, WatchdogConfig,
    normalize_workspace,
};
use warden_mock::{MockConfig, MockServer};

pub const REPLY: &str = "warden-e2e: the mock answered.";
/// Where Codex posts its requests on the mock.
pub const RESPONSES: &str = "/v1/responses";
/// The allowance of a turn that should just work (a real turn takes ~0.5 s).
pub const TURN: Duration = Duration::from_secs(30);
pub const RELAXED: Duration = Duration::from_secs(20);

/// The `codex` binary, or `None` (the skip printed) when it is not
/// configured and CI does not require it.
pub fn codex_bin(test: &str) -> Option<PathBuf> {
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

/// A workspace, a `HOME`, the mock and the sources the supervisor made.
pub struct Fixture {
    pub dir: tempfile::TempDir,
    pub workspace: PathBuf,
    pub home: PathBuf,
    pub bin: PathBuf,
    pub mock: MockServer,
    sources: Arc<Mutex<Vec<Weak<CodexSource>>>>,
}

impl Fixture {
    pub async fn new(bin: PathBuf, mock: MockConfig) -> Self {
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
            dir,
            workspace,
            home,
            bin,
            mock,
            sources: Arc::default(),
        }
    }

    pub fn options(&self) -> CodexOptions {
        let settings = ProcessSettings::default().with_grace_period(Duration::from_secs(2));
        CodexOptions::default()
            .with_binary(&self.bin)
            .with_base_url(self.mock.url("/v1"))
            .with_api_key_env("WARDEN_E2E_KEY")
            .with_env("WARDEN_E2E_KEY", "dummy")
            .with_env("HOME", &self.home)
            .with_settings(settings)
    }

    pub fn key(&self) -> SessionKey {
        let ws = normalize_workspace(&self.workspace).expect("normalize");
        SessionKey::new(ws.to_string_lossy())
    }

    pub async fn supervisor(
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

    pub fn pid(&self) -> Option<u32> {
        let source = self.sources.lock().expect("lock").last()?.upgrade()?;
        source.pid(&self.key())
    }

    /// The thread ids Codex wrote session files for.
    pub fn threads(&self) -> Vec<String> {
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

    /// An executable `sh` script `name` in the test's directory: `body`
    /// with `$CODEX` the real binary. warden executes it directly, as it
    /// would `codex`; the script stands for a CLI that misbehaves.
    pub fn wrapper(&self, name: &str, body: &str) -> PathBuf {
        let path = self.dir.path().join(name);
        let script = format!(
            "#!/bin/sh\nCODEX='{}'\nMARK='{}'\n{body}\n",
            self.bin.display(),
            self.dir.path().join(format!("{name}.ran")).display()
        );
        std::fs::write(&path, script).expect("write wrapper");
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .expect("chmod");
        path
    }
}

/// Default supervisor settings with a watchdog allowance and quick retries.
pub fn config(allowance: Duration) -> SupervisorConfig {
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

pub async fn stored(store: &MemoryStore, key: &SessionKey) -> SessionRecord {
    store.load(key).await.expect("load").expect("a record")
}

/// Whether `pid` and every process of its group are gone.
pub fn group_gone(pid: u32) -> bool {
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

/// Polls `check` until it holds or `limit` passes; whether it held.
pub async fn eventually(limit: Duration, mut check: impl FnMut() -> bool) -> bool {
    let until = Instant::now() + limit;
    while !check() {
        if Instant::now() >= until {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    true
}

/// Sends `message` and waits for its answer (the text with warden's
/// context indicator, and the summary).
pub async fn ask(
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

/// The turn's text as a reader sees it: every edit applied in order, and
/// the number of discards; `Err` (the error's text) when the turn failed.
pub async fn relayed(
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
pub async fn store_with(fx: &Fixture, id: &str) -> Arc<MemoryStore> {
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

/// Sends a turn whose first request stalls and returns its handle, the
/// stalled process's pid and when the turn was sent.
pub async fn stalled_turn(
    fx: &Fixture,
    sup: &Supervisor,
) -> (warden_core::TurnHandle, u32, Instant) {
    let t0 = Instant::now();
    let turn = sup
        .send_to_workspace(&fx.workspace, "hello")
        .await
        .expect("send");
    let mut pid = None;
    assert!(
        eventually(TURN, || {
            pid = fx.pid();
            pid.is_some() && fx.mock.requests_to(RESPONSES) == 1
        })
        .await,
        "codex started and reached the mock"
    );
    (turn, pid.expect("a pid"), t0)
}
