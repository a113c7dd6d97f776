//! The [`StreamTask`]: reads one attempt's stream under the watchdog.
//!
//! On spawn it registers with the watchdog (before the request is sent),
//! then runs one task that opens the stream, stamps the heartbeat on every
//! frame and sends parsed events straight to the [`ReportSink`] (no actor
//! hop on the hot path). Exactly one of three things ends it, the first to
//! happen:
//!
//! 1. the reader finishes (stream complete, a stream error, or a panic of
//!    the source, reported as `Internal`),
//! 2. the watchdog's expiry (`ESTREAM_TIMEOUT`),
//! 3. a cancel.
//!
//! Ending drops the reader in place, so the stream and its connection are
//! gone *before* the single [`StreamReport::Ended`] is sent; then the
//! watchdog entry is removed. If the runtime drops the task (shutdown), the
//! stream and the watch entry are released the same way, without a report.
//!
//! # Backpressure
//!
//! Every forwarded event carries a [`Credit`]: one, and one more per 4 KiB
//! of its text (so what is in flight is bounded in bytes as well as in
//! events); at most [`StreamOptions::max_in_flight`] credits of an attempt
//! exist at once. A
//! credit is returned when whoever ends up with the event drops it (a
//! [`TurnHandle`](crate::TurnHandle) when its consumer takes the event out;
//! a custom sink when it drops the report). When none is left the reader
//! stops reading the source, so a consumer that does not keep up (a paused
//! stdout reader, a slow bridge) holds the connection's bytes in the kernel
//! and the server, not in warden's memory.
//!
//! A stall is blamed on the side that causes it: while the reader waits for
//! a credit, warden's own consumer is not reading, so the stream is kept
//! alive (a beat every third of its allowance) and the server's allowance
//! starts afresh when reading resumes. The watchdog judges the source only.

mod task;

use std::sync::Arc;
use std::time::Duration;

use derive_setters::Setters;
use tokio::sync::OwnedSemaphorePermit;

use crate::error::StreamError;
use crate::event::AgentEvent;
pub use crate::source::AttemptId;
use crate::source::{EventSource, TurnRequest};
use crate::watchdog::{WatchId, WatchdogHandle};
pub use task::{StreamHandle, StreamTask};

/// How an attempt ended.
#[derive(Debug, Clone, PartialEq)]
pub enum StreamOutcome {
    /// The stream ended after its terminal frame.
    Completed,
    /// Cancelled by the user before anything else ended it.
    Cancelled,
    /// Failed; `ESTREAM_TIMEOUT` when the watchdog killed it.
    Failed(StreamError),
}

/// Flow-control credit of one event in flight (see the module docs on
/// backpressure): dropping it lets the stream's reader read one more event.
/// Keep it with the event until the event is consumed.
#[derive(Debug, Default)]
pub struct Credit(#[allow(dead_code)] Option<OwnedSemaphorePermit>);

impl Credit {
    /// A credit that holds nothing back (for events not read from a stream).
    pub fn none() -> Self {
        Self(None)
    }
}

/// What a [`StreamTask`] reports to its owner.
#[derive(Debug)]
pub enum StreamReport {
    /// A parsed event of the attempt.
    Event {
        /// Which attempt: its turn and its number within the turn (1 first).
        attempt: AttemptId,
        /// The event, as the source parsed it.
        event: AgentEvent,
        /// Its flow-control credit: drop it once the event is consumed.
        credit: Credit,
    },
    /// The attempt is over; sent exactly once, after its last event.
    Ended {
        /// Which attempt: its turn and its number within the turn (1 first).
        attempt: AttemptId,
        /// How it ended.
        outcome: StreamOutcome,
        /// The watch entry it had.
        watch_id: WatchId,
    },
}

/// Receives a stream's reports, on the stream's task: it must not block
/// (cast to an actor, send on an unbounded channel).
pub type ReportSink = Arc<dyn Fn(StreamReport) + Send + Sync + 'static>;

/// Per-stream options.
#[derive(Debug, Clone, PartialEq, Eq, Setters)]
#[setters(prefix = "with_", strip_option)]
#[non_exhaustive]
pub struct StreamOptions {
    /// Silence allowance for this stream; `None` uses the watchdog's default
    /// (45 s or `WARDEN_STREAM_TIMEOUT`).
    pub timeout: Option<Duration>,
    /// Silence allowance while a tool runs (after `ToolUseStarted`, before
    /// its `ToolUseFinished`). Default 10 min.
    pub tool_timeout: Duration,
    /// Progress allowance: an attempt that delivers no content (text,
    /// thinking, tool call or tool input) for this long is killed with
    /// [`StreamError::NoProgress`] even though keep-alives arrive — a
    /// server that only pings. `None` (default) disables it. While a tool
    /// runs, or while the consumer holds the stream back, it does not run
    /// down (the tool allowance and backpressure cover those). Env:
    /// `WARDEN_PROGRESS_TIMEOUT` via
    /// [`SupervisorConfig::from_env`](crate::SupervisorConfig::from_env).
    pub progress_timeout: Option<Duration>,
    /// Credits of events forwarded but not yet consumed (their [`Credit`]
    /// not yet dropped) before the reader stops reading the source: an
    /// event takes one, and one more per 4 KiB of its text (a delta larger
    /// than the whole window takes all of it). Default 256 (256 small
    /// events, about 1 MiB of large ones); values below 1 count as 1.
    pub max_in_flight: usize,
}

impl Default for StreamOptions {
    fn default() -> Self {
        Self {
            timeout: None,
            tool_timeout: Duration::from_secs(600),
            progress_timeout: None,
            max_in_flight: 256,
        }
    }
}

/// Everything a [`StreamTask`] needs.
pub struct StreamArgs {
    /// Which attempt this is.
    pub attempt: AttemptId,
    /// The source to open.
    pub source: Arc<dyn EventSource>,
    /// The request to send.
    pub request: TurnRequest,
    /// The watchdog to register with.
    pub watchdog: WatchdogHandle,
    /// Per-stream options.
    pub options: StreamOptions,
    /// Where reports go.
    pub sink: ReportSink,
    /// The attempt's span (`attempt_started`); `watchdog_killed` is its child.
    /// `tracing::Span::none()` when not traced.
    pub span: tracing::Span,
}
