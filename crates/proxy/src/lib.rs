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
//! | `POST /v1/messages` or `/v1/chat/completions` without `"stream": true` | sent upstream as a stream, watched, retried and continued like the above; the whole JSON answer assembled from it, within [`ProxyConfig::max_reply_bytes`]; tool input that is not JSON, or an answer that is neither a stream nor JSON, is an error in the provider's shape, never a made-up answer |
//! | `POST /v1beta/models/<model>:streamGenerateContent?alt=sse` (Gemini) | watched; retried, continued and spliced |
//! | `POST /v1beta/models/<model>:generateContent` | sent upstream as `:streamGenerateContent?alt=sse`, watched, retried and continued like the above; one `GenerateContentResponse` assembled from it |
//! | `POST /v1/responses` with `"stream": true` | watched; retried, continued mid-text and spliced |
//! | any other `/v1/…` or `/v1beta/…` request | passed through as it is, bodies streamed both ways |
//! | any other path | sent to [`ProxyConfig::other_upstream`] when set (unwatched); else answered here: `200` for `HEAD /` and `GET /`, `404` otherwise — nothing goes to a host the user did not name |
//!
//! A request goes to the Gemini upstream when its path is under
//! `/v1beta/` (Gemini's, its key in `x-goog-api-key`), to the Anthropic
//! upstream when it carries an `anthropic-version` header (every Anthropic
//! client sends one), else to the OpenAI upstream.
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
//!    through as the upstream sent it, and so is an overloaded one (429,
//!    503, 529), at once: the client's own retries take it up, and the
//!    proxy's on top of them would multiply what the upstream is asked.
//! 2. **Mid-text**: the reply is continued — the request again, with the
//!    partial reply as an assistant message and [`CONTINUE_ASK`] after it —
//!    and the continuation is spliced into the same downstream response:
//!    its `message_start` dropped, what it repeats trimmed by the
//!    [`Stitcher`], its text joined to the open text block (Claude Code
//!    keeps only the last text block), later blocks renumbered, usage
//!    merged. The client receives one well-formed stream.
//! 3. **Neither** (inside a thinking block, whose signature only the model
//!    can write; inside a tool call's input; attempts exhausted; a
//!    Responses stream inside a reasoning item or a tool call): the downstream stream ends with the provider's own
//!    retryable error event (Anthropic `overloaded_error`, OpenAI
//!    `server_error`, Gemini `UNAVAILABLE`), so the client's retry starts
//!    now rather than after its own 5-minute wait. Never a hang, never a
//!    torn event, never a plain close (for which Claude Code 2.1.332 sends
//!    the whole request again, a new reply paid again, and ends the turn
//!    with `API Error: Connection lost mid-response` when 4 tries are cut;
//!    `docs/proxy.md`).
//! 4. **Only streams stall** (every attempt went silent after its head,
//!    before any content: a broken streaming path): the last resort is one
//!    request for the whole answer without a stream, given to the client
//!    as it asked for it — replayed as the provider's events to a stream
//!    ([`WholeFallback`]; by default once the [`RetryPolicy`]'s attempts
//!    are spent, under an agent CLI after the first).
//!
//! ## Privacy and safety
//!
//! Headers (`x-api-key`, `authorization`, `anthropic-version`,
//! `anthropic-beta`, …) are forwarded untouched and never logged or put in
//! spans; neither is prompt or reply text. Request bodies of the watched
//! routes are buffered (a continuation needs them), up to
//! [`ProxyConfig::max_body_bytes`]; an answer assembled for a client that
//! asked for no stream, or read whole in place of a stream, up to
//! [`ProxyConfig::max_reply_bytes`]; everything else is streamed.
//!
//! [`WatchdogActor`]: warden_core::WatchdogActor
//! [`RetryPolicy`]: warden_core::RetryPolicy
//! [`Admission`]: warden_core::Admission
//! [`Stitcher`]: warden_core::continuation::Stitcher
//! [`CONTINUE_ASK`]: warden_llm::CONTINUE_ASK
//!
//! A broken chat-completions stream is continued the same way as an
//! Anthropic one (that API has no resume of its own); the continuation's
//! chunks carry the first attempt's `id`. So is a Responses stream broken
//! mid-text (the request's `input`, the items the client has whole, the
//! partial text as an assistant message, then the ask): the continuation's
//! start is dropped, its message joins the open item (its id and output
//! index), every event is renumbered so `sequence_number` runs on, and
//! `response.completed` carries the first attempt's id, every item and the
//! whole text.
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

mod access;
mod assemble;
mod circuit;
mod client;
mod config;
mod headers;
mod replay;
mod run;
pub mod spans;
mod splice;
mod upstream;

use std::sync::Arc;

use axum::Router;
use axum::extract::{Request, State};
use axum::response::Response;
use axum::routing::post;
use tokio::time::Instant;
use warden_core::{Admission, AdmissionConfig, WatchdogActor, WatchdogConfig};

pub use access::{AccessLog, AccessRecord, ClientPath, Outcome, RecoveryEvent, RecoveryLog};
pub use circuit::CircuitConfig;
pub use config::{
    ANTHROPIC_API, DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_FRAME_BYTES, DEFAULT_MAX_REPLY_BYTES,
    DEFAULT_PROGRESS_TIMEOUT, GEMINI_API, OPENAI_API, ProxyConfig, WHOLE_FALLBACK_DEADLINE,
    WholeFallback,
};
use run::Inner;
use upstream::{Protocol, Upstream};
/// The connection limits of [`ProxyConfig::connections`].
pub use warden_http::Limits;

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

