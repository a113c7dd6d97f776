//! # warden-claude: the agent-CLI crate
//!
//! Coding-agent CLIs as warden [`EventSource`](warden_core::EventSource)s.
//! [`AgentCli`] says how one CLI is started and how its stdout reads;
//! [`CliSource`] runs any of them as a child process group with the same
//! guarantees (watchdog-fed frames, resume by the agent's own id, typed
//! resume failures, cancel that ends the group, garbage-line limits). The
//! adapters here: Claude Code ([`ClaudeOptions`], [`ClaudeSource`]), the
//! Codex CLI ([`CodexOptions`], [`CodexSource`]), the Gemini CLI
//! ([`GeminiOptions`], [`GeminiSource`]), and OpenCode and its fork Kilo
//! Code ([`OpenCodeOptions`], [`OpenCodeSource`]), Qwen Code
//! ([`QwenOptions`], [`QwenSource`]), and Aider ([`AiderOptions`],
//! [`AiderSource`], plain text instead of JSON lines). Adding
//! a CLI is one file: see [`cli`] and `examples/third_agent.rs`, and
//! `docs/agents.md` for what each agent's tests show.
//!
//! The wire layer (warden's watched proxy engine under a CLI's model
//! traffic, a stalled reply continued inside the CLI's own request) is the
//! crate `warden-wire`: `WiredSourceFactory::start(options, wire_options)`
//! runs these sources under it, each session on a route of its own
//! ([`CliSource::set_per_session`], [`CliSource::end_session`]). It is a
//! crate of its own so that this one needs `warden-core` alone.
//!
//! The rest of this page is Claude Code's adapter: [`ClaudeSource`] runs
//! the real `claude` binary and turns its stream-json output into
//! [`Frame`](warden_core::Frame)s.
//!
//! ```no_run
//! use std::sync::Arc;
//! use warden_claude::{ClaudeOptions, ClaudeSourceFactory, PermissionMode};
//! use warden_core::{Supervisor, SupervisorConfig};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let options = ClaudeOptions::default()
//!     .with_model("claude-sonnet-4-5")
//!     .with_permission_mode(PermissionMode::AcceptEdits)
//!     .with_scratch_dir("/var/tmp/warden-claude");
//! let supervisor = Supervisor::start(
//!     SupervisorConfig::from_env()?,
//!     Arc::new(ClaudeSourceFactory::new(options)),
//! )
//! .await?;
//! let turn = supervisor
//!     .send_to_workspace("/work/repo", "How many files are here?")
//!     .await?;
//! let (text, _summary) = turn.finish().await?;
//! println!("{text}");
//! supervisor.shutdown().await;
//! # Ok(())
//! # }
//! ```
//!
//! # The process
//!
//! The binary ([`CliProcess::binary`], default `claude` on `PATH`) is
//! executed directly, never through a shell, in the request's workspace
//! (warden has already normalized it), as
//!
//! ```text
//! claude --output-format stream-json --input-format stream-json --verbose
//!        [--resume <id>] [--model M] --permission-mode <mode>
//!        [--include-partial-messages] [--append-system-prompt <text>] [extra args…]
//! ```
//!
//! with [`CliProcess::env`] added to its environment. Each user turn is
//! one line on its stdin, `{"type":"user","message":{"role":"user",
//! "content":"…"}}`. `--dangerously-skip-permissions` is never used (Claude
//! Code refuses it as root, and CI runs as root); the default permission
//! mode is `default`, which works as root. [`PermissionMode::BypassPermissions`]
//! adds `IS_SANDBOX=1`, without which root may not use it.
//! [`ClaudeOptions::scratch_dir`] sets `CLAUDE_CODE_TMPDIR` and
//! `XDG_RUNTIME_DIR` so nothing is left under `/tmp`.
//!
//! One long-lived process per session key serves consecutive turns: after
//! a turn's `result` line the process waits for the next line on stdin. The
//! next turn reuses it when the request resumes the id that process
//! announced last, in the same workspace with the same appended system
//! prompt. Otherwise (first turn, a different id, a fresh start after a
//! resume failure, the process died while idle) the old process is
//! terminated, the source waits until it is gone (so the new one never
//! finds the conversation "already in use"), and a new process starts with
//! `--resume <request.resume_id>` when the request has one. warden's session
//! stores the id of every `system/init` line before it goes on, so that is
//! the newest id (a resume forks the id); a retry of the same turn without
//! one resumes the id the failed attempt's process announced.
//!
//! # Process ownership and termination
//!
//! The child leads its own process group (`process_group(0)`), so its tool
//! processes are in the group too. The stream returned by
//! [`open`](warden_core::EventSource::open) owns the process until the
//! turn's `result` line; dropping it earlier (the watchdog's kill, a
//! cancel, a failure) terminates the group: `SIGTERM` to the group, up to
//! [`ProcessSettings::grace_period`] (default 2 s) for the leader to exit and
//! the group to empty, then `SIGKILL` to the group. A keeper thread per
//! process reaps the leader as soon as it exits (no zombie), and a leader
//! that exits on its own takes its group with it (no orphan). Dropping the
//! source, [`ClaudeSource::close_session`] and [`ClaudeSource::shutdown`]
//! do the same for idle processes; the last two wait until the groups are
//! gone. Termination runs on plain threads, so it completes even while the
//! tokio runtime shuts down. Use [`ClaudeSourceFactory`] to give each
//! session its own source: a session's shutdown drops its source and so
//! its process.
//!
//! # Line mapping
//!
//! Every stdout line is parsed as JSON (key order differs between CLI
//! versions) and yields at least one frame; every frame feeds the
//! watchdog.
//!
//! | stdout line | frames |
//! | --- | --- |
//! | `system` / `init` | `SessionStarted { session_id, model }` (the newest id is kept) |
//! | `system` / `api_retry` | `ProviderRetry { attempt, status: error_status }` |
//! | `assistant` content blocks | `text` → `TextDelta`, `thinking` → `ThinkingDelta`, `tool_use` → `ToolUseStarted`; then `usage` → `Usage`, a `stop_reason` → `Stop` |
//! | `user` `tool_result` blocks | `ToolUseFinished` (ends the tool allowance) |
//! | `stream_event` (`--include-partial-messages`) | the Anthropic deltas: `text_delta`, `thinking_delta`, `tool_use` block starts, `input_json_delta` → `ToolInputDelta`, `message_start`/`message_delta` usage → `Usage` (input and cache counts kept from `message_start`), `stop_reason` → `Stop`; the `assistant` lines of a streamed message then only repeat it and count as liveness |
//! | `result` `success` | `TurnComplete { context_window: modelUsage.<model>.contextWindow, duration: duration_ms }`; the stream ends and the process waits for the next turn |
//! | `result` `compact` / `compaction` | liveness: mid-turn compaction, not the end of the turn |
//! | any other JSON object, a blank line | `KeepAlive` |
//!
//! **Garbage lines.** A line that is not a JSON object (a CLI or a wrapper
//! may print noise) counts as liveness (`KeepAlive`) and is logged as a
//! warning with its length, never its text. More than
//! [`ProcessSettings::max_garbage_lines`] (default 20) such lines *in a row*
//! fail the turn with `Malformed` (fatal): a process that only prints noise
//! does not keep the watchdog fed for ever. A line longer than
//! [`ProcessSettings::max_line_bytes`] (default 16 MiB) fails the turn with
//! `FrameTooLarge`.
//!
//! # Errors
//!
//! Resume failures arrive after the process started: as a `result` line
//! (check `is_error`, not `subtype`), or as an exit before any result with
//! the reason on stderr. The last [`ProcessSettings::stderr_tail_lines`]
//! (default 50) stderr lines of the source's most recently started process
//! are kept for [`diagnostics`](warden_core::EventSource::diagnostics).
//! Error messages carry the exit status and at most the last five stderr
//! lines (clipped), never the prompt.
//!
//! | What happened | [`StreamError`](warden_core::StreamError) | Retryable |
//! | --- | --- | --- |
//! | `result` with `is_error` whose `errors` say "No conversation found with session ID" | `UnknownSession` | no (resume-failure path) |
//! | `result` with `terminal_reason` `prompt_too_long` / `blocking_limit`, or "Prompt is too long" | `ContextOverflow { reason }` | no (resume-failure path) |
//! | `result` subtype `error_max_turns`, `error_max_budget_usd`, `error_during_execution`, other `error_*` | `Api { kind: subtype }` | no |
//! | `result` `success` with `is_error` and `api_error_status` 401/403 | `Unauthorized` | no |
//! | `result` `success` with `is_error`, other status | `Api { status, kind: terminal_reason }` | for 408, 409, 429, 5xx |
//! | exit before a result, stderr "No conversation found…" or "--resume requires a valid session ID" | `UnknownSession` | no (resume-failure path) |
//! | exit before a result, stderr "Session ID … is already in use" | `Api { kind: "session_in_use" }` | yes |
//! | any other exit before a result: before any JSON line / after one | `Connection` / `Truncated`, with the exit status and the stderr tail (never prompt text) | yes |
//! | the binary cannot be started | `Connection` | yes |
//! | too many garbage lines / a line over the limit | `Malformed` / `FrameTooLarge` | no |
//!
//! # Transcripts
//!
//! Before a resume the source computes the transcript path,
//! `${CLAUDE_CONFIG_DIR:-$HOME/.claude}/projects/<key>/<id>.jsonl` (both
//! variables looked up in [`CliProcess::env`] first), and logs a debug
//! event with whether it exists and its size;
//! [`diagnostics`](warden_core::EventSource::diagnostics) reports the same.
//! The key rule is [`transcript::project_key`].
//!
//! # Runtime
//!
//! [`ClaudeSource::open`](warden_core::EventSource::open) must run on a
//! tokio runtime with its IO driver enabled (the child's pipes are
//! registered with it).
//!
//! # Dependencies and why
//! - `warden-core`: the `EventSource` trait, frames, events and errors.
//! - `tokio` (`process`, `io-util`): async reads and writes on the child's
//!   pipes.
//! - `futures-util`: the `Stream` of frames and `BoxFuture`.
//! - `serde_json`: each stdout line is parsed as JSON.
//! - `nix` (`signal`, `process`): safe `killpg` for process-group
//!   termination (this workspace denies unsafe code), and `sigprocmask` in
//!   the test agent.
//! - `tracing`: structured events; this library never installs a
//!   subscriber.
//!
//! # Testing
//!
//! The `fake-claude` binary (feature `fake-agent`, turned on for this
//! crate's own tests) replays scripted stream-json lines in place of the
//! real CLI; see its source, `src/bin/fake-claude.rs`.

