//! `warden chat --agent qwen-code`: the real Qwen Code (`WARDEN_QWEN_BIN`,
//! installed by `.ci/run`) against the mock's chat-completions endpoint,
//! through the wire layer. Two invocations, one Qwen Code session
//! (`--resume <uuid>`), one model request and one CLI run per turn (no
//! memory-extraction request), the context indicator, its home under the
//! data directory (never `~/.qwen`); a session Qwen Code no longer has ("No
//! saved session found") falls back to a fresh one with the message
//! re-delivered and a notice. Skipped with a printed reason when the
//! binary is not there, unless `WARDEN_REQUIRE_QWEN=1`.

mod common;

use std::path::Path;
use std::time::Duration;

use common::*;
use serde_json::Value;
use warden_mock::{MockConfig, MockServer};

const CHAT: &str = "/v1/chat/completions";

fn qwen_bin() -> Option<std::ffi::OsString> {
    let bin = std::env::var_os("WARDEN_QWEN_BIN").filter(|v| !v.is_empty());
    if bin.is_none() {
        assert_ne!(
            std::env::var("WARDEN_REQUIRE_QWEN").as_deref(),
            Ok("1"),
            "WARDEN_REQUIRE_QWEN=1 but WARDEN_QWEN_BIN is unset"
        );
        eprintln!("skipped: set WARDEN_QWEN_BIN to the qwen binary to run this test");
    }
    bin
}

async fn session_id(data: &Path) -> String {
    let out = run(&["sessions", "--json", "--data-dir", arg(data)]).await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let sessions: Vec<Value> = serde_json::from_str(&stdout(&out)).expect("JSON array");
    sessions[0]["agent_session_id"]
        .as_str()
        .expect("the CLI's session id")
        .to_owned()
}

/// A test's mock, directories and `warden chat` of one message.
struct Fixture {
    bin: std::ffi::OsString,
    mock: MockServer,
    dir: tempfile::TempDir,
}

impl Fixture {
    async fn new(bin: std::ffi::OsString) -> Self {
        let mock = MockServer::start(MockConfig::default())
            .await
            .expect("mock");
        let dir = tempfile::tempdir().expect("tempdir");
        for d in ["repo", "home"] {
            std::fs::create_dir_all(dir.path().join(d)).expect("mkdir");
        }
        Self { bin, mock, dir }
    }

    fn path(&self, name: &str) -> std::path::PathBuf {
        self.dir.path().join(name)
    }

    async fn chat(&self, message: &str) -> std::process::Output {
        let (workspace, data) = (self.path("repo"), self.path("data"));
        let base_url = self.mock.base_url();
        let mut cmd = command(&[
            "chat",
            "--workspace",
            arg(&workspace),
            "--data-dir",
            arg(&data),
            "--agent",
            "qwen-code",
            "--base-url",
            &base_url,
            message,
        ]);
        cmd.env("WARDEN_QWEN_BIN", &self.bin)
            .env("OPENAI_API_KEY", "dummy")
            .env("HOME", self.path("home"));
        let out = output(cmd, Duration::from_secs(120)).await;
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        let reply = stdout(&out);
        assert_eq!(
            reply.matches("Hello from warden-mock.").count(),
            1,
            "the reply, once: {reply}"
        );
        assert!(reply.contains("[ctx: "), "{reply}");
        out
    }

    /// Qwen Code's saved chats of the workspace's project (its one
    /// project under the data directory).
    fn chats(&self) -> std::path::PathBuf {
        let projects = self.path("data/qwen/projects");
        let project: Vec<_> = std::fs::read_dir(&projects)
            .expect("its projects under the data directory")
            .flatten()
            .collect();
        assert_eq!(project.len(), 1, "one project: {project:?}");
        project[0].path().join("chats")
    }
}

/// Two chats: one session, one request and one run per turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qwen_code_chats_resume_the_same_session_one_request_and_one_run_per_turn() {
    let Some(bin) = qwen_bin() else {
        return;
    };
    let fx = Fixture::new(bin).await;
    let first = fx.chat("Say hello.").await;
    let id = session_id(&fx.path("data")).await;
    assert!(warden_claude::is_uuid(&id), "{id}");
    assert!(
        fx.chats().join(format!("{id}.jsonl")).exists(),
        "its session is kept under the data directory"
    );
    assert!(
        !fx.path("home/.qwen").exists(),
        "the user's own ~/.qwen is not used"
    );
    assert_eq!(
        fx.mock.requests_to(CHAT),
        1,
        "one request, no memory extraction"
    );

    let second = fx.chat("Again.").await;
    assert_eq!(session_id(&fx.path("data")).await, id, "the same session");
    for out in [&first, &second] {
        let said = stderr(out);
        assert!(
            !said.contains("starting fresh") && !said.contains("Retrying"),
            "one run per turn: {said}"
        );
    }
    assert_eq!(fx.mock.requests_to(CHAT), 2, "one request per turn");
    let saved = std::fs::read_to_string(fx.chats().join(format!("{id}.jsonl"))).expect("its chat");
    assert!(
        saved.contains("Say hello.") && saved.contains("Again."),
        "both turns in the one session"
    );
    fx.mock.shutdown().await;
}

/// Its saved chats lost: a fresh session, the message once, the user told.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_qwen_code_no_longer_has_falls_back_to_a_fresh_one_with_the_message() {
    let Some(bin) = qwen_bin() else {
        return;
    };
    let fx = Fixture::new(bin).await;
    fx.chat("Say hello.").await;
    let id = session_id(&fx.path("data")).await;
    std::fs::remove_dir_all(fx.chats()).expect("rm its chats");

    let out = fx.chat("Still there?").await;
    let said = stderr(&out);
    assert!(
        said.contains("could not be found — starting fresh"),
        "the user is told: {said}"
    );
    let fresh = session_id(&fx.path("data")).await;
    assert!(warden_claude::is_uuid(&fresh) && fresh != id, "{fresh}");
    assert_eq!(
        fx.mock.requests_to(CHAT),
        2,
        "the failed resume sent nothing; the message once, fresh"
    );
    fx.mock.shutdown().await;
}
