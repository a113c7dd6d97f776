//! # warden-proxy
//!
//! A local proxy that speaks the providers' own APIs and gives every client
//! behind it — Claude Code, the official SDKs, anything that takes a base
//! URL — warden's watchdog, retries, shared backoff and continuation,
//! without a line of their code changed:
//!
//! ```sh
//! warden proxy &                                   # listens on 127.0.0.1:8787
//! ANTHROPIC_BASE_URL=http://127.0.0.1:8787 claude
//! ```
//!
//! | request | what the proxy does |
//! |---|---|
//! | `POST /v1/messages` with `"stream": true` | watched; retried, continued and spliced |
//! | `POST /v1/chat/completions` with `"stream": true` | watched; retried, continued and spliced |
//! | `POST /v1/responses` with `"stream": true` | watched; retried until the first byte |
//! | anything else | passed through as it is, bodies streamed both ways |
//!
//! A request goes to the Anthropic upstream when it carries an
//! `anthropic-version` header (every Anthropic client sends one), else to
//! the OpenAI upstream.
//!
//! ## What happens when an upstream stream breaks
//!
//! Every upstream attempt is watched by a [`WatchdogActor`]
//! (`warden_core`): each complete SSE frame (pings and comments included)
//! is a heartbeat, and silence past [`ProxyConfig::timeout`] kills the
//! attempt. A killed, closed-early or failed attempt (connection error,
//! retryable status, malformed or oversized frame, a retryable `error`
//! event) is then handled by how far the client already is:
//!
//! 1. **Nothing forwarded yet**: the request is sent again after a backoff
//!    ([`RetryPolicy`]; `retry-after` honoured, and a 429's wait is shared
//!    by every request to that upstream through [`Admission`]). The
//!    client's response head is held until the first event is ready, so it
//!    sees only a later first byte. A non-retryable error answer is passed
//!    through as the upstream sent it.
//! 2. **Mid-text**: the reply is continued — the request again, with the
//!    partial reply as an assistant message and [`CONTINUE_ASK`] after it —
//!    and the continuation is spliced into the same downstream response:
//!    its `message_start` dropped, what it repeats trimmed by the
//!    [`Stitcher`], its text joined to the open text block (Claude Code
//!    keeps only the last text block), later blocks renumbered, usage
//!    merged. The client receives one well-formed stream.
//! 3. **Neither** (inside a thinking block, whose signature only the model
//!    can write; inside a tool call's input; attempts exhausted; a
//!    Responses stream): the downstream stream ends with the provider's own
//!    retryable error event (Anthropic `overloaded_error`, OpenAI
//!    `server_error`), so the client's retry starts now rather than after
//!    its own 5-minute wait. Never a hang, never a torn event, never a plain
//!    close (which Claude Code takes as an empty success).
//!
//! ## Privacy and safety
//!
//! Headers (`x-api-key`, `authorization`, `anthropic-version`,
//! `anthropic-beta`, …) are forwarded untouched and never logged or put in
//! spans; neither is prompt or reply text. Request bodies of the watched
//! routes are buffered (a continuation needs them), up to
//! [`ProxyConfig::max_body_bytes`]; everything else is streamed.
//!
//! [`WatchdogActor`]: warden_core::WatchdogActor
//! [`RetryPolicy`]: warden_core::RetryPolicy
//! [`Admission`]: warden_core::Admission
//! [`Stitcher`]: warden_core::continuation::Stitcher
//! [`CONTINUE_ASK`]: warden_llm::CONTINUE_ASK
//!
//! A broken chat-completions stream is continued the same way as an
//! Anthropic one (that API has no resume of its own); the continuation's
//! chunks carry the first attempt's `id`. A Responses stream is retried
//! until its first byte and ended with an `error` event after that.
//!
//! ## Use
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use warden_proxy::{Proxy, ProxyConfig};
//! let proxy = Proxy::start(ProxyConfig::default()).await?;
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8787").await?;
//! proxy.serve(listener, std::future::pending()).await?;
//! # Ok(()) }
//! ```

mod anthropic;
mod chat;
mod headers;
mod responses;
mod run;
pub mod spans;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use tokio::time::Instant;
use warden_core::{
    Admission, AdmissionConfig, ConfigError, RetryPolicy, WatchdogActor, WatchdogConfig,
};

/// Where the proxy sends Anthropic requests by default.
pub const ANTHROPIC_API: &str = "https://api.anthropic.com";
/// Where the proxy sends OpenAI requests by default.
pub const OPENAI_API: &str = "https://api.openai.com";
/// Largest request body of a watched route: 32 MiB (Claude Code's requests
/// are ~100 KB; the API's own limit is 32 MB).
pub const DEFAULT_MAX_BODY_BYTES: usize = 32 * 1024 * 1024;
/// Largest single SSE event accepted from an upstream: 16 MiB.
pub const DEFAULT_MAX_FRAME_BYTES: usize = 16 * 1024 * 1024;

