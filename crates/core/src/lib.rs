//! # warden-core
//!
//! Actors that keep long-lived LLM agent sessions and their streams alive,
//! on [`ractor`] and tokio.
//!
//! ```text
//! WorkspaceSupervisor            one per orchestrator; SessionKey -> SessionActor
//!  ├─ WatchdogActor              liveness of every running stream
//!  └─ SessionActor (per key)     one agent conversation
//!      └─ StreamActor (per turn attempt) reads one streaming response
//! ```
//!
//! - A [`StreamActor`] registers its stream with the [`WatchdogActor`]
//!   *before* the request is sent and stamps a [`Heartbeat`] on every raw
//!   frame (pings and keep-alive comments included).
//! - The watchdog kills a stream silent for longer than its timeout
//!   (default 45 s, `WARDEN_STREAM_TIMEOUT` in ms, per-stream override);
//!   the kill closes the stream for real and surfaces as the retryable
//!   [`StreamError::InactivityTimeout`] (`ESTREAM_TIMEOUT`).
//! - A [`SessionActor`] retries failed attempts from scratch under its
//!   [`RetryPolicy`]; a user cancel wins the race and is never retried.
//! - The [`WorkspaceSupervisor`] spawns sessions on demand and restarts them
//!   per [`Restart`] and [`RestartIntensity`].
//!
//! # Example
//!
//! ```
//! use std::sync::Arc;
//! use warden_core::testing::ChannelSource;
//! use warden_core::{EventSource, SessionKey, Supervisor, SupervisorConfig};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // Any EventSource works; the channel source lets this example script frames.
//! let (source, control) = ChannelSource::new();
//! let factory = move |_: &SessionKey| source.clone() as Arc<dyn EventSource>;
//! let supervisor = Supervisor::start(SupervisorConfig::from_env()?, Arc::new(factory)).await?;
//!
//! let turn = supervisor.send("/work/repo", "hello").await?;
//! let attempt = control.next_attempt().await.expect("stream opened");
//! attempt.text("Hi there!");
//! attempt.finish();
//!
//! let (text, summary) = turn.finish().await?;
//! assert_eq!(text, "Hi there!");
//! assert_eq!(summary.attempts, 1);
//! supervisor.shutdown().await;
//! # Ok(())
//! # }
//! ```
//!
//! Runtime guarantees (no early kill, bound on late kill, cancel versus
//! kill, what is retried) are written down in `docs/runtime-semantics.md`.
//!
//! # Dependencies and why
//! - `ractor`: the actor runtime and supervision tree.
//! - `tokio`: timers (paused-clock testable), tasks, channels.
//! - `futures-util`: the `Stream` abstraction of event sources.
//! - `thiserror`: the typed error enums.
//! - `tracing`: structured events; this library never installs a subscriber.
//! - `rand`: retry jitter.
pub mod config;
pub mod context;
pub mod error;
pub mod event;
pub mod lifecycle;
pub mod notify;
pub mod policy;
pub mod session;
pub mod source;
pub mod spans;
pub mod store;
pub mod stream;
pub mod supervisor;
pub mod testing;
mod util;
pub mod watchdog;
pub mod workspace;

pub use context::ContextConfig;
pub use error::*;
pub use event::*;
pub use lifecycle::*;
pub use notify::*;
pub use policy::*;
pub use session::*;
pub use source::*;
pub use spans::TraceAnchor;
pub use store::*;
pub use stream::*;
pub use supervisor::*;
pub use watchdog::*;
pub use workspace::normalize_workspace;
