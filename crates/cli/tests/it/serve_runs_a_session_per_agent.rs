//! `warden serve --agent claude-code --agent codex` with the real CLIs
//! against `warden mock`: a session per agent, each answered by its own
//! CLI (the mock's journal shows which API each turn reached); a turn
//! asking another agent of a session is `409 agent_mismatch` naming both;
//! after a restart with the agents in the other order (another default,
//! given as a comma list) each session still runs its own agent.
//!
//! The CLIs come from `.ci/run` (`WARDEN_CLAUDE_BIN`, `WARDEN_CODEX_BIN`);
//! without them the test says why and passes, unless
//! `WARDEN_REQUIRE_CLAUDE=1` / `WARDEN_REQUIRE_CODEX=1` (CI).

use crate::common;

use std::path::Path;
use std::time::Duration;

use common::*;
use futures_util::StreamExt as _;
use serde_json::{Value, json};
use warden_mock::{MockConfig, MockServer};

const PATIENCE: Duration = Duration::from_secs(120);
const REPLY: &str = "Hello from warden-mock.";

/// The binary in `var`, or `None` with the reason printed (a failure when
/// `require` is `1`).
fn binary(var: &str, require: &str) -> Option<String> {
    match std::env::var(var).ok().filter(|v| !v.is_empty()) {
        Some(bin) => Some(bin),
        None => {
            assert_ne!(
                std::env::var(require).as_deref(),
                Ok("1"),
                "{require}=1 but {var} is unset"
            );
            eprintln!("skipped: set {var} (see .ci/run) to run this test");
            None
        }
    }
}

struct Node {
    child: tokio::process::Child,
    base: String,
    token: String,
    client: reqwest::Client,
}

impl Node {
    async fn start(data: &Path, mock: &MockServer, agents: &[&str], env: &[(&str, &str)]) -> Self {
        let (child, base, token) = serve_on(data, &mock.base_url(), agents, env).await;
        Self {
            child,
            base,
            token,
            client: reqwest::Client::new(),
        }
    }

    /// A turn streamed to its end: its status and its events' text.
    async fn turn(&self, body: Value) -> (u16, String) {
        let response = self
            .client
            .post(format!("{}/v1/turns", self.base))
            .bearer_auth(&self.token)
            .header("accept", "text/event-stream")
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .await
            .expect("post");
        let status = response.status().as_u16();
        let mut stream = response.bytes_stream();
        let mut text = String::new();
        while let Some(chunk) = tokio::time::timeout(PATIENCE, stream.next())
            .await
            .expect("the turn's events in time")
        {
            text.push_str(&String::from_utf8_lossy(&chunk.expect("chunk")));
        }
        (status, text)
    }

    /// Each workspace session's agent, from `GET /v1/sessions?detail=full`.
    async fn agents(&self) -> Vec<(String, Value)> {
        let text = self
            .client
            .get(format!("{}/v1/sessions?detail=full", self.base))
            .bearer_auth(&self.token)
            .send()
            .await
            .expect("get")
            .text()
            .await
            .expect("body");
        let list: Value = serde_json::from_str(&text).expect("JSON");
        let mut agents: Vec<(String, Value)> = list["sessions"]
            .as_array()
            .expect("sessions")
            .iter()
            .map(|s| {
                (
                    s["workspace"].as_str().unwrap_or("").to_owned(),
                    s["agent"].clone(),
                )
            })
            .collect();
        agents.sort_by(|a, b| a.0.cmp(&b.0));
        agents
    }

