//! `warden chat --agent aider`: the real Aider (`WARDEN_AIDER_BIN`,
//! installed by `.ci/run`) against the mock's chat-completions endpoint,
//! through the wire layer. Two invocations, one conversation: warden names
//! it and keeps its chat-history file under the data directory, the second
//! turn restores it (Aider sends the first exchange back), one model
//! request and one Aider run per turn, the context indicator from its
//! `Tokens:` line, no price-map download (its line would be on stdout); a
//! history file that is gone falls back to a fresh conversation with the
//! message re-delivered and a notice (Aider itself would start afresh
//! without a word). A cancel through `warden serve` mid-stall ends its
//! process (Aider would wait a day on the stream: warden gives it
//! `--timeout 86400`), nothing retried. Skipped with a printed reason when
//! the binary is not there, unless `WARDEN_REQUIRE_AIDER=1`.

use crate::common;

use std::path::Path;
use std::time::Duration;

use common::agent_chat::AgentChat;
use common::cancel;
use common::*;
use serde_json::Value;

const CHAT: &str = "/v1/chat/completions";

fn aider_bin() -> Option<std::ffi::OsString> {
    let bin = std::env::var_os("WARDEN_AIDER_BIN").filter(|v| !v.is_empty());
    if bin.is_none() {
        assert_ne!(
            std::env::var("WARDEN_REQUIRE_AIDER").as_deref(),
            Ok("1"),
            "WARDEN_REQUIRE_AIDER=1 but WARDEN_AIDER_BIN is unset"
        );
        eprintln!("skipped: set WARDEN_AIDER_BIN to the aider binary to run this test");
    }
    bin
}

async fn session(data: &Path) -> Value {
    let out = run(&["sessions", "--json", "--data-dir", arg(data)]).await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let sessions: Vec<Value> = serde_json::from_str(&stdout(&out)).expect("JSON array");
    sessions[0].clone()
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
    async fn new(bin: std::ffi::OsString) -> Self {
        Self(AgentChat::new("aider", "WARDEN_AIDER_BIN", bin).await)
    }

    /// One turn, the model named (its price map then not fetched); only
    /// the reply on stdout, none of Aider's banner.
    async fn chat(&self, message: &str) -> std::process::Output {
        let out = self
            .0
            .chat(
                message,
                &["--model", "mock-model"],
                &[("OPENAI_API_KEY", "dummy")],
            )
            .await;
        let reply = stdout(&out);
        for banner in ["Aider v", "Tokens:", "Repo-map:", "HTTPSConnectionPool"] {
            assert!(!reply.contains(banner), "only the reply: {reply}");
        }
        out
    }
}

/// Two chats: one conversation restored, one request and one run per turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aider_chats_restore_the_same_conversation_one_request_and_one_run_per_turn() {
    let Some(bin) = aider_bin() else {
        return;
    };
    let fx = Fixture::new(bin).await;
    let first = fx.chat("Say hello.").await;
    let one = session(&fx.path("data")).await;
    let id = one["agent_session_id"]
        .as_str()
        .expect("its name")
        .to_owned();
    assert!(warden_claude::is_aider_id(&id), "{id}");
    let history = fx.path("data/aider").join(format!("{id}.md"));
    assert!(
        history.exists(),
        "its chat history under the data directory"
    );
    let sent_first = one["context_tokens"].as_u64().expect("context tokens");
    assert!(sent_first > 0, "the context indicator from its Tokens line");
    assert_eq!(fx.mock.requests_to(CHAT), 1, "one request");

    let second = fx.chat("Again.").await;
    let two = session(&fx.path("data")).await;
    assert_eq!(
        two["agent_session_id"],
        id.as_str(),
        "the same conversation"
    );
    assert!(
        two["context_tokens"].as_u64().expect("context tokens") > sent_first,
        "the second turn sent the first exchange back: {two}"
    );
    for out in [&first, &second] {
        let said = stderr(out);
        assert!(
            !said.contains("starting fresh") && !said.contains("Retrying"),
            "one run per turn: {said}"
        );
    }
    assert_eq!(fx.mock.requests_to(CHAT), 2, "one request per turn");
    let saved = std::fs::read_to_string(&history).expect("its history");
    assert!(
        saved.contains("Say hello.") && saved.contains("Again."),
        "both turns in the one conversation"
    );
    fx.0.mock.shutdown().await;
}

/// Its chat history lost: a fresh conversation, the message once, the
/// user told.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversation_whose_history_is_gone_falls_back_to_a_fresh_one_with_the_message() {
    let Some(bin) = aider_bin() else {
        return;
    };
    let fx = Fixture::new(bin).await;
    fx.chat("Say hello.").await;
    let id = session(&fx.path("data")).await["agent_session_id"]
        .as_str()
        .expect("its name")
        .to_owned();
    std::fs::remove_file(fx.path("data/aider").join(format!("{id}.md"))).expect("rm");

    let out = fx.chat("Still there?").await;
    let said = stderr(&out);
    assert!(
        said.contains("could not be found — starting fresh"),
        "the user is told: {said}"
    );
    let fresh = session(&fx.path("data")).await["agent_session_id"]
        .as_str()
        .expect("its name")
        .to_owned();
    assert!(warden_claude::is_aider_id(&fresh) && fresh != id, "{fresh}");
    assert_eq!(
        fx.mock.requests_to(CHAT),
        2,
        "the failed resume sent nothing; the message once, fresh"
    );
    fx.0.mock.shutdown().await;
}

/// A cancel mid-turn ends Aider's process group at once; nothing retried.
/// Its process is the one naming warden's chat-history files for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_aider_turn_ends_its_process_and_nothing_is_retried() {
    let Some(bin) = aider_bin() else {
        return;
    };
    let bin = bin.to_string_lossy().into_owned();
    cancel::a_cancelled_turn_ends_every_process(cancel::Cancelled {
        name: "aider",
        serve_args: &["--agent", "aider", "--model", "mock-model"],
        env: &[
            ("WARDEN_AIDER_BIN", bin.as_str()),
            ("OPENAI_API_KEY", "dummy"),
        ],
        path: CHAT,
        reach_within: Duration::from_secs(60),
        at_least: 1,
        processes: |data, _| cancel::processes_naming(&data.join("aider")),
    })
    .await;
}
