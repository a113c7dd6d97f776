//! The Gemini CLI (`@google/gemini-cli`, measured with 0.61.0) on the
//! [`AgentCli`] trait: [`GeminiOptions`] is the adapter, [`GeminiSource`]
//! the source.
//!
//! # The process
//!
//! One process per turn ([`ProcessLifetime::Turn`]), executed directly
//! (never through a shell) in the turn's workspace, the prompt as one
//! argument (`--prompt=<message>`, so a message starting with `-` is not an
//! option), stdin closed at once (nothing is written: as `/dev/null`):
//!
//! ```text
//! GEMINI_CLI_NO_RELAUNCH=true [GEMINI_CLI_HOME=<dir>] [GOOGLE_GEMINI_BASE_URL=<url>]
//! gemini --output-format stream-json --skip-trust -m <model>
//!        [--approval-mode <mode>] [--resume <uuid>] [extra args…] --prompt=<message>
//! ```
//!
//! - `GEMINI_CLI_NO_RELAUNCH=true`, always: otherwise the CLI re-launches
//!   itself as a child and its top-level process ignores `SIGTERM`
//!   without forwarding it. warden signals the whole process group
//!   anyway; with this the CLI is one process that exits at once.
//! - `--skip-trust`: headless, an untrusted folder is exit 55.
//! - `-m`, always ([`GeminiOptions::model`], default
//!   [`GEMINI_DEFAULT_MODEL`]): the default `auto` first asks a routing
//!   model for a JSON classification.
//! - **Its own home.** With [`GeminiOptions::gemini_home`] the child gets
//!   `GEMINI_CLI_HOME=<dir>` (the CLI then keeps settings and sessions in
//!   `<dir>/.gemini`, not `~/.gemini`; `HOME` is left alone for the tools
//!   it runs), and before each start warden merges into
//!   `<dir>/.gemini/settings.json` ([`GeminiOptions::settings_json`]): API
//!   key auth (`security.auth.selectedType = "gemini-api-key"`, without
//!   which `GOOGLE_GEMINI_BASE_URL` is exit 41), no usage statistics, and
//!   `general.maxAttempts` ([`GeminiOptions::max_attempts`], default 1:
//!   see *Retries* below). The key comes from the child's environment
//!   (`GEMINI_API_KEY`).
//! - **Approvals.** Headless, tools that need approval are not offered to
//!   the model unless [`GeminiOptions::approval`] says otherwise
//!   ([`GeminiApproval::AutoEdit`], [`GeminiApproval::Yolo`]).
//! - A message over [`GEMINI_MAX_PROMPT_BYTES`] (Linux's limit on one argument)
//!   fails the turn before anything starts (`Api`, not retryable).
//!
//! # Lines, resume and errors
//!
//! | stdout line | frames |
//! | --- | --- |
//! | `init` | when resuming, `SessionStarted { session_id }`; another id than the one resumed is a *silent* resume failure → `UnknownSession`. A fresh conversation's id is announced only with a successful `result`: a first turn that fails leaves no session Gemini can resume |
//! | `message` `assistant` (`delta`) | `TextDelta` |
//! | `tool_use` / `tool_result` | `ToolUseStarted` / `ToolUseFinished` |
//! | `error` | liveness; its message explains a following `result` error |
//! | `result` `success` | `Usage` of the last request (from the session file, see below) and `TurnComplete { duration }` |
//! | `result` `error` | "The input token count … exceeds …" → `ContextOverflow`; an HTTP 401/403 → `Unauthorized`; another 4xx but 408/409/429 → `Api` (fatal); anything else (a stream cut, 5xx, 429) → `Api` (retryable) |
//!
//! A process that exits before its `result` line with stderr `Error
//! resuming session` / `Invalid session identifier` / `No previous
//! sessions found for this project.` (exit 42) failed to resume:
//! `UnknownSession`. Exit 41 (auth) is `Unauthorized`. Any other early
//! exit is `Connection` (no JSON line yet) or `Truncated`, both retryable:
//! a `SIGTERM`ed Gemini exits **0** with no `result` line, so the exit
//! code never makes a turn a success — only `result.status:"success"`
//! does. A resume id that is not a UUID would be read as `latest` or a
//! list index, so it fails the turn with `UnknownSession` before anything
//! starts.
//!
//! **Retries.** Gemini retries a broken stream on its own and re-sends the
//! partial text as new deltas with no marker on stdout (the CLI drops its
//! internal retry event in stream-json mode), so no parser can tell a
//! retry's text from new text. warden therefore turns Gemini's retries
//! off (`general.maxAttempts = 1`): a cut stream ends the process with
//! `result.status:"error"`, and warden's own retry — which discards the
//! text shown so far ([`TurnEvent::discards_shown_text`](warden_core::TurnEvent::discards_shown_text))
//! — answers again. The relayed reply is then the reply exactly once.
//!
//! **Context.** `result.stats` sums every request of the turn, so the
//! context in use is read from the session file
//! (`<gemini dir>/tmp/<project>/chats/session-<time>-<id8>.jsonl`, the
//! newest one holding the id; `<gemini dir>` is `$GEMINI_CLI_HOME/.gemini`,
//! else `$HOME/.gemini`, looked up in [`CliProcess::env`] first): the
//! last `"type":"gemini"` record's `tokens.input` (with `tokens.cached`
//! as the cached part). The window is [`GEMINI_CONTEXT_WINDOW`] (the CLI's
//! own `tokenLimit()`; it prints none).
//!
//! A request's `append_system_prompt` is not passed: Gemini reads
//! `GEMINI.md`, which also survives a fresh start.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use derive_setters::Setters;
use serde_json::{Value, json};
use warden_core::StreamError;

