//! The Codex CLI (`@openai/codex`, measured with 0.169.0) on the
//! [`AgentCli`] trait: [`CodexOptions`] is the adapter, [`CodexSource`]
//! the source.
//!
//! # The process
//!
//! One process per turn ([`ProcessLifetime::Turn`]), executed directly
//! (never through a shell) in the turn's workspace, the prompt written to
//! its stdin (`-`: no length limit, not visible in `ps`), then stdin closed:
//!
//! ```text
//! codex exec [resume <thread_id>] --json --skip-git-repo-check
//!       -c sandbox_mode="<mode>" [-m <model>]
//!       [-c model_provider=warden -c model_providers.warden={…}]
//!       [-c analytics.enabled=false --disable plugins --disable remote_plugin --disable apps]
//!       [extra args…] -
//! ```
//!
//! **Sandbox and approvals.** `codex exec` never asks for approval (its
//! policy is `never`); what commands may do is the sandbox:
//! [`CodexSandbox::ReadOnly`] (the default), `WorkspaceWrite` or
//! `DangerFullAccess`, passed as `-c sandbox_mode=…` because
//! `exec resume` has no `-s`. `--dangerously-bypass-approvals-and-sandbox`
//! is never passed; add it with [`CodexOptions::with_arg`] inside a sandbox
//! of your own.
//!
//! **A local endpoint.** [`CodexOptions::with_base_url`] adds a model
//! provider `warden` (`wire_api = "responses"`, the key from the variable
//! [`CodexOptions::api_key_env`]), e.g. `warden mock`'s `/v1/responses`.
//!
//! # Lines, resume and errors
//!
//! | stdout line | frames |
//! | --- | --- |
//! | `thread.started` | `SessionStarted { thread_id }`; when resuming, another id is a *silent* resume failure → `UnknownSession` |
//! | `item.*` `agent_message` / `reasoning` | `TextDelta` / `ThinkingDelta` (only text not yet sent for that item) |
//! | `item.started` / `item.completed` of a tool item (`command_execution`, `file_change`, `mcp_tool_call`, `web_search`) | `ToolUseStarted` / `ToolUseFinished` |
//! | `error` "Reconnecting... n/m" | `ProviderRetry { attempt: n }` |
//! | `error` "ran out of room in the model's context window" | `ContextOverflow` (fresh-start path) |
//! | `turn.completed` | `Usage` of the last request and `TurnComplete { context_window }`, both from the session file (see below) |
//! | `turn.failed` | `Api` (retryable), `Unauthorized` for 401/403, `ContextOverflow` as above |
//!
//! A process that exits before `turn.completed` with stderr `no rollout
//! found for thread id`, `rollout at … is empty` or `does not start with
//! session metadata` failed to resume: `UnknownSession`. A resume id that
//! is not a UUID would start a new thread with exit 0, so it fails the turn
//! with `UnknownSession` before anything starts. Any other early exit is
//! `Connection` (no JSON line yet) or `Truncated`, both retryable.
//!
//! **Context.** `turn.completed.usage` is cumulative over the thread, so
//! the context in use is read from the session file
//! (`$CODEX_HOME/sessions/YYYY/MM/DD/rollout-…-<thread_id>.jsonl`,
//! `CODEX_HOME` defaulting to `$HOME/.codex`, both looked up in
//! [`CliProcess::env`] first): the last `token_count` event's
//! `last_token_usage` and `model_context_window`. Without that file the
//! turn reports no usage (never the cumulative sum).
//!
//! A request's `append_system_prompt` is not passed: Codex reads
//! `AGENTS.md`, which also survives a fresh start.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use derive_setters::Setters;
use warden_core::StreamError;

use crate::cli::{
    AgentCli, CliCommand, CliProcess, ProcessLifetime, ProcessSettings, SpawnRequest,
    cli_process_builders,
};
use crate::source::{CliSource, CliSourceFactory};

mod parse;
mod rollout;

pub use parse::CodexParser;

/// An [`EventSource`](warden_core::EventSource) running the Codex CLI, one
/// `codex exec` process per turn.
pub type CodexSource = CliSource<CodexOptions>;

