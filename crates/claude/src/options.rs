//! [`ClaudeOptions`]: how the `claude` binary is run.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

/// Claude Code's `--permission-mode`.
///
/// The default is [`PermissionMode::Default`]: it works as root (CI runs as
/// root) and needs nothing else; in headless mode a tool call that would
/// need an interactive approval is not approved, and the agent is told so.
/// `--dangerously-skip-permissions` is never passed: Claude Code refuses it
/// as root.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum PermissionMode {
    /// `default`: ask for approval (denied in headless mode). Works as root.
    #[default]
    Default,
    /// `acceptEdits`: file edits are approved, other tools need approval.
    AcceptEdits,
    /// `plan`: read-only planning.
    Plan,
    /// `bypassPermissions`: every tool runs without approval. As root,
    /// Claude Code accepts it only with `IS_SANDBOX=1` in its environment,
    /// so the source sets `IS_SANDBOX=1` for this mode unless the extra
    /// environment already sets `IS_SANDBOX`.
    BypassPermissions,
    /// Any other mode name, passed as given.
    Custom(String),
}

impl PermissionMode {
    /// The value passed to `--permission-mode`.
    pub fn as_str(&self) -> &str {
        match self {
            Self::Default => "default",
            Self::AcceptEdits => "acceptEdits",
            Self::Plan => "plan",
            Self::BypassPermissions => "bypassPermissions",
            Self::Custom(s) => s,
        }
    }
}

/// How [`ClaudeSource`](crate::ClaudeSource) runs the `claude` binary.
///
/// Every run has `--output-format stream-json --input-format stream-json
/// --verbose`, then `--resume <id>` when the turn resumes a conversation,
/// then the options below, then [`extra_args`](Self::extra_args).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct ClaudeOptions {
    /// The binary to run. Default `claude`, found on `PATH`. It is executed
    /// directly, never through a shell.
    pub binary: PathBuf,
    /// `--model`. Default `None` (Claude Code's own default).
    pub model: Option<String>,
    /// `--permission-mode`. Default [`PermissionMode::Default`].
    pub permission_mode: PermissionMode,
    /// Text for `--append-system-prompt`. Default `None`. When the turn
    /// request carries its own text too, both are passed, this one first,
    /// separated by a blank line.
    pub append_system_prompt: Option<String>,
    /// `--include-partial-messages`: text arrives as Anthropic deltas
    /// (`stream_event` lines) instead of one block at a time. Default
    /// `false`.
    pub include_partial_messages: bool,
    /// More arguments, appended last. Default empty.
    pub extra_args: Vec<OsString>,
    /// More environment variables for the child, on top of this process's
    /// environment. Default empty. `HOME` or `CLAUDE_CONFIG_DIR` set here
    /// are also where [`diagnostics`](warden_core::EventSource::diagnostics)
    /// looks for transcripts.
    pub env: Vec<(OsString, OsString)>,
    /// A scratch directory for Claude Code's temporary files and sockets:
    /// when set, it is created and passed as `CLAUDE_CODE_TMPDIR` and
    /// `XDG_RUNTIME_DIR`, so nothing is left under `/tmp`. Default `None`
    /// (the child inherits both variables).
    pub scratch_dir: Option<PathBuf>,
    /// How long a process group has after `SIGTERM` before `SIGKILL`.
    /// Default 2 s.
    pub grace_period: Duration,
    /// Longest stdout line accepted; a longer one fails the turn with
    /// `FrameTooLarge`. Default 16 MiB (tool results carrying whole files
    /// make long lines).
    pub max_line_bytes: usize,
    /// How many stdout lines in a row may fail to parse as JSON before the
    /// turn fails with `Malformed`. Each such line counts as liveness and is
    /// logged as a warning (its length, never its text). Default 20; `0`
    /// fails on the first one.
    pub max_garbage_lines: u32,
    /// How many stderr lines are kept for diagnostics. Default 50.
    pub stderr_tail_lines: usize,
    /// Where each running process is recorded (see
    /// [`ProcessSettings::children_dir`](crate::ProcessSettings::children_dir)),
    /// so that after a `kill -9` of this process the next one ends it with
    /// [`end_orphaned_children`](crate::end_orphaned_children): a Claude
    /// Code process killed warden's way keeps its turn going, re-sends the
    /// message on its own and writes the conversation the next warden
    /// resumes. Default `None` (not recorded).
    pub children_dir: Option<PathBuf>,
}

