//! OpenCode (`opencode-ai`, measured with 1.18.33) and its fork Kilo Code
//! CLI (`@kilocode/cli`, 7.7.7) on the [`AgentCli`] trait: one adapter,
//! [`OpenCodeOptions`], whose [`OpenCodeFlavor`] says which of the two it
//! runs; [`OpenCodeSource`] is the source. Both print the same JSON lines
//! and take the same flags; they differ in names (binary, variables) and
//! in how they take faults (`docs/agents.md`).
//!
//! # The process
//!
//! One process per turn ([`ProcessLifetime::Turn`]), executed directly
//! (never through a shell) in the turn's workspace, the prompt written to
//! its stdin (no length limit, not in `ps`, a message starting with `-` is
//! no option), then stdin closed:
//!
//! ```text
//! opencode run --format json [-m <provider>/<model>] [--dir <workspace>] [-s <ses_id>] [extra args…]
//! ```
//!
//! (`kilo run …` for Kilo). `--dir` is always the workspace: OpenCode
//! resuming a session from another directory sends the request, prints
//! nothing and never exits.
//!
//! - **Configuration** comes in one variable, `OPENCODE_CONFIG_CONTENT`
//!   (`KILO_CONFIG_CONTENT`), merged over the user's own files
//!   ([`OpenCodeOptions::config_json`]): no auto-update, no sharing, no
//!   title agent (a new session's second model request, measured) and,
//!   with [`OpenCodeOptions::base_url`], a provider `warden`
//!   (`@ai-sdk/openai-compatible`, `baseURL`, the key from
//!   `{env:<api_key_env>}`) with the model, which `-m warden/<model>` picks.
//!   Its `chunkTimeout` is `false` (OpenCode; Kilo has no stall timeout
//!   and refuses `false`) unless [`OpenCodeOptions::chunk_timeout`] says
//!   otherwise: the CLI's own stall timeout (300 s, then the whole request
//!   re-sent, 6 attempts) never competes with warden's wire layer and
//!   watchdog, which decide.
//! - **Nothing phones home**: `*_DISABLE_AUTOUPDATE`,
//!   `*_DISABLE_MODELS_FETCH`, `*_DISABLE_LSP_DOWNLOAD`, for Kilo
//!   `KILO_TELEMETRY_LEVEL=off` and `KILO_DISABLE_CODEBASE_INDEXING`, and
//!   `npm_config_offline=true`: on every start the CLI npm-installs its
//!   plugin package into its config directory (a registry request; with
//!   the variable the install fails at once, in the background, and the
//!   turn goes on).
//! - **Approvals**: `run` asks for none and runs the model's tools (shell
//!   included) as its default permissions allow; warden passes no
//!   `--auto`, so nothing is wider than that default. There is no sandbox.
//!
//! # Lines, resume and errors
//!
//! Every line carries `sessionID`; a text part is printed once, whole.
//!
//! | stdout line | frames |
//! | --- | --- |
//! | the first line | `SessionStarted { sessionID }`; when resuming, another id is a *silent* resume failure → `UnknownSession` |
//! | `step_start` | liveness; a second one before a `step_finish` is the CLI's own retry of the request → `ProviderRetry` |
//! | `text` / `reasoning` | `TextDelta` / `ThinkingDelta` (the whole part) |
//! | `tool_use` (printed once the tool ran) | `ToolUseStarted` and `ToolUseFinished` |
//! | `step_finish` | `Usage` of the step's request (`part.tokens`: `input`, `cache.read`, `cache.write`, `output`); reason `tool-calls`: another step follows; `unknown` (the model stream ended without a finish reason; Kilo says `other`) → `Truncated`; any other reason ends the turn: `TurnComplete` |
//! | `error` | `ContextOverflowError` → `ContextOverflow`; an HTTP 401/403 → `Unauthorized`; another 4xx but 408/409/429 → `Api` (fatal); anything else → `Api` (retryable) |
//!
//! `Truncated` on `reason:"unknown"` (Kilo: `"other"`, which it also
//! gives a finish reason it does not know) is what keeps a cut stream from
//! reaching the user: OpenCode would ask the model to go on from the
//! partial text, again and again while the stream keeps being cut (357
//! requests in 180 s, measured); Kilo would end the turn with the partial
//! text as the reply (exit 0). warden's retry discards the text shown
//! ([`TurnEvent::discards_shown_text`](warden_core::TurnEvent::discards_shown_text))
//! and resumes the session.
//!
//! A process that exits before its last step with stderr `Session not
//! found` (exit 1) failed to resume: `UnknownSession`. A resume id that is
//! not `ses_` and letters or digits fails the turn with `UnknownSession`
//! before anything starts. Any other early exit is `Connection` (no JSON
//! line yet) or `Truncated`, both retryable.
//!
//! **Context.** Each `step_finish` carries its own request's tokens, so
//! the last one of a turn is the context in use; the window is
//! [`OpenCodeOptions::context_window`] (the CLI prints none).
//!
//! A request's `append_system_prompt` is not passed: OpenCode reads
//! `AGENTS.md`, which also survives a fresh start.