use crate::cli::{
    AgentCli, CliCommand, CliProcess, ProcessLifetime, ProcessSettings, SpawnRequest,
    TranscriptInfo, cli_process_builders,
};
use crate::source::{CliSource, CliSourceFactory};

mod parse;
mod session_file;

pub use parse::GeminiParser;

/// An [`EventSource`](warden_core::EventSource) running the Gemini CLI,
/// one `gemini` process per turn.
pub type GeminiSource = CliSource<GeminiOptions>;

/// A [`SourceFactory`](warden_core::SourceFactory) giving each session its
/// own [`GeminiSource`].
pub type GeminiSourceFactory = CliSourceFactory<GeminiOptions>;

/// What survives a fresh start of a Gemini conversation.
pub const GEMINI_FRESH_START_NOTE: &str = "Project context is preserved in GEMINI.md.";

/// The context window of Gemini's models (the CLI's `tokenLimit()`).
pub const GEMINI_CONTEXT_WINDOW: u64 = 1_048_576;

/// The model when none is given: `-m` is always passed.
pub const GEMINI_DEFAULT_MODEL: &str = "gemini-2.5-pro";

/// The longest message passed as `--prompt=<message>`: Linux limits one
/// argument to 128 KiB (`MAX_ARG_STRLEN`, with the option and its NUL).
pub const GEMINI_MAX_PROMPT_BYTES: usize = 128 * 1024 - 16;

/// Gemini's `--approval-mode` for tools.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum GeminiApproval {
    /// No flag: Gemini's default (headless, tools that need approval are
    /// not offered).
    #[default]
    Default,
    /// `auto_edit`: file edits are approved.
    AutoEdit,
    /// `yolo`: everything is approved (shell tools included).
    Yolo,
}

impl GeminiApproval {
    /// The `--approval-mode` value, `None` for the default.
    pub fn as_arg(self) -> Option<&'static str> {
        match self {
            Self::Default => None,
            Self::AutoEdit => Some("auto_edit"),
            Self::Yolo => Some("yolo"),
        }
    }
}