impl Default for ClaudeOptions {
    fn default() -> Self {
        Self {
            binary: PathBuf::from("claude"),
            model: None,
            permission_mode: PermissionMode::Default,
            append_system_prompt: None,
            include_partial_messages: false,
            extra_args: Vec::new(),
            env: Vec::new(),
            scratch_dir: None,
            grace_period: Duration::from_secs(2),
            max_line_bytes: 16 * 1024 * 1024,
            max_garbage_lines: 20,
            stderr_tail_lines: 50,
            children_dir: None,
        }
    }
}

impl ClaudeOptions {
    /// Sets [`binary`](Self::binary).
    pub fn with_binary(mut self, binary: impl Into<PathBuf>) -> Self {
        self.binary = binary.into();
        self
    }

    /// Sets [`model`](Self::model).
    pub fn with_model(mut self, model: impl Into<String>) -> Self {
        self.model = Some(model.into());
        self
    }

    /// Sets [`permission_mode`](Self::permission_mode).
    pub fn with_permission_mode(mut self, mode: PermissionMode) -> Self {
        self.permission_mode = mode;
        self
    }

    /// Sets [`append_system_prompt`](Self::append_system_prompt).
    pub fn with_append_system_prompt(mut self, text: impl Into<String>) -> Self {
        self.append_system_prompt = Some(text.into());
        self
    }

    /// Sets [`include_partial_messages`](Self::include_partial_messages).
    pub fn with_partial_messages(mut self, on: bool) -> Self {
        self.include_partial_messages = on;
        self
    }

    /// Appends one of [`extra_args`](Self::extra_args).
    pub fn with_arg(mut self, arg: impl Into<OsString>) -> Self {
        self.extra_args.push(arg.into());
        self
    }

