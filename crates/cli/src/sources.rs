//! Building the agent a command talks to: an HTTP API (Anthropic or
//! OpenAI-compatible) or the Claude Code CLI.

use std::path::PathBuf;
use std::sync::Arc;

use futures_util::future::BoxFuture;
use warden_core::store::ConversationStore;
use warden_core::{EventSource, EventStream, StreamError, TurnRequest};
use warden_llm::{
    Anthropic, AnthropicSource, Api, BuildError, HttpOptions, OpenAi, OpenAiResponses,
    OpenAiResponsesSource, OpenAiSource, SourceOptions, Transcripts,
};

use warden_claude::{OpenCodeFlavor, OpenCodeOptions};

use crate::exit::CliError;

/// The wire protocol of an HTTP endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Provider {
    /// Anthropic Messages API (`POST /v1/messages`).
    Anthropic,
    /// OpenAI-compatible chat completions (`POST /v1/chat/completions`).
    Openai,
    /// OpenAI's Responses API (`POST /v1/responses`; a broken stream is
    /// re-attached, not replayed).
    OpenaiResponses,
}

impl Provider {
    /// warden-llm's description of this API: endpoint path, variables,
    /// name.
    pub(crate) fn api(self) -> &'static warden_llm::Provider {
        match self {
            Provider::Anthropic => &warden_llm::Provider::ANTHROPIC,
            Provider::Openai => &warden_llm::Provider::OPENAI,
            Provider::OpenaiResponses => &warden_llm::Provider::OPENAI_RESPONSES,
        }
    }

    /// The provider a full endpoint URL names, if it names one.
    pub(crate) fn from_url(url: &str) -> Option<Provider> {
        let path = url.split(['?', '#']).next().unwrap_or(url);
        let path = path.trim_end_matches('/');
        [
            Provider::Anthropic,
            Provider::Openai,
            Provider::OpenaiResponses,
        ]
        .into_iter()
        .find(|p| path.ends_with(p.api().path))
    }

    /// `url` without this provider's endpoint path (and query): the base URL
    /// the sources append the path to.
    pub(crate) fn base_url(self, url: &str) -> String {
        let path = url.split(['?', '#']).next().unwrap_or(url);
        let path = path.trim_end_matches('/');
        path.strip_suffix(self.api().path)
            .unwrap_or(path)
            .to_owned()
    }
}

/// An HTTP source of either protocol.
#[derive(Debug, Clone)]
pub(crate) enum HttpSource {
    Anthropic(AnthropicSource),
    Openai(OpenAiSource),
    OpenaiResponses(OpenAiResponsesSource),
}

/// Settings for [`HttpSource::new`].
#[derive(Debug, Default)]
pub(crate) struct HttpSettings {
    /// Base URL; default the provider's `*_BASE_URL` variable, else its API.
    pub(crate) base_url: Option<String>,
    /// Model; default the source's.
    pub(crate) model: Option<String>,
    /// Keep conversations here (resumable sessions).
    pub(crate) transcripts: Option<Transcripts>,
    /// Or there (a cluster's database); takes precedence.
    pub(crate) conversations: Option<Arc<dyn ConversationStore>>,
}

impl HttpSource {
    /// A source for `provider`; the API key comes from
    /// `ANTHROPIC_API_KEY` / `OPENAI_API_KEY` (none is sent when unset, as a
    /// local server needs none).
    pub(crate) fn new(provider: Provider, settings: HttpSettings) -> Result<Self, CliError> {
        // An empty flag is an error (check_url), never the default
        // endpoint; an empty variable counts as unset.
        let base_url = match settings.base_url {
            Some(url) => Some(url),
            None => std::env::var(provider.api().base_url_env)
                .ok()
                .filter(|u| !u.trim().is_empty()),
        };
        if let Some(url) = &base_url {
            check_url(url)?;
        }
        let key = std::env::var(provider.api().api_key_env).unwrap_or_default();
        let mut http = HttpOptions::default();
        if let Some(t) = settings.transcripts {
            http = http.with_transcripts(t);
        }
        if let Some(c) = settings.conversations {
            http = http.with_conversation_store(c);
        }
        let base = base_url.as_deref().map(|url| provider.base_url(url));
        let built = match provider {
            Provider::Anthropic => {
                build::<Anthropic>(key, http, base, settings.model).map(HttpSource::Anthropic)
            }
            Provider::Openai => {
                build::<OpenAi>(key, http, base, settings.model).map(HttpSource::Openai)
            }
            Provider::OpenaiResponses => build::<OpenAiResponses>(key, http, base, settings.model)
                .map(HttpSource::OpenaiResponses),
        };
        built.map_err(|e| match e {
            BuildError::InvalidBaseUrl { reason } => CliError::usage(format!(
                "invalid URL {:?}: {reason}",
                base_url.unwrap_or_default()
            )),
            other => CliError::failure(other.to_string()),
        })
    }

