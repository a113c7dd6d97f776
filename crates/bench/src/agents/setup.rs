//! What section 14's runs share: the agent CLIs (their binaries and
//! sessions' sources, straight to the mock or through the wire layer),
//! the wire layer as `warden chat|serve` put it under them, a supervisor
//! of the CLIs' sessions and the figures' medians.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use warden_claude::{
    AiderOptions, AiderSourceFactory, ClaudeOptions, ClaudeSourceFactory, CodexOptions,
    CodexSourceFactory, GeminiOptions, GeminiSourceFactory, OpenCodeFlavor, OpenCodeOptions,
    OpenCodeSourceFactory, QwenOptions, QwenSourceFactory,
};
use warden_core::{MemoryStore, SourceFactory, Supervisor, SupervisorConfig, WatchdogConfig};
use warden_proxy::{Proxy, ProxyConfig};

/// An agent CLI the section runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Cli {
    ClaudeCode,
    Codex,
    Gemini,
    OpenCode,
    Kilo,
    Qwen,
    Aider,
}

impl Cli {
    /// Every one, in the order the tables list them.
    pub(super) const ALL: [Self; 7] = [
        Self::ClaudeCode,
        Self::Codex,
        Self::Gemini,
        Self::OpenCode,
        Self::Kilo,
        Self::Qwen,
        Self::Aider,
    ];

    /// Those whose stalled turns are measured ([`super::stalled`]).
    pub(super) const STALLED: [Self; 3] = [Self::ClaudeCode, Self::Codex, Self::Gemini];

    /// How many of `turns` it runs each way: the chat-completions CLIs'
    /// turns are slower (a process start each, 3-20 s), so fewer of them
    /// keep each CLI's part to a minute or two (Kilo Code's, 9-20 s a
    /// turn, fewest).
    pub(super) fn turns(self, turns: usize) -> usize {
        match self {
            Self::ClaudeCode | Self::Codex | Self::Gemini => turns,
            Self::OpenCode | Self::Qwen | Self::Aider => turns.min(6),
            Self::Kilo => turns.min(4),
        }
    }

    /// Its name in the tables.
    pub(super) fn name(self) -> &'static str {
        match self {
            Self::ClaudeCode => "claude-code",
            Self::Codex => "codex",
            Self::Gemini => "gemini",
            Self::OpenCode => "opencode",
            Self::Kilo => "kilo-code",
            Self::Qwen => "qwen-code",
            Self::Aider => "aider",
        }
    }

    /// The variable naming its binary.
    fn var(self) -> &'static str {
        match self {
            Self::ClaudeCode => "WARDEN_CLAUDE_BIN",
            Self::Codex => "WARDEN_CODEX_BIN",
            Self::Gemini => "WARDEN_GEMINI_BIN",
            Self::OpenCode => "WARDEN_OPENCODE_BIN",
            Self::Kilo => "WARDEN_KILO_BIN",
            Self::Qwen => "WARDEN_QWEN_BIN",
            Self::Aider => "WARDEN_AIDER_BIN",
        }
    }

    /// Its binary, or why it is skipped.
    pub(super) fn binary(self) -> Result<PathBuf, String> {
        let var = self.var();
        match std::env::var_os(var).filter(|v| !v.is_empty()) {
            Some(bin) if Path::new(&bin).is_file() => Ok(PathBuf::from(bin)),
            Some(bin) => Err(format!("{var}={} is not a file", bin.to_string_lossy())),
            None => Err(format!("{var} is unset")),
        }
    }

    /// The sessions of `bin` whose model requests go to `api` (the mock's
    /// base URL, or the wire layer's in front of it), each in a home of
    /// its own under `base`, as `warden chat --agent` runs them against
    /// `--base-url` (Codex's provider is the URL plus `/v1`; Gemini CLI's
    /// own retries off, `GeminiOptions::max_attempts` 1 by default; the
    /// chat-completions CLIs' provider the URL plus `/v1`, Aider's model
    /// named so it skips its price-map download).
    pub(super) fn factory(
        self,
        bin: &Path,
        api: &str,
        base: &Path,
    ) -> Result<Arc<dyn SourceFactory>, String> {
        let home = base.join("home");
        std::fs::create_dir_all(&home)
            .map_err(|e| format!("cannot create {}: {e}", home.display()))?;
        Ok(match self {
            Self::ClaudeCode => Arc::new(ClaudeSourceFactory::new(
                ClaudeOptions::default()
                    .with_binary(bin)
                    .with_env("ANTHROPIC_BASE_URL", api)
                    .with_env("ANTHROPIC_API_KEY", "dummy")
                    .with_env("DISABLE_TELEMETRY", "1")
                    .with_env("DISABLE_AUTOUPDATER", "1")
                    .with_env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
                    .with_env("HOME", &home)
                    .with_scratch_dir(base.join("scratch")),
            )),
            Self::Codex => Arc::new(CodexSourceFactory::new(
                CodexOptions::default()
                    .with_binary(bin)
                    .with_base_url(format!("{api}/v1"))
                    .with_api_key_env("WARDEN_BENCH_KEY")
                    .with_env("WARDEN_BENCH_KEY", "dummy")
                    .with_env("HOME", &home),
            )),
            Self::Gemini => Arc::new(GeminiSourceFactory::new(
                GeminiOptions::default()
                    .with_binary(bin)
                    .with_model("gemini-2.5-pro")
                    .with_base_url(api)
                    .with_gemini_home(base.join("gemini-home"))
                    .with_env("GEMINI_API_KEY", "dummy")
                    .with_env("HOME", &home),
            )),
            Self::OpenCode | Self::Kilo => {
                let flavor = if self == Self::Kilo {
                    OpenCodeFlavor::Kilo
                } else {
                    OpenCodeFlavor::OpenCode
                };
                Arc::new(OpenCodeSourceFactory::new(
                    OpenCodeOptions::new(flavor)
                        .with_binary(bin)
                        .with_base_url(format!("{api}/v1"))
                        .with_api_key_env("WARDEN_BENCH_KEY")
                        .with_env("WARDEN_BENCH_KEY", "dummy")
                        .with_env("HOME", &home),
                ))
            }
            Self::Qwen => {
                let options = QwenOptions::default()
                    .with_binary(bin)
                    .with_base_url(format!("{api}/v1"))
                    .with_qwen_home(base.join("qwen-home"))
                    .with_env("OPENAI_API_KEY", "dummy")
                    .with_env("HOME", &home);
                options.write_settings().map_err(|e| e.to_string())?;
                Arc::new(QwenSourceFactory::new(options))
            }
            Self::Aider => Arc::new(AiderSourceFactory::new(
                AiderOptions::default()
                    .with_binary(bin)
                    .with_base_url(format!("{api}/v1"))
                    .with_model("mock-model")
                    .with_history_dir(base.join("aider"))
                    .with_env("OPENAI_API_KEY", "dummy")
                    .with_env("HOME", &home),
            )),
        })
    }
}

