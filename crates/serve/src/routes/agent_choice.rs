//! Which agent a turn runs: its session's (bound on its first turn when
//! the server runs several), or `409 agent_mismatch` naming both; see
//! [`crate::agent`] for the rule as users read it.

use std::sync::Arc;

use warden_core::{SessionKey, StoreError};

use crate::agent::{Agent, SessionAgents};
use crate::api::ErrorType;
use crate::config::ServeConfig;
use crate::error::ApiError;

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
    fn lists_read_as_words() {
        assert_eq!(list(&[Agent::Codex]), "codex");
        assert_eq!(
            list(&[Agent::ClaudeCode, Agent::Codex, Agent::Gemini]),
            "claude-code, codex and gemini"
        );
    }
}