    /// Sends `body` as is (see `open_body` of the sources).
    pub(crate) fn open_body(
        &self,
        body: Vec<u8>,
        request: TurnRequest,
    ) -> BoxFuture<'static, Result<EventStream, StreamError>> {
        match self {
            HttpSource::Anthropic(s) => s.open_body(body, request),
            HttpSource::Openai(s) => s.open_body(body, request),
            HttpSource::OpenaiResponses(s) => s.open_body(body, request),
        }
    }

    /// As a shared [`EventSource`].
    pub(crate) fn into_source(self) -> Arc<dyn EventSource> {
        match self {
            HttpSource::Anthropic(s) => Arc::new(s),
            HttpSource::Openai(s) => Arc::new(s),
            HttpSource::OpenaiResponses(s) => Arc::new(s),
        }
    }
}

/// A source for the API `P`: its defaults, overridden where given.
fn build<P: Api>(
    key: String,
    http: HttpOptions,
    base_url: Option<String>,
    model: Option<String>,
) -> Result<warden_llm::HttpSource<P>, BuildError> {
    let mut options = SourceOptions::<P>::default()
        .with_api_key(key)
        .with_http(http);
    if let Some(url) = base_url {
        options = options.with_base_url(url);
    }
    if let Some(model) = model {
        options = options.with_model(model);
    }
    warden_llm::HttpSource::new(options)
}

/// A usage error unless `url` is an `http(s)` URL with a host and a
/// non-zero port (an empty string included). Called before anything else
/// runs, so a bad URL neither reads input nor connects anywhere.
pub(crate) fn check_url(url: &str) -> Result<(), CliError> {
    warden_llm::validate_base_url(url).map_err(|e| match e {
        BuildError::InvalidBaseUrl { reason } => {
            CliError::usage(format!("invalid URL {url:?}: {reason}"))
        }
        other => CliError::usage(format!("invalid URL {url:?}: {other}")),
    })?;
    // A plain-HTTP URL without a port is almost always a forgotten port
    // (a local mock, proxy or gateway), not port 80: say so rather than
    // connect to 80. HTTPS without one is the public APIs' 443.
    if let Ok(parsed) = reqwest::Url::parse(url.trim())
        && parsed.scheme() == "http"
        && parsed.port().is_none()
        && !has_explicit_port(url)
    {
        let host = parsed.host_str().unwrap_or("HOST");
        return Err(CliError::usage(format!(
            "invalid URL {url:?}: no port; write http://{host}:PORT (http://{host}:80 if you mean port 80)"
        )));
    }
    Ok(())
}

/// Whether `url`'s authority spells a port (`:80` counts, although the URL
/// parser drops a scheme's default port).
fn has_explicit_port(url: &str) -> bool {
    let rest = url.trim().split_once("://").map_or("", |(_, r)| r);
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let host_port = authority.rsplit('@').next().unwrap_or_default();
    match host_port.rsplit_once(':') {
        // An IPv6 literal's colons are inside brackets.
        Some((host, port)) => !port.is_empty() && !port.contains(']') && !host.is_empty(),
        None => false,
    }
}

/// The `claude` binary: `--claude-bin`, else `WARDEN_CLAUDE_BIN`, else
/// `claude` on `PATH`.
pub(crate) fn claude_binary(flag: Option<PathBuf>) -> Result<PathBuf, CliError> {
    let wanted = flag
        .or_else(|| std::env::var_os("WARDEN_CLAUDE_BIN").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from("claude"));
    which::which(&wanted).map_err(|_| {
        CliError::usage(format!(
            "the Claude Code CLI ({}) was not found; install it (npm install -g @anthropic-ai/claude-code), pass --claude-bin, or use --agent anthropic",
            wanted.display()
        ))
    })
}

/// The `codex` binary: `WARDEN_CODEX_BIN`, else `codex` on `PATH`.
pub(crate) fn codex_binary() -> Result<PathBuf, CliError> {
    let wanted = std::env::var_os("WARDEN_CODEX_BIN")
        .filter(|v| !v.is_empty())
        .map_or_else(|| PathBuf::from("codex"), PathBuf::from);
    which::which(&wanted).map_err(|_| {
        CliError::usage(format!(
            "the Codex CLI ({}) was not found; install it (npm install -g @openai/codex) or set WARDEN_CODEX_BIN",
            wanted.display()
        ))
    })
}

