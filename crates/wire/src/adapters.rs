//! The adapters a library user puts under the wire in a line
//! ([`WiredSourceFactory`]), and how each one's CLI is pointed at it
//! ([`WireAdapter`]): the same variable or configuration the `warden`
//! binary sets.

use std::ffi::OsString;
use std::sync::Arc;

use warden_claude::{
    AgentCli, AiderOptions, ClaudeOptions, CliSource, CodexOptions, GeminiOptions, OpenCodeOptions,
    QwenOptions,
};
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
        let configured = env_value(&self.process.env, ANTHROPIC_BASE_URL);
        Some(config.with_anthropic_upstream(anthropic_upstream(configured.as_deref())))
    }

    fn through_wire(mut self, url: &str) -> Self {
        self.process.env.retain(|(k, _)| k != ANTHROPIC_BASE_URL);
        self.with_env(ANTHROPIC_BASE_URL, url)
    }
}

/// Codex reaches the wire through its provider's `base_url` (the wire
/// plus `/v1`), when it uses an API key ([`CodexOptions::base_url`] set,
/// or [`CodexOptions::api_key_env`] in the environment).
impl WireAdapter for CodexOptions {
    fn upstream(&self, config: ProxyConfig) -> Option<ProxyConfig> {
        let by_key = self.base_url.is_some()
            || env_value(&self.process.env, &self.api_key_env).is_some()
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

/// The chat-completions CLIs (OpenCode and Kilo Code, Qwen Code, Aider)
/// reach the wire through the provider warden names for them, their
/// `base_url` (which ends in `/v1`): the wire plus `/v1`. Without one they
/// use the user's own providers, which the wire does not carry.
macro_rules! chat_completions_adapter {
    ($($options:ty),+) => {$(
        impl WireAdapter for $options {
            fn upstream(&self, config: ProxyConfig) -> Option<ProxyConfig> {
                let url = self.base_url.as_deref()?;
                Some(config.with_openai_upstream(openai_upstream(Some(url))))
            }

            fn through_wire(self, url: &str) -> Self {
                self.with_base_url(format!("{url}/v1"))
            }
        }
    )+};
}

chat_completions_adapter!(OpenCodeOptions, QwenOptions, AiderOptions);

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

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> ProxyConfig {
        ProxyConfig::default()
    }

    #[test]
    fn each_adapter_reaches_the_wire_where_the_binary_points_it_and_goes_on_to_its_own_upstream() {
        let wire = "http://127.0.0.1:4000";
        let claude = ClaudeOptions::default().with_env("ANTHROPIC_BASE_URL", "http://mock:1");
        let config = claude.upstream(base()).expect("always carried");
        assert_eq!(config.anthropic_upstream, "http://mock:1");
        let claude = claude.through_wire(wire);
        assert_eq!(
            env_value(&claude.process.env, ANTHROPIC_BASE_URL).as_deref(),
            Some(wire)
        );
        assert_eq!(
            claude
                .process
                .env
                .iter()
                .filter(|(k, _)| k == ANTHROPIC_BASE_URL)
                .count(),
            1,
            "the user's value replaced, not shadowed"
        );

        let codex = CodexOptions::default().with_base_url("http://mock:1/v1");
        let config = codex.upstream(base()).expect("a provider named");
        assert_eq!(config.openai_upstream, "http://mock:1");
        assert_eq!(
            codex.through_wire(wire).base_url.as_deref(),
            Some("http://127.0.0.1:4000/v1")
        );
        let signed_in = CodexOptions::default().with_api_key_env("WARDEN_WIRE_TEST_NO_SUCH_KEY");
        assert!(
            signed_in.upstream(base()).is_none(),
            "a ChatGPT sign-in is not carried"
        );

        let gemini = GeminiOptions::default().with_base_url("http://mock:2/");
        let config = gemini.upstream(base()).expect("always carried");
        assert_eq!(config.gemini_upstream, "http://mock:2");
        assert!(!config.gemini_client_retries, "its own retries are off");
        assert_eq!(gemini.through_wire(wire).base_url.as_deref(), Some(wire));

        let qwen = QwenOptions::default();
        assert!(qwen.upstream(base()).is_none(), "the user's own providers");
        let qwen = qwen.with_base_url("http://mock:3/v1");
        assert_eq!(
            qwen.upstream(base()).expect("named").openai_upstream,
            "http://mock:3"
        );
        assert_eq!(
            qwen.through_wire(wire).base_url.as_deref(),
            Some("http://127.0.0.1:4000/v1")
        );
    }
}
