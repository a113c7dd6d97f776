//! [`AgentCli`]: what warden needs to know about a coding-agent CLI to run
//! it as an [`EventSource`](warden_core::EventSource).
//!
//! An adapter says how one process is started ([`AgentCli::command`]), how
//! a user turn reaches it ([`AgentCli::turn_input`] and
//! [`AgentCli::lifetime`]), and how its stdout lines read
//! ([`AgentCli::parser`], a [`TurnParser`] per process). Everything else is
//! shared by every CLI and lives in [`CliSource`](crate::CliSource): the
//! process group (no shell; `SIGTERM`, grace, `SIGKILL` to the group on
//! cancel or drop), the stderr tail, line limits and garbage lines, the
//! resume id of a retried turn, and which process serves which turn.
//!
//! How the guarantees map onto an adapter:
//!
//! | guarantee | what the adapter does |
//! | --- | --- |
//! | resume by the agent's own id | [`SpawnRequest::resume_id`] into the command; [`TurnParser::session_id`] (and a `SessionStarted` frame) for the id to resume next |
//! | an id that is not one → fresh start | [`TurnParser::is_session_id`] says what the CLI's ids look like; an announced id of another form is dropped, a stored one fails its resume with `UnknownSession` |
//! | resume failure → fresh start with notice | return [`StreamError::UnknownSession`] (an id the CLI does not know, also a *silent* one: the CLI announcing another id) or [`StreamError::ContextOverflow`] from [`TurnParser::line`] or [`TurnParser::ended_early`]; warden's session starts a fresh conversation, re-delivers the message and tells the user |
//! | context indicator | the last `Usage` frame of a turn is the context in use (input + cache counts of the last request, not a turn's sum); the window is `TurnComplete::context_window`, else [`AgentCli::context_window`] |
//! | watchdog | every line yields at least one frame; nothing to do |
//! | cancel ends the process group | nothing to do |
//!
//! `examples/third_agent.rs` adds a CLI in one file.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use derive_setters::Setters;
use serde_json::Value;
use warden_core::{Frame, StreamError};

/// How long a process serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProcessLifetime {
    /// One process serves consecutive turns: each turn's input is written
    /// to its stdin, which stays open (Claude Code's stream-json input).
    /// After a complete turn the process waits for the next one and is
    /// reused when the next turn resumes the id it announced, in the same
    /// workspace, with the same model and system prompt.
    Session,
    /// One process per turn: the turn's input is written to stdin, which is
    /// then closed, and the process exits after the turn (Codex's `exec`).
    /// The next turn starts a new process resuming the announced id, once
    /// the previous one has exited (bounded by the grace period).
    Turn,
}

/// What one process is started for.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct SpawnRequest<'a> {
    /// The agent conversation to resume, if any.
    pub resume_id: Option<&'a str>,
    /// The model: the turn's, else the adapter's default.
    pub model: Option<&'a str>,
    /// Extra system prompt text (see [`AgentCli::system_prompt`]).
    pub system_prompt: Option<&'a str>,
    /// The working directory (already normalized by warden), if any.
    pub workspace: Option<&'a Path>,
    /// The user message of the turn this process is started for. A
    /// [`ProcessLifetime::Turn`] CLI that takes its prompt as an argument
    /// (Gemini's `--prompt`) reads it here; others get it on stdin
    /// ([`AgentCli::turn_input`]).
    pub message: Option<&'a str>,
}

/// A process to start: run directly, never through a shell, in the turn's
/// workspace.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CliCommand {
    /// The program (a path, or a name looked up on `PATH`).
    pub program: PathBuf,
    /// Its arguments.
    pub args: Vec<OsString>,
    /// Variables added to this process's environment.
    pub env: Vec<(OsString, OsString)>,
}

impl CliCommand {
    /// `program` with no arguments and no extra environment.
    pub fn new(program: impl Into<PathBuf>) -> Self {
        Self {
            program: program.into(),
            args: Vec::new(),
            env: Vec::new(),
        }
    }

    /// Appends arguments.
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Adds one environment variable.
    pub fn env(mut self, key: impl Into<OsString>, value: impl Into<OsString>) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }
}

