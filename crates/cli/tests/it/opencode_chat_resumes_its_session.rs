//! `warden chat --agent opencode`: the real OpenCode (`WARDEN_OPENCODE_BIN`,
//! installed by `.ci/run`) against the mock's chat-completions endpoint,
//! through the wire layer. Two invocations, one OpenCode session (`-s`),
//! one model request and one CLI run per turn (no title request), the
//! context indicator, nothing fetched from the npm registry; a session
//! OpenCode no longer has ("Session not found") falls back to a fresh one
//! with the message re-delivered and a notice; a turn cancelled through
//! `warden serve` mid-stream ends every process of the CLI at once, with
//! nothing retried. The same for its fork Kilo
//! Code CLI (`--agent kilo-code`, `WARDEN_KILO_BIN`). Skipped with a
//! printed reason when the binary is not there, unless
//! `WARDEN_REQUIRE_OPENCODE=1` / `WARDEN_REQUIRE_KILO=1`.

use crate::common;

use std::path::Path;
use std::time::Duration;

use common::agent_chat::AgentChat;
use common::cancel;
use common::*;
use serde_json::Value;

const CHAT: &str = "/v1/chat/completions";

/// One CLI of the OpenCode family.
#[derive(Clone, Copy)]
struct Cli {
    /// Its `--agent`.
    agent: &'static str,
    /// The variable naming its binary, and the one requiring it.
    bin: &'static str,
    require: &'static str,
    /// Its store under `~/.local/share`, and the database's name there.
    store: &'static str,
}

const OPENCODE: Cli = Cli {
    agent: "opencode",
    bin: "WARDEN_OPENCODE_BIN",
    require: "WARDEN_REQUIRE_OPENCODE",
    store: "opencode",
};

const KILO: Cli = Cli {
    agent: "kilo-code",
    bin: "WARDEN_KILO_BIN",
    require: "WARDEN_REQUIRE_KILO",
    store: "kilo",
};

fn cli_bin(cli: Cli) -> Option<std::ffi::OsString> {
    let bin = std::env::var_os(cli.bin).filter(|v| !v.is_empty());
    if bin.is_none() {
        assert_ne!(
            std::env::var(cli.require).as_deref(),
            Ok("1"),
            "{}=1 but {} is unset",
            cli.require,
            cli.bin
        );
        eprintln!(
            "skipped: set {} to the CLI's binary to run this test",
            cli.bin
        );
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
struct Fixture(AgentChat);

impl std::ops::Deref for Fixture {
    type Target = AgentChat;
    fn deref(&self) -> &AgentChat {
        &self.0
    }
}

impl Fixture {
    async fn new(cli: Cli, bin: std::ffi::OsString) -> Self {
        Self(AgentChat::new(cli.agent, cli.bin, bin).await)
    }

    async fn chat(&self, message: &str) -> std::process::Output {
        self.0.chat(message, &[], &[]).await
    }
}

/// Two chats: one session, one request and one run per turn.
async fn chats_resume_the_same_session(cli: Cli) {
    let Some(bin) = cli_bin(cli) else {
        return;
    };
    let fx = Fixture::new(cli, bin).await;
    let first = fx.chat("Say hello.").await;
    let id = session_id(&fx.path("data")).await;
    assert!(id.starts_with("ses_"), "{id}");
    assert_eq!(
        fx.mock.requests_to(CHAT),
        1,
        "one request, no title request"
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
    assert!(
        !fx.path("home/.npm").exists(),
        "no plugin install reached the npm registry"
    );
    fx.0.mock.shutdown().await;
}

/// The CLI's whole store lost: a fresh session, the message once.
async fn a_lost_session_falls_back_to_a_fresh_one(cli: Cli) {
    let Some(bin) = cli_bin(cli) else {
        return;
    };
    let fx = Fixture::new(cli, bin).await;
    fx.chat("Say hello.").await;
    let id = session_id(&fx.path("data")).await;
    // The CLI's whole store gone: its `-s <id>` is "Session not found".
    let store = fx.path(&format!("home/.local/share/{}", cli.store));
    let db = format!("{}.db", cli.store);
    for entry in std::fs::read_dir(&store)
        .expect("the CLI's store")
        .flatten()
    {
        if entry.file_name().to_string_lossy().starts_with(&db) {
            std::fs::remove_file(entry.path()).expect("rm");
        }
    }

    let out = fx.chat("Still there?").await;
    let said = stderr(&out);
    assert!(
        said.contains("could not be found — starting fresh"),
        "the user is told: {said}"
    );
    let fresh = session_id(&fx.path("data")).await;
    assert!(fresh.starts_with("ses_") && fresh != id, "{fresh}");
    assert_eq!(
        fx.mock.requests_to(CHAT),
        2,
        "the failed resume sent nothing; the message once, fresh"
    );
    fx.0.mock.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opencode_chats_resume_the_same_session_one_request_and_one_run_per_turn() {
    chats_resume_the_same_session(OPENCODE).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_opencode_no_longer_has_falls_back_to_a_fresh_one_with_the_message() {
    a_lost_session_falls_back_to_a_fresh_one(OPENCODE).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kilo_chats_resume_the_same_session_one_request_and_one_run_per_turn() {
    chats_resume_the_same_session(KILO).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_kilo_no_longer_has_falls_back_to_a_fresh_one_with_the_message() {
    a_lost_session_falls_back_to_a_fresh_one(KILO).await;
}

/// A turn cancelled through `warden serve` while the CLI waits on a
/// stalled model stream: every process of the CLI gone at once (its stall
/// timeout is off, so it would wait for ever), one request, nothing
/// retried. Its processes are those naming the workspace (warden runs it
/// with `--dir <workspace>`; Kilo's wrapper and the native binary it
/// starts both).
async fn a_cancelled_turn_ends_the_cli_and_nothing_is_retried(cli: Cli) {
    let Some(bin) = cli_bin(cli) else {
        return;
    };
    let bin = bin.to_string_lossy().into_owned();
    cancel::a_cancelled_turn_ends_every_process(cancel::Cancelled {
        name: cli.agent,
        serve_args: &["--agent", cli.agent],
        env: &[(cli.bin, bin.as_str()), ("OPENAI_API_KEY", "dummy")],
        path: CHAT,
        reach_within: Duration::from_secs(90),
        at_least: 1,
        processes: |_, workspace| cancel::processes_naming(workspace),
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_opencode_turn_ends_its_process_and_nothing_is_retried() {
    a_cancelled_turn_ends_the_cli_and_nothing_is_retried(OPENCODE).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_kilo_turn_ends_its_wrapper_and_binary_and_nothing_is_retried() {
    a_cancelled_turn_ends_the_cli_and_nothing_is_retried(KILO).await;
}