use std::ffi::OsString;
use std::time::Duration;

use derive_setters::Setters;
use serde_json::{Value, json};
use warden_core::StreamError;

use crate::cli::{
    AgentCli, CliCommand, CliProcess, ProcessLifetime, ProcessSettings, SpawnRequest,
    cli_process_builders,
};
use crate::source::{CliSource, CliSourceFactory};

mod parse;

pub use parse::OpenCodeParser;

/// An [`EventSource`](warden_core::EventSource) running OpenCode or Kilo
/// Code, one `run` process per turn.
pub type OpenCodeSource = CliSource<OpenCodeOptions>;

/// A [`SourceFactory`](warden_core::SourceFactory) giving each session its
/// own [`OpenCodeSource`].
pub type OpenCodeSourceFactory = CliSourceFactory<OpenCodeOptions>;

/// What survives a fresh start of an OpenCode or Kilo Code session.
pub const OPENCODE_FRESH_START_NOTE: &str = "Project context is preserved in AGENTS.md.";

/// The provider warden adds when it names the endpoint
/// ([`OpenCodeOptions::base_url`]).
pub const OPENCODE_PROVIDER: &str = "warden";

/// The model of that provider when none is given.
pub const OPENCODE_DEFAULT_MODEL: &str = "gpt-4.1";

/// The context window reported when none is given: the CLI prints none.
pub const OPENCODE_CONTEXT_WINDOW: u64 = 128_000;

/// Which CLI of the OpenCode family runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum OpenCodeFlavor {
    /// OpenCode (`opencode`, variables `OPENCODE_*`).
    #[default]
    OpenCode,
    /// Kilo Code CLI (`kilo`, variables `KILO_*`), an OpenCode fork.
    Kilo,
}

impl OpenCodeFlavor {
    /// The name in logs and [`EventSource::provider`](warden_core::EventSource::provider).
    pub fn name(self) -> &'static str {
        match self {
            Self::OpenCode => "opencode",
            Self::Kilo => "kilo-code",
        }
    }

    /// The binary on `PATH`.
    pub fn binary(self) -> &'static str {
        match self {
            Self::OpenCode => "opencode",
            Self::Kilo => "kilo",
        }
    }

    /// The prefix of its variables.
    fn prefix(self) -> &'static str {
        match self {
            Self::OpenCode => "OPENCODE",
            Self::Kilo => "KILO",
        }
    }

    /// The `step_finish` reasons of a model stream that ended without a
    /// finish reason (`unknown`; Kilo says `other`).
    fn cut_reasons(self) -> &'static [&'static str] {
        match self {
            Self::OpenCode => &parse::CUT_STREAM,
            Self::Kilo => &parse::KILO_CUT_STREAM,
        }
    }

    /// The variables that keep it from phoning home and updating.
    fn quiet_env(self) -> Vec<(String, &'static str)> {
        let p = self.prefix();
        let mut env = vec![
            (format!("{p}_DISABLE_AUTOUPDATE"), "1"),
            (format!("{p}_DISABLE_MODELS_FETCH"), "1"),
            (format!("{p}_DISABLE_LSP_DOWNLOAD"), "1"),
            ("npm_config_offline".to_owned(), "true"),
        ];
        if self == Self::Kilo {
            env.push(("KILO_TELEMETRY_LEVEL".to_owned(), "off"));
            env.push(("KILO_DISABLE_CODEBASE_INDEXING".to_owned(), "1"));
        }
        env
    }
}

