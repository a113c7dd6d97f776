//! The agent kinds a session can run ([`Agent`]), and which one each
//! session of a server runs ([`SessionAgents`]).
//!
//! A server runs one agent kind or several (`warden serve --agent
//! claude-code --agent codex`). A session keeps the agent it was started
//! with: its first turn's `agent`, else the server's default (the first
//! one listed). A later turn asking for another is refused with `409
//! agent_mismatch`, naming both, and nothing is sent. With several agents
//! the binding is kept by a [`SessionAgents`] store, written before the
//! first message is accepted, so it survives a restart.

use std::sync::Arc;

use futures_util::future::BoxFuture;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use warden_core::{SessionKey, StoreError};

use crate::api::ErrorType;
use crate::config::ServeConfig;
use crate::error::ApiError;

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
    /// The Anthropic Messages API; warden keeps the transcript.
    Anthropic,
    /// An OpenAI-compatible chat completions API; warden keeps the
    /// transcript.
    Openai,
}

impl Agent {
    /// Every agent kind.
    pub const ALL: [Agent; 5] = [
        Agent::ClaudeCode,
        Agent::Codex,
        Agent::Gemini,
        Agent::Anthropic,
        Agent::Openai,
    ];

    /// Its wire name (`claude-code`, `codex`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            Agent::ClaudeCode => "claude-code",
            Agent::Codex => "codex",
            Agent::Gemini => "gemini",
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
        matches!(self, Agent::ClaudeCode | Agent::Codex | Agent::Gemini)
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

/// The agent a turn of session `key` runs, with `asked` the turn's
/// `agent`: the session's (binding it on its first turn), or `409
/// agent_mismatch` naming the session's and the one asked for. `None`
/// when the server does not say which agent it runs (not checked).
/// `existing` says whether the session has a stored record: one stored
/// without a binding (by a server of one agent) runs the default.
pub(crate) async fn agent_for_turn(
    config: &ServeConfig,
    key: &SessionKey,
    asked: Option<Agent>,
    existing: impl std::future::Future<Output = bool>,
) -> Result<Option<Agent>, ApiError> {
    let Some(&default) = config.agents.first() else {
        return Ok(None);
    };
    let several = config.agents.len() > 1;
    let runs = match &config.session_agents {
        Some(book) if several => bound(config, book, key, asked, default, existing).await?,
        _ => default,
    };
    match asked {
        Some(asked) if asked != runs => Err(mismatch(config, key, runs, asked)),
        _ => Ok(Some(runs)),
    }
}

/// The agent `key` is bound to, binding it now when it is not.
async fn bound(
    config: &ServeConfig,
    book: &Arc<dyn SessionAgents>,
    key: &SessionKey,
    asked: Option<Agent>,
    default: Agent,
    existing: impl std::future::Future<Output = bool>,
) -> Result<Agent, ApiError> {
    let unavailable = |e: StoreError| {
        ApiError::new(
            ErrorType::Unavailable,
            format!(
                "cannot read or keep the agent of session {}: {e}",
                key.as_str()
            ),
        )
    };
    if let Some(agent) = book.get(key).map_err(unavailable)? {
        return Ok(agent);
    }
    if let Some(asked) = asked.filter(|a| !config.agents.contains(a)) {
        // Not one this server runs: refused before anything is bound.
        return Err(mismatch(config, key, default, asked));
    }
    let wanted = match asked {
        // A session stored before its agent was (a server of one agent)
        // runs the default, whatever is asked.
        Some(asked) if !existing.await => asked,
        Some(_) => default,
        None => default,
    };
    book.bind(key, wanted).await.map_err(unavailable)
}

/// `409 agent_mismatch`: session `key` runs `runs`, the turn asked for
/// `asked`; nothing was sent.
fn mismatch(config: &ServeConfig, key: &SessionKey, runs: Agent, asked: Agent) -> ApiError {
    let message = if config.agents.len() > 1 {
        let served = config.agents.contains(&asked);
        let elsewhere = if served {
            "start a new session (another key or workspace) for it".to_owned()
        } else {
            format!("this server runs {} only", list(&config.agents))
        };
        format!(
            "session {} runs the {runs} agent (it keeps the agent it was started with); a turn \
             cannot switch it to {asked}, and nothing was sent. Drop `agent` or send {runs} to \
             use this session; for {asked}, {elsewhere}",
            key.as_str()
        )
    } else {
        format!(
            "session {} runs the {runs} agent (every session of this server does); a turn \
             cannot switch it to {asked}, and nothing was sent. Send it to a server running \
             {asked}, or drop `agent` to use {runs}",
            key.as_str()
        )
    };
    ApiError::new(ErrorType::AgentMismatch, message).with(|e| {
        e.agent = Some(runs);
        e.requested = Some(asked);
    })
}

/// `a, b and c`.
fn list(agents: &[Agent]) -> String {
    let names: Vec<&str> = agents.iter().map(|a| a.as_str()).collect();
    match names.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} and {last}", rest.join(", ")),
        _ => names.join(""),
    }
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

    #[test]
    fn lists_read_as_words() {
        assert_eq!(list(&[Agent::Codex]), "codex");
        assert_eq!(
            list(&[Agent::ClaudeCode, Agent::Codex, Agent::Gemini]),
            "claude-code, codex and gemini"
        );
    }
}