/// One proxied request, as the access log reports it (no headers, no
/// bodies).
#[derive(Debug, Clone, serde::Serialize)]
#[non_exhaustive]
pub struct AccessRecord {
    /// `anthropic` or `openai`.
    pub upstream: &'static str,
    /// The request method.
    pub method: String,
    /// The request path (no query string).
    pub path: String,
    /// The status the client got.
    pub status: u16,
    /// From the request to the end of the response body, in milliseconds.
    pub duration_ms: u64,
    /// Upstream attempts made (1 when nothing went wrong).
    pub attempts: u32,
    /// Attempts the watchdog killed.
    pub kills: u32,
    /// Continuations spliced into the response.
    pub continuations: u32,
    /// How the response ended: `complete`, `passthrough`, `upstream_error`
    /// (an upstream error answer passed on), `error_event` (ended with the
    /// provider's retryable error event), `client_gone`.
    pub outcome: &'static str,
}

/// Called once per request when its response has ended.
pub type AccessLog = Arc<dyn Fn(&AccessRecord) + Send + Sync>;

/// How the proxy behaves.
#[derive(Clone)]
#[non_exhaustive]
pub struct ProxyConfig {
    /// Base URL of the Anthropic API. Default [`ANTHROPIC_API`].
    pub anthropic_upstream: String,
    /// Base URL of the OpenAI API. Default [`OPENAI_API`].
    pub openai_upstream: String,
    /// Silence allowed on an upstream stream (and before its first byte)
    /// before the attempt is killed. Default 45 s; [`ProxyConfig::from_env`]
    /// takes `WARDEN_STREAM_TIMEOUT` (milliseconds) instead when it is set.
    pub timeout: Duration,
    /// Attempts per request (the first included) and backoff between them.
    /// Default [`RetryPolicy::default`].
    pub retry: RetryPolicy,
    /// Largest request body of a watched route. Default
    /// [`DEFAULT_MAX_BODY_BYTES`].
    pub max_body_bytes: usize,
    /// Largest SSE event accepted from an upstream. Default
    /// [`DEFAULT_MAX_FRAME_BYTES`].
    pub max_frame_bytes: usize,
    /// Called once per request with its [`AccessRecord`]. Default none.
    pub access_log: Option<AccessLog>,
}

impl std::fmt::Debug for ProxyConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProxyConfig")
            .field("anthropic_upstream", &self.anthropic_upstream)
            .field("openai_upstream", &self.openai_upstream)
            .field("timeout", &self.timeout)
            .field("retry", &self.retry)
            .field("max_body_bytes", &self.max_body_bytes)
            .field("max_frame_bytes", &self.max_frame_bytes)
            .field("access_log", &self.access_log.is_some())
            .finish()
    }
}

impl Default for ProxyConfig {
    /// The built-in defaults; the environment is not read (see
    /// [`ProxyConfig::from_env`]).
    fn default() -> Self {
        Self {
            anthropic_upstream: ANTHROPIC_API.to_owned(),
            openai_upstream: OPENAI_API.to_owned(),
            timeout: WatchdogConfig::default().default_timeout,
            retry: RetryPolicy::default(),
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            max_frame_bytes: DEFAULT_MAX_FRAME_BYTES,
            access_log: None,
        }
    }
}

impl ProxyConfig {
    /// The defaults with `WARDEN_STREAM_TIMEOUT` (milliseconds) applied to
    /// [`timeout`](Self::timeout) when it is set. A value that is not a
    /// whole number of milliseconds in `1..=86_400_000` is an error, as it
    /// is for the supervisor: a typo never silently becomes the default.
    pub fn from_env() -> Result<Self, ConfigError> {
        Ok(Self {
            timeout: WatchdogConfig::from_env()?.default_timeout,
            ..Self::default()
        })
    }

    /// Sets [`anthropic_upstream`](Self::anthropic_upstream).
    pub fn with_anthropic_upstream(mut self, url: impl Into<String>) -> Self {
        self.anthropic_upstream = url.into();
        self
    }

    /// Sets [`openai_upstream`](Self::openai_upstream).
    pub fn with_openai_upstream(mut self, url: impl Into<String>) -> Self {
        self.openai_upstream = url.into();
        self
    }

    /// Sets [`timeout`](Self::timeout).
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Sets [`retry`](Self::retry).
    pub fn with_retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// Sets [`max_frame_bytes`](Self::max_frame_bytes).
    pub fn with_max_frame_bytes(mut self, bytes: usize) -> Self {
        self.max_frame_bytes = bytes;
        self
    }

    /// Sets [`access_log`](Self::access_log).
    pub fn with_access_log(mut self, log: impl Fn(&AccessRecord) + Send + Sync + 'static) -> Self {
        self.access_log = Some(Arc::new(log));
        self
    }
}

/// Why the proxy could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProxyError {
    /// An upstream URL is not an `http://` or `https://` URL.
    #[error("invalid upstream URL {url:?}: {reason}")]
    Upstream {
        /// The URL.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The timeout is zero or too large.
    #[error("invalid timeout: {0}")]
    Timeout(warden_core::ConfigError),
    /// The HTTP client or the watchdog could not be built.
    #[error("cannot start the proxy: {0}")]
    Start(String),
}

