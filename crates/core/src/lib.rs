//! # warden-core
//!
//! Actors that keep long-lived LLM agent sessions and their streams alive,
//! on [`ractor`] and tokio.
//!
//! ```text
//! Supervisor                     one per orchestrator; SessionKey -> SessionActor
//!  ├─ WatchdogActor              liveness of every running stream
//!  └─ SessionActor (per key)     one agent conversation
//!      └─ StreamTask (per turn attempt) reads one streaming response
//! ```
//!
//! - A [`StreamTask`](stream::StreamTask) registers its stream with the [`WatchdogActor`]
//!   *before* the request is sent and stamps a [`Heartbeat`](watchdog::Heartbeat) on every raw
//!   frame (pings and keep-alive comments included).
//! - The watchdog kills a stream silent for longer than its timeout
//!   (default 45 s, `WARDEN_STREAM_TIMEOUT` in ms, per-stream override);
//!   the kill closes the stream for real and surfaces as the retryable
//!   [`StreamError::InactivityTimeout`] (`ESTREAM_TIMEOUT`).
//! - A session actor ([`SessionHandle`]) retries failed attempts from scratch under its
//!   [`RetryPolicy`]; a user cancel wins the race and is never retried.
//! - The supervisor ([`Supervisor`]) spawns sessions on demand and restarts them
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
//! - `serde` / `serde_json`: records the stores keep, and a turn's stored
//!   events (JSON, as clients receive them).
//!
//! # Public surface
//!
//! The root holds what a newcomer needs, in six groups (the
//! [`Supervisor`] and its configuration; the [`EventSource`] port and what
//! flows through it; errors; the reusable [`WatchdogActor`],
//! [`RetryPolicy`] and [`Admission`]; state and notices). The rest is read
//! by path in public modules: [`watchdog`] (handles, guards, heartbeats),
//! [`stream`] ([`StreamTask`](stream::StreamTask), which reads one attempt
//! for your own supervisor), [`admission`], [`policy`], [`lifecycle`]
//! (the event bus), [`adapter`] (wrapping a stream as a source),
//! [`store`] (the ports a store implements: sessions, turn logs,
//! conversations), [`cluster`] (placement), [`config`], [`context`],
//! [`continuation`] and [`spans`]. The actors' state, their messages and
//! the contract between a session and its supervisor are private.
//!
//! # Features
//!
//! - `testing`, for your tests (enable it under `[dev-dependencies]`, never
//!   for a build you ship): `testing::ChannelSource`, an in-process source
//!   a test drives frame by frame, and `testing::spawn_session`, a session
//!   without a supervisor. The example above uses it.
//!
//! Fault injection needs no feature: [`SessionHandle::fail`] crashes a
//! session as a failure would, so a restart policy can be seen to act (in
//! a chaos test or a staging run) on a normal build.

pub mod adapter;
pub mod admission;
pub mod cluster;
pub mod config;
pub mod context;
pub mod continuation;
mod error;
mod event;
mod exit_class;
pub mod lifecycle;
pub mod names;
mod notify;
pub mod policy;
mod session;
mod source;
pub mod spans;
pub mod store;
pub mod stream;
mod supervisor;
#[cfg(feature = "testing")]
pub mod testing;
mod transition;
mod util;
pub mod watchdog;
mod workspace;

// The supervisor and what configures it.
pub use context::ContextConfig;
pub use session::{
    ContinueFrom, RecoveredTurn, Redelivery, SendOptions, SessionConfig, SessionHandle,
    SessionStatus, SubmitError, TextEdit, TurnCanceller, TurnEvent, TurnHandle, TurnSummary,
    TurnText, Unstick,
};
pub use stream::StreamOptions;
pub use supervisor::{
    ShutdownTimeouts, Supervisor, SupervisorBuilder, SupervisorConfig, SupervisorError,
};
pub use workspace::normalize_workspace;
// Agents: the source port and what flows through it.
pub use adapter::source_fn;
pub use continuation::{Continuation, StreamPhase};
pub use event::{AgentEvent, Frame, Usage};
pub use source::{
    AttemptId, Diagnostics, EventSource, EventStream, SessionKey, SessionSpec, SourceFactory,
    TurnRequest, specs,
};
// Errors.
pub use error::{ActorError, ConfigError, ResumeCause, StreamError, TurnError, retryable_status};
pub use exit_class::ExitClass;
// The reusable parts: watchdog, policies, shared backoff.
pub use admission::{Admission, AdmissionConfig};
pub use policy::{Restart, RestartIntensity, RetryPolicy, RetryVerdict, Retryable};
pub use watchdog::{WatchdogActor, WatchdogConfig};
// State and what users hear.
pub use lifecycle::LifecycleEvent;
pub use notify::{LogNotifier, Notice, Notifier};
pub use store::{
    Durability, MemoryStore, PendingMessage, RecordStatus, SessionRecord, SessionStore, StoreError,
    StoredUsage,
};

/// What implementing or adapting an [`EventSource`] needs, in one import:
/// `use warden_core::prelude::*;`.
pub mod prelude {
    pub use crate::adapter::Ending;
    pub use crate::{
        AgentEvent, Diagnostics, EventSource, EventStream, Frame, SessionKey, StreamError,
        TurnRequest, Usage, source_fn,
    };
    pub use futures_util::Stream;
    pub use futures_util::future::BoxFuture;
}
