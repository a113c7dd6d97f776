//! Qwen Code (`@qwen-code/qwen-code`, measured with 0.24.4, a Gemini CLI
//! fork speaking OpenAI chat completions) on the [`AgentCli`] trait:
//! [`QwenOptions`] is the adapter, [`QwenSource`] the source.
//!
//! # The process
//!
//! One process per turn ([`ProcessLifetime::Turn`]), executed directly
//! (never through a shell) in the turn's workspace, the prompt written to
//! its stdin (no length limit, not in `ps`), then stdin closed:
//!
//! ```text
//! QWEN_CODE_NO_RELAUNCH=true QWEN_STREAM_IDLE_TIMEOUT_MS=0 [QWEN_HOME=<dir>]
//! [OPENAI_BASE_URL=<url>] qwen --auth-type openai --output-format stream-json
//!      [-m <model>] [--resume <uuid>] [extra args…]
//! ```
//!
//! - `QWEN_CODE_NO_RELAUNCH=true`: its entry script still starts `cli.js`
//!   as a child, which then does not re-launch itself a second time.
//!   `SIGINT`/`SIGTERM` to the entry alone leave the children holding the
//!   model stream (measured): warden signals the whole process group,
//!   as for every CLI.
//! - **Its own home.** With [`QwenOptions::qwen_home`] the child gets
//!   `QWEN_HOME=<dir>` (made absolute: the CLI would resolve a relative
//!   one from the workspace; settings, sessions and memories there, not in
//!   `~/.qwen`), and before each start warden merges into
//!   `<dir>/settings.json` ([`QwenOptions::settings_json`]): OpenAI auth,
//!   no usage statistics, no telemetry, no auto-update, **no managed
//!   memory** (otherwise each turn makes a second "memory extraction"
//!   request after the reply), and the model's `generationConfig`:
//!   `maxRetries` 0 and `streamIdleTimeoutMs` 0 (no stall timeout of its
//!   own; also `QWEN_STREAM_IDLE_TIMEOUT_MS=0`), so warden's layers
//!   decide. The key comes from the child's environment (`OPENAI_API_KEY`).
//! - **Approvals.** Headless, the default mode does not offer the model
//!   the write and shell tools; warden passes no `--yolo` or
//!   `--approval-mode`, so nothing is wider than that default.
//!
//! # Lines, resume and errors
//!
//! Claude-Code-like stream-json lines:
//!
//! | stdout line | frames |
//! | --- | --- |
//! | `system` / `init` | `SessionStarted { session_id, model }`; when resuming, another id is a *silent* resume failure → `UnknownSession` |
//! | `system` / `retry` | the CLI retried its model request itself → `Truncated` (retryable) |
//! | `assistant` | as Claude Code's: `TextDelta`, `ThinkingDelta`, `ToolUseStarted`, then `Usage` of that request |
//! | `user` `tool_result` blocks | `ToolUseFinished` |
//! | `result` `success` | `TurnComplete { duration: duration_ms }` |
//! | `result` with `is_error` | "maximum context length" → `ContextOverflow`; "Missing API key" or an HTTP 401/403 → `Unauthorized`; another 4xx but 408/409/429 → `Api` (fatal); anything else → `Api` (retryable) |
//!
//! `Truncated` on a `retry` line is what keeps the CLI's own retries from
//! doubling the reply: it continues a cut or stalled stream itself and
//! prints the partial text again with each attempt, in one `assistant`
//! line at the end. warden's retry discards the text shown
//! ([`TurnEvent::discards_shown_text`](warden_core::TurnEvent::discards_shown_text))
//! and resumes the session. Under the wire layer the CLI never sees the
//! cut or the stall: the wire continues the stream and splices it.
//!
//! A process that exits before its `result` line with stderr `No saved
//! session found` (exit 1) failed to resume: `UnknownSession`. A resume
//! id that is not a UUID fails the turn with `UnknownSession` before
//! anything starts. Any other early exit is `Connection` (no JSON line
//! yet) or `Truncated`, both retryable.
//!
//! **Context.** Each `assistant` line carries its own request's usage, so
//! the last one of a turn is the context in use; the window is
//! [`QwenOptions::context_window`] (the CLI prints none).
//!
//! A request's `append_system_prompt` is not passed: Qwen Code reads
//! `QWEN.md`, which also survives a fresh start.