    /// SIGTERM, and its exit within the patience.
    async fn stop(mut self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id().expect("pid") as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("SIGTERM");
        let status = tokio::time::timeout(PATIENCE, self.child.wait())
            .await
            .expect("exits in time")
            .expect("wait");
        assert_eq!(status.code(), Some(0));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_session_keeps_its_own_cli_across_a_restart() {
    let Some(claude) = binary("WARDEN_CLAUDE_BIN", "WARDEN_REQUIRE_CLAUDE") else {
        return;
    };
    let Some(codex) = binary("WARDEN_CODEX_BIN", "WARDEN_REQUIRE_CODEX") else {
        return;
    };
    let mock = MockServer::start(MockConfig::default())
        .await
        .expect("mock");
    let dir = tempfile::tempdir().expect("tempdir");
    let (data, home) = (dir.path().join("data"), dir.path().join("home"));
    let (planner, reviewer) = (dir.path().join("planner"), dir.path().join("reviewer"));
    for d in [&home, &planner, &reviewer] {
        std::fs::create_dir_all(d).expect("mkdir");
    }
    let home = home.to_str().expect("utf-8");
    let env = [
        ("HOME", home),
        ("WARDEN_CODEX_BIN", codex.as_str()),
        ("ANTHROPIC_API_KEY", "dummy"),
        ("OPENAI_API_KEY", "dummy"),
        ("DISABLE_TELEMETRY", "1"),
        ("DISABLE_AUTOUPDATER", "1"),
        ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1"),
    ];
    let node = Node::start(
        &data,
        &mock,
        &[
            "--agent",
            "claude-code",
            "--agent",
            "codex",
            "--claude-bin",
            &claude,
        ],
        &env,
    )
    .await;
    let (planner_ws, reviewer_ws) = (arg(&planner), arg(&reviewer));

    // The planner names no agent: the default, Claude Code (Messages API).
    let (status, events) = node
        .turn(json!({"workspace": planner_ws, "message": "Plan it."}))
        .await;
    assert_eq!(status, 200, "{events}");
    assert!(
        events.contains("event: done") && events.contains(REPLY),
        "{events}"
    );
    let messages = mock.requests_to("/v1/messages");
    assert!(messages >= 1, "Claude Code reached the Messages API");
    assert_eq!(mock.requests_to("/v1/responses"), 0);

    // The reviewer names Codex (Responses API).
    let (status, events) = node
        .turn(json!({"workspace": reviewer_ws, "message": "Review it.", "agent": "codex"}))
        .await;
    assert_eq!(status, 200, "{events}");
    assert!(
        events.contains("event: done") && events.contains(REPLY),
        "{events}"
    );
    assert_eq!(mock.requests_to("/v1/responses"), 1, "Codex answered");
    assert_eq!(
        mock.requests_to("/v1/messages"),
        messages,
        "not Claude Code"
    );

    // Claude Code asked of the Codex session: 409 naming both.
    let (status, refused) = node
        .turn(json!({"workspace": reviewer_ws, "message": "Switch.", "agent": "claude-code"}))
        .await;
    assert_eq!(status, 409, "{refused}");
    let refused: Value = serde_json::from_str(&refused).expect("JSON error");
    assert_eq!(refused["error"]["type"], "agent_mismatch", "{refused}");
    assert_eq!(refused["error"]["agent"], "codex", "{refused}");
    assert_eq!(refused["error"]["requested"], "claude-code", "{refused}");
    let expected = vec![
        (planner_ws.to_owned(), json!("claude-code")),
        (reviewer_ws.to_owned(), json!("codex")),
    ];
    assert_eq!(node.agents().await, expected);
    node.stop().await;

    // Restarted with Codex the default (a comma list): each session keeps
    // its own agent, shown and run.
    let node = Node::start(
        &data,
        &mock,
        &["--agent", "codex,claude-code", "--claude-bin", &claude],
        &env,
    )
    .await;
    assert_eq!(
        node.agents().await,
        expected,
        "the agents survive a restart"
    );
    let (status, events) = node
        .turn(json!({"workspace": planner_ws, "message": "Go on."}))
        .await;
    assert_eq!(status, 200, "{events}");
    assert!(events.contains(REPLY), "{events}");
    assert!(
        mock.requests_to("/v1/messages") > messages,
        "Claude Code again"
    );
    assert_eq!(mock.requests_to("/v1/responses"), 1, "not Codex");
    let (status, refused) = node
        .turn(json!({"workspace": planner_ws, "message": "Switch.", "agent": "codex"}))
        .await;
    assert_eq!(status, 409, "{refused}");
    assert!(refused.contains(r#""agent":"claude-code""#), "{refused}");
    node.stop().await;
    mock.shutdown().await;
}
