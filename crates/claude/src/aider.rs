//! Aider (`aider-chat`, measured with 0.86.2, Python, speaking OpenAI chat
//! completions through litellm) on the [`AgentCli`] trait:
//! [`AiderOptions`] is the adapter, [`AiderSource`] the source.
//!
//! # The process
//!
//! One process per turn ([`ProcessLifetime::Turn`]), executed directly
//! (never through a shell) in the turn's workspace, stdin closed at once:
//!
//! ```text
//! [OPENAI_API_BASE=<url>] COLUMNS=10000 aider --message-file <dir>/<id>.message
//!     --no-pretty --no-check-update --analytics-disable
//!     --no-show-model-warnings --no-show-release-notes
//!     --chat-history-file <dir>/<id>.md --input-history-file <dir>/<id>.input
//!     --restore-chat-history --timeout 86400
//!     [--model-metadata-file <dir>/<id>.models.json] [--model openai/<model>]
//!     [--yes-always] [extra args…]
//! ```
//!
//! - **The conversation.** Aider has no session id: it keeps a
//!   conversation as a Markdown file and sends it all back with
//!   `--restore-chat-history`. warden names each conversation
//!   (`aider-<time>-<n>`, [`is_aider_id`]) and keeps its file under
//!   [`AiderOptions::history_dir`] (`DATA_DIR/aider`), never in the
//!   workspace; a resume restores that file. A file that is gone is a
//!   resume failure (`UnknownSession`, before anything starts): Aider
//!   itself would start afresh, exit 0, and never say so.
//! - **The prompt** goes in a file (`--message-file`, mode 0600 next to
//!   the history, removed by the next run), not in `ps`.
//! - **Its own knobs off.** `--no-check-update` (a PyPI request),
//!   `--analytics-disable`; the price-map download Aider tries on every
//!   start (`raw.githubusercontent.com`, a line on stdout and a DNS
//!   timeout where DNS hangs) is skipped by naming the model in a
//!   `--model-metadata-file` warden writes (its window then comes from
//!   there). `--timeout 86400`: its read timeout (600 s by default) would
//!   end a stall with the half reply printed as the answer, exit 0; the
//!   process layer's watchdog and the wire layer decide instead.
//! - **Approvals.** `--yes-always` only with
//!   [`AiderOptions::yes_always`]; otherwise its headless default (which
//!   takes each question's default answer).
//!
//! # Lines and errors
//!
//! Plain text ([`AiderParser`]): the banner up to its `Repo-map:` line,
//! then the reply line by line, then `Tokens: N sent, M received.`, which
//! ends the turn (`Usage` of N input tokens: the context indicator).
//! Aider exits 0 on every fault, so the text is all there is: a
//! `litellm.<Kind>Error:` anywhere in a line fails the turn at once (its
//! own retries would print the partial text again), by kind: a context
//! overflow → `ContextOverflow`, `AuthenticationError` → `Unauthorized`,
//! `BadRequestError` and the like → `Api` (fatal), the rest (a cut, a
//! timeout, 5xx, 429) → `Api` (retryable); `Retrying in …` → `Truncated`.
//! A run that ends without its `Tokens:` line is `Truncated` (text seen)
//! or `Connection`. What it cannot tell: a stream the server ended
//! cleanly but early, without a finish reason, prints as a whole reply;
//! under the wire layer the wire continues such a stream first.
//!
//! A request's `append_system_prompt` is not passed: Aider reads its
//! conventions from `CONVENTIONS.md` only when told (`--read`).

use std::cell::RefCell;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use derive_setters::Setters;
use serde_json::json;
use warden_core::StreamError;

use crate::cli::{
    AgentCli, CliCommand, CliProcess, ProcessLifetime, ProcessSettings, SpawnRequest,
    TranscriptInfo, cli_process_builders,
};
use crate::source::{CliSource, CliSourceFactory};

mod parse;

pub use parse::AiderParser;

/// An [`EventSource`](warden_core::EventSource) running Aider, one `aider`
/// process per turn.
pub type AiderSource = CliSource<AiderOptions>;