use std::ffi::OsString;
use std::path::PathBuf;

use derive_setters::Setters;
use serde_json::{Value, json};
use warden_core::StreamError;

use crate::cli::{
    AgentCli, CliCommand, CliProcess, ProcessLifetime, ProcessSettings, SpawnRequest,
    cli_process_builders,
};
use crate::gemini::merge_settings_file;
use crate::source::{CliSource, CliSourceFactory};

mod parse;

pub use parse::QwenParser;

/// An [`EventSource`](warden_core::EventSource) running Qwen Code, one
/// `qwen` process per turn.
pub type QwenSource = CliSource<QwenOptions>;

/// A [`SourceFactory`](warden_core::SourceFactory) giving each session its
/// own [`QwenSource`].
pub type QwenSourceFactory = CliSourceFactory<QwenOptions>;

/// What survives a fresh start of a Qwen Code session.
pub const QWEN_FRESH_START_NOTE: &str = "Project context is preserved in QWEN.md.";

/// The context window reported when none is given: the CLI prints none.
pub const QWEN_CONTEXT_WINDOW: u64 = 131_072;

/// How [`QwenSource`] runs Qwen Code: `qwen --auth-type openai
/// --output-format stream-json [-m …] [--resume <uuid>]`, the prompt on
/// stdin, one process per turn, never through a shell. `docs/agents.md`
/// has how it takes faults.
#[derive(Debug, Clone, PartialEq, Setters)]
#[setters(prefix = "with_", strip_option)]
#[non_exhaustive]
pub struct QwenOptions {
    /// The binary (default `qwen`), its more arguments (after warden's), environment and
    /// limits, shared by every adapter ([`CliProcess`]).
    #[setters(skip)]
    pub process: CliProcess,
    /// `-m`, when the turn names no model. Default `None`: the CLI's.
    #[setters(into)]
    pub model: Option<String>,
    /// `OPENAI_BASE_URL`: an OpenAI chat-completions base URL (ending in
    /// `/v1`; the CLI posts to `{base_url}/chat/completions`). Default
    /// `None`: the child's own.
    #[setters(into)]
    pub base_url: Option<String>,
    /// `QWEN_HOME` for the child, where warden writes the settings file
    /// ([`write_settings`](Self::write_settings)) and Qwen Code keeps its
    /// sessions. Default `None`: the child's own `~/.qwen`, untouched.
    #[setters(into)]
    pub qwen_home: Option<PathBuf>,
    /// The context window reported. Default [`QWEN_CONTEXT_WINDOW`].
    pub context_window: u64,
}

impl Default for QwenOptions {
    fn default() -> Self {
        Self {
            process: CliProcess::new("qwen"),
            model: None,
            base_url: None,
            qwen_home: None,
            context_window: QWEN_CONTEXT_WINDOW,
        }
    }
}

cli_process_builders!(QwenOptions);

impl QwenOptions {
    /// The arguments of one run (without the binary).
    pub fn args(&self, resume_id: Option<&str>, model: Option<&str>) -> Vec<OsString> {
        let mut args: Vec<OsString> = ["--auth-type", "openai", "--output-format", "stream-json"]
            .map(OsString::from)
            .into();
        if let Some(model) = model.or(self.model.as_deref()) {
            args.extend(["-m".into(), model.into()]);
        }
        if let Some(id) = resume_id {
            args.extend(["--resume".into(), id.into()]);
        }
        args.extend(self.process.extra_args.iter().cloned());
        args
    }

    /// The settings warden needs, merged into `settings.json`.
    pub fn settings_json(&self) -> Value {
        json!({
            "security": {"auth": {"selectedType": "openai"}},
            "privacy": {"usageStatisticsEnabled": false},
            "telemetry": {"enabled": false},
            "general": {"enableAutoUpdate": false},
            "memory": {"enableManagedAutoMemory": false},
            "model": {"generationConfig": {"maxRetries": 0, "streamIdleTimeoutMs": 0}},
        })
    }

