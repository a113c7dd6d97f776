//! The adapters a library user puts under the wire in a line
//! ([`WiredSourceFactory`]), and how each one's CLI is pointed at it
//! ([`WireAdapter`]): the same variable or configuration the `warden`
//! binary sets.

use std::ffi::OsString;
use std::sync::Arc;

use warden_claude::{AgentCli, ClaudeOptions, CliSource, CodexOptions, GeminiOptions};
use warden_core::{EventSource, SessionKey, SourceFactory};
use warden_proxy::ProxyConfig;

use crate::layer::WireLayer;
use crate::options::{WireError, WireOptions};
use crate::upstream::{anthropic_upstream, gemini_upstream, openai_upstream};

/// An agent CLI whose model traffic the wire layer can carry.
pub trait WireAdapter: AgentCli + Clone {
    /// `config` with this CLI's upstream set to what it would reach
    /// without the wire (its options, else its environment, else the
    /// provider's API); `None` when the wire cannot carry its traffic
    /// (Codex signed in to ChatGPT: the engine does not speak its backend).
    fn upstream(&self, config: ProxyConfig) -> Option<ProxyConfig>;

    /// Itself with its model requests sent to the wire at `url`.
    fn through_wire(self, url: &str) -> Self;
}

/// The last value of `name` in `env`.
fn env_value(env: &[(OsString, OsString)], name: &str) -> Option<String> {
    env.iter()
        .rev()
        .find(|(k, _)| k == name)
        .and_then(|(_, v)| v.to_str())
        .filter(|v| !v.trim().is_empty())
        .map(str::to_owned)
}

/// Claude Code's base URL variable.
const ANTHROPIC_BASE_URL: &str = "ANTHROPIC_BASE_URL";

/// Claude Code reaches the wire through `ANTHROPIC_BASE_URL`.
impl WireAdapter for ClaudeOptions {
    fn upstream(&self, config: ProxyConfig) -> Option<ProxyConfig> {
        let configured = env_value(&self.env, ANTHROPIC_BASE_URL);
        Some(config.with_anthropic_upstream(anthropic_upstream(configured.as_deref())))
    }

    fn through_wire(mut self, url: &str) -> Self {
        self.env.retain(|(k, _)| k != ANTHROPIC_BASE_URL);
        self.with_env(ANTHROPIC_BASE_URL, url)
    }
}

/// Codex reaches the wire through its provider's `base_url` (the wire
/// plus `/v1`), when it uses an API key ([`CodexOptions::base_url`] set,
/// or [`CodexOptions::api_key_env`] in the environment).
impl WireAdapter for CodexOptions {
    fn upstream(&self, config: ProxyConfig) -> Option<ProxyConfig> {
        let by_key = self.base_url.is_some()
            || env_value(&self.env, &self.api_key_env).is_some()
            || std::env::var_os(&self.api_key_env).is_some_and(|v| !v.is_empty());
        by_key.then(|| config.with_openai_upstream(openai_upstream(self.base_url.as_deref())))
    }

    fn through_wire(self, url: &str) -> Self {
        self.with_base_url(format!("{url}/v1"))
    }
}

/// Gemini CLI reaches the wire through `GOOGLE_GEMINI_BASE_URL`; with its
/// own retries off ([`GeminiOptions::max_attempts`] 1, the default) the
/// wire retries an overloaded answer itself.
impl WireAdapter for GeminiOptions {
    fn upstream(&self, config: ProxyConfig) -> Option<ProxyConfig> {
        Some(
            config
                .with_gemini_upstream(gemini_upstream(self.base_url.as_deref()))
                .with_gemini_client_retries(self.max_attempts > 1),
        )
    }

    fn through_wire(self, url: &str) -> Self {
        self.with_base_url(url)
    }
}

/// A [`SourceFactory`] running the CLI `A` under a wire layer of its own:
/// one [`CliSource`] pointed at the wire, and for each session that source
/// on the session's own route ([`WireLayer::session_source`]), whose
/// process is ended and route removed when the session's source is
/// dropped. The wire stops when the factory and every source it made are
/// dropped. With the wire off ([`WireOptions::off`], or a CLI the wire
/// cannot carry) each session gets a plain source of its own, as from
/// [`CliSourceFactory`](warden_claude::CliSourceFactory).
#[derive(Debug)]
pub struct WiredSourceFactory<A: AgentCli> {
    cli: A,
    wired: Option<(WireLayer, Arc<CliSource<A>>)>,
}

impl<A: WireAdapter> WiredSourceFactory<A> {
    /// Starts the wire for `cli` (unless `options` turn it off or the wire
    /// cannot carry it): its upstream is what `cli` would reach without
    /// it. Must run on a tokio runtime.
    pub async fn start(cli: A, options: WireOptions) -> Result<Self, WireError> {
        let config = ProxyConfig::under_agent_cli(options.stream_timeout);
        let Some(config) = options.enabled.then(|| cli.upstream(config)).flatten() else {
            return Ok(Self { cli, wired: None });
        };
        let wire = WireLayer::start(config).await?;
        let source = Arc::new(CliSource::new(cli.clone().through_wire(wire.url())));
        source.set_per_session(wire.per_session());
        Ok(Self {
            cli,
            wired: Some((wire, source)),
        })
    }

    /// The wire, when it runs.
    pub fn wire(&self) -> Option<&WireLayer> {
        self.wired.as_ref().map(|(wire, _)| wire)
    }

    /// The one source of every session under the wire, when it runs.
    pub fn source(&self) -> Option<&Arc<CliSource<A>>> {
        self.wired.as_ref().map(|(_, source)| source)
    }
}

impl<A: WireAdapter> SourceFactory for WiredSourceFactory<A> {
    fn source_for(&self, key: &SessionKey) -> Arc<dyn EventSource> {
        match &self.wired {
            Some((wire, source)) => {
                let ends = Arc::clone(source);
                let end = Arc::new(move |key: &SessionKey| ends.end_session(key));
                wire.session_source(key, Arc::clone(source) as Arc<dyn EventSource>, end)
            }
            None => Arc::new(CliSource::new(self.cli.clone())),
        }
    }
}