/// How [`GeminiSource`] runs `gemini`: `gemini --output-format
/// stream-json --skip-trust -m <model> [--approval-mode …] [--resume
/// <uuid>] --prompt=<message>` with `GEMINI_CLI_NO_RELAUNCH=true`, one
/// process per turn, never through a shell. `docs/agents.md` has how
/// Gemini takes each fault.
#[derive(Debug, Clone, PartialEq, Setters)]
#[setters(prefix = "with_", strip_option)]
#[non_exhaustive]
pub struct GeminiOptions {
    /// The binary (default `gemini`), its more arguments (before the prompt), environment and
    /// limits, shared by every adapter ([`CliProcess`]).
    #[setters(skip)]
    pub process: CliProcess,
    /// `-m`, when the turn names no model. Default [`GEMINI_DEFAULT_MODEL`].
    #[setters(into)]
    pub model: String,
    /// `GOOGLE_GEMINI_BASE_URL` (e.g. `warden mock`'s URL). Default `None`.
    #[setters(into)]
    pub base_url: Option<String>,
    /// `GEMINI_CLI_HOME` for the child, where warden writes the settings
    /// file ([`write_settings`](Self::write_settings)) and Gemini keeps its
    /// sessions. Default `None`: the child's own `~/.gemini`, untouched
    /// (it must then select API-key auth itself).
    #[setters(into)]
    pub gemini_home: Option<PathBuf>,
    /// `--approval-mode`. Default [`GeminiApproval::Default`].
    pub approval: GeminiApproval,
    /// `general.maxAttempts` in the settings file. Default 1: Gemini's own
    /// retries re-send partial text with no marker on stdout, so warden
    /// retries instead and discards the text shown (`docs/agents.md`).
    #[setters(skip)]
    pub max_attempts: u32,
}

impl Default for GeminiOptions {
    fn default() -> Self {
        Self {
            process: CliProcess::new("gemini"),
            model: GEMINI_DEFAULT_MODEL.to_owned(),
            base_url: None,
            gemini_home: None,
            approval: GeminiApproval::default(),
            max_attempts: 1,
        }
    }
}

cli_process_builders!(GeminiOptions);

impl GeminiOptions {
    /// Sets [`max_attempts`](Self::max_attempts), raising a 0 to 1 (a
    /// check, so written out rather than derived).
    pub fn with_max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = attempts.max(1);
        self
    }
    /// The arguments of one run (without the binary).
    pub fn args(
        &self,
        resume_id: Option<&str>,
        model: Option<&str>,
        message: &str,
    ) -> Vec<OsString> {
        let mut args: Vec<OsString> = ["--output-format", "stream-json", "--skip-trust", "-m"]
            .map(OsString::from)
            .into();
        args.push(model.unwrap_or(&self.model).into());
        if let Some(mode) = self.approval.as_arg() {
            args.extend(["--approval-mode".into(), mode.into()]);
        }
        if let Some(id) = resume_id {
            args.extend(["--resume".into(), id.into()]);
        }
        args.extend(self.process.extra_args.iter().cloned());
        args.push(format!("--prompt={message}").into());
        args
    }

    /// The settings warden needs, merged into `settings.json`.
    pub fn settings_json(&self) -> Value {
        json!({
            "security": {"auth": {"selectedType": "gemini-api-key"}},
            "privacy": {"usageStatisticsEnabled": false},
            "general": {"maxAttempts": self.max_attempts}
        })
    }

    /// Merges [`settings_json`](Self::settings_json) into
    /// `<gemini_home>/.gemini/settings.json` (other keys kept), writing
    /// only when something changes. Nothing without a
    /// [`gemini_home`](Self::gemini_home).
    pub fn write_settings(&self) -> std::io::Result<()> {
        let Some(home) = &self.gemini_home else {
            return Ok(());
        };
        merge_settings_file(&home.join(".gemini"), &self.settings_json())
    }

    /// Where Gemini keeps its state: `$GEMINI_CLI_HOME/.gemini`, else
    /// `$HOME/.gemini` ([`gemini_home`](Self::gemini_home) and
    /// [`env`](CliProcess::env) first, then this process's environment).
    pub fn gemini_dir(&self) -> Option<PathBuf> {
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
        self.gemini_home
            .clone()
            .or_else(|| var("GEMINI_CLI_HOME").map(PathBuf::from))
            .or_else(|| var("HOME").map(PathBuf::from))
            .map(|h| h.join(".gemini"))
    }
}