mod aider;
mod children;
mod claude_code;
pub mod cli;
mod codex;
mod gemini;
mod lines;
mod opencode;
mod options;
mod process;
mod qwen;
mod source;
pub mod transcript;
mod turn;

pub use aider::{
    AIDER_CONTEXT_WINDOW, AIDER_FRESH_START_NOTE, AIDER_TIMEOUT_SECS, AiderOptions, AiderParser,
    AiderSource, AiderSourceFactory, is_aider_id,
};
pub use children::end_orphaned_children;
pub use claude_code::{
    ClaudeParser, ClaudeSource, ClaudeSourceFactory, FRESH_START_NOTE, window_for_model,
};
pub use cli::{
    AgentCli, CliCommand, CliProcess, ExitInfo, ProcessLifetime, ProcessSettings, SpawnRequest,
    Step, TranscriptInfo, TurnParser, is_plain_id, is_uuid,
};
pub use codex::{
    CODEX_FRESH_START_NOTE, CodexOptions, CodexParser, CodexSandbox, CodexSource,
    CodexSourceFactory,
};
pub use gemini::{
    GEMINI_CONTEXT_WINDOW, GEMINI_DEFAULT_MODEL, GEMINI_FRESH_START_NOTE, GEMINI_MAX_PROMPT_BYTES,
    GeminiApproval, GeminiOptions, GeminiParser, GeminiSource, GeminiSourceFactory,
};
pub use lines::{clip, stderr_summary};
pub use opencode::{
    OPENCODE_CONTEXT_WINDOW, OPENCODE_DEFAULT_MODEL, OPENCODE_FRESH_START_NOTE, OPENCODE_PROVIDER,
    OpenCodeFlavor, OpenCodeOptions, OpenCodeParser, OpenCodeSource, OpenCodeSourceFactory,
};
pub use options::{ClaudeOptions, PermissionMode};
pub use qwen::{
    QWEN_CONTEXT_WINDOW, QWEN_FRESH_START_NOTE, QwenOptions, QwenParser, QwenSource,
    QwenSourceFactory,
};
pub use source::{CliSource, CliSourceFactory};
