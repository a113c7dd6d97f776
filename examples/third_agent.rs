//! A third agent CLI in one file: an [`AgentCli`] adapter for "echo-cli",
//! run by warden with the same process-group, watchdog and resume
//! machinery as Claude Code and Codex.
//!
//! ```sh
//! cargo run --example third_agent
//! ```
//!
//! The CLI is this binary again with `--fake-cli` (run directly, no
//! shell): prompt on stdin, JSON lines out, one process per turn,
//! `--resume <id>`. The second of two turns resumes the first's id.

use std::io::{BufRead, Write};
use std::sync::Arc;

use serde_json::{Value, json};
use warden_claude::{
    AgentCli, CliCommand, CliSourceFactory, ExitInfo, ProcessLifetime, SpawnRequest, Step,
    TurnParser, stderr_summary,
};
use warden_core::{AgentEvent, Frame, StreamError, Supervisor, Usage};

/// The adapter: how echo-cli is started and how its lines read.
#[derive(Debug, Clone)]
struct EchoCli;

impl AgentCli for EchoCli {
    type Parser = EchoParser;

    fn name(&self) -> &str {
        "echo-cli"
    }

    fn lifetime(&self) -> ProcessLifetime {
        ProcessLifetime::Turn
    }

    fn command(&self, spawn: &SpawnRequest<'_>) -> Result<CliCommand, StreamError> {
        let exe = std::env::current_exe().map_err(|e| StreamError::Connection {
            message: e.to_string(),
        })?;
        let mut command = CliCommand::new(exe).args(["--fake-cli"]);
        if let Some(id) = spawn.resume_id {
            command = command.args(["--resume", id]);
        }
        Ok(command)
    }

    fn turn_input(&self, message: &str) -> std::io::Result<Vec<u8>> {
        Ok(format!("{message}\n").into_bytes())
    }

    fn parser(&self, _spawn: &SpawnRequest<'_>) -> EchoParser {
        EchoParser::default()
    }

    /// echo-cli's model has a small window.
    fn context_window(&self, _model: Option<&str>) -> Option<u64> {
        Some(8_000)
    }
}

/// Reads `{"kind":"hello"|"say"|"done"}` lines.
#[derive(Debug, Default)]
struct EchoParser {
    conversation: Option<String>,
}

impl TurnParser for EchoParser {
    fn line(&mut self, line: &Value) -> Step {
        let text = |k: &str| line.get(k).and_then(Value::as_str).map(str::to_owned);
        match text("kind").as_deref() {
            Some("hello") => {
                self.conversation = text("conversation");
                Step::Frames(vec![Frame::Event(AgentEvent::SessionStarted {
                    session_id: self.conversation.clone().unwrap_or_default(),
                    model: None,
                })])
            }
            Some("say") => Step::Frames(vec![Frame::Event(AgentEvent::TextDelta(
                text("text").unwrap_or_default(),
            ))]),
            Some("done") => {
                // The context in use: this request's input tokens.
                let usage = Usage {
                    input_tokens: line.get("tokens").and_then(Value::as_u64).unwrap_or(0),
                    ..Usage::default()
                };
                Step::Complete(vec![
                    Frame::Event(AgentEvent::Usage(usage)),
                    Frame::Event(AgentEvent::TurnComplete {
                        context_window: None,
                        duration: None,
                    }),
                ])
            }
            _ => Step::Frames(Vec::new()), // liveness
        }
    }

    fn session_id(&self) -> Option<&str> {
        self.conversation.as_deref()
    }

    fn ended_early(&mut self, exit: ExitInfo, stderr: &[String], _saw_json: bool) -> StreamError {
        StreamError::Truncated {
            message: format!("echo-cli ended early ({exit}): {}", stderr_summary(stderr)),
        }
    }
}

/// The fake CLI: one turn, then exit.
fn fake_cli(args: &[String]) -> anyhow::Result<()> {
    let resumed = args
        .iter()
        .position(|a| a == "--resume")
        .map(|i| args[i + 1].clone());
    let mut prompt = String::new();
    std::io::stdin().lock().read_line(&mut prompt)?;
    let mut out = std::io::stdout().lock();
    let conversation = resumed.clone().unwrap_or_else(|| "conv-1".to_owned());
    for line in [
        json!({"kind": "hello", "conversation": conversation}),
        json!({"kind": "say", "text": format!("echo: {}", prompt.trim())}),
        json!({"kind": "say", "text": if resumed.is_some() { " (resumed)" } else { "" }}),
        json!({"kind": "done", "tokens": 2_000}),
    ] {
        writeln!(out, "{line}")?;
    }
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--fake-cli") {
        return fake_cli(&args);
    }
    let workspace = tempfile::tempdir()?;
    let supervisor = Supervisor::builder(Arc::new(CliSourceFactory::new(EchoCli)))
        .start()
        .await?;
    for message in ["hello", "again"] {
        let turn = supervisor
            .send_to_workspace(workspace.path(), message)
            .await?;
        let (text, _summary) = turn.finish().await?;
        println!("{text}"); // the reply, then the context indicator
    }
    for status in supervisor.statuses().await? {
        println!("agent conversation: {:?}", status.record.agent_session_id);
    }
    supervisor.shutdown().await;
    Ok(())
}