/// How [`OpenCodeSource`] runs OpenCode or Kilo Code: `run --format json
/// [-m …] --dir <workspace> [-s <id>]`, the prompt on stdin, one process
/// per turn, never through a shell. `docs/agents.md` has how each takes
/// faults.
#[derive(Debug, Clone, PartialEq, Setters)]
#[setters(prefix = "with_", strip_option)]
#[non_exhaustive]
pub struct OpenCodeOptions {
    /// Which CLI. Default [`OpenCodeFlavor::OpenCode`].
    #[setters(skip)]
    pub flavor: OpenCodeFlavor,
    /// The binary (default the flavor's: `opencode`, `kilo`), its more arguments (after warden's), environment and
    /// limits, shared by every adapter ([`CliProcess`]).
    #[setters(skip)]
    pub process: CliProcess,
    /// The model: with [`base_url`](Self::base_url) a model of the
    /// `warden` provider (default [`OPENCODE_DEFAULT_MODEL`]), else
    /// `provider/model` as the CLI takes it (default: the CLI's).
    #[setters(into)]
    pub model: Option<String>,
    /// An OpenAI chat-completions base URL (ending in `/v1`: the CLI posts
    /// to `{base_url}/chat/completions`) for a provider `warden`. Default
    /// `None`: the user's own providers.
    #[setters(into)]
    pub base_url: Option<String>,
    /// The variable holding that provider's API key. Default
    /// `OPENAI_API_KEY` (unset: no key, as a local server needs none).
    #[setters(into)]
    pub api_key_env: String,
    /// The provider's `chunkTimeout`. Default `None`: no stall timeout of
    /// the CLI's own (warden's layers decide): `false` for OpenCode, none
    /// for Kilo (which has none and refuses `false`).
    pub chunk_timeout: Option<Duration>,
    /// The context window reported. Default [`OPENCODE_CONTEXT_WINDOW`].
    pub context_window: u64,
}

impl Default for OpenCodeOptions {
    fn default() -> Self {
        Self::new(OpenCodeFlavor::default())
    }
}

cli_process_builders!(OpenCodeOptions);

impl OpenCodeOptions {
    /// The defaults for `flavor`.
    pub fn new(flavor: OpenCodeFlavor) -> Self {
        Self {
            flavor,
            process: CliProcess::new(flavor.binary()),
            model: None,
            base_url: None,
            api_key_env: "OPENAI_API_KEY".to_owned(),
            chunk_timeout: None,
            context_window: OPENCODE_CONTEXT_WINDOW,
        }
    }

    /// The defaults for Kilo Code.
    pub fn kilo() -> Self {
        Self::new(OpenCodeFlavor::Kilo)
    }

    /// The `-m` value for a turn asking for `model`, if any.
    fn model_arg(&self, model: Option<&str>) -> Option<String> {
        let model = model.or(self.model.as_deref());
        match &self.base_url {
            Some(_) => Some(format!(
                "{OPENCODE_PROVIDER}/{}",
                model.unwrap_or(OPENCODE_DEFAULT_MODEL)
            )),
            None => model.map(str::to_owned),
        }
    }

    /// The arguments of one run (without the binary).
    pub fn args(
        &self,
        resume_id: Option<&str>,
        model: Option<&str>,
        workspace: Option<&std::path::Path>,
    ) -> Vec<OsString> {
        let mut args: Vec<OsString> = ["run", "--format", "json"].map(OsString::from).into();
        if let Some(model) = self.model_arg(model) {
            args.extend(["-m".into(), model.into()]);
        }
        if let Some(dir) = workspace {
            args.extend(["--dir".into(), dir.into()]);
        }
        if let Some(id) = resume_id {
            args.extend(["-s".into(), id.into()]);
        }
        args.extend(self.process.extra_args.iter().cloned());
        args
    }

    /// The configuration passed in `OPENCODE_CONFIG_CONTENT`
    /// (`KILO_CONFIG_CONTENT`) for a turn asking for `model`.
    pub fn config_json(&self, model: Option<&str>) -> Value {
        // No title request: one model request per step, and no title
        // anyone reads in a headless run.
        let mut config = json!({
            "autoupdate": false,
            "share": "disabled",
            "agent": {"title": {"disable": true}},
        });
        if let Some(url) = &self.base_url {
            let model = model
                .or(self.model.as_deref())
                .unwrap_or(OPENCODE_DEFAULT_MODEL);
            let mut options = json!({
                "baseURL": url,
                "apiKey": format!("{{env:{}}}", self.api_key_env),
            });
            match (self.chunk_timeout, self.flavor) {
                (Some(t), _) => options["chunkTimeout"] = json!(t.as_millis().max(1)),
                (None, OpenCodeFlavor::OpenCode) => options["chunkTimeout"] = json!(false),
                // Kilo has no stall timeout by default, and refuses `false`
                // (its whole configuration is then skipped).
                (None, _) => {}
            }
            config["provider"] = json!({
                OPENCODE_PROVIDER: {
                    "npm": "@ai-sdk/openai-compatible",
                    "name": OPENCODE_PROVIDER,
                    "options": options,
                    "models": {model: {"name": model}},
                }
            });
        }
        config
    }
}