/// The wire layer in front of `upstream` (every API's), as `warden
/// chat|serve` runs it for `stream_timeout` (`crates/cli/src/wire.rs`):
/// its base URL (the proxy serves until the process ends).
pub(super) async fn wire(upstream: &str, stream_timeout: Duration) -> Result<String, String> {
    let config = ProxyConfig::under_agent_cli(stream_timeout)
        .with_anthropic_upstream(upstream)
        .with_openai_upstream(upstream)
        .with_gemini_upstream(upstream)
        // Gemini CLI's own retries are off, as under warden chat.
        .with_gemini_client_retries(false);
    let proxy = Proxy::start(config).await.map_err(|e| e.to_string())?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| e.to_string())?;
    let url = format!(
        "http://{}",
        listener.local_addr().map_err(|e| e.to_string())?
    );
    tokio::spawn(async move { proxy.serve(listener, std::future::pending()).await });
    Ok(url)
}

/// A supervisor of `factory`'s sessions whose watchdog allows
/// `stream_timeout` of silence.
pub(super) async fn supervisor(
    factory: Arc<dyn SourceFactory>,
    stream_timeout: Duration,
) -> Result<Supervisor, String> {
    let config = SupervisorConfig::default().with_watchdog(
        WatchdogConfig::default()
            .with_default_timeout(stream_timeout)
            .map_err(|e| e.to_string())?,
    );
    Supervisor::builder(factory)
        .config(config)
        .store(Arc::new(MemoryStore::new()))
        .start()
        .await
        .map_err(|e| e.to_string())
}

/// One turn of `message` in `workspace`, to its end (at most 120 s): how
/// long it took.
pub(super) async fn turn(
    sup: &Supervisor,
    workspace: &Path,
    message: &str,
) -> Result<Duration, String> {
    let t0 = std::time::Instant::now();
    let turn = sup
        .send_to_workspace(workspace, message)
        .await
        .map_err(|e| e.to_string())?;
    tokio::time::timeout(Duration::from_secs(120), turn.finish())
        .await
        .map_err(|_| "took over 120 s".to_owned())?
        .map_err(|e| e.to_string())?;
    Ok(t0.elapsed())
}

/// The median of `values` (the upper one of an even count).
pub(super) fn median<T: Ord + Copy + Default>(values: &[T]) -> T {
    let mut sorted = values.to_vec();
    sorted.sort();
    sorted.get(sorted.len() / 2).copied().unwrap_or_default()
}

/// `a ÷ b`, as the tables print a ratio.
pub(super) fn ratio(a: f64, b: f64) -> String {
    if b > 0.0 {
        format!("{:.2}x", a / b)
    } else {
        "n/a".to_owned()
    }
}
