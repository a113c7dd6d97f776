//! The wire layer under an agent CLI: warden's own watched proxy engine
//! (`warden_proxy`, what `warden proxy` runs), in this process, on
//! loopback, with the CLI's model traffic pointed at it (Claude Code's
//! `ANTHROPIC_BASE_URL`, Codex's provider `base_url`; the engine tells
//! them apart by Anthropic's `anthropic-version` header). For Claude Code
//! (the Messages API) a stall or a cut mid-reply is continued inside
//! the CLI's own request and spliced into the same response, a stall inside
//! a thinking block retried unseen (thinking is held back: no human
//! watches these streams): the CLI never sees the fault, is never killed
//! for it, and the reply is not generated twice. The process layer (the
//! session's watchdog on the CLI's stdout) stays for what the wire cannot
//! see: a CLI that hangs with a healthy upstream, crashes or prints
//! garbage. Its allowance counts the model stream the wire sends the CLI
//! too, so a long thinking stream is not taken for a silent CLI: under
//! one session (`warden chat`, [`Wire::live`]) every stream the wire
//! carries; under many (`warden serve`, [`Wire::live_sessions`]) each
//! session's CLI reaches the wire on a route of its own, its base URL
//! with `/s/<id>` after it ([`Wire::per_session`]), which the wire strips,
//! and the streams sent on that route count for that session alone.
//!
//! Codex speaks the Responses API, which the engine watches and continues
//! the same way: a stall before any byte is retried unseen, a stall or a
//! cut mid-text continued with a continuation turn and spliced into the
//! same response, so Codex never retries it (no `Reconnecting...`). Inside
//! a reasoning item or a tool call the stream ends with a retryable
//! `error` event and closes before `response.completed`, which Codex
//! retries itself (`Reconnecting... 1/5`) at once, instead of after its
//! own idle timeout (300 s) or being killed by the watchdog on its stdout.
//!
//! Gemini CLI reaches the wire through `GOOGLE_GEMINI_BASE_URL` (the
//! engine knows its `/v1beta/` paths): a stall or a cut mid-text is
//! continued with a continuation turn and spliced into the same stream,
//! as for Claude Code. warden turns the CLI's own retries off
//! (`general.maxAttempts` 1: they re-send the partial text as new text),
//! so the wire retries an overloaded answer before any byte itself, per
//! the shared backoff, instead of handing it back.
//!
//! OpenCode and Kilo Code speak OpenAI chat completions (a provider
//! `warden` whose `baseURL` is the engine plus `/v1`), whose streams the
//! engine continues as Claude Code's: a stall or a cut mid-text is
//! continued with a continuation turn, the repeat trimmed, and spliced
//! into the same completion, so the CLI sees one whole reply (and never
//! runs its own re-send, or its request loop on a cut stream). So does
//! Qwen Code (`OPENAI_BASE_URL`, the engine plus `/v1`), whose own
//! continuation would print the partial text again, and Aider
//! (`OPENAI_API_BASE`), which would print a cut stream's half reply as
//! its answer (exit 0), or retry it and print the partial text again.
//!
//! The layer itself is the library's ([`warden_wire::WireLayer`], the one
//! implementation library users get too); this module says which agents
//! it carries and where their requests go on.

use std::sync::Arc;
use std::time::Duration;

use warden_claude::CliCommand;
use warden_core::{EventSource, SessionKey};
use warden_proxy::ProxyConfig;
use warden_serve::Agent;
use warden_wire::{WireError, WireLayer};

use crate::exit::CliError;

/// A running wire layer and the agents whose traffic it carries.
pub(crate) struct Wire {
    layer: WireLayer,
    agents: Vec<Agent>,
}

impl Wire {
    /// The wire layer under those of `agents` whose model traffic it can
    /// carry (none when `off`, `--no-wire-watch`): Claude Code and Gemini
    /// CLI always;
    /// Codex when warden names its provider anyway (`base_url`, the
    /// user's `--base-url`) or it would use an API key (`OPENAI_API_KEY`),
    /// not a ChatGPT sign-in, whose backend the engine does not speak;
    /// OpenCode, Kilo Code, Qwen Code and Aider when warden names their provider
    /// (`--base-url`; without it they use the user's own providers).
    /// Its upstreams are what each CLI would reach without warden.
    pub(crate) async fn for_agents(
        agents: &[Agent],
        base_url: Option<&str>,
        off: bool,
        stream_timeout: Duration,
    ) -> Result<Option<Self>, CliError> {
        let codex_by_key = base_url.is_some()
            || std::env::var("OPENAI_API_KEY").is_ok_and(|key| !key.trim().is_empty());
        let wired: Vec<Agent> = agents
            .iter()
            .copied()
            .filter(|agent| match agent {
                Agent::ClaudeCode | Agent::Gemini => true,
                Agent::Codex => codex_by_key,
                Agent::OpenCode | Agent::KiloCode | Agent::QwenCode | Agent::Aider => {
                    base_url.is_some()
                }
                _ => false,
            })
            .collect();
        if off || wired.is_empty() {
            return Ok(None);
        }
        let config = ProxyConfig::under_agent_cli(stream_timeout)
            .with_anthropic_upstream(warden_wire::anthropic_upstream(base_url))
            .with_openai_upstream(warden_wire::openai_upstream(base_url))
            .with_gemini_upstream(warden_wire::gemini_upstream(base_url))
            // Its CLI's retries are off (`GeminiOptions::max_attempts`).
            .with_gemini_client_retries(false);
        Self::start(config, wired).await.map(Some)
    }

