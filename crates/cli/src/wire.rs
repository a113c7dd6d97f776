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
//! garbage. Under one session (`warden chat`, [`Wire::live`]) its
//! allowance counts the model stream the wire sends the CLI too, so a
//! long thinking stream is not taken for a silent CLI.
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
//! continuation would print the partial text again.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt as _;
use futures_util::future::BoxFuture;
use parking_lot::Mutex;
use tokio::sync::watch;
use warden_core::{Diagnostics, EventSource, EventStream, Frame, StreamError, TurnRequest};
use warden_proxy::{Outcome, Proxy, ProxyConfig, RecoveryEvent};
use warden_serve::Agent;

use crate::exit::CliError;

/// A running wire layer.
pub(crate) struct Wire {
    proxy: Proxy,
    /// What it saw of the model requests it carried.
    seen: Arc<Mutex<Seen>>,
    /// Its silence allowance per attempt.
    allowance: Duration,
    /// Counts the chunks of model streams it sent its CLIs.
    sent: Arc<watch::Sender<u64>>,
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
    /// OpenCode, Kilo Code and Qwen Code when warden names their provider
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
                Agent::OpenCode | Agent::KiloCode | Agent::QwenCode => base_url.is_some(),
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
        let seen = Arc::new(Mutex::new(Seen::default()));
        let (killed, ended) = (Arc::clone(&seen), Arc::clone(&seen));
        let allowance = config.timeout;
        let limits = config.connections.clone();
        let config = config
            // What it did, as `warden proxy` says it: the CLI never sees
            // it, so this line is the only trace of it on the terminal.
            .with_recovery_log(move |recovery| {
                if let RecoveryEvent::Killed { request, .. } = recovery {
                    let mut seen = killed.lock();
                    seen.stalled.insert(*request);
                    seen.kills += 1;
                    seen.stalling = true;
                }
                eprintln!("warden: wire layer: {recovery}");
            })
            .with_access_log(move |record| {
                if record.outcome == Outcome::Complete {
                    let mut seen = ended.lock();
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
        let sent = Arc::new(watch::Sender::new(0_u64));
        let (counted, live) = (Arc::clone(&sent), Arc::clone(&seen));
        // Every chunk a CLI is sent of its model stream is counted (as
        // `Proxy::serve` serves it, within its connection limits), unless
        // an attempt went silent since the last whole reply: a stream the
        // wire is recovering is not live, so the process layer's clock
        // runs (a turn whose every stream stalls still ends on time).
        let app = proxy.router().layer(axum::middleware::map_response(
            move |response: axum::response::Response| {
                let (counted, live) = (Arc::clone(&counted), Arc::clone(&live));
                async move {
                    let (parts, body) = response.into_parts();
                    let body = body.into_data_stream().inspect(move |_| {
                        if !live.lock().stalling {
                            counted.send_modify(|n| *n = n.wrapping_add(1));
                        }
                    });
                    axum::response::Response::from_parts(parts, axum::body::Body::from_stream(body))
                }
            },
        ));
        let task = tokio::spawn(async move {
            warden_http::serve(listener, app, limits, async move {
                let _ = stopped.await;
            })
            .await
        });
        Ok(Self {
            proxy,
            seen,
            allowance,
            sent,
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
        self.seen.lock().every_request_stalled(self.allowance)
    }

    /// `source`, whose attempts are also live while this wire sends their
    /// CLI its model stream: the process layer's silence allowance is then
    /// measured against the CLI's output and its model stream, so a CLI
    /// reading a long reply, or waiting on thinking the wire holds back
    /// (the wire keeps that stream live with a comment per held event),
    /// is not killed as silent. A CLI that hangs on a healthy stream is
    /// still killed once the stream ends. For a wire under one session
    /// (`warden chat`): every chunk counts for it.
    pub(crate) fn live(&self, source: Arc<dyn EventSource>) -> Arc<dyn EventSource> {
        Arc::new(Live {
            inner: source,
            sent: self.sent.subscribe(),
        })
    }
}

/// A CLI's source whose streams also yield liveness
/// ([`Frame::KeepAlive`]) for each chunk the wire sends the CLI.
struct Live {
    inner: Arc<dyn EventSource>,
    sent: watch::Receiver<u64>,
}

impl EventSource for Live {
    fn open(&self, request: TurnRequest) -> BoxFuture<'static, Result<EventStream, StreamError>> {
        let opening = self.inner.open(request);
        let mut sent = self.sent.clone();
        Box::pin(async move {
            let stream = opening.await?;
            sent.mark_unchanged();
            Ok(Box::pin(with_liveness(stream, sent)) as EventStream)
        })
    }

    fn continues(&self) -> bool {
        self.inner.continues()
    }

    fn tools_run_in_stream(&self) -> bool {
        self.inner.tools_run_in_stream()
    }

    fn restarts_repeat_tool_calls(&self) -> bool {
        self.inner.restarts_repeat_tool_calls()
    }

    fn runs_in_workspace(&self) -> bool {
        self.inner.runs_in_workspace()
    }

    fn provider(&self) -> &str {
        self.inner.provider()
    }

    fn context_window(&self, model: Option<&str>) -> Option<u64> {
        self.inner.context_window(model)
    }

    fn fresh_start_note(&self) -> Option<String> {
        self.inner.fresh_start_note()
    }

    fn diagnostics(&self, session_id: &str, workspace: Option<&std::path::Path>) -> Diagnostics {
        self.inner.diagnostics(session_id, workspace)
    }
}

/// `stream`'s items, and a [`Frame::KeepAlive`] whenever `sent` changes,
/// until `stream` ends.
fn with_liveness(
    stream: EventStream,
    sent: watch::Receiver<u64>,
) -> impl futures_util::Stream<Item = Result<Frame, StreamError>> + Send {
    futures_util::stream::unfold((stream, Some(sent)), |(mut stream, mut sent)| async move {
        loop {
            let Some(watching) = sent.as_mut() else {
                let item = stream.next().await?;
                return Some((item, (stream, sent)));
            };
            tokio::select! {
                biased;
                item = stream.next() => return item.map(|item| (item, (stream, sent))),
                changed = watching.changed() => match changed {
                    Ok(()) => return Some((Ok(Frame::KeepAlive), (stream, sent))),
                    // The wire is gone: the CLI's own output only.
                    Err(_) => sent = None,
                },
            }
        }
    })
}

/// What the wire layer saw of the model requests it carried.
#[derive(Debug, Default)]
struct Seen {
    /// Requests with an attempt killed for silence.
    stalled: HashSet<u64>,
    /// Attempts killed for silence.
    kills: u32,
    /// Requests whose reply was whole.
    completed: u32,
    /// An attempt went silent since the last whole reply.
    stalling: bool,
}

impl Seen {
    fn every_request_stalled(&self, allowance: Duration) -> Option<String> {
        (self.completed == 0 && !self.stalled.is_empty()).then(|| {
            format!(
                "wire layer: the model stream stalled on every request of this turn: {} \
                 request(s), {} attempt(s) silent for {:.1}s, each killed and retried or \
                 continued, none completed",
                self.stalled.len(),
                self.kills,
                allowance.as_secs_f64()
            )
        })
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