impl AgentCli for OpenCodeOptions {
    type Parser = OpenCodeParser;

    fn name(&self) -> &str {
        self.flavor.name()
    }

    fn lifetime(&self) -> ProcessLifetime {
        ProcessLifetime::Turn
    }

    fn command(&self, spawn: &SpawnRequest<'_>) -> Result<CliCommand, StreamError> {
        let mut command = CliCommand::new(&self.process.binary)
            .args(self.args(spawn.resume_id, spawn.model, spawn.workspace))
            .env(
                format!("{}_CONFIG_CONTENT", self.flavor.prefix()),
                self.config_json(spawn.model).to_string(),
            );
        for (key, value) in self.flavor.quiet_env() {
            command = command.env(key, value);
        }
        command.env.extend(self.process.env.iter().cloned());
        Ok(command)
    }

    fn turn_input(&self, message: &str) -> std::io::Result<Vec<u8>> {
        Ok(message.as_bytes().to_vec())
    }

    fn parser(&self, spawn: &SpawnRequest<'_>) -> OpenCodeParser {
        OpenCodeParser::new(
            self.flavor.name(),
            self.flavor.cut_reasons(),
            spawn.resume_id.map(str::to_owned),
            self.model_arg(spawn.model),
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
        Some(OPENCODE_FRESH_START_NOTE.to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn text(args: &[OsString]) -> Vec<String> {
        args.iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn a_resumed_turn_is_run_json_in_its_directory_with_the_session_and_no_auto() {
        let o = OpenCodeOptions::default().with_base_url("http://127.0.0.1:9/v1");
        let args = text(&o.args(Some("ses_abc"), Some("m"), Some(std::path::Path::new("/w"))));
        assert_eq!(
            args,
            [
                "run", "--format", "json", "-m", "warden/m", "--dir", "/w", "-s", "ses_abc"
            ]
        );
        let config = o.config_json(Some("m"));
        assert_eq!(
            config["provider"]["warden"]["options"],
            json!({"baseURL": "http://127.0.0.1:9/v1", "apiKey": "{env:OPENAI_API_KEY}", "chunkTimeout": false})
        );
        assert_eq!(
            config["provider"]["warden"]["models"],
            json!({"m": {"name": "m"}})
        );
        assert_eq!(config["autoupdate"], json!(false));
    }

    #[test]
    fn without_a_base_url_the_users_providers_and_model_are_used() {
        let o = OpenCodeOptions::default();
        assert_eq!(text(&o.args(None, None, None)), ["run", "--format", "json"]);
        assert_eq!(o.config_json(None).get("provider"), None);
        assert_eq!(
            text(&o.args(None, Some("anthropic/claude"), None))[3..],
            ["-m", "anthropic/claude"]
        );
    }

    #[test]
    fn kilo_is_the_same_command_with_its_own_names_and_telemetry_off() {
        let o = OpenCodeOptions::kilo();
        assert_eq!(o.process.binary, PathBuf::from("kilo"));
        let spawn = SpawnRequest {
            resume_id: None,
            model: None,
            system_prompt: None,
            workspace: None,
            message: Some("hi"),
        };
        let command = o.command(&spawn).expect("command");
        let env: Vec<(String, String)> = command
            .env
            .iter()
            .map(|(k, v)| {
                (
                    k.to_string_lossy().into_owned(),
                    v.to_string_lossy().into_owned(),
                )
            })
            .collect();
        for wanted in [
            ("KILO_TELEMETRY_LEVEL", "off"),
            ("KILO_DISABLE_AUTOUPDATE", "1"),
            ("npm_config_offline", "true"),
        ] {
            assert!(
                env.iter().any(|(k, v)| k == wanted.0 && v == wanted.1),
                "{wanted:?} in {env:?}"
            );
        }
        assert!(env.iter().any(|(k, _)| k == "KILO_CONFIG_CONTENT"));
        let config = o.with_base_url("http://h:1/v1").config_json(None);
        assert_eq!(
            config["provider"]["warden"]["options"].get("chunkTimeout"),
            None,
            "Kilo skips a whole configuration with chunkTimeout false"
        );
    }
}