/// Which API a request is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Upstream {
    Anthropic,
    OpenAi,
}

impl Upstream {
    fn name(self) -> &'static str {
        match self {
            Self::Anthropic => "anthropic",
            Self::OpenAi => "openai",
        }
    }
}

/// A running proxy: its HTTP client, watchdog and shared backoff. Cheap to
/// clone.
#[derive(Clone)]
pub struct Proxy {
    inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) config: ProxyConfig,
    pub(crate) http: reqwest::Client,
    pub(crate) watchdog: warden_core::WatchdogHandle,
    pub(crate) admission: Admission,
}

impl std::fmt::Debug for Proxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proxy")
            .field("config", &self.inner.config)
            .finish()
    }
}

impl Proxy {
    /// Starts the proxy's watchdog and HTTP client.
    pub async fn start(config: ProxyConfig) -> Result<Self, ProxyError> {
        for url in [&config.anthropic_upstream, &config.openai_upstream] {
            warden_llm::validate_base_url(url).map_err(|e| ProxyError::Upstream {
                url: url.clone(),
                reason: e.to_string(),
            })?;
        }
        let watchdog_config = WatchdogConfig::default()
            .with_default_timeout(config.timeout)
            .map_err(ProxyError::Timeout)?;
        let (watchdog, _) = WatchdogActor::spawn(watchdog_config)
            .await
            .map_err(|e| ProxyError::Start(e.to_string()))?;
        let http = reqwest::Client::builder()
            // Redirects are never followed: the key goes only where the
            // user pointed the proxy.
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| ProxyError::Start(e.to_string()))?;
        Ok(Self {
            inner: Arc::new(Inner {
                config,
                http,
                watchdog,
                admission: Admission::new(AdmissionConfig::default()),
            }),
        })
    }

    /// The proxy as an axum [`Router`]: every path and method.
    pub fn router(&self) -> Router {
        Router::new().fallback(handle).with_state(self.clone())
    }

    /// Serves the proxy on `listener` until `shutdown` completes (then
    /// lets open responses finish). Sockets get `TCP_NODELAY`: a stream's
    /// small events go out at once instead of waiting on Nagle's
    /// algorithm for the previous segment's ACK.
    pub async fn serve(
        &self,
        listener: tokio::net::TcpListener,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        use axum::serve::ListenerExt as _;
        let listener = listener.tap_io(|tcp| {
            let _ = tcp.set_nodelay(true);
        });
        axum::serve(listener, self.router())
            .with_graceful_shutdown(shutdown)
            .await
    }

    /// Stops the proxy's watchdog (streams still open are no longer
    /// watched).
    pub fn stop(&self) {
        self.inner.watchdog.actor().stop(None);
    }
}

/// Every request.
async fn handle(State(proxy): State<Proxy>, request: Request) -> Response {
    let started = Instant::now();
    let upstream = if request.headers().contains_key("anthropic-version") {
        Upstream::Anthropic
    } else {
        Upstream::OpenAi
    };
    let watched = request.method() == Method::POST
        && match upstream {
            Upstream::Anthropic => request.uri().path() == "/v1/messages",
            Upstream::OpenAi => matches!(
                request.uri().path(),
                "/v1/chat/completions" | "/v1/responses"
            ),
        };
    let record = AccessRecord {
        upstream: upstream.name(),
        method: request.method().to_string(),
        path: request.uri().path().to_owned(),
        status: 0,
        duration_ms: 0,
        attempts: 1,
        kills: 0,
        continuations: 0,
        outcome: "passthrough",
    };
    if watched {
        run::watched(proxy.inner, upstream, request, record, started).await
    } else {
        run::passthrough(proxy.inner, upstream, request, record, started).await
    }
}

/// A JSON error answer in the provider's shape.
pub(crate) fn error_response(upstream: Upstream, status: StatusCode, message: &str) -> Response {
    let body = match upstream {
        Upstream::Anthropic => serde_json::json!({
            "type": "error",
            "error": {"type": anthropic_error_type(status), "message": message},
        }),
        Upstream::OpenAi => serde_json::json!({
            "error": {"message": message, "type": openai_error_type(status), "param": null, "code": null},
        }),
    };
    let mut response = (status, Body::from(body.to_string())).into_response();
    response.headers_mut().insert(
        axum::http::header::CONTENT_TYPE,
        axum::http::HeaderValue::from_static("application/json"),
    );
    response
}

fn anthropic_error_type(status: StatusCode) -> &'static str {
    match status.as_u16() {
        400 | 413 | 415 => "invalid_request_error",
        429 => "rate_limit_error",
        502 | 504 => "api_error",
        _ => "overloaded_error",
    }
}

fn openai_error_type(status: StatusCode) -> &'static str {
    match status.as_u16() {
        400 | 413 | 415 => "invalid_request_error",
        _ => "server_error",
    }
}
