//! `warden stream`: a watchdog-protected streaming client for one request.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use warden_core::{
    EventSource, EventStream, RetryPolicy, SessionConfig, SessionKey, StreamError, Supervisor,
    SupervisorConfig, TurnRequest, WatchdogConfig,
};

use crate::exit::{CliError, Exit};
use crate::input::{MAX_INPUT_BYTES, read_bounded};
use crate::relay::relay;
use crate::sources::{HttpSettings, HttpSource, Provider, check_url};

/// Arguments of `warden stream`.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Text deltas go to stdout as they arrive. When the stream is silent for longer than
--timeout, the watchdog kills it and stderr says \"Connection lost during streaming.
Retrying...\". A reply that broke mid-text is continued where it stopped (Anthropic by
prefill or a continuation turn, the Responses API by re-attaching; not with --body): stdout
just goes on and stderr says \"continuing\". Otherwise the request starts over and its text
is printed again from the start.
API keys come from ANTHROPIC_API_KEY / OPENAI_API_KEY (none is sent when unset).

Examples:
  warden stream http://127.0.0.1:8080/v1/messages --timeout 2000
  warden stream https://api.openai.com/v1/chat/completions --body request.json")]
pub(crate) struct StreamArgs {
    /// The endpoint: a full URL (`…/v1/messages`, `…/v1/chat/completions`,
    /// `…/v1/responses`) or a base URL the provider's path is appended to.
    url: String,
    /// The wire protocol. Default: taken from the URL's path, else anthropic.
    #[arg(long, value_enum)]
    provider: Option<Provider>,
    /// A JSON request body to send as is (`"stream": true` is set for you),
    /// at most 32 MiB.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["message", "model"])]
    body: Option<PathBuf>,
    /// The user message, when no --body is given.
    #[arg(long, default_value = "Hello")]
    message: String,
    /// The model, when no --body is given.
    #[arg(long)]
    model: Option<String>,
    /// Silence allowed on the stream before it is killed: milliseconds, or
    /// a duration with a unit (45s). Default: WARDEN_STREAM_TIMEOUT, else
    /// 45000.
    #[arg(long, value_name = "MS", value_parser = crate::units::millis)]
    timeout: Option<Duration>,
    /// Retries after a failed attempt (timeouts, connection errors, 429/5xx),
    /// at most 100.
    #[arg(long, value_name = "N", default_value_t = 3,
          value_parser = clap::value_parser!(u32).range(..=i64::from(MAX_RETRIES)))]
    retries: u32,
}

/// The most `--retries` accepted: with backoff capped at a few seconds, 100
/// retries already wait out minutes of outage; more is a usage error.
pub(crate) const MAX_RETRIES: u32 = 100;

/// The request to replay on every attempt.
struct StreamSource {
    http: HttpSource,
    inner: Arc<dyn EventSource>,
    body: Option<Arc<Vec<u8>>>,
    provider: &'static str,
}

impl EventSource for StreamSource {
    fn open(&self, request: TurnRequest) -> BoxFuture<'static, Result<EventStream, StreamError>> {
        match &self.body {
            Some(body) => self.http.open_body(body.as_ref().clone(), request),
            None => self.inner.open(request),
        }
    }

    fn provider(&self) -> &str {
        self.provider
    }

    /// A body given as is cannot be turned into a continuation.
    fn continues(&self) -> bool {
        self.body.is_none() && self.inner.continues()
    }

    fn restarts_repeat_tool_calls(&self) -> bool {
        self.inner.restarts_repeat_tool_calls()
    }

    fn tools_run_in_stream(&self) -> bool {
        self.inner.tools_run_in_stream()
    }
}

/// Runs `warden stream`.
pub(crate) async fn run(args: StreamArgs) -> Result<Exit, CliError> {
    check_url(&args.url)?;
    let provider = args
        .provider
        .or_else(|| Provider::from_url(&args.url))
        .unwrap_or(Provider::Anthropic);
    let timeout = match args.timeout {
        Some(t) => warden_core::config::validate_timeout("--timeout", t)
            .map_err(|e| CliError::usage(e.to_string()))?,
        None => warden_core::config::stream_timeout_from_env()
            .map_err(|e| CliError::usage(e.to_string()))?,
    };
    let body = args
        .body
        .as_deref()
        .map(|path| read_body(path, provider))
        .transpose()?;
    let http = HttpSource::new(
        provider,
        HttpSettings {
            base_url: Some(args.url.clone()),
            model: args.model,
            transcripts: None,
            conversations: None,
        },
    )?;
    let source: Arc<dyn EventSource> = Arc::new(StreamSource {
        inner: http.clone().into_source(),
        http,
        body: body.map(Arc::new),
        provider: provider.api().name,
    });
    let config = SupervisorConfig::default()
        .with_watchdog(
            WatchdogConfig::default()
                .with_default_timeout(timeout)
                .map_err(|e| CliError::usage(e.to_string()))?,
        )
        .with_session(
            SessionConfig::default()
                .with_retry(
                    RetryPolicy::default().with_max_attempts(args.retries.saturating_add(1)),
                )
                .with_idle_timeout(Duration::ZERO),
        );
    let factory = move |_: &SessionKey| source.clone();
    let supervisor = Supervisor::builder(Arc::new(factory))
        .config(config)
        .start()
        .await?;
    let result = async {
        let turn = supervisor.send("stream", args.message).await?;
        relay(turn, crate::relay::Piped::Live).await
    }
    .await;
    supervisor.shutdown().await;
    let relayed = result?;
    if relayed.line_open {
        println!();
    }
    Ok(Exit::Ok)
}

/// Reads a request body: a JSON object, made to ask for a stream.
fn read_body(path: &Path, provider: Provider) -> Result<Vec<u8>, CliError> {
    let shown = path.display();
    let file = std::fs::File::open(path)
        .map_err(|e| CliError::usage(format!("cannot read --body {shown}: {e}")))?;
    let bytes = read_bounded(file, MAX_INPUT_BYTES, &format!("--body {shown}"))?;
    let mut value: serde_json::Value = serde_json::from_slice(&bytes)
        .map_err(|e| CliError::usage(format!("--body {shown} is not valid JSON: {e}")))?;
    let object = value.as_object_mut().ok_or_else(|| {
        CliError::usage(format!(
            "--body {shown} must be a JSON object (a request body)"
        ))
    })?;
    object.insert("stream".into(), serde_json::Value::Bool(true));
    if provider == Provider::Openai {
        object
            .entry("stream_options")
            .or_insert_with(|| serde_json::json!({ "include_usage": true }));
    }
    serde_json::to_vec(&value).map_err(|e| CliError::failure(e.to_string()))
}