/// Merges `patch` into `<dir>/settings.json` (other keys kept), writing
/// only when something changes (through a temporary file renamed over
/// it): the settings file of Gemini CLI and of its fork Qwen Code.
pub(crate) fn merge_settings_file(dir: &Path, patch: &Value) -> std::io::Result<()> {
    let path = dir.join("settings.json");
    let old = std::fs::read(&path)
        .ok()
        .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
        .filter(Value::is_object);
    let mut merged = old.clone().unwrap_or_else(|| json!({}));
    merge(&mut merged, patch);
    if old.as_ref() == Some(&merged) {
        return Ok(());
    }
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join("settings.json.warden-tmp");
    std::fs::write(&tmp, serde_json::to_vec_pretty(&merged)?)?;
    std::fs::rename(&tmp, &path)
}

/// Sets every leaf of `patch` in `target`, keeping the rest.
fn merge(target: &mut Value, patch: &Value) {
    match (target, patch) {
        (Value::Object(t), Value::Object(p)) => {
            for (k, v) in p {
                let slot = t.entry(k.clone()).or_insert(Value::Null);
                if v.is_object() && slot.is_object() {
                    merge(slot, v);
                } else {
                    *slot = v.clone();
                }
            }
        }
        (t, p) => *t = p.clone(),
    }
}

impl AgentCli for GeminiOptions {
    type Parser = GeminiParser;

    fn name(&self) -> &str {
        "gemini"
    }

    fn lifetime(&self) -> ProcessLifetime {
        ProcessLifetime::Turn
    }

    fn command(&self, spawn: &SpawnRequest<'_>) -> Result<CliCommand, StreamError> {
        let message = spawn.message.unwrap_or_default();
        if message.len() > GEMINI_MAX_PROMPT_BYTES {
            return Err(StreamError::Api {
                status: None,
                kind: "message_too_long".to_owned(),
                message: format!(
                    "a Gemini CLI prompt is one argument of at most {GEMINI_MAX_PROMPT_BYTES} bytes; this message has {}",
                    message.len()
                ),
                retryable: false,
                retry_after: None,
            });
        }
        self.write_settings().map_err(|e| StreamError::Connection {
            message: format!("could not write the Gemini CLI settings file: {e}"),
        })?;
        let mut command = CliCommand::new(&self.process.binary)
            .args(self.args(spawn.resume_id, spawn.model, message))
            .env("GEMINI_CLI_NO_RELAUNCH", "true");
        if let Some(home) = &self.gemini_home {
            command = command.env("GEMINI_CLI_HOME", home);
        }
        if let Some(url) = &self.base_url {
            command = command.env("GOOGLE_GEMINI_BASE_URL", url);
        }
        command.env.extend(self.process.env.iter().cloned());
        Ok(command)
    }

    fn turn_input(&self, _message: &str) -> std::io::Result<Vec<u8>> {
        // The prompt is an argument; stdin is closed at once.
        Ok(Vec::new())
    }

    fn parser(&self, spawn: &SpawnRequest<'_>) -> GeminiParser {
        GeminiParser::new(
            spawn.resume_id.map(str::to_owned),
            Some(spawn.model.unwrap_or(&self.model).to_owned()),
            self.gemini_dir(),
        )
    }

    fn settings(&self) -> ProcessSettings {
        self.process.settings.clone()
    }

    fn system_prompt(&self, _request: Option<&str>) -> Option<String> {
        None
    }

    fn default_model(&self) -> Option<&str> {
        Some(&self.model)
    }

    fn context_window(&self, _model: Option<&str>) -> Option<u64> {
        Some(GEMINI_CONTEXT_WINDOW)
    }

    fn fresh_start_note(&self) -> Option<String> {
        Some(GEMINI_FRESH_START_NOTE.to_owned())
    }

    fn transcript(&self, session_id: &str, _workspace: Option<&Path>) -> TranscriptInfo {
        let path = self
            .gemini_dir()
            .and_then(|dir| session_file::find(&dir, session_id));
        let bytes = path
            .as_ref()
            .and_then(|p| std::fs::metadata(p).ok())
            .map(|m| m.len());
        TranscriptInfo::new(path, bytes)
    }
}

#[cfg(test)]
#[path = "gemini/options_tests.rs"]
mod tests;