/// The `gemini` binary: `WARDEN_GEMINI_BIN`, else `gemini` on `PATH`.
pub(crate) fn gemini_binary() -> Result<PathBuf, CliError> {
    let wanted = std::env::var_os("WARDEN_GEMINI_BIN")
        .filter(|v| !v.is_empty())
        .map_or_else(|| PathBuf::from("gemini"), PathBuf::from);
    which::which(&wanted).map_err(|_| {
        CliError::usage(format!(
            "the Gemini CLI ({}) was not found; install it (npm install -g @google/gemini-cli) or set WARDEN_GEMINI_BIN",
            wanted.display()
        ))
    })
}

/// The binary of OpenCode (`WARDEN_OPENCODE_BIN`, else `opencode` on
/// `PATH`) or Kilo Code (`WARDEN_KILO_BIN`, else `kilo`).
pub(crate) fn opencode_binary(flavor: OpenCodeFlavor) -> Result<PathBuf, CliError> {
    let (var, package) = match flavor {
        OpenCodeFlavor::Kilo => ("WARDEN_KILO_BIN", "@kilocode/cli"),
        _ => ("WARDEN_OPENCODE_BIN", "opencode-ai"),
    };
    let wanted = std::env::var_os(var)
        .filter(|v| !v.is_empty())
        .map_or_else(|| PathBuf::from(flavor.binary()), PathBuf::from);
    which::which(&wanted).map_err(|_| {
        CliError::usage(format!(
            "the {} CLI ({}) was not found; install it (npm install -g {package}) or set {var}",
            flavor.name(),
            wanted.display()
        ))
    })
}

/// How `--agent opencode|kilo-code` runs the CLI: its binary, `--base-url`
/// (plus `/v1`) as the `baseURL` of a provider `warden` whose key is
/// `OPENAI_API_KEY`, and the model (that provider's, default `gpt-4.1`;
/// without a base URL the CLI's own `provider/model`).
pub(crate) fn opencode_options(
    flavor: OpenCodeFlavor,
    model: Option<String>,
    base_url: Option<String>,
) -> Result<OpenCodeOptions, CliError> {
    let mut options = OpenCodeOptions::new(flavor).with_binary(opencode_binary(flavor)?);
    if let Some(model) = model {
        options = options.with_model(model);
    }
    if let Some(url) = base_url {
        options = options.with_base_url(v1_base_url(&url));
    }
    Ok(options)
}

/// The directory under the data directory that is the Gemini CLI's
/// `GEMINI_CLI_HOME`: its `.gemini/settings.json` (written by warden) and
/// its sessions; the user's own `~/.gemini` is never used.
pub(crate) const GEMINI_HOME: &str = "gemini";

/// How `--agent gemini` runs the CLI: its binary, its own home under
/// `data_dir` ([`GEMINI_HOME`]), `--base-url` as `GOOGLE_GEMINI_BASE_URL`
/// and the model (default `gemini-2.5-pro`).
pub(crate) fn gemini_options(
    data_dir: &std::path::Path,
    model: Option<String>,
    base_url: Option<String>,
) -> Result<warden_claude::GeminiOptions, CliError> {
    let mut options = warden_claude::GeminiOptions::default()
        .with_binary(gemini_binary()?)
        .with_gemini_home(data_dir.join(GEMINI_HOME));
    if let Some(model) = model {
        options = options.with_model(model);
    }
    if let Some(url) = base_url {
        options = options.with_base_url(url.trim_end_matches('/'));
    }
    // Written now, so that a broken data directory is an error here, not
    // at the first turn.
    options.write_settings().map_err(|e| {
        CliError::failure(format!(
            "cannot write the Gemini CLI settings under {}: {e}",
            data_dir.join(GEMINI_HOME).display()
        ))
    })?;
    Ok(options)
}

/// The directory under the data directory that is Qwen Code's
/// `QWEN_HOME`: its `settings.json` (written by warden), its sessions and
/// memories; the user's own `~/.qwen` is never used.
pub(crate) const QWEN_HOME: &str = "qwen";

/// The binary of Qwen Code (`WARDEN_QWEN_BIN`, else `qwen` on `PATH`).
pub(crate) fn qwen_binary() -> Result<PathBuf, CliError> {
    let wanted = std::env::var_os("WARDEN_QWEN_BIN")
        .filter(|v| !v.is_empty())
        .map_or_else(|| PathBuf::from("qwen"), PathBuf::from);
    which::which(&wanted).map_err(|_| {
        CliError::usage(format!(
            "Qwen Code ({}) was not found; install it (npm install -g @qwen-code/qwen-code) or set WARDEN_QWEN_BIN",
            wanted.display()
        ))
    })
}