/// A [`SourceFactory`](warden_core::SourceFactory) giving each session its
/// own [`CodexSource`].
pub type CodexSourceFactory = CliSourceFactory<CodexOptions>;

/// What survives a fresh start of a Codex thread.
pub const CODEX_FRESH_START_NOTE: &str = "Project context is preserved in AGENTS.md.";

/// Codex's sandbox for model-generated commands (`sandbox_mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum CodexSandbox {
    /// `read-only`: commands may read, not write. Codex's own default.
    #[default]
    ReadOnly,
    /// `workspace-write`: writes inside the workspace (and temp dirs).
    WorkspaceWrite,
    /// `danger-full-access`: no sandbox.
    DangerFullAccess,
}

impl CodexSandbox {
    /// The `sandbox_mode` value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ReadOnly => "read-only",
            Self::WorkspaceWrite => "workspace-write",
            Self::DangerFullAccess => "danger-full-access",
        }
    }
}

/// How [`CodexSource`] runs `codex`.
#[derive(Debug, Clone, PartialEq, Setters)]
#[setters(prefix = "with_", strip_option)]
#[non_exhaustive]
pub struct CodexOptions {
    /// The binary (default `codex`), its more arguments (before the
    /// prompt), environment and limits, shared by every adapter
    /// ([`CliProcess`]). `HOME` or `CODEX_HOME` in its environment are
    /// where the session files are looked for.
    #[setters(skip)]
    pub process: CliProcess,
    /// `-m`. Default `None` (Codex's default model).
    #[setters(into)]
    pub model: Option<String>,
    /// `sandbox_mode`. Default [`CodexSandbox::ReadOnly`].
    pub sandbox: CodexSandbox,
    /// A Responses API base URL (ending in `/v1`) for a model provider
    /// named `warden`. Default `None` (Codex's configured provider).
    #[setters(into)]
    pub base_url: Option<String>,
    /// The variable holding that provider's key. Default `OPENAI_API_KEY`.
    #[setters(into)]
    pub api_key_env: String,
    /// That provider's `stream_idle_timeout_ms` (Codex's own stall
    /// timeout, 300 s by default, retried 5 times). Default `None`.
    pub stream_idle_timeout_ms: Option<u64>,
    /// Turn off Codex's analytics and plugin/app fetches (it otherwise
    /// calls github.com and chatgpt.com). Default `true`.
    #[setters(skip)]
    pub quiet: bool,
}

impl Default for CodexOptions {
    fn default() -> Self {
        Self {
            process: CliProcess::new("codex"),
            model: None,
            sandbox: CodexSandbox::default(),
            base_url: None,
            api_key_env: "OPENAI_API_KEY".to_owned(),
            stream_idle_timeout_ms: None,
            quiet: true,
        }
    }
}

cli_process_builders!(CodexOptions);

impl CodexOptions {
    /// The arguments of one run (without the binary).
    pub fn args(&self, resume_id: Option<&str>, model: Option<&str>) -> Vec<OsString> {
        let mut args: Vec<OsString> = vec!["exec".into()];
        if let Some(id) = resume_id {
            args.extend(["resume".into(), id.into()]);
        }
        args.extend(["--json", "--skip-git-repo-check", "-c"].map(OsString::from));
        args.push(format!("sandbox_mode=\"{}\"", self.sandbox.as_str()).into());
        if let Some(model) = model {
            args.extend(["-m".into(), model.into()]);
        }
        if let Some(url) = &self.base_url {
            let idle = self
                .stream_idle_timeout_ms
                .map(|ms| format!(",stream_idle_timeout_ms={ms}"))
                .unwrap_or_default();
            args.extend(["-c".into(), "model_provider=warden".into(), "-c".into()]);
            args.push(
                format!(
                    "model_providers.warden={{name=\"warden\",base_url={},wire_api=\"responses\",env_key={}{idle}}}",
                    toml_string(url),
                    toml_string(&self.api_key_env)
                )
                .into(),
            );
        }
        if self.quiet {
            args.extend(
                [
                    "-c",
                    "analytics.enabled=false",
                    "--disable",
                    "plugins",
                    "--disable",
                    "remote_plugin",
                    "--disable",
                    "apps",
                ]
                .map(OsString::from),
            );
        }
        args.extend(self.process.extra_args.iter().cloned());
        args.push("-".into());
        args
    }

