//! # warden-mock
//!
//! A fault-injecting mock LLM streaming server: it speaks the Anthropic
//! Messages API, the OpenAI-compatible chat completions API, OpenAI's
//! Responses API and Google's Gemini API (`streamGenerateContent`) on
//! `127.0.0.1`, faithfully enough for the official SDKs and the Claude Code
//! CLI, and plays a chosen [`Scenario`] on each request: a normal reply, a
//! long thinking pause kept alive by pings, a stall that holds the socket
//! open forever, an abrupt TCP close, HTTP 429/500/529/400 errors, a
//! mid-stream error event, a malformed or an oversized frame.
//!
//! Tests use it to drive a real client through a fault and then check what
//! the server saw: how many requests reached each path and, above all,
//! whether the client gave up on a stream by closing its connection
//! ([`ServerEvent::ClientClosed`]).
//!
//! # Example
//!
//! "The first attempt stalls; the client gives up on it; the retry
//! succeeds" (here the client is `reqwest`; in a real test it is the code
//! under test, pointed at [`MockServer::base_url`]):
//!
//! ```
//! use std::time::Duration;
//! use warden_mock::{MockConfig, MockServer, Scenario};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let server = MockServer::start(
//!     MockConfig::default().with_sequence([Scenario::Stall, Scenario::Normal]),
//! )
//! .await?;
//! let client = reqwest::Client::new();
//! let request = || {
//!     client
//!         .post(server.url("/v1/messages?beta=true"))
//!         .header("content-type", "application/json")
//!         .body(r#"{"model":"claude-x","max_tokens":64,"stream":true,
//!                  "messages":[{"role":"user","content":"hi"}]}"#)
//!         .send()
//! };
//!
//! // Attempt 1 stalls after a few frames; a watchdog would drop it.
//! let mut first = request().await?;
//! assert!(first.chunk().await?.is_some());
//! drop(first);
//! // The server saw the client close request 1's connection mid-stream.
//! assert!(server.wait_for_client_close(1, Duration::from_secs(5)).await);
//!
//! // Attempt 2 plays the next scenario of the sequence: a normal reply.
//! let body = request().await?.text().await?;
//! assert!(body.ends_with("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"));
//! assert_eq!(server.requests_to("/v1/messages"), 2);
//! assert_eq!(server.closed_by_client(), 1);
//! server.shutdown().await;
//! # Ok(())
//! # }
//! ```
//!
//! # Endpoints
//!
//! | request | answer |
//! |---|---|
//! | `POST /v1/messages` (any query, e.g. `?beta=true`) | Anthropic Messages: SSE when `"stream": true`, else one JSON message |
//! | `POST /v1/chat/completions` | OpenAI chunks, usage chunk with `stream_options.include_usage`, `data: [DONE]`; JSON when not streaming |
//! | `POST /v1/responses` | OpenAI Responses API: typed events numbered by `sequence_number`, ending `response.completed`; JSON when not streaming. With `"background": true` the response is kept |
//! | `GET /v1/responses/{id}?stream=true&starting_after=N` | a kept response's events after `N` again (re-attach; nothing generated twice); without `stream`, its JSON; unknown or not kept: 404 |
//! | `POST /v1beta/models/<model>:streamGenerateContent?alt=sse` | Google's Gemini API: `data:` chunks, the last with `finishReason: "STOP"` and `usageMetadata`; `:generateContent` gives one JSON response. The model (and a `mock-NAME` scenario) comes from the path |
//! | `POST /v1/messages/count_tokens` | `{"input_tokens": N}` |
//! | `GET /v1/models` | one `mock-NAME` model per scenario (readable by both SDKs) |
//! | `GET /`, `HEAD /` | 200 |
//! | anything else | 404 with an Anthropic-shaped JSON error |
//!
//! Any path prefix before `/v1/…` (or `/v1beta/…`) is accepted, so a base URL such as
//! `http://127.0.0.1:PORT/proxy` works. Unknown request fields (tools,
//! system, metadata, thinking…) are ignored; the model is echoed. Streams
//! are `content-type: text/event-stream` with `cache-control: no-cache`,
//! and each frame is flushed before the next pause.
//!
//! # Choosing a scenario
//!
//! Each request to one of the streaming APIs picks its scenario, in
//! this order:
//! 1. the header `x-mock-scenario: NAME` (an unknown name is a 400);
//! 2. the model: `mock-NAME` (e.g. `mock-stall`) or a name ending in
//!    `:NAME` (e.g. `claude-sonnet-4-5:abrupt-close`);
//! 3. a path prefix `/scenario/NAME/…`, e.g. the base URL
//!    [`MockServer::scenario_base_url`] (an unknown name is a 404);
//! 4. the script of its session, [`MockConfig::scripts`]: a request under
//!    a `/session/KEY/…` path prefix (a session given the base URL
//!    `{base_url}/session/KEY`) plays the next entry of `KEY`'s script, the
//!    last one past its end — so one worker's first attempt stalls,
//!    whichever request comes first (it may come before the `/scenario/`
//!    prefix: `/session/KEY/scenario/NAME/…`);
//! 5. the script [`MockConfig::sequence`]: the n-th request that reaches
//!    this step plays entry n, requests past the end play the last entry;
//! 6. [`MockConfig::default_scenario`] ([`Scenario::Normal`] by default).
//!
//! [`Scenario::all`] lists every scenario with a one-line description.
//!
//! # Continuing a broken reply
//!
//! The Anthropic endpoint continues a partial reply as the real API does:
//! a request ending with the assistant's partial text (a *prefill*) gets
//! the rest of the reply the mock intended, generating only that; a prefill
//! ending in whitespace gets the API's 400 ([`TRAILING_WHITESPACE`]);
//! models of Claude 4.6 and later (`claude-opus-4-8`, …, or any model named
//! `…no-prefill…`) refuse prefill with the API's 400 ([`NO_PREFILL`]) and
//! take a *continuation turn* instead — the partial text as an assistant
//! message, then a user message asking to continue (it must say "continue"
//! and "cut off") — answered with the partial text's last three words
//! repeated, then the rest. The chat-completions and Responses endpoints
//! (no prefill) take the same continuation turn: in `messages`, and in a
//! Responses request's `input` items. [`RequestRecord::continuation`] and
//! [`RequestRecord::output_tokens`] show what each request did and cost.
//!
//! # What a test can check
//!
//! - [`MockServer::requests_to`], [`MockServer::request_counts`] and
//!   [`MockServer::requests`]: requests per path, with scenario, model,
//!   status and [`Outcome`] (never the prompt text);
//! - [`MockServer::closed_by_client`] and
//!   [`MockServer::wait_for_client_close`]: the client closed the
//!   connection while the server was still streaming or holding it;
//! - [`MockServer::events`], [`MockServer::wait_for_event`],
//!   [`MockServer::subscribe`]: the ordered [`ServerEvent`] log.
//!
//! Timing knobs ([`MockConfig::frame_interval`],
//! [`MockConfig::thinking_pause`], [`MockConfig::ping_interval`],
//! [`MockConfig::fault_after_frames`]) default to tens of milliseconds and
//! run on the real clock: sockets do not mix well with a paused tokio
//! clock.
//!
//! # Dependencies and why
//! - `hyper` (HTTP/1.1 server) with `hyper-util` (tokio IO adapter) and
//!   `http-body-util` (bounded request body reads): frame-by-frame
//!   streaming, and a response body dropped as soon as the client leaves.
//! - `tokio`: listener, connection tasks, timers.
//! - `serde_json`: request fields and response frames.
//! - `thiserror`: [`MockError`]; `tracing`: debug events, no subscriber.

mod anthropic;
mod body;
mod config;
mod continuation;
mod error;
mod gemini;
mod handler;
mod journal;
mod openai;
mod reply;
mod responses;
mod route;
mod scenario;
mod script;
mod server;

pub use config::{
    DEFAULT_FAULT_AFTER_FRAMES, DEFAULT_FRAME_INTERVAL, DEFAULT_OVERSIZED_BYTES,
    DEFAULT_PING_INTERVAL, DEFAULT_RETRY_AFTER, DEFAULT_THINKING_PAUSE, MockConfig, TokenUsage,
};
pub use continuation::{NO_PREFILL, TRAILING_WHITESPACE};
pub use error::MockError;
pub use journal::{Endpoint, Outcome, RequestId, RequestRecord, Selection, ServerEvent};
pub use reply::prompt_digest;
pub use scenario::{ParseScenarioError, Scenario};
pub use server::MockServer;

/// The header that selects a scenario for one request: `x-mock-scenario`.
pub const SCENARIO_HEADER: &str = handler::SCENARIO_HEADER;

/// Locks `m`, ignoring poison (each value is changed in one step).
fn util_lock<T>(m: &parking_lot::Mutex<T>) -> parking_lot::MutexGuard<'_, T> {
    m.lock()
}