/// A running proxy: its HTTP client, watchdog and shared backoff. Cheap to
/// clone.
#[derive(Clone)]
pub struct Proxy {
    inner: Arc<Inner>,
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
        let other = config.other_upstream.iter();
        for url in [
            &config.anthropic_upstream,
            &config.openai_upstream,
            &config.gemini_upstream,
        ]
        .into_iter()
        .chain(other)
        {
            warden_llm::validate_base_url(url).map_err(|e| ProxyError::Upstream {
                url: url.clone(),
                reason: e.to_string(),
            })?;
        }
        let watchdog_config = WatchdogConfig::default()
            .with_default_timeout(config.timeout)
            .map_err(ProxyError::Timeout)?;
        for (what, d) in [
            ("progress timeout", config.progress_timeout),
            ("deadline", config.deadline),
        ] {
            if let Some(d) = d {
                warden_core::config::validate_timeout(what, d).map_err(ProxyError::Timeout)?;
            }
        }
        let (watchdog, _) = WatchdogActor::spawn(watchdog_config)
            .await
            .map_err(|e| ProxyError::Start(e.to_string()))?;
        let http = reqwest::Client::builder()
            // Redirects are never followed: the key goes only where the
            // user pointed the proxy.
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| ProxyError::Start(e.to_string()))?;
        let upstreams = Arc::new(client::Upstreams::new().map_err(ProxyError::Start)?);
        let circuits = [
            circuit::Circuit::new(config.circuit),
            circuit::Circuit::new(config.circuit),
            circuit::Circuit::new(config.circuit),
        ];
        Ok(Self {
            inner: Arc::new(Inner {
                config,
                http,
                upstreams,
                watchdog,
                admission: Admission::new(AdmissionConfig::default()),
                stopping: tokio_util::sync::CancellationToken::new(),
                circuits,
            }),
        })
    }

    /// The proxy as an axum [`Router`]: the streaming routes watched,
    /// every other path and method passed through.
    pub fn router(&self) -> Router {
        Router::new()
            .route("/v1/messages", post(messages).fallback(passthrough))
            .route(
                "/v1/chat/completions",
                post(chat_completions).fallback(passthrough),
            )
            .route("/v1/responses", post(responses).fallback(passthrough))
            .route("/v1beta/models/{call}", post(gemini).fallback(passthrough))
            .fallback(passthrough)
            .with_state(self.clone())
    }

    /// Serves the proxy on `listener` within
    /// [`ProxyConfig::connections`] until `shutdown` completes, then until
    /// the open responses have finished (idle connections and half-read
    /// request heads are closed at once). Dropping the future closes every
    /// connection still open; [`Proxy::end_open_responses`] first ends
    /// the watched ones with the provider's error event. Sockets get
    /// `TCP_NODELAY`. See [`warden_http`].
    pub async fn serve(
        &self,
        listener: tokio::net::TcpListener,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        let limits = self.inner.config.connections.clone();
        warden_http::serve(listener, self.router(), limits, shutdown).await
    }

    /// Ends every watched response still open — the stream with the
    /// provider's error event, a response not yet started with its error
    /// answer — and retries nothing from now on: the last step of a
    /// shutdown whose grace period is over. Responses passed through
    /// unwatched are not touched.
    pub fn end_open_responses(&self) {
        self.inner.stopping.cancel();
    }

    /// Stops the proxy's watchdog (streams still open are no longer
    /// watched).
    pub fn stop(&self) {
        self.inner.watchdog.actor().stop(None);
    }
}

/// `POST /v1/messages`.
async fn messages(State(proxy): State<Proxy>, request: Request) -> Response {
    watched(proxy, Protocol::Messages, request).await
}

/// `POST /v1/chat/completions`.
async fn chat_completions(State(proxy): State<Proxy>, request: Request) -> Response {
    watched(proxy, Protocol::ChatCompletions, request).await
}

/// `POST /v1/responses`.
async fn responses(State(proxy): State<Proxy>, request: Request) -> Response {
    watched(proxy, Protocol::Responses, request).await
}

/// `POST /v1beta/models/<model>:<action>`: watched when it generates
/// content (`:streamGenerateContent?alt=sse`, `:generateContent`), else
/// passed through.
async fn gemini(state: State<Proxy>, request: Request) -> Response {
    if upstream::GeminiCall::of(request.uri()) == upstream::GeminiCall::Other {
        return passthrough(state, request).await;
    }
    watched(state.0, Protocol::Gemini, request).await
}

/// A request on a watched route: watched when it goes to the upstream that
/// speaks the route's protocol, else passed through (an OpenAI-compatible
/// server may serve `/v1/messages` too).
async fn watched(proxy: Proxy, protocol: Protocol, request: Request) -> Response {
    let started = Instant::now();
    let upstream = Upstream::of(request.uri().path(), request.headers());
    let record = run::new_record(upstream, &request);
    if upstream == protocol.upstream() {
        run::watched(proxy.inner, protocol, request, record, started).await
    } else {
        let base = run::base_of(&proxy.inner, upstream).to_owned();
        run::passthrough(proxy.inner, upstream, base, request, record, started).await
    }
}

/// Every other request: an API path is passed through as it is to its
/// upstream; any other path to the `other_upstream` if one is configured,
/// else answered here.
async fn passthrough(State(proxy): State<Proxy>, request: Request) -> Response {
    let started = Instant::now();
    let upstream = Upstream::of(request.uri().path(), request.headers());
    let record = run::new_record(upstream, &request);
    let base = if upstream::is_api_path(request.uri().path()) {
        run::base_of(&proxy.inner, upstream).to_owned()
    } else {
        match &proxy.inner.config.other_upstream {
            Some(base) => base.clone(),
            None => return run::local(&proxy.inner, upstream, &request, record, started),
        }
    };
    run::passthrough(proxy.inner, upstream, base, request, record, started).await
}
