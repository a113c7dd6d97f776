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

use std::sync::Arc;
use std::time::Duration;

use warden_claude::CliCommand;
use warden_core::{EventSource, SessionKey};
use warden_proxy::{Outcome, Proxy, ProxyConfig, RecoveryEvent};
use warden_serve::Agent;

use live::Live;
use routes::{Routes, routed};

mod live;
mod routes;

use crate::exit::CliError;

/// A running wire layer.
pub(crate) struct Wire {
    proxy: Proxy,
    /// What it carried, route by route.
    routes: Arc<Routes>,
    /// Its silence allowance per attempt.
    allowance: Duration,
    agents: Vec<Agent>,
    url: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
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
        let codex_by_key = base_url.is_some() || env("OPENAI_API_KEY").is_some();
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
            .with_anthropic_upstream(anthropic_upstream(base_url))
            .with_openai_upstream(openai_upstream(base_url))
            .with_gemini_upstream(gemini_upstream(base_url))
            // Its CLI's retries are off (`GeminiOptions::max_attempts`).
            .with_gemini_client_retries(false);
        Self::start(config, wired).await.map(Some)
    }

    /// Starts the engine of `config` on loopback.
    async fn start(config: ProxyConfig, agents: Vec<Agent>) -> Result<Self, CliError> {
        let routes = Arc::new(Routes::default());
        let (killed, ended) = (Arc::clone(&routes), Arc::clone(&routes));
        let allowance = config.timeout;
        let limits = config.connections.clone();
        let config = config
            // What it did, as `warden proxy` says it: the CLI never sees
            // it, so this line is the only trace of it (naming the
            // session whose route it came on).
            .with_recovery_log(move |recovery| {
                let route = recovery
                    .path()
                    .map_or_else(|| Arc::clone(&killed.root), |path| killed.of_path(path).0);
                if let RecoveryEvent::Killed { request, .. } = recovery {
                    let mut seen = route.seen.lock();
                    seen.stalled.insert(*request);
                    seen.kills += 1;
                    seen.stalling = true;
                }
                eprintln!("{}", Routes::line(&route, recovery));
            })
            .with_access_log(move |record| {
                if record.outcome == Outcome::Complete {
                    let route = ended.of_path(&record.path).0;
                    let mut seen = route.seen.lock();
                    seen.completed += 1;
                    seen.stalling = false;
                }
            });
        let proxy = Proxy::start(config)
            .await
            .map_err(|e| CliError::usage(format!("the wire layer: {e}")))?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| CliError::failure(format!("the wire layer cannot listen: {e}")))?;
        let url = match listener.local_addr() {
            Ok(addr) => format!("http://{addr}"),
            Err(e) => return Err(CliError::failure(format!("the wire layer: {e}"))),
        };
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        // Served as `Proxy::serve` serves it, within its connection
        // limits, each request first taken off its route ([`routed`]).
        let app = axum::Router::new().fallback_service(proxy.router()).layer(
            axum::middleware::from_fn_with_state(Arc::clone(&routes), routed),
        );
        let task = tokio::spawn(async move {
            warden_http::serve(listener, app, limits, async move {
                let _ = stopped.await;
            })
            .await
        });
        Ok(Self {
            proxy,
            routes,
            allowance,
            agents,
            url,
            stop: Some(stop),
            task,
        })
    }

    /// Where `agent` sends its model requests: the wire, when it carries
    /// that agent's traffic (Codex and OpenCode add `/v1` to it, as to
    /// any `--base-url`).
    pub(crate) fn base_url(&self, agent: Agent) -> Option<String> {
        self.agents.contains(&agent).then(|| self.url.clone())
    }

    /// Why nothing it carried could save a failed turn, when every model
    /// request stalled: how many, how many silent attempts it killed and
    /// after how long; `None` when one completed or none stalled.
    pub(crate) fn every_request_stalled(&self) -> Option<String> {
        self.routes
            .root
            .seen
            .lock()
            .every_request_stalled(self.allowance)
    }

    /// `source`, whose attempts are also live while this wire sends their
    /// CLI its model stream: the process layer's silence allowance is then
    /// measured against the CLI's output and its model stream, so a CLI
    /// reading a long reply, or waiting on thinking the wire holds back
    /// (the wire keeps that stream live with a comment per held event),
    /// is not killed as silent. A CLI that hangs on a healthy stream is
    /// still killed once the stream ends. For a wire under one session
    /// (`warden chat`): every chunk sent without a route counts for it.
    pub(crate) fn live(&self, source: Arc<dyn EventSource>) -> Arc<dyn EventSource> {
        Arc::new(Live {
            inner: source,
            sent: self.routes.root.sent.subscribe(),
        })
    }

    /// [`live`](Self::live) for a wire under many sessions (`warden
    /// serve`): session `key`'s source, live while the wire sends its
    /// CLI's model stream on the session's own route (its CLI's command
    /// edited by [`per_session`](Self::per_session)), not another's.
    pub(crate) fn live_sessions(
        &self,
    ) -> impl Fn(&SessionKey, Arc<dyn EventSource>) -> Arc<dyn EventSource> + Send + Sync + 'static
    {
        let routes = Arc::clone(&self.routes);
        move |key, source| {
            Arc::new(Live {
                inner: source,
                sent: routes.of_session(key).1.sent.subscribe(),
            })
        }
    }

    /// The edit each process of session `key` gets
    /// (`CliSource::set_per_session`): wherever its command names the
    /// wire (an environment variable, an argument, a configuration in
    /// one), the session's route after it: `http://127.0.0.1:P/s/<id>`,
    /// which every CLI the wire carries keeps as a path prefix (the
    /// Anthropic, OpenAI and Gemini SDKs add their paths to it).
    pub(crate) fn per_session(
        &self,
    ) -> impl Fn(&SessionKey, &mut CliCommand) + Send + Sync + 'static {
        let (routes, url) = (Arc::clone(&self.routes), self.url.clone());
        move |key, command| routes.put_on_route(&url, key, command)
    }
}