    /// Adds one variable to [`env`](Self::env).
    pub fn with_env(mut self, key: impl Into<OsString>, value: impl Into<OsString>) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    /// Sets [`scratch_dir`](Self::scratch_dir).
    pub fn with_scratch_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.scratch_dir = Some(dir.into());
        self
    }

    /// Sets [`grace_period`](Self::grace_period).
    pub fn with_grace_period(mut self, grace: Duration) -> Self {
        self.grace_period = grace;
        self
    }

    /// Sets [`children_dir`](Self::children_dir).
    pub fn with_children_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.children_dir = Some(dir.into());
        self
    }

    /// Sets [`max_line_bytes`](Self::max_line_bytes).
    pub fn with_max_line_bytes(mut self, limit: usize) -> Self {
        self.max_line_bytes = limit;
        self
    }

    /// Sets [`max_garbage_lines`](Self::max_garbage_lines).
    pub fn with_max_garbage_lines(mut self, lines: u32) -> Self {
        self.max_garbage_lines = lines;
        self
    }

    /// Sets [`stderr_tail_lines`](Self::stderr_tail_lines).
    pub fn with_stderr_tail_lines(mut self, lines: usize) -> Self {
        self.stderr_tail_lines = lines;
        self
    }

    /// The child's extra environment as it will be set: [`env`](Self::env),
    /// then the scratch directory variables, then `IS_SANDBOX=1` for
    /// [`PermissionMode::BypassPermissions`] unless `IS_SANDBOX` is set.
    pub fn child_env(&self) -> Vec<(OsString, OsString)> {
        let mut env = self.env.clone();
        if let Some(dir) = &self.scratch_dir {
            env.push(("CLAUDE_CODE_TMPDIR".into(), dir.clone().into_os_string()));
            env.push(("XDG_RUNTIME_DIR".into(), dir.clone().into_os_string()));
        }
        if self.permission_mode == PermissionMode::BypassPermissions
            && !env.iter().any(|(k, _)| k == "IS_SANDBOX")
        {
            env.push(("IS_SANDBOX".into(), "1".into()));
        }
        env
    }

    /// The command-line arguments of one run (without the binary).
    pub fn args(
        &self,
        resume_id: Option<&str>,
        append_system_prompt: Option<&str>,
    ) -> Vec<OsString> {
        self.args_for_model(resume_id, append_system_prompt, self.model.as_deref())
    }

    /// [`args`](Self::args) with `model` in place of
    /// [`model`](Self::model) (a turn that asks for its own).
    pub fn args_for_model(
        &self,
        resume_id: Option<&str>,
        append_system_prompt: Option<&str>,
        model: Option<&str>,
    ) -> Vec<OsString> {
        let mut args: Vec<OsString> = [
            "--output-format",
            "stream-json",
            "--input-format",
            "stream-json",
            "--verbose",
        ]
        .into_iter()
        .map(OsString::from)
        .collect();
        if let Some(id) = resume_id {
            args.push("--resume".into());
            args.push(id.into());
        }
        if let Some(model) = model {
            args.push("--model".into());
            args.push(model.into());
        }
        args.push("--permission-mode".into());
        args.push(self.permission_mode.as_str().into());
        if self.include_partial_messages {
            args.push("--include-partial-messages".into());
        }
        if let Some(text) = append_system_prompt {
            args.push("--append-system-prompt".into());
            args.push(text.into());
        }
        args.extend(self.extra_args.iter().cloned());
        args
    }

    /// The system prompt text of a turn: [`append_system_prompt`](Self::append_system_prompt)
    /// and the request's, joined by a blank line.
    pub(crate) fn system_prompt_for(&self, request: Option<&str>) -> Option<String> {
        match (self.append_system_prompt.as_deref(), request) {
            (None, None) => None,
            (Some(a), None) => Some(a.to_owned()),
            (None, Some(b)) => Some(b.to_owned()),
            (Some(a), Some(b)) => Some(format!("{a}\n\n{b}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_args_are_stream_json_verbose_with_default_permission_mode() {
        let args = ClaudeOptions::default().args(None, None);
        assert_eq!(
            args,
            [
                "--output-format",
                "stream-json",
                "--input-format",
                "stream-json",
                "--verbose",
                "--permission-mode",
                "default"
            ]
            .map(OsString::from)
        );
    }

    #[test]
    fn resume_model_prompt_and_extra_args_are_passed_in_order() {
        let o = ClaudeOptions::default()
            .with_model("claude-x")
            .with_permission_mode(PermissionMode::AcceptEdits)
            .with_partial_messages(true)
            .with_arg("--max-turns")
            .with_arg("3");
        let args = o.args(Some("abc"), Some("be brief"));
        let text: Vec<String> = args
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            text[5..],
            [
                "--resume",
                "abc",
                "--model",
                "claude-x",
                "--permission-mode",
                "acceptEdits",
                "--include-partial-messages",
                "--append-system-prompt",
                "be brief",
                "--max-turns",
                "3"
            ]
        );
        assert!(!text.iter().any(|a| a == "--dangerously-skip-permissions"));
    }

    #[test]
    fn bypass_permissions_sets_is_sandbox_unless_already_set() {
        let o = ClaudeOptions::default().with_permission_mode(PermissionMode::BypassPermissions);
        assert!(
            o.child_env()
                .contains(&(OsString::from("IS_SANDBOX"), OsString::from("1")))
        );
        let o = o.with_env("IS_SANDBOX", "0");
        let env = o.child_env();
        assert_eq!(env.iter().filter(|(k, _)| k == "IS_SANDBOX").count(), 1);
        assert!(env.contains(&(OsString::from("IS_SANDBOX"), OsString::from("0"))));
        assert!(
            !ClaudeOptions::default()
                .child_env()
                .iter()
                .any(|(k, _)| k == "IS_SANDBOX")
        );
    }

    #[test]
    fn scratch_dir_sets_tmpdir_and_runtime_dir() {
        let env = ClaudeOptions::default().with_scratch_dir("/s").child_env();
        assert!(env.contains(&(OsString::from("CLAUDE_CODE_TMPDIR"), OsString::from("/s"))));
        assert!(env.contains(&(OsString::from("XDG_RUNTIME_DIR"), OsString::from("/s"))));
    }

    #[test]
    fn system_prompts_from_options_and_request_are_joined() {
        let o = ClaudeOptions::default();
        assert_eq!(o.system_prompt_for(None), None);
        assert_eq!(o.system_prompt_for(Some("r")).as_deref(), Some("r"));
        let o = o.with_append_system_prompt("o");
        assert_eq!(o.system_prompt_for(None).as_deref(), Some("o"));
        assert_eq!(o.system_prompt_for(Some("r")).as_deref(), Some("o\n\nr"));
    }
}