    /// Where Codex keeps its state: `CODEX_HOME`, else `$HOME/.codex`
    /// ([`env`](CliProcess::env) first, then this process's environment).
    pub fn codex_home(&self) -> Option<PathBuf> {
        let var = |name: &str| {
            self.process
                .env
                .iter()
                .rev()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
                .or_else(|| std::env::var_os(name))
                .filter(|v| !v.is_empty())
        };
        var("CODEX_HOME")
            .map(PathBuf::from)
            .or_else(|| var("HOME").map(|h| Path::new(&h).join(".codex")))
    }
}

/// `text` as a TOML basic string.
fn toml_string(text: &str) -> String {
    serde_json::Value::from(text).to_string()
}

impl AgentCli for CodexOptions {
    type Parser = CodexParser;

    fn name(&self) -> &str {
        "codex"
    }

    fn lifetime(&self) -> ProcessLifetime {
        ProcessLifetime::Turn
    }

    fn command(&self, spawn: &SpawnRequest<'_>) -> Result<CliCommand, StreamError> {
        let mut command =
            CliCommand::new(&self.process.binary).args(self.args(spawn.resume_id, spawn.model));
        command.env = self.process.env.clone();
        Ok(command)
    }

    fn turn_input(&self, message: &str) -> std::io::Result<Vec<u8>> {
        Ok(message.as_bytes().to_vec())
    }

    fn parser(&self, spawn: &SpawnRequest<'_>) -> CodexParser {
        CodexParser::new(
            spawn.resume_id.map(str::to_owned),
            spawn.model.map(str::to_owned),
            self.codex_home(),
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

    fn fresh_start_note(&self) -> Option<String> {
        Some(CODEX_FRESH_START_NOTE.to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(args: &[OsString]) -> Vec<String> {
        args.iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn a_fresh_turn_is_exec_json_with_the_sandbox_and_the_prompt_on_stdin() {
        let args = text(
            &CodexOptions::default()
                .with_arg("--x")
                .args(None, Some("m")),
        );
        assert_eq!(args[..3], ["exec", "--json", "--skip-git-repo-check"]);
        assert!(args.contains(&"sandbox_mode=\"read-only\"".to_owned()));
        assert!(args.windows(2).any(|w| w == ["-m", "m"]));
        assert_eq!(args[args.len() - 2..], ["--x", "-"]);
        assert!(!args.iter().any(|a| a.contains("bypass")));
    }

    #[test]
    fn a_resumed_turn_is_exec_resume_with_the_thread_id_and_the_provider() {
        let o = CodexOptions::default()
            .with_base_url("http://127.0.0.1:9/v1")
            .with_api_key_env("K")
            .with_stream_idle_timeout_ms(3000)
            .with_sandbox(CodexSandbox::WorkspaceWrite);
        let args = text(&o.args(Some("abc"), None));
        assert_eq!(args[..3], ["exec", "resume", "abc"]);
        assert!(args.contains(&"model_provider=warden".to_owned()));
        assert!(args.contains(
            &"model_providers.warden={name=\"warden\",base_url=\"http://127.0.0.1:9/v1\",wire_api=\"responses\",env_key=\"K\",stream_idle_timeout_ms=3000}"
                .to_owned()
        ));
        assert!(args.contains(&"sandbox_mode=\"workspace-write\"".to_owned()));
    }

    #[test]
    fn codex_home_prefers_codex_home_then_home_from_the_child_env() {
        let o = CodexOptions::default().with_env("HOME", "/h");
        assert_eq!(o.codex_home(), Some(PathBuf::from("/h/.codex")));
        let o = o.with_env("CODEX_HOME", "/c");
        assert_eq!(o.codex_home(), Some(PathBuf::from("/c")));
    }
}