impl Drop for Wire {
    fn drop(&mut self) {
        // The CLIs are gone by now (their sources shut down first): end
        // what is still open at once.
        self.proxy.end_open_responses();
        self.proxy.stop();
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.task.abort();
    }
}

/// The Anthropic API a Claude Code session would reach without warden:
/// `--base-url` when given, else the CLI's own `ANTHROPIC_BASE_URL`, else
/// the provider's.
fn anthropic_upstream(base_url: Option<&str>) -> String {
    base_url
        .map(str::to_owned)
        .or_else(|| env("ANTHROPIC_BASE_URL"))
        .unwrap_or_else(|| warden_proxy::ANTHROPIC_API.to_owned())
}

/// The Gemini API a Gemini CLI session would reach without warden:
/// `--base-url` when given (its `GOOGLE_GEMINI_BASE_URL`), else the CLI's
/// own `GOOGLE_GEMINI_BASE_URL`, else Google's.
fn gemini_upstream(base_url: Option<&str>) -> String {
    base_url
        .map(str::to_owned)
        .or_else(|| env("GOOGLE_GEMINI_BASE_URL"))
        .map(|url| url.trim_end_matches('/').to_owned())
        .unwrap_or_else(|| warden_proxy::GEMINI_API.to_owned())
}

/// The OpenAI API a Codex session would reach without warden, as the
/// engine's base (its requests' paths start with `/v1`): `--base-url`
/// when given (Codex's provider is that URL with `/v1` added,
/// [`v1_base_url`](crate::sources::v1_base_url)), else
/// `OPENAI_BASE_URL` (which ends in `/v1`), else the provider's.
fn openai_upstream(base_url: Option<&str>) -> String {
    base_url
        .map(str::to_owned)
        .or_else(|| env("OPENAI_BASE_URL"))
        .map(|url| {
            let url = url.trim_end_matches('/');
            url.strip_suffix("/v1").unwrap_or(url).to_owned()
        })
        .unwrap_or_else(|| warden_proxy::OPENAI_API.to_owned())
}

/// A variable of this process's environment, when set and not blank.
fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

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
            let wire = format!("{}/v1/responses", openai_upstream(Some(url)));
            assert_eq!(wire, codex, "{url}");
        }
    }
}
