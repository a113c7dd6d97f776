//! Claude Code on the [`AgentCli`] trait: [`ClaudeOptions`] is the adapter.
//!
//! One long-lived process per session ([`ProcessLifetime::Session`]), user
//! turns as stream-json lines on stdin; the line mapping and the errors are
//! in the [crate docs](crate).

use std::path::Path;

use crate::cli::{
    AgentCli, CliCommand, ProcessLifetime, ProcessSettings, SpawnRequest, TranscriptInfo,
};
use crate::options::ClaudeOptions;
use crate::source::{CliSource, CliSourceFactory};
use crate::transcript;

mod errors;
pub(crate) mod parse;
#[cfg(test)]
mod parse_tests;

pub use parse::ClaudeParser;

/// An [`EventSource`](warden_core::EventSource) that runs the Claude Code
/// CLI: one long-lived `claude` process per session key serves consecutive
/// turns over stdin; see the [crate docs](crate) for when a process is
/// reused, restarted with `--resume`, or killed. Dropping the source
/// terminates its idle processes (SIGTERM, grace period, SIGKILL).
pub type ClaudeSource = CliSource<ClaudeOptions>;

/// A [`SourceFactory`](warden_core::SourceFactory) giving each session its
/// own [`ClaudeSource`], so that a session's shutdown (which drops its
/// source) terminates its process.
pub type ClaudeSourceFactory = CliSourceFactory<ClaudeOptions>;

/// What survives a fresh start of a Claude Code session: the project's
/// memory file, read again by the new conversation.
pub const FRESH_START_NOTE: &str = "Project context is preserved in CLAUDE.md.";

/// The context window Claude Code gives `model`: 1,000,000 tokens for the
/// `[1m]` variants (`sonnet[1m]`, `claude-sonnet-4-5[1m]`, any case);
/// `None` (warden's 200,000 default) otherwise. A window Claude Code
/// reports with a turn (`modelUsage.*.contextWindow`) wins over this.
pub fn window_for_model(model: &str) -> Option<u64> {
    model
        .to_ascii_lowercase()
        .contains("[1m]")
        .then_some(1_000_000)
}

impl AgentCli for ClaudeOptions {
    type Parser = ClaudeParser;

    fn name(&self) -> &str {
        "claude"
    }

    fn lifetime(&self) -> ProcessLifetime {
        ProcessLifetime::Session
    }

    fn command(&self, spawn: &SpawnRequest<'_>) -> Result<CliCommand, warden_core::StreamError> {
        if let Some(dir) = &self.scratch_dir
            && let Err(e) = std::fs::create_dir_all(dir)
        {
            tracing::warn!(dir = %dir.display(), error = %e, "could not create the scratch directory");
        }
        let mut command = CliCommand::new(&self.process.binary).args(self.args_for_model(
            spawn.resume_id,
            spawn.system_prompt,
            spawn.model,
        ));
        command.env = self.child_env();
        Ok(command)
    }

    fn turn_input(&self, message: &str) -> std::io::Result<Vec<u8>> {
        let line = serde_json::json!({
            "type": "user",
            "message": {"role": "user", "content": message},
        });
        let mut bytes = serde_json::to_vec(&line).map_err(std::io::Error::other)?;
        bytes.push(b'\n');
        Ok(bytes)
    }

    fn parser(&self, spawn: &SpawnRequest<'_>) -> ClaudeParser {
        ClaudeParser::new(spawn.resume_id.map(str::to_owned))
    }

    fn settings(&self) -> ProcessSettings {
        self.process.settings.clone()
    }

    fn system_prompt(&self, request: Option<&str>) -> Option<String> {
        self.system_prompt_for(request)
    }

    fn default_model(&self) -> Option<&str> {
        self.model.as_deref()
    }

    fn context_window(&self, model: Option<&str>) -> Option<u64> {
        model.and_then(window_for_model)
    }

    fn fresh_start_note(&self) -> Option<String> {
        Some(FRESH_START_NOTE.to_owned())
    }

    fn transcript(&self, session_id: &str, workspace: Option<&Path>) -> TranscriptInfo {
        let Some(config) = transcript::config_dir(&self.child_env()) else {
            return TranscriptInfo::default();
        };
        let cwd = match workspace {
            Some(w) => w.to_path_buf(),
            None => match std::env::current_dir() {
                Ok(d) => d,
                Err(_) => return TranscriptInfo::default(),
            },
        };
        let cwd = transcript::real_path(&cwd);
        match transcript::find_transcript(&config, &cwd, session_id) {
            Some((path, bytes)) => TranscriptInfo::new(Some(path), Some(bytes)),
            None => TranscriptInfo::new(
                Some(transcript::transcript_path(&config, &cwd, session_id)),
                None,
            ),
        }
    }

    fn before_resume(&self, session_id: &str, workspace: Option<&Path>) {
        let info = self.transcript(session_id, workspace);
        let elsewhere = match (&info.bytes, transcript::config_dir(&self.child_env())) {
            (None, Some(config)) => transcript::find_transcript_anywhere(&config, session_id),
            _ => None,
        };
        tracing::debug!(
            gen_ai.conversation.id = session_id,
            transcript = ?info.path,
            exists = info.bytes.is_some(),
            transcript_bytes = ?info.bytes,
            found_elsewhere = ?elsewhere,
            "resuming claude session"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_million_windows_come_from_the_1m_model_names() {
        assert_eq!(window_for_model("claude-sonnet-4-5"), None);
        assert_eq!(window_for_model("claude-sonnet-4-5[1m]"), Some(1_000_000));
        assert_eq!(window_for_model("Claude-Opus[1M]"), Some(1_000_000));
        assert_eq!(window_for_model("sonnet[1m]"), Some(1_000_000));
    }
}