/// Limits shared by every CLI's process.
#[derive(Debug, Clone, PartialEq, Eq, Setters)]
#[setters(prefix = "with_", strip_option)]
#[non_exhaustive]
pub struct ProcessSettings {
    /// How long a process group has after `SIGTERM` before `SIGKILL`.
    /// Default 2 s.
    pub grace_period: Duration,
    /// Longest stdout line accepted; a longer one fails the turn with
    /// `FrameTooLarge`. Default 16 MiB.
    pub max_line_bytes: usize,
    /// How many stdout lines in a row may fail to parse as a JSON object
    /// before the turn fails with `Malformed`; each counts as liveness.
    /// Default 20.
    pub max_garbage_lines: u32,
    /// How many stderr lines are kept for diagnostics and errors.
    /// Default 50.
    pub stderr_tail_lines: usize,
    /// Where each process started is recorded until its group is gone, so
    /// that the next warden ends the ones a crash of this one left
    /// running ([`end_orphaned_children`](crate::end_orphaned_children)).
    /// Default none: nothing recorded.
    #[setters(into)]
    pub children_dir: Option<PathBuf>,
}

impl Default for ProcessSettings {
    fn default() -> Self {
        Self {
            grace_period: Duration::from_secs(2),
            max_line_bytes: 16 * 1024 * 1024,
            max_garbage_lines: 20,
            stderr_tail_lines: 50,
            children_dir: None,
        }
    }
}

/// What every adapter's options share: which binary runs, with which more
/// arguments and environment, under which limits. Each adapter's options
/// embed it as `process` and get its builder methods (`with_binary`,
/// `with_arg`, `with_env`, `with_settings`) from one macro, so a new
/// adapter declares none of them.
#[derive(Debug, Clone, PartialEq, Setters)]
#[setters(prefix = "with_")]
#[non_exhaustive]
pub struct CliProcess {
    /// The binary to run: a path, or a name found on `PATH` (each
    /// adapter's default is its CLI's name). It is executed directly,
    /// never through a shell.
    #[setters(into)]
    pub binary: PathBuf,
    /// More arguments, added where the adapter says (after its own).
    /// Default empty.
    #[setters(skip)]
    pub extra_args: Vec<OsString>,
    /// More environment variables for the child, on top of this process's
    /// environment. Default empty. `HOME` or the CLI's own home variable
    /// set here are also where diagnostics look for its transcripts.
    #[setters(skip)]
    pub env: Vec<(OsString, OsString)>,
    /// Process limits. Default [`ProcessSettings::default`].
    pub settings: ProcessSettings,
}

impl CliProcess {
    /// `binary` with no more arguments or environment and the default
    /// limits.
    pub fn new(binary: impl Into<PathBuf>) -> Self {
        Self {
            binary: binary.into(),
            extra_args: Vec::new(),
            env: Vec::new(),
            settings: ProcessSettings::default(),
        }
    }

    /// Appends one argument to [`extra_args`](Self::extra_args) (not a
    /// setter: each call adds one).
    pub fn with_arg(mut self, arg: impl Into<OsString>) -> Self {
        self.extra_args.push(arg.into());
        self
    }

    /// Adds one variable to [`env`](Self::env) (not a setter: each call
    /// adds one; a later value of the same name wins in the child).
    pub fn with_env(mut self, key: impl Into<OsString>, value: impl Into<OsString>) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }
}

/// The builder methods of [`CliProcess`] on an adapter's options that
/// embed it as `process`, written once here for every adapter: inherent
/// methods, so callers need no trait in scope (a `Deref` to the shared
/// part would hand back a `CliProcess`, not the adapter's options).
macro_rules! cli_process_builders {
    ($($options:ty),+ $(,)?) => {$(
        impl $options {
            /// Sets [`CliProcess::binary`](crate::CliProcess::binary): the
            /// binary to run, executed directly, never through a shell.
            pub fn with_binary(mut self, binary: impl Into<std::path::PathBuf>) -> Self {
                self.process = self.process.with_binary(binary);
                self
            }

            /// Appends one argument to
            /// [`CliProcess::extra_args`](crate::CliProcess::extra_args).
            pub fn with_arg(mut self, arg: impl Into<std::ffi::OsString>) -> Self {
                self.process = self.process.with_arg(arg);
                self
            }

            /// Adds one variable to the child's environment,
            /// [`CliProcess::env`](crate::CliProcess::env).
            pub fn with_env(
                mut self,
                key: impl Into<std::ffi::OsString>,
                value: impl Into<std::ffi::OsString>,
            ) -> Self {
                self.process = self.process.with_env(key, value);
                self
            }

            /// Sets [`CliProcess::settings`](crate::CliProcess::settings):
            /// the process limits.
            pub fn with_settings(mut self, settings: crate::ProcessSettings) -> Self {
                self.process = self.process.with_settings(settings);
                self
            }
        }
    )+};
}
pub(crate) use cli_process_builders;

