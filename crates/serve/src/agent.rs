//! The agent kinds a session can run ([`Agent`]), and which one each
//! session of a server runs ([`SessionAgents`]).
//!
//! A server runs one agent kind or several (`warden serve --agent
//! claude-code --agent codex`). A session keeps the agent it was started
//! with: its first turn's `agent`, else the server's default (the first
//! one listed). A later turn asking for another is refused with `409
//! agent_mismatch`, naming both, and nothing is sent. With several agents
//! the binding is kept by a [`SessionAgents`] store, written before the
//! first message is accepted, so it survives a restart. Which agent a turn
//! runs, and the refusal, are decided where turns are accepted
//! (`routes/agent_choice.rs`).

use futures_util::future::BoxFuture;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use warden_core::{SessionKey, StoreError};

/// The agent a session runs: an agent CLI warden drives in the session's
/// workspace, or an HTTP API whose transcript warden keeps.
// The one list of agent kinds: the OpenAPI document's `Agent` enum (and
// from it the clients' types and the console's labels) is derived from
// it, and with the `clap` feature so are the CLI's `--agent` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "kebab-case")]
pub enum Agent {
    /// The Claude Code CLI (`claude`), one child process per session; it
    /// keeps its own transcripts.
    ClaudeCode,
    /// The Codex CLI (`codex exec`), one child process per turn, read-only
    /// sandbox; it keeps its own threads.
    Codex,
    /// The Gemini CLI (`gemini`), one child process per turn; it keeps its
    /// own sessions.
    Gemini,
    /// OpenCode (`opencode run`), one child process per turn; it keeps its
    /// own sessions.
    #[serde(rename = "opencode")]
    #[cfg_attr(feature = "clap", value(name = "opencode"))]
    OpenCode,
    /// Kilo Code CLI (`kilo run`, an OpenCode fork), one child process per
    /// turn; it keeps its own sessions.
    KiloCode,
    /// Qwen Code (`qwen`, a Gemini CLI fork speaking OpenAI chat
    /// completions), one child process per turn; it keeps its own
    /// sessions.
    QwenCode,
    /// Aider (`aider --message-file`, Python, speaking OpenAI chat completions),
    /// one child process per turn; warden keeps its chat-history file.
    Aider,
    /// The Anthropic Messages API; warden keeps the transcript.
    Anthropic,
    /// An OpenAI-compatible chat completions API; warden keeps the
    /// transcript.
    Openai,
}

impl Agent {
    /// Every agent kind.
    pub const ALL: [Agent; 9] = [
        Agent::ClaudeCode,
        Agent::Codex,
        Agent::Gemini,
        Agent::OpenCode,
        Agent::KiloCode,
        Agent::QwenCode,
        Agent::Aider,
        Agent::Anthropic,
        Agent::Openai,
    ];

    /// Its wire name (`claude-code`, `codex`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            Agent::ClaudeCode => "claude-code",
            Agent::Codex => "codex",
            Agent::Gemini => "gemini",
            Agent::OpenCode => "opencode",
            Agent::KiloCode => "kilo-code",
            Agent::QwenCode => "qwen-code",
            Agent::Aider => "aider",
            Agent::Anthropic => "anthropic",
            Agent::Openai => "openai",
        }
    }

    /// The kind named `name`, if any.
    pub fn parse(name: &str) -> Option<Agent> {
        Agent::ALL.into_iter().find(|a| a.as_str() == name)
    }

    /// Whether it runs in its session's workspace directory (the agent
    /// CLIs), which must then exist.
    pub fn runs_in_workspace(self) -> bool {
        matches!(
            self,
            Agent::ClaudeCode
                | Agent::Codex
                | Agent::Gemini
                | Agent::OpenCode
                | Agent::KiloCode
                | Agent::QwenCode
                | Agent::Aider
        )
    }
}

impl std::fmt::Display for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which agent each session runs, kept durably by a server with several
/// agents: a session is bound to one when its first message is accepted
/// and stays bound (its conversation id is that agent's).
pub trait SessionAgents: Send + Sync + 'static {
    /// The agent session `key` is bound to, if it is bound.
    fn get(&self, key: &SessionKey) -> Result<Option<Agent>, StoreError>;

    /// Binds `key` to `agent` unless it is bound already (atomically: of
    /// two racing binds one wins); the agent it is bound to afterwards.
    /// Durable once the future resolves.
    fn bind<'a>(
        &'a self,
        key: &'a SessionKey,
        agent: Agent,
    ) -> BoxFuture<'a, Result<Agent, StoreError>>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_names_are_serdes_and_parse_back() {
        for agent in Agent::ALL {
            let json = serde_json::to_value(agent).expect("serializes");
            assert_eq!(json, agent.as_str());
            assert_eq!(Agent::parse(agent.as_str()), Some(agent));
        }
        assert_eq!(Agent::parse("cursor"), None);
    }
}