    /// Merges [`settings_json`](Self::settings_json) into
    /// `<qwen_home>/settings.json` (other keys kept), writing only when
    /// something changes. Nothing without a [`qwen_home`](Self::qwen_home).
    pub fn write_settings(&self) -> std::io::Result<()> {
        match &self.qwen_home {
            Some(home) => merge_settings_file(home, &self.settings_json()),
            None => Ok(()),
        }
    }
}

impl AgentCli for QwenOptions {
    type Parser = QwenParser;

    fn name(&self) -> &str {
        "qwen-code"
    }

    fn lifetime(&self) -> ProcessLifetime {
        ProcessLifetime::Turn
    }

    fn command(&self, spawn: &SpawnRequest<'_>) -> Result<CliCommand, StreamError> {
        self.write_settings().map_err(|e| StreamError::Connection {
            message: format!("could not write the Qwen Code settings file: {e}"),
        })?;
        let mut command = CliCommand::new(&self.process.binary)
            .args(self.args(spawn.resume_id, spawn.model))
            .env("QWEN_CODE_NO_RELAUNCH", "true")
            .env("QWEN_STREAM_IDLE_TIMEOUT_MS", "0");
        if let Some(home) = &self.qwen_home {
            // The CLI resolves a relative one from its working directory,
            // the workspace.
            let home = std::path::absolute(home).map_err(|e| StreamError::Connection {
                message: format!("Qwen Code's home {}: {e}", home.display()),
            })?;
            command = command.env("QWEN_HOME", home);
        }
        if let Some(url) = &self.base_url {
            command = command.env("OPENAI_BASE_URL", url);
        }
        command.env.extend(self.process.env.iter().cloned());
        Ok(command)
    }

    fn turn_input(&self, message: &str) -> std::io::Result<Vec<u8>> {
        Ok(message.as_bytes().to_vec())
    }

    fn parser(&self, spawn: &SpawnRequest<'_>) -> QwenParser {
        QwenParser::new(
            spawn.resume_id.map(str::to_owned),
            spawn.model.or(self.model.as_deref()).map(str::to_owned),
        )
    }

    fn settings(&self) -> ProcessSettings {
        self.process.settings.clone()
    }

    fn system_prompt(&self, _request: Option<&str>) -> Option<String> {
        None
    }

    fn default_model(&self) -> Option<&str> {
        self.model.as_deref()
    }

    fn context_window(&self, _model: Option<&str>) -> Option<u64> {
        Some(self.context_window)
    }

    fn fresh_start_note(&self) -> Option<String> {
        Some(QWEN_FRESH_START_NOTE.to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resumed_turn_is_openai_stream_json_with_its_own_home_and_no_stall_timeout() {
        let dir = tempfile::tempdir().expect("tempdir");
        let o = QwenOptions::default()
            .with_base_url("http://127.0.0.1:9/v1")
            .with_qwen_home(dir.path().join("q"));
        let spawn = SpawnRequest {
            resume_id: Some("0e4b1d5a-0000-4000-8000-000000000000"),
            model: Some("m"),
            system_prompt: None,
            workspace: None,
            message: Some("hi"),
        };
        let command = o.command(&spawn).expect("command");
        let args: Vec<String> = command
            .args
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            args,
            [
                "--auth-type",
                "openai",
                "--output-format",
                "stream-json",
                "-m",
                "m",
                "--resume",
                "0e4b1d5a-0000-4000-8000-000000000000"
            ]
        );
        for wanted in [
            ("QWEN_CODE_NO_RELAUNCH", "true"),
            ("QWEN_STREAM_IDLE_TIMEOUT_MS", "0"),
            ("OPENAI_BASE_URL", "http://127.0.0.1:9/v1"),
        ] {
            assert!(
                command
                    .env
                    .iter()
                    .any(|(k, v)| k == wanted.0 && v == wanted.1),
                "{wanted:?}"
            );
        }
        let written: Value = serde_json::from_slice(
            &std::fs::read(dir.path().join("q/settings.json")).expect("settings written"),
        )
        .expect("JSON");
        assert_eq!(written["memory"]["enableManagedAutoMemory"], json!(false));
        assert_eq!(
            written["model"]["generationConfig"],
            json!({"maxRetries": 0, "streamIdleTimeoutMs": 0})
        );
        assert_eq!(written["telemetry"]["enabled"], json!(false));
        assert_eq!(o.turn_input("hi").expect("input"), b"hi");
    }
}
