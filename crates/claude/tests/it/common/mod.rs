//! Helpers shared by the tests: a scratch workspace, the fake agent's
//! options and script lines, stream collection, and process checks.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::{Value, json};
use tempfile::TempDir;
use warden_claude::ClaudeOptions;
use warden_core::{AgentEvent, EventStream, Frame, SessionKey, StreamError, TurnRequest};

/// The grace period the tests use.
pub(crate) const GRACE: Duration = Duration::from_millis(400);

/// Upper bound for anything a test waits for.
pub(crate) const PATIENCE: Duration = Duration::from_secs(10);

/// The session id the fake announces on a fresh start.
pub(crate) const SESS_1: &str = "00000000-0000-4000-8000-000000000001";
/// The id a resume of [`SESS_1`] announces (the fake forks the id).
pub(crate) const SESS_1_FORK: &str = "00000000-0000-4000-8000-000000000002";
/// The id a resume of [`SESS_1_FORK`] announces.
pub(crate) const SESS_1_FORK_FORK: &str = "00000000-0000-4000-8000-000000000003";

/// The `system/init` line (`docs/wire-formats.md`), with the fake's session id.
pub(crate) const INIT: &str = r#"{"type":"system","subtype":"init","cwd":"{cwd}","session_id":"{session_id}","model":"claude-x","tools":["Bash"],"permissionMode":"default"}"#;

/// An assistant text block echoing the turn's message, with usage.
pub(crate) const ECHO: &str = r#"{"type":"assistant","message":{"id":"msg_{turn}","content":[{"type":"text","text":"echo {content}"}],"usage":{"input_tokens":3,"cache_read_input_tokens":14000,"cache_creation_input_tokens":200,"output_tokens":1}},"session_id":"{session_id}"}"#;

/// A success result, `type` last as in 2.1.332.
pub(crate) const RESULT: &str = r#"{"subtype":"success","is_error":false,"duration_ms":600,"num_turns":1,"result":"echo {content}","session_id":"{session_id}","total_cost_usd":0.0123,"usage":{"input_tokens":6,"cache_creation_input_tokens":200,"cache_read_input_tokens":28000,"output_tokens":40},"modelUsage":{"claude-x":{"contextWindow":200000}},"type":"result"}"#;

/// `{"out": line}`.
pub(crate) fn out(line: &str) -> Value {
    json!({ "out": line })
}

/// `{"err": line}`.
pub(crate) fn err(line: &str) -> Value {
    json!({ "err": line })
}

/// A complete turn: init, the echo, the result.
pub(crate) fn echo_turn() -> Value {
    json!([out(INIT), out(ECHO), out(RESULT)])
}

/// A script where every turn is [`echo_turn`].
pub(crate) fn echo_script() -> Value {
    json!({ "turns": [echo_turn()] })
}

/// A scratch directory with a workspace and a home.
pub(crate) struct Fixture {
    /// Keeps everything alive.
    pub(crate) dir: TempDir,
    /// The agent's working directory (its real path).
    pub(crate) workspace: PathBuf,
    /// `HOME` for the agent.
    pub(crate) home: PathBuf,
    /// The fake's record file.
    pub(crate) record: PathBuf,
}

impl Fixture {
    /// A new scratch directory.
    pub(crate) fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = std::fs::canonicalize(dir.path()).expect("canonicalize");
        let workspace = root.join("work.space_1");
        let home = root.join("home");
        std::fs::create_dir_all(&workspace).expect("workspace");
        std::fs::create_dir_all(&home).expect("home");
        let record = root.join("record.jsonl");
        Self {
            dir,
            workspace,
            home,
            record,
        }
    }

    /// Options running the fake agent with `script`.
    pub(crate) fn options(&self, script: Value) -> ClaudeOptions {
        ClaudeOptions::default()
            .with_binary(env!("CARGO_BIN_EXE_fake-claude"))
            .with_env("FAKE_CLAUDE_SCRIPT", script.to_string())
            .with_env("FAKE_CLAUDE_RECORD", self.record.as_os_str())
            .with_env("HOME", self.home.as_os_str())
            .with_scratch_dir(self.dir.path().join("scratch"))
            .with_grace_period(GRACE)
    }

    /// A request for turn `turn` in this fixture's workspace.
    pub(crate) fn request(&self, turn: u64, message: &str, resume: Option<&str>) -> TurnRequest {
        let mut r = TurnRequest::new(SessionKey::new("ws"), turn, message);
        r.workspace = Some(self.workspace.clone());
        r.resume_id = resume.map(str::to_owned);
        r
    }

    /// Everything the fake recorded.
    pub(crate) fn records(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.record)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// The recorded events of one kind.
    pub(crate) fn recorded(&self, event: &str) -> Vec<Value> {
        self.records()
            .into_iter()
            .filter(|r| r["event"] == event)
            .collect()
    }

    /// The pids of the fake agents started so far.
    pub(crate) fn agent_pids(&self) -> Vec<u32> {
        self.recorded("start").iter().map(pid_of).collect()
    }

    /// The pids of grandchildren started so far.
    pub(crate) fn grandchild_pids(&self) -> Vec<u32> {
        self.recorded("grandchild").iter().map(pid_of).collect()
    }

    /// The arguments of the `n`th agent started.
    pub(crate) fn args(&self, n: usize) -> Vec<String> {
        self.recorded("start")
            .get(n)
            .and_then(|r| r["args"].as_array().cloned())
            .unwrap_or_default()
            .iter()
            .filter_map(|a| a.as_str().map(str::to_owned))
            .collect()
    }
}