/// What one stdout line means for the turn.
#[derive(Debug, PartialEq)]
#[non_exhaustive]
pub enum Step {
    /// Frames to yield; the turn goes on. An empty list yields one
    /// `KeepAlive` (every line is liveness).
    Frames(Vec<Frame>),
    /// The turn is complete: yield these frames (end with `TurnComplete`)
    /// and end the stream.
    Complete(Vec<Frame>),
    /// The turn failed.
    Fail(StreamError),
}

/// How a process that ended before the turn's end exited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ExitInfo {
    /// Exited with this code.
    Code(i32),
    /// Killed by this signal.
    Signal(i32),
    /// Closed stdout but did not exit within the grace period.
    StillRunning,
    /// Unknown (the wait failed).
    Unknown,
}

impl std::fmt::Display for ExitInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Code(c) => write!(f, "exit status {c}"),
            Self::Signal(s) => write!(f, "signal {s}"),
            Self::StillRunning => f.write_str("stdout closed, process still running"),
            Self::Unknown => f.write_str("unknown exit status"),
        }
    }
}

/// Reads one process's stdout, one JSON object per line. Lives as long as
/// the process.
pub trait TurnParser: std::fmt::Debug + Send + 'static {
    /// Resets per-turn state before a user turn is sent.
    fn begin_turn(&mut self) {}

    /// Maps one stdout line that parsed as a JSON object. Blank lines and
    /// lines that are not JSON objects never reach it (they are liveness,
    /// up to [`ProcessSettings::max_garbage_lines`] in a row).
    fn line(&mut self, line: &Value) -> Step;

    /// Maps one stdout line (without its newline, blank ones included)
    /// of a CLI that prints plain text instead of JSON lines (Aider):
    /// `Some` takes the line, and [`line`](Self::line) never sees it.
    /// Default `None`: every line is read as JSON.
    fn text(&mut self, _line: &str) -> Option<Step> {
        None
    }

    /// The newest agent conversation id this process announced: the one
    /// the next turn resumes.
    fn session_id(&self) -> Option<&str>;

    /// Whether `id` has the form of this CLI's conversation ids. An
    /// announced id that does not is never passed on (no `SessionStarted`,
    /// never stored, the next turn starts a fresh conversation); a resume
    /// id that does not fails the turn with [`StreamError::UnknownSession`]
    /// before anything starts, which starts a fresh conversation. Default
    /// [`is_plain_id`]; Claude Code, Codex and Gemini take [`is_uuid`].
    fn is_session_id(id: &str) -> bool
    where
        Self: Sized,
    {
        is_plain_id(id)
    }

    /// The error of a process whose stdout ended before the turn did, from
    /// how it exited and its last stderr lines. `saw_json`: whether a JSON
    /// line was read in this turn. A resume failure here is
    /// [`StreamError::UnknownSession`]; an unexplained exit is usually
    /// `Connection` (nothing read) or `Truncated` (retryable).
    fn ended_early(&mut self, exit: ExitInfo, stderr: &[String], saw_json: bool) -> StreamError;
}

/// Whether `id` is a UUID (8-4-4-4-12 hex digits): the form of Claude
/// Code's session ids, Codex's thread ids and Gemini's session ids. Any
/// other id would not resume: Claude Code cannot be given one with a NUL,
/// Codex would start a new thread, Gemini would read `latest` or a list
/// index.
pub fn is_uuid(id: &str) -> bool {
    let groups: Vec<&str> = id.split('-').collect();
    groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(g, n)| g.len() == n && g.chars().all(|c| c.is_ascii_hexdigit()))
}

/// Whether `id` is safe to store and hand back as an argument: 1 to 256
/// printable ASCII characters without `/` or `\` (no NUL or other control
/// character, no space, no path).
pub fn is_plain_id(id: &str) -> bool {
    (1..=256).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_graphic() && b != b'/' && b != b'\\')
}