/// How `--agent qwen-code` runs the CLI: its binary, its own home under
/// `data_dir` ([`QWEN_HOME`]), `--base-url` (plus `/v1`) as
/// `OPENAI_BASE_URL` (the key is `OPENAI_API_KEY`), and the model
/// (default: the CLI's).
pub(crate) fn qwen_options(
    data_dir: &std::path::Path,
    model: Option<String>,
    base_url: Option<String>,
) -> Result<warden_claude::QwenOptions, CliError> {
    let mut options = warden_claude::QwenOptions::default()
        .with_binary(qwen_binary()?)
        .with_qwen_home(data_dir.join(QWEN_HOME));
    if let Some(model) = model {
        options = options.with_model(model);
    }
    if let Some(url) = base_url {
        options = options.with_base_url(v1_base_url(&url));
    }
    // Written now, so that a broken data directory is an error here, not
    // at the first turn.
    options.write_settings().map_err(|e| {
        CliError::failure(format!(
            "cannot write the Qwen Code settings under {}: {e}",
            data_dir.join(QWEN_HOME).display()
        ))
    })?;
    Ok(options)
}

/// The directory under the data directory where Aider's conversations
/// (their chat-history files) are kept; never the workspace.
pub(crate) const AIDER_HISTORY: &str = "aider";

/// The binary of Aider (`WARDEN_AIDER_BIN`, else `aider` on `PATH`).
pub(crate) fn aider_binary() -> Result<PathBuf, CliError> {
    let wanted = std::env::var_os("WARDEN_AIDER_BIN")
        .filter(|v| !v.is_empty())
        .map_or_else(|| PathBuf::from("aider"), PathBuf::from);
    which::which(&wanted).map_err(|_| {
        CliError::usage(format!(
            "Aider ({}) was not found; install it (pip install aider-chat) or set WARDEN_AIDER_BIN",
            wanted.display()
        ))
    })
}

/// How `--agent aider` runs the CLI: its binary, its conversations under
/// `data_dir` ([`AIDER_HISTORY`]), `--base-url` (plus `/v1`) as
/// `OPENAI_API_BASE` (the key is `OPENAI_API_KEY`), and the model
/// (`openai/<model>` under a base URL; default: Aider's).
pub(crate) fn aider_options(
    data_dir: &std::path::Path,
    model: Option<String>,
    base_url: Option<String>,
) -> Result<warden_claude::AiderOptions, CliError> {
    let mut options = warden_claude::AiderOptions::default()
        .with_binary(aider_binary()?)
        .with_history_dir(data_dir.join(AIDER_HISTORY));
    if let Some(model) = model {
        options = options.with_model(model);
    }
    if let Some(url) = base_url {
        options = options.with_base_url(v1_base_url(&url));
    }
    Ok(options)
}

/// The provider base URL of Codex and OpenCode for `url`: they post to
/// `{base}/responses` and `{base}/chat/completions`, so `/v1` is added
/// unless the URL already ends with it.
pub(crate) fn v1_base_url(url: &str) -> String {
    let url = url.trim_end_matches('/');
    if url.ends_with("/v1") {
        url.to_owned()
    } else {
        format!("{url}/v1")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codex_base_urls_end_in_v1_once() {
        assert_eq!(v1_base_url("http://h:1"), "http://h:1/v1");
        assert_eq!(v1_base_url("http://h:1/v1/"), "http://h:1/v1");
        assert_eq!(v1_base_url("http://h:1/p"), "http://h:1/p/v1");
    }

    #[test]
    fn endpoint_urls_name_their_provider_and_base() {
        let url = "http://127.0.0.1:8080/v1/chat/completions";
        assert_eq!(Provider::from_url(url), Some(Provider::Openai));
        assert_eq!(Provider::Openai.base_url(url), "http://127.0.0.1:8080");
        let url = "https://api.anthropic.com/v1/messages?beta=true";
        assert_eq!(Provider::from_url(url), Some(Provider::Anthropic));
        assert_eq!(
            Provider::Anthropic.base_url(url),
            "https://api.anthropic.com"
        );
        assert_eq!(Provider::from_url("http://h/proxy/"), None);
        assert_eq!(
            Provider::Anthropic.base_url("http://h/proxy/"),
            "http://h/proxy"
        );
    }
}
