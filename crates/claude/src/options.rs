//! [`ClaudeOptions`]: how the `claude` binary is run.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use derive_setters::Setters;

use crate::cli::{CliProcess, cli_process_builders};

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
/// then the options below, then [`extra_args`](CliProcess::extra_args).
#[derive(Debug, Clone, PartialEq, Setters)]
#[setters(prefix = "with_", strip_option)]
#[non_exhaustive]
pub struct ClaudeOptions {
    /// The binary (default `claude`, found on `PATH`), its more arguments
    /// (appended last), environment and limits, shared by every adapter
    /// ([`CliProcess`]). `HOME` or `CLAUDE_CONFIG_DIR` in its environment
    /// are also where [`diagnostics`](warden_core::EventSource::diagnostics)
    /// looks for transcripts. Its
    /// [`children_dir`](crate::ProcessSettings::children_dir) records each
    /// running process, so that after a `kill -9` of this process the next
    /// one ends it with [`end_orphaned_children`](crate::end_orphaned_children):
    /// a Claude Code process killed warden's way keeps its turn going,
    /// re-sends the message on its own and writes the conversation the
    /// next warden resumes.
    #[setters(skip)]
    pub process: CliProcess,
    /// `--model`. Default `None` (Claude Code's own default).
    #[setters(into)]
    pub model: Option<String>,
    /// `--permission-mode`. Default [`PermissionMode::Default`].
    pub permission_mode: PermissionMode,
    /// Text for `--append-system-prompt`. Default `None`. When the turn
    /// request carries its own text too, both are passed, this one first,
    /// separated by a blank line.
    #[setters(into)]
    pub append_system_prompt: Option<String>,
    /// `--include-partial-messages`: text arrives as Anthropic deltas
    /// (`stream_event` lines) instead of one block at a time. Default
    /// `false`.
    #[setters(rename = "with_partial_messages")]
    pub include_partial_messages: bool,
    /// A scratch directory for Claude Code's temporary files and sockets:
    /// when set, it is created and passed as `CLAUDE_CODE_TMPDIR` and
    /// `XDG_RUNTIME_DIR`, so nothing is left under `/tmp`. Default `None`
    /// (the child inherits both variables).
    #[setters(into)]
    pub scratch_dir: Option<PathBuf>,
}

impl Default for ClaudeOptions {
    fn default() -> Self {
        Self {
            process: CliProcess::new("claude"),
            model: None,
            permission_mode: PermissionMode::Default,
            append_system_prompt: None,
            include_partial_messages: false,
            scratch_dir: None,
        }
    }
}

cli_process_builders!(ClaudeOptions);

/// The process limits of [`ProcessSettings`](crate::ProcessSettings) one
/// at a time, as Claude Code's options had them before the limits were
/// shared: each sets that field of the embedded
/// [`settings`](CliProcess::settings), a field of a field, which the
/// derive does not reach.
impl ClaudeOptions {
    /// Sets how long a process group has after `SIGTERM` before `SIGKILL`
    /// ([`ProcessSettings::grace_period`](crate::ProcessSettings::grace_period),
    /// default 2 s).
    pub fn with_grace_period(mut self, grace: Duration) -> Self {
        self.process.settings.grace_period = grace;
        self
    }

    /// Sets where each running process is recorded
    /// ([`ProcessSettings::children_dir`](crate::ProcessSettings::children_dir)).
    pub fn with_children_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.process.settings.children_dir = Some(dir.into());
        self
    }

    /// Sets the longest stdout line accepted
    /// ([`ProcessSettings::max_line_bytes`](crate::ProcessSettings::max_line_bytes),
    /// default 16 MiB: tool results carrying whole files make long lines).
    pub fn with_max_line_bytes(mut self, limit: usize) -> Self {
        self.process.settings.max_line_bytes = limit;
        self
    }

    /// Sets how many stdout lines in a row may fail to parse before the
    /// turn fails with `Malformed`
    /// ([`ProcessSettings::max_garbage_lines`](crate::ProcessSettings::max_garbage_lines),
    /// default 20; `0` fails on the first one).
    pub fn with_max_garbage_lines(mut self, lines: u32) -> Self {
        self.process.settings.max_garbage_lines = lines;
        self
    }

    /// Sets how many stderr lines are kept for diagnostics
    /// ([`ProcessSettings::stderr_tail_lines`](crate::ProcessSettings::stderr_tail_lines),
    /// default 50).
    pub fn with_stderr_tail_lines(mut self, lines: usize) -> Self {
        self.process.settings.stderr_tail_lines = lines;
        self
    }
}

impl ClaudeOptions {
    /// The child's extra environment as it will be set: [`env`](CliProcess::env),
    /// then the scratch directory variables, then `IS_SANDBOX=1` for
    /// [`PermissionMode::BypassPermissions`] unless `IS_SANDBOX` is set.
    pub fn child_env(&self) -> Vec<(OsString, OsString)> {
        let mut env = self.process.env.clone();
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
        args.extend(self.process.extra_args.iter().cloned());
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