/// A coding-agent CLI that warden runs as a child process.
///
/// Implement it in one file and wrap it in a
/// [`CliSource`](crate::CliSource); see the [module docs](self) for what
/// each part gives.
pub trait AgentCli: std::fmt::Debug + Send + Sync + 'static {
    /// The parser of one process's stdout.
    type Parser: TurnParser;

    /// A short name for logs and [`EventSource::provider`](warden_core::EventSource::provider).
    fn name(&self) -> &str;

    /// How long a process serves. Default [`ProcessLifetime::Session`].
    fn lifetime(&self) -> ProcessLifetime {
        ProcessLifetime::Session
    }

    /// The command of one process. An error here (say, a resume id the CLI
    /// would silently not resume) fails the turn before anything starts.
    fn command(&self, spawn: &SpawnRequest<'_>) -> Result<CliCommand, StreamError>;

    /// The bytes written to stdin for one user turn.
    fn turn_input(&self, message: &str) -> std::io::Result<Vec<u8>>;

    /// A parser for a process started for `spawn`.
    fn parser(&self, spawn: &SpawnRequest<'_>) -> Self::Parser;

    /// Process limits. Default [`ProcessSettings::default`].
    fn settings(&self) -> ProcessSettings {
        ProcessSettings::default()
    }

    /// The system prompt text of a turn from the request's (the adapter
    /// may add its own). Default: the request's.
    fn system_prompt(&self, request: Option<&str>) -> Option<String> {
        request.map(str::to_owned)
    }

    /// The adapter's default model. Default `None`.
    fn default_model(&self) -> Option<&str> {
        None
    }

    /// The context window of `model` when the CLI does not report one.
    /// Default `None` (warden's default window).
    fn context_window(&self, _model: Option<&str>) -> Option<u64> {
        None
    }

    /// What survives a fresh start, told to the user with the notice.
    /// Default `None`.
    fn fresh_start_note(&self) -> Option<String> {
        None
    }

    /// Where the CLI keeps `session_id`'s conversation for `workspace`, and
    /// its size when it exists, for diagnostics. Default unknown.
    fn transcript(&self, _session_id: &str, _workspace: Option<&Path>) -> TranscriptInfo {
        TranscriptInfo::default()
    }

    /// Called before a process resumes `session_id` (say, to log whether
    /// its transcript exists). Default: nothing.
    fn before_resume(&self, _session_id: &str, _workspace: Option<&Path>) {}
}

/// Where a conversation is kept, for diagnostics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct TranscriptInfo {
    /// Where it is or should be.
    pub path: Option<PathBuf>,
    /// Its size when it exists.
    pub bytes: Option<u64>,
}

impl TranscriptInfo {
    /// `path` and its size, when known.
    pub fn new(path: Option<PathBuf>, bytes: Option<u64>) -> Self {
        Self { path, bytes }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_adapters_options_take_the_shared_process_builders_and_its_derived_setters() {
        let limits = ProcessSettings::default()
            .with_grace_period(Duration::from_millis(7))
            .with_children_dir("/run/kids");
        assert_eq!(limits.children_dir, Some(PathBuf::from("/run/kids")));
        let want = CliProcess::new("/bin/x")
            .with_arg("--a")
            .with_arg("--b")
            .with_env("K", "1")
            .with_env("K", "2")
            .with_settings(limits.clone());
        assert_eq!(want.extra_args, ["--a", "--b"].map(OsString::from));
        assert_eq!(want.env.len(), 2, "each with_env adds one");
        macro_rules! shared {
            ($options:expr) => {
                $options
                    .with_binary("/bin/x")
                    .with_arg("--a")
                    .with_arg("--b")
                    .with_env("K", "1")
                    .with_env("K", "2")
                    .with_settings(limits.clone())
                    .process
            };
        }
        let got = [
            shared!(crate::ClaudeOptions::default()),
            shared!(crate::CodexOptions::default()),
            shared!(crate::GeminiOptions::default()),
            shared!(crate::OpenCodeOptions::kilo()),
            shared!(crate::QwenOptions::default()),
            shared!(crate::AiderOptions::default()),
        ];
        for process in got {
            assert_eq!(process, want);
        }
        let codex = crate::CodexOptions::default()
            .with_model("m")
            .with_stream_idle_timeout_ms(5);
        assert_eq!(codex.model.as_deref(), Some("m"));
        assert_eq!(codex.stream_idle_timeout_ms, Some(5));
        let claude = crate::ClaudeOptions::default()
            .with_partial_messages(true)
            .with_grace_period(Duration::from_millis(7));
        assert!(claude.include_partial_messages);
        assert_eq!(
            claude.process.settings.grace_period,
            Duration::from_millis(7)
        );
        let gemini = crate::GeminiOptions::default().with_max_attempts(0);
        assert_eq!(gemini.max_attempts, 1, "with_max_attempts raises a 0 to 1");
    }

    #[test]
    fn a_uuid_is_an_id_and_a_nul_a_path_a_list_index_or_latest_are_not() {
        assert!(is_uuid("01a248eb-745c-7d71-9292-022ab8cab1e9"));
        for id in [
            "not-a-uuid",
            "latest",
            "3",
            "",
            "01a248eb-745c-7d71-9292-022ab8cab1e\0",
        ] {
            assert!(!is_uuid(id), "{id:?}");
        }
        assert!(is_plain_id("conv-1"));
        for id in ["", "a\0b", "a b", "../x", "a\\b", "\u{1b}]0;x\u{7}"] {
            assert!(!is_plain_id(id), "{id:?}");
        }
        assert!(!is_plain_id(&"x".repeat(257)));
    }
}
