//! # warden-llm
//!
//! Real [`EventSource`](warden_core::EventSource)s for warden: streaming
//! LLM APIs over HTTP.
//!
//! - [`AnthropicSource`]: the Anthropic Messages API, `POST
//!   {base_url}/v1/messages` with `stream: true`, headers `x-api-key`,
//!   `anthropic-version: 2023-06-01`, `content-type: application/json`.
//! - [`OpenAiSource`]: OpenAI-compatible chat completions, `POST
//!   {base_url}/v1/chat/completions` with `Authorization: Bearer`, `stream:
//!   true` and `stream_options: {include_usage: true}`.
//!
//! Both are one type, [`HttpSource`], parameterised by the [`Api`] it talks
//! to, with [`SourceOptions`] of the same parameter. Where each API is and
//! what a command line reads to configure it (endpoint path, key and
//! base-URL variables, defaults, the provider name) is written once, in
//! [`Provider`].
//!
//! Each [`open`](warden_core::EventSource::open) sends one request (one
//! user message, the turn's `append_system_prompt` as system text) and
//! returns a stream that owns the response body: dropping it closes the
//! connection. With [`HttpOptions::with_transcripts`] the sources keep
//! conversations on disk and resume them by id, like an agent CLI
//! ([`transcript`]); with [`HttpOptions::with_conversation_store`] they keep
//! them in any [`ConversationStore`](warden_core::store::ConversationStore) instead (a cluster's database, so
//! another node can resume them). The Claude Code CLI source (JSON Lines from a child
//! process) lives in its own crate, `warden-claude`.
//!
//! ```no_run
//! use warden_core::{EventSource, SessionKey, TurnRequest};
//! use warden_llm::{AnthropicOptions, AnthropicSource};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let source = AnthropicSource::new(
//!     AnthropicOptions::default()
//!         .with_api_key(std::env::var("ANTHROPIC_API_KEY")?)
//!         .with_model("claude-sonnet-4-5"),
//! )?;
//! let stream = source
//!     .open(TurnRequest::new(SessionKey::new("/work/repo"), 1, "hello"))
//!     .await?;
//! # drop(stream);
//! # Ok(())
//! # }
//! ```
//!
//! # Event mapping
//!
//! | Anthropic | OpenAI | [`AgentEvent`](warden_core::AgentEvent) |
//! | --- | --- | --- |
//! | `text_delta` | `delta.content` | `TextDelta` |
//! | `thinking_delta` | `delta.reasoning_content` | `ThinkingDelta` |
//! | `content_block_start` of a `tool_use` block | first `delta.tool_calls[i]` (with `id` / `name`) | `ToolUseStarted` |
//! | `input_json_delta` | `tool_calls[i].function.arguments` | `ToolInputDelta` |
//! | `content_block_stop` of a tool block | `finish_reason` (or `[DONE]`) for open calls | `ToolUseFinished` |
//! | `message_start` / `message_delta` usage | the `usage` chunk | `Usage` |
//! | `message_delta.stop_reason` | `finish_reason` | `Stop` |
//! | `message_stop` | `data: [DONE]` | `TurnComplete`, then the stream ends |
//!
//! `message_delta` usually reports only `output_tokens`: its `Usage`
//! keeps the input and cache fields of `message_start`, so the last
//! `Usage` of a turn gives the context in use. OpenAI's `prompt_tokens` →
//! `input_tokens`, `completion_tokens` → `output_tokens`.
//!
//! # Liveness
//!
//! The watchdog must be fed from *raw* frames, pings and `: keep-alive`
//! comments included, and only from *complete* frames: the [`sse`] parser
//! (written here to the HTML Standard: CR/LF/CRLF line ends, a leading BOM)
//! reports comment lines and data-less events as
//! [`Frame::KeepAlive`](warden_core::Frame), and every parsed event yields at
//! least one frame (`ping`, `signature_delta`, `citations_delta`, text block
//! starts and anything unknown become `KeepAlive`). A partial line or bare
//! blank lines are not life: a server trickling bytes without completing a
//! frame is killed at the allowance like a silent one. See [`decode`].
//!
//! # Errors
//!
//! | What happened | [`StreamError`](warden_core::StreamError) | Retryable |
//! | --- | --- | --- |
//! | Connect, send or body read failed | `Connection` | yes |
//! | Non-2xx with `x-should-retry: true` | `Api { status, .. }` | yes |
//! | 401, 403 | `Unauthorized` | no |
//! | 400 saying the prompt is too long (or `context_length_exceeded`) | `ContextOverflow { reason: "prompt_too_long" }` | no (resume-failure path) |
//! | 408, 409, 429, ≥ 500 without `x-should-retry: false` | `Api { status, .. }` | yes |
//! | Any other non-2xx, or a retryable status with `x-should-retry: false` | `Api { status, .. }` | no |
//! | `event: error` (or an OpenAI `{"error": ..}` chunk) of kind `overloaded_error`, `api_error`, `rate_limit_error`, `timeout_error`, `server_error`, `rate_limit_exceeded` | `Api { status: None, .. }` | yes |
//! | `event: error` of any other kind | `Api { status: None, .. }` | no |
//! | Body ended before `message_stop` / `[DONE]` | `Truncated` | yes |
//! | One SSE event over [`HttpOptions::max_frame_bytes`] | `FrameTooLarge` | no |
//! | A 3xx (never followed) | `Api { kind: "redirect", .. }`, the message names the `Location` | no |
//! | A 2xx with a `content-type` other than `text/event-stream`, a `content-encoding` other than `identity`, or a gzip body | `Api { kind: NOT_AN_EVENT_STREAM, .. }` (wrong endpoint, content type or compression) | no |
//! | Invalid JSON in `data:`, invalid UTF-8 | `Malformed` (serde's message, quoted input redacted, never the frame) | no |
//!
//! `retry_after` of an `Api` error comes from `retry-after-ms`, else
//! `retry-after` (seconds or an HTTP date), capped at
//! [`HttpOptions::max_retry_after`]. Redirects are not followed (the key
//! must not go elsewhere): a 3xx is a fatal `Api` naming its target.
//! Requests ask for `accept-encoding: identity`. This crate does not retry: the session does, under its
//! policy. Logs carry statuses, kinds and sizes, never prompt or completion
//! text nor the key.
//!
//! # Modules
//!
//! Each module imports only the ones above it in this table (children of
//! `wire` also import `wire`); no cycle.
//!
//! | module | owns | imports | may not import |
//! | --- | --- | --- | --- |
//! | `provider` | [`Protocol`], [`Provider`], [`Api`] and its [`Anthropic`] / [`OpenAi`] / [`OpenAiResponses`] | nothing | anything |
//! | [`sse`] | the SSE parser: bytes → events and keep-alives | nothing | anything |
//! | `json` | JSON parsing whose errors redact quoted input | nothing | anything |
//! | `classify` | HTTP status, headers, error bodies and error events → [`StreamError`](warden_core::StreamError); `retry-after`; prompt too long | `json` | `wire`, `decode`, `transport`, `source` |
//! | `wire` (`wire/anthropic`, `wire/openai`, `wire/responses`) | per protocol: request body, auth headers, serde wire types, the event mapper (events → frames) | `provider`, `sse`, `json`, `classify` | `decode`, `transport`, `source`, `reqwest` |
//! | [`decode`] | SSE bytes → frames through a protocol's mapper; names no provider | `provider`, `sse`, `wire` | `transport`, `source`, `reqwest` |
//! | [`transcript`] | conversations on disk, replay | `json` | `wire`, `decode`, `transport`, `source` |
//! | `options` | [`HttpOptions`], [`SourceOptions`] | `provider`, `transcript` | `wire`, `decode`, `transport`, `source` |
//! | `transport` | [`BuildError`], [`validate_base_url`], the endpoint: client, request, answer checks, send-or-replay | `provider`, `classify`, `decode`, `transcript`, `options` | `wire`, `source` |
//! | `continuation` | continuing a broken Anthropic reply: prefill or continuation turn, learned per model; stitching the stream | nothing (core only) | anything |
//! | `source` | [`HttpSource`]: options → endpoint, turn → body, recording; continuation (Anthropic) and re-attach (Responses) | `provider`, `wire`, `transcript`, `options`, `transport`, `continuation` | — |
//!
//! The workspace test `tests/modules_import_only_the_layers_below.rs` checks the table.
//!
//! # Dependencies and why
//! - `warden-core`: the `EventSource` trait, frames, events and errors.
//! - `reqwest` (0.12, rustls, `stream`; no default features): a well-kept
//!   HTTP client on hyper; rustls avoids a system OpenSSL; `stream` reads
//!   the body chunk by chunk.
//! - No SSE crate: `eventsource-stream` 0.2.3 panicked on a leading BOM and
//!   held back the last event of CR-only streams, and liveness needs to see
//!   comment lines, which SSE crates drop. The [`sse`] parser implements the
//!   HTML Standard's event stream interpretation, property-tested over every
//!   line end, BOM split and chunking.
//! - `serde`, `serde_json`: request bodies, `data:` payloads, error bodies.
//! - `httpdate`: `Retry-After` as an HTTP date.
//! - `futures-util`: the `Stream` trait and combinators.
//! - `thiserror`: [`BuildError`].
//! - `tracing`: structured events; this library never installs a subscriber.
//! - `tokio` (`rt`): transcript files are read and written on the blocking
//!   pool, off the runtime's workers.
//! - `rand`: random conversation ids.

mod classify;
mod continuation;
pub mod decode;
mod json;
mod options;
mod provider;
mod source;
pub mod sse;
pub mod transcript;
mod transport;
mod wire;

pub use classify::{
    NOT_AN_EVENT_STREAM, classify_response, error_chain, is_retryable_error_kind, stream_error,
};
pub use continuation::CONTINUE_ASK;
pub use options::{
    AnthropicOptions, HttpOptions, OpenAiOptions, OpenAiResponsesOptions, SharedConversationStore,
    SourceOptions,
};
pub use provider::{Anthropic, Api, OpenAi, OpenAiResponses, Protocol, Provider};
pub use source::{AnthropicSource, HttpSource, OpenAiResponsesSource, OpenAiSource};
pub use transcript::{TornTail, Transcript, Transcripts};
pub use transport::{BuildError, validate_base_url};
pub use wire::{ANTHROPIC_VERSION, Progress, gemini};

/// Locks `m`, ignoring poison (each value is changed in one step).
fn util_lock<T>(m: &parking_lot::Mutex<T>) -> parking_lot::MutexGuard<'_, T> {
    m.lock()
}