/// A [`SourceFactory`](warden_core::SourceFactory) giving each session its
/// own [`AiderSource`].
pub type AiderSourceFactory = CliSourceFactory<AiderOptions>;

/// The context window reported when none is given: Aider prints none.
pub const AIDER_CONTEXT_WINDOW: u64 = 131_072;

/// What survives a fresh start of an Aider conversation.
pub const AIDER_FRESH_START_NOTE: &str =
    "The workspace's files (and Aider's git commits) are kept; the chat history is not.";

/// The read timeout passed to Aider (`--timeout`, seconds): long enough
/// that warden's layers, not Aider, end a stalled request.
pub const AIDER_TIMEOUT_SECS: u64 = 86_400;

/// The prefix of the conversation names warden gives Aider's chats.
const ID_PREFIX: &str = "aider-";

thread_local! {
    /// The name a fresh conversation got in [`AiderOptions::command`],
    /// for the parser made right after it on the same thread
    /// ([`AiderOptions::parser`]; both are called in one synchronous
    /// step of a process's start).
    static FRESH_ID: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Whether `id` names one of warden's Aider conversations: `aider-`
/// followed by ASCII letters, digits and `-` (a file name, never a path).
pub fn is_aider_id(id: &str) -> bool {
    id.strip_prefix(ID_PREFIX).is_some_and(|rest| {
        (1..=64).contains(&rest.len())
            && rest.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
    })
}

/// A new conversation name, unique in this process and across restarts.
fn new_id() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!(
        "{ID_PREFIX}{nanos:x}-{:x}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// How [`AiderSource`] runs Aider: `aider --message-file … --no-pretty
/// --chat-history-file … --restore-chat-history …`, one process per turn,
/// never through a shell. `docs/agents.md` has how it takes faults.
#[derive(Debug, Clone, PartialEq, Setters)]
#[setters(prefix = "with_", strip_option)]
#[non_exhaustive]
pub struct AiderOptions {
    /// The binary (default `aider`), its more arguments (after warden's), environment and
    /// limits, shared by every adapter ([`CliProcess`]).
    #[setters(skip)]
    pub process: CliProcess,
    /// `--model`, when the turn names no model (`openai/` is put before a
    /// name without a provider when [`base_url`](Self::base_url) is set).
    /// Default `None`: Aider's.
    #[setters(into)]
    pub model: Option<String>,
    /// `OPENAI_API_BASE`: an OpenAI chat-completions base URL (ending in
    /// `/v1`). Default `None`: the child's own.
    #[setters(into)]
    pub base_url: Option<String>,
    /// Where the conversations' chat-history files (and each run's
    /// message file) are kept. Default `aider` (relative to warden's
    /// working directory; `warden chat|serve` use `DATA_DIR/aider`).
    #[setters(into)]
    pub history_dir: PathBuf,
    /// `--yes-always`: answer every question Aider asks yes. Default
    /// `false`: its headless default.
    pub yes_always: bool,
    /// The context window reported (and written in the model metadata).
    /// Default [`AIDER_CONTEXT_WINDOW`].
    pub context_window: u64,
}

impl Default for AiderOptions {
    fn default() -> Self {
        Self {
            process: CliProcess::new("aider"),
            model: None,
            base_url: None,
            history_dir: PathBuf::from("aider"),
            yes_always: false,
            context_window: AIDER_CONTEXT_WINDOW,
        }
    }
}

cli_process_builders!(AiderOptions);

impl AiderOptions {
    /// The chat-history file of conversation `id`.
    pub fn history_file(&self, id: &str) -> PathBuf {
        self.history_dir.join(format!("{id}.md"))
    }

    /// The model Aider is given for `model` (the turn's, else the
    /// default): `openai/<name>` for a name without a provider when
    /// warden names the base URL.
    fn aider_model(&self, model: Option<&str>) -> Option<String> {
        let model = model.or(self.model.as_deref())?;
        Some(match &self.base_url {
            Some(_) if !model.contains('/') => format!("openai/{model}"),
            _ => model.to_owned(),
        })
    }

    /// The arguments of one run of conversation `id` (without the
    /// binary); `dir` is the absolute history directory.
    pub fn args(&self, dir: &Path, id: &str, model: Option<&str>) -> Vec<OsString> {
        let file = |ext: &str| dir.join(format!("{id}.{ext}")).into_os_string();
        let mut args: Vec<OsString> = vec!["--message-file".into(), file("message")];
        args.extend(
            [
                "--no-pretty",
                "--no-check-update",
                "--analytics-disable",
                "--no-show-model-warnings",
                "--no-show-release-notes",
            ]
            .map(OsString::from),
        );
        args.extend([
            "--chat-history-file".into(),
            file("md"),
            "--input-history-file".into(),
            file("input"),
            "--restore-chat-history".into(),
            "--timeout".into(),
            AIDER_TIMEOUT_SECS.to_string().into(),
        ]);
        if let Some(model) = self.aider_model(model) {
            args.extend([
                "--model-metadata-file".into(),
                file("models.json"),
                "--model".into(),
                model.into(),
            ]);
        }
        if self.yes_always {
            args.push("--yes-always".into());
        }
        args.extend(self.process.extra_args.iter().cloned());
        args
    }

    /// Writes what one run reads: the message file (0600) and, with a
    /// model, the model metadata naming it (so Aider skips its price-map
    /// download).
    fn write_run_files(
        &self,
        dir: &Path,
        id: &str,
        message: &str,
        model: Option<&str>,
    ) -> std::io::Result<()> {
        use std::io::Write as _;
        use std::os::unix::fs::OpenOptionsExt as _;
        std::fs::create_dir_all(dir)?;
        let path = dir.join(format!("{id}.message"));
        let _ = std::fs::remove_file(&path);
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)?
            .write_all(message.as_bytes())?;
        if let Some(model) = self.aider_model(model) {
            let metadata = json!({ model: {
                "max_input_tokens": self.context_window,
                "max_tokens": self.context_window,
                "max_output_tokens": 8192,
                "input_cost_per_token": 0,
                "output_cost_per_token": 0,
                "litellm_provider": "openai",
                "mode": "chat",
            }});
            // The conversation's own: sessions running other models at
            // once do not overwrite it.
            std::fs::write(dir.join(format!("{id}.models.json")), metadata.to_string())?;
        }
        Ok(())
    }
}

impl AgentCli for AiderOptions {
    type Parser = AiderParser;

    fn name(&self) -> &str {
        "aider"
    }

    fn lifetime(&self) -> ProcessLifetime {
        ProcessLifetime::Turn
    }

    fn command(&self, spawn: &SpawnRequest<'_>) -> Result<CliCommand, StreamError> {
        let failed = |what: &str, e: std::io::Error| StreamError::Connection {
            message: format!("could not {what} for aider: {e}"),
        };
        // The CLI runs in the workspace: a relative directory would move.
        let dir = std::path::absolute(&self.history_dir)
            .map_err(|e| failed("find its history directory", e))?;
        let id = match spawn.resume_id {
            Some(id) => {
                if !self.history_file(id).exists() {
                    return Err(StreamError::UnknownSession {
                        session_id: id.to_owned(),
                        message: format!("aider's chat history {id}.md is gone"),
                    });
                }
                id.to_owned()
            }
            None => {
                let id = new_id();
                FRESH_ID.with(|fresh| *fresh.borrow_mut() = Some(id.clone()));
                id
            }
        };
        self.write_run_files(&dir, &id, spawn.message.unwrap_or_default(), spawn.model)
            .map_err(|e| failed("write the message file", e))?;
        let mut command = CliCommand::new(&self.process.binary)
            .args(self.args(&dir, &id, spawn.model))
            // Its error lines are wrapped at 80 columns on a pipe.
            .env("COLUMNS", "10000");
        if let Some(url) = &self.base_url {
            command = command.env("OPENAI_API_BASE", url);
        }
        command.env.extend(self.process.env.iter().cloned());
        Ok(command)
    }

    fn turn_input(&self, _message: &str) -> std::io::Result<Vec<u8>> {
        // The message is in its file; stdin is closed.
        Ok(Vec::new())
    }

    fn parser(&self, spawn: &SpawnRequest<'_>) -> AiderParser {
        let id = match spawn.resume_id {
            Some(id) => Some(id.to_owned()),
            None => FRESH_ID.with(|fresh| fresh.borrow_mut().take()),
        };
        AiderParser::new(id, self.aider_model(spawn.model))
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
        Some(AIDER_FRESH_START_NOTE.to_owned())
    }

    fn transcript(&self, session_id: &str, _workspace: Option<&Path>) -> TranscriptInfo {
        let path = self.history_file(session_id);
        let bytes = std::fs::metadata(&path).ok().map(|m| m.len());
        TranscriptInfo::new(Some(path), bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::TurnParser as _;

    fn spawn<'a>(resume_id: Option<&'a str>, message: &'a str) -> SpawnRequest<'a> {
        SpawnRequest {
            resume_id,
            model: Some("m"),
            system_prompt: None,
            workspace: None,
            message: Some(message),
        }
    }

    #[test]
    fn a_fresh_turn_names_its_chat_history_file_and_the_parser_announces_that_name() {
        let dir = tempfile::tempdir().expect("tempdir");
        let o = AiderOptions::default()
            .with_base_url("http://127.0.0.1:9/v1")
            .with_history_dir(dir.path());
        let spawn = spawn(None, "hi there");
        let command = o.command(&spawn).expect("command");
        let id = o.parser(&spawn).session_id().expect("a name").to_owned();
        assert!(is_aider_id(&id), "{id}");
        let args: Vec<String> = command
            .args
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        let after = |flag: &str| {
            let at = args.iter().position(|a| a == flag).expect(flag);
            args[at + 1].clone()
        };
        let history = o.history_file(&id);
        assert_eq!(after("--chat-history-file"), history.to_string_lossy());
        assert_eq!(after("--model"), "openai/m");
        assert_eq!(after("--timeout"), "86400");
        for flag in [
            "--restore-chat-history",
            "--no-pretty",
            "--no-check-update",
            "--analytics-disable",
        ] {
            assert!(args.iter().any(|a| a == flag), "{flag}");
        }
        assert!(!args.iter().any(|a| a == "--yes-always"));
        assert!(!args.iter().any(|a| a.contains("hi there")), "not in ps");
        assert_eq!(
            std::fs::read_to_string(after("--message-file")).expect("message file"),
            "hi there"
        );
        let metadata: serde_json::Value =
            serde_json::from_slice(&std::fs::read(after("--model-metadata-file")).expect("meta"))
                .expect("JSON");
        assert_eq!(metadata["openai/m"]["max_input_tokens"], json!(131_072));
        assert!(
            command
                .env
                .iter()
                .any(|(k, v)| k == "OPENAI_API_BASE" && v == "http://127.0.0.1:9/v1")
        );

        // Its file there, the next turn restores it; gone, nothing starts.
        std::fs::write(&history, "# aider chat\n").expect("history");
        let resumed = o.command(&self::spawn(Some(&id), "again")).expect("resume");
        assert!(
            resumed
                .args
                .iter()
                .any(|a| a.to_string_lossy() == history.to_string_lossy())
        );
        std::fs::remove_file(&history).expect("rm");
        assert!(matches!(
            o.command(&self::spawn(Some(&id), "again")),
            Err(StreamError::UnknownSession { .. })
        ));
        let yes = o.clone().with_yes_always(true);
        assert!(
            yes.command(&self::spawn(None, "x"))
                .expect("command")
                .args
                .iter()
                .any(|a| a == "--yes-always")
        );
    }

    #[test]
    fn only_warden_names_are_conversation_ids() {
        assert!(is_aider_id(&new_id()));
        for id in [
            "",
            "aider-",
            "aider-../x",
            "conv-1",
            "aider-a/b",
            "aider-a b",
        ] {
            assert!(!is_aider_id(id), "{id:?}");
        }
    }
}