    /// Starts the engine of `config` on loopback.
    async fn start(config: ProxyConfig, agents: Vec<Agent>) -> Result<Self, CliError> {
        let layer = WireLayer::start(config).await.map_err(|e| match e {
            WireError::Config(_) => CliError::usage(e.to_string()),
            _ => CliError::failure(e.to_string()),
        })?;
        Ok(Self { layer, agents })
    }

    /// Where `agent` sends its model requests: the wire, when it carries
    /// that agent's traffic (Codex and OpenCode add `/v1` to it, as to
    /// any `--base-url`).
    pub(crate) fn base_url(&self, agent: Agent) -> Option<String> {
        self.agents
            .contains(&agent)
            .then(|| self.layer.url().to_owned())
    }

    /// The line a session's first turn gets when `agent`'s model traffic
    /// goes through this wire (`session`: whose, under `warden serve`):
    /// that it is on, where, what it does and how to turn it off. `None`
    /// when it does not carry `agent`.
    pub(crate) fn announcement(
        &self,
        agent: Agent,
        session: Option<&SessionKey>,
    ) -> Option<String> {
        self.agents
            .contains(&agent)
            .then(|| announcement(self.layer.url(), agent, session))
    }

    /// Why nothing it carried could save a failed turn, when every model
    /// request stalled ([`WireLayer::every_request_stalled`]).
    pub(crate) fn every_request_stalled(&self) -> Option<String> {
        self.layer.every_request_stalled()
    }

    /// `source`, live while this wire sends its one session's CLI its
    /// model stream (`warden chat`, [`WireLayer::live`]).
    pub(crate) fn live(&self, source: Arc<dyn EventSource>) -> Arc<dyn EventSource> {
        self.layer.live(source)
    }

    /// Session `key`'s source on its own route (`warden serve`,
    /// [`WireLayer::session_source`]): when the session's last source is
    /// dropped, `end` ends its CLI's process and the route is removed.
    /// Each session's source starts in this process (its first turn
    /// here) with the [`announcement`](Self::announcement) on stderr.
    pub(crate) fn live_sessions(
        &self,
        agent: Agent,
        end: Arc<dyn Fn(&SessionKey) + Send + Sync>,
    ) -> impl Fn(&SessionKey, Arc<dyn EventSource>) -> Arc<dyn EventSource> + Send + Sync + 'static
    {
        let layer = self.layer.clone();
        move |key, source| {
            eprintln!("{}", announcement(layer.url(), agent, Some(key)));
            layer.session_source(key, source, Arc::clone(&end))
        }
    }

    /// The edit each process of session `key` gets
    /// (`CliSource::set_per_session`, [`WireLayer::per_session`]).
    pub(crate) fn per_session(
        &self,
    ) -> impl Fn(&SessionKey, &mut CliCommand) + Send + Sync + 'static {
        self.layer.per_session()
    }
}

/// What a session's first turn is told when `agent`'s model traffic goes
/// through the wire at `url` (issue 47: it says that it is on).
fn announcement(url: &str, agent: Agent, session: Option<&SessionKey>) -> String {
    let whose = session
        .map(|key| format!("session {key}: "))
        .unwrap_or_default();
    format!(
        "warden: wire layer on: {whose}{agent}'s model requests go through warden's watched \
         engine at {url}, which continues a stalled or cut reply unseen by the CLI \
         (--no-wire-watch turns it off)"
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn codex_reaches_through_the_wire_the_url_it_would_reach_without_it() {
        // Codex posts to {its base_url}/responses, the engine to
        // {upstream}{path}, the path being /v1/responses.
        for url in [
            "http://h:1",
            "http://h:1/v1",
            "http://h:1/p/",
            "http://h:1/p/v1/",
        ] {
            let codex = format!("{}/responses", crate::sources::v1_base_url(url));
            let wire = format!("{}/v1/responses", warden_wire::openai_upstream(Some(url)));
            assert_eq!(wire, codex, "{url}");
        }
    }
}