fn pid_of(r: &Value) -> u32 {
    r["pid"]
        .as_u64()
        .and_then(|p| u32::try_from(p).ok())
        .expect("pid")
}

/// Reads the whole stream: its frames, and the error that ended it.
pub(crate) async fn run(mut stream: EventStream) -> (Vec<Frame>, Option<StreamError>) {
    let mut frames = Vec::new();
    let read = async {
        while let Some(item) = stream.next().await {
            match item {
                Ok(f) => frames.push(f),
                Err(e) => {
                    // Nothing follows an error.
                    assert!(stream.next().await.is_none(), "frames after an error");
                    return Some(e);
                }
            }
        }
        None
    };
    let error = tokio::time::timeout(PATIENCE, read)
        .await
        .expect("stream ended in time");
    (frames, error)
}

/// Reads frames until one matches `pred`; returns them all.
pub(crate) async fn read_until(
    stream: &mut EventStream,
    pred: impl Fn(&Frame) -> bool,
) -> Vec<Frame> {
    let mut frames = Vec::new();
    let read = async {
        while let Some(item) = stream.next().await {
            let f = item.expect("no error before the awaited frame");
            let done = pred(&f);
            frames.push(f);
            if done {
                return;
            }
        }
        panic!("stream ended before the awaited frame: {frames:?}");
    };
    tokio::time::timeout(PATIENCE, read)
        .await
        .expect("frame arrived in time");
    frames
}

/// The events among `frames`.
pub(crate) fn events(frames: &[Frame]) -> Vec<AgentEvent> {
    frames
        .iter()
        .filter_map(|f| match f {
            Frame::Event(e) => Some(e.clone()),
            Frame::KeepAlive => None,
        })
        .collect()
}

/// The text of `frames`' text deltas.
pub(crate) fn text(frames: &[Frame]) -> String {
    events(frames)
        .into_iter()
        .filter_map(|e| match e {
            AgentEvent::TextDelta(t) => Some(t),
            _ => None,
        })
        .collect()
}

/// Whether `frame` is a `SessionStarted`.
pub(crate) fn is_started(frame: &Frame) -> bool {
    matches!(frame, Frame::Event(AgentEvent::SessionStarted { .. }))
}

/// The state letter of `/proc/<pid>/stat`, or `None` when there is no such
/// process (it exited and was reaped).
pub(crate) fn proc_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The state follows the command name, which is in parentheses.
    let after = &stat[stat.rfind(')')? + 1..];
    after.trim_start().chars().next()
}

/// The agent was reaped: no process, not even a zombie.
pub(crate) fn reaped(pid: u32) -> bool {
    proc_state(pid).is_none()
}

/// The process is dead: reaped, or a zombie waiting for its (new) parent.
pub(crate) fn dead(pid: u32) -> bool {
    matches!(proc_state(pid), None | Some('Z') | Some('X'))
}

/// Polls `cond` until it holds or `within` passes; whether it held.
pub(crate) async fn eventually(within: Duration, cond: impl Fn() -> bool) -> bool {
    let start = Instant::now();
    loop {
        if cond() {
            return true;
        }
        if start.elapsed() > within {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The real path of `p`.
pub(crate) fn real(p: &Path) -> PathBuf {
    std::fs::canonicalize(p).expect("canonicalize")
}
