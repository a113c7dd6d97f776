//! One typed [`Transition`] per thing that happens to a session, recorded
//! in one place.
//!
//! Recording a transition emits, together and from the same values:
//!
//! - its **span** (named [`Transition::name`], its one name from
//!   [`crate::names`]), parented per the trace shape in [`crate::spans`];
//! - its **log event**, inside that span, with `event = <name>`;
//! - its [`LifecycleEvent`] on the [`EventBus`], when it has one.
//!
//! The actors never call `tracing` or `EventBus::publish` for a transition
//! themselves, so the three views cannot drift apart. No variant carries
//! prompt or completion text.

use std::path::Path;
use std::time::Duration;

use opentelemetry::trace::SpanContext;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use crate::context::ContextReport;
use crate::continuation::StreamPhase;
use crate::error::{ResumeCause, StreamError};
use crate::event::Usage;
use crate::lifecycle::{AttemptOutcome, EventBus};
use crate::names;
use crate::source::AttemptId;
use crate::source::{Diagnostics, SessionKey};
use crate::spans::TraceAnchor;
use crate::store::StoreError;

/// Which incarnation of a session starts (its anchor's `warden.incarnation`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Incarnation {
    /// A session with no stored conversation.
    Spawn,
    /// A session resuming its stored conversation.
    Resume,
    /// A fresh start after a resume failure.
    FreshFallback,
}

impl Incarnation {
    /// The `warden.incarnation` attribute of its `session_spawned` span.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Spawn => "spawn",
            Self::Resume => "resume",
            Self::FreshFallback => "fresh_fallback",
        }
    }
}

/// Something that happened to a session; see the module docs.
#[derive(Debug)]
pub(crate) enum Transition<'a> {
    /// A session incarnation started: its anchor span.
    Incarnated {
        /// Which kind.
        incarnation: Incarnation,
        /// The agent's working directory.
        workspace: Option<&'a Path>,
        /// Restarts so far.
        restart_count: u32,
        /// The model, when known.
        model: Option<&'a str>,
        /// The previous incarnation, linked from this one.
        previous: Option<&'a TraceAnchor>,
        /// Unanswered messages re-delivered from the record.
        recovered: usize,
    },
    /// A turn began (its span stays open while it runs): the root of a
    /// trace of its own, linked to its incarnation's anchor and to the turn
    /// before it.
    TurnStarted {
        /// Turn number.
        turn: u64,
        /// The source's provider name.
        provider: &'a str,
        /// Its session incarnation's anchor, linked.
        anchor: &'a TraceAnchor,
        /// The turn before it in this incarnation, linked.
        follows: Option<&'a SpanContext>,
        /// Re-delivered from the record after the session stopped without
        /// answering it (a crash, a node lost): `warden.recovered`.
        recovered: bool,
        /// The previous incarnation's anchor, linked when recovered.
        previous: Option<&'a TraceAnchor>,
    },
    /// A re-delivered turn's story before this run, under its new trace's
    /// root.
    TurnRedelivered {
        /// Turn number.
        turn: u64,
        /// Why it was re-delivered (`ENODE_LOST`, `ENODE_DRAINED`,
        /// `ESTORE_UNREACHABLE`).
        cause: &'a str,
        /// The trace it was accepted in (hex): its earlier incarnation's.
        previous_trace: Option<&'a str>,
        /// The span there it hung from (the anchor), linked.
        previous: Option<&'a SpanContext>,
        /// The events its clients already had.
        events_delivered: u64,
        /// The node that re-delivers it, on a cluster.
        node: Option<&'a str>,
    },
    /// An attempt's stream started (its span stays open while it runs).
    AttemptStarted {
        /// Which attempt: its turn and its number within the turn (1 first).
        attempt: AttemptId,
        /// Its silence allowance.
        timeout: Duration,
        /// The source's provider name.
        provider: &'a str,
        /// The failed attempt this one retries, linked.
        retries: Option<&'a SpanContext>,
    },
    /// An attempt waits for admission (a concurrency limit or a shared
    /// backoff); its span stays open until it is admitted or dropped.
    AttemptQueued {
        /// Which attempt: its turn and its number within the turn (1 first).
        attempt: AttemptId,
        /// The admission pool it waits in.
        pool: &'a str,
    },
    /// A queued attempt was admitted; recorded onto its `attempt_queued`
    /// span.
    AttemptAdmitted {
        /// Which attempt: its turn and its number within the turn (1 first).
        attempt: AttemptId,
        /// How long it waited.
        waited: Duration,
    },
    /// The watchdog killed a silent stream (the stream's own view).
    WatchdogKill {
        /// The watch entry.
        watch_id: u64,
        /// Silence observed.
        silent_for: Duration,
        /// The allowance.
        timeout: Duration,
    },
    /// The session learned its attempt was killed for silence.
    StreamTimedOut {
        /// Which attempt: its turn and its number within the turn (1 first).
        attempt: AttemptId,
        /// Where its stream was (`stream.phase`).
        phase: StreamPhase,
        /// Silence observed.
        silent_for: Duration,
        /// The allowance.
        timeout: Duration,
    },
    /// An attempt's stream ended; recorded onto its `attempt_started` span.
    AttemptEnded {
        /// Which attempt: its turn and its number within the turn (1 first).
        attempt: AttemptId,
        /// How.
        outcome: AttemptOutcome,
        /// The failure's code, when it failed.
        error_code: Option<&'static str>,
    },
    /// A failed attempt will be retried from scratch.
    RetryScheduled {
        /// The failed attempt.
        failed: AttemptId,
        /// Backoff before the next one.
        delay: Duration,
        /// The failure's code.
        error_code: &'static str,
        /// The failed attempt's span, linked.
        retries: Option<&'a SpanContext>,
    },
    /// A reply that broke mid-text will be continued.
    ContinueScheduled {
        /// The attempt that broke.
        failed: AttemptId,
        /// Backoff before the continuation.
        delay: Duration,
        /// The failure's code.
        error_code: &'static str,
        /// Bytes of text the consumer keeps.
        kept_bytes: usize,
        /// The broken attempt's span, linked.
        retries: Option<&'a SpanContext>,
    },
    /// The user cancelled the turn.
    TurnCancelled {
        /// Turn number.
        turn: u64,
    },
    /// The turn ran past its wall-clock cap and is stopped.
    TurnDeadline {
        /// Turn number.
        turn: u64,
        /// The cap.
        after: Duration,
    },
    /// The turn's reply passed its size cap and is stopped.
    TurnTooLarge {
        /// Turn number.
        turn: u64,
        /// The cap, in bytes.
        limit: usize,
    },
    /// The agent announced (or changed) its session id; stored durably.
    AgentSessionId {
        /// The new id.
        session_id: &'a str,
        /// The id before, if any.
        previous: Option<&'a str>,
    },
    /// Context usage at the end of a turn.
    ContextUsage(ContextReport),
    /// A turn ended; recorded onto the turn's own span.
    TurnFinished {
        /// Turn number.
        turn: u64,
        /// Attempts used.
        attempts: u32,
        /// `None` on success.
        error_code: Option<&'static str>,
        /// The turn's last usage report.
        usage: Option<Usage>,
        /// Context in use.
        context: Option<ContextReport>,
    },
    /// An idle session stops itself.
    Reaped {
        /// How long it was idle.
        idle_for: Duration,
        /// Tokens in context, if known.
        context_tokens: Option<u64>,
        /// Its workspace.
        workspace: Option<&'a Path>,
    },
    /// A session actor stopped (published only; its spans are elsewhere).
    SessionStopped {
        /// Why.
        reason: &'a str,
        /// Whether it crashed.
        abnormal: bool,
    },
    /// The supervisor restarts a crashed session.
    Restarted {
        /// Restarts inside the intensity window.
        restarts_in_window: u32,
        /// The crash.
        cause: &'a str,
    },
    /// The supervisor gives a session up (restart intensity exceeded).
    GivenUp {
        /// The original failure.
        cause: &'a str,
    },
    /// A stored conversation could not be resumed.
    ResumeFailed {
        /// The id that failed.
        failed_id: &'a str,
        /// Why.
        cause: ResumeCause,
        /// The error the resume ended with (its code is `error.type`).
        error: &'a StreamError,
        /// The agent's working directory.
        workspace: Option<&'a Path>,
        /// What the source knows.
        diagnostics: &'a Diagnostics,
    },
    /// The session restarted fresh with its unanswered messages.
    FreshFallback {
        /// The id that failed.
        failed_id: &'a str,
        /// Messages re-delivered.
        redelivered: usize,
    },
    /// The session failed for good.
    SessionFailed {
        /// Every cause.
        reason: &'a str,
    },
    /// The session's record could not be read or written.
    StoreFailed {
        /// The store's error.
        error: &'a StoreError,
    },
    /// A workspace path was normalized to another spelling.
    WorkspaceNormalized {
        /// As given.
        original: &'a Path,
        /// As used (also the session key).
        normalized: &'a Path,
    },
}

/// Where a transition's span hangs.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Parent<'a> {
    /// Under a session incarnation's anchor.
    Anchor(&'a TraceAnchor),
    /// Under an open span (a turn, an attempt).
    Span(&'a tracing::Span),
    /// A new trace (anchors, turns, workspace normalization).
    Root,
}

/// The session a transition belongs to.
#[derive(Debug, Clone, Copy)]
pub(crate) struct At<'a> {
    /// The session.
    pub(crate) key: &'a SessionKey,
    /// Its agent session id, once known.
    pub(crate) conversation: Option<&'a str>,
    /// Where the span hangs.
    pub(crate) parent: Parent<'a>,
    /// Where the lifecycle event goes (none for the stream's own view).
    pub(crate) bus: Option<&'a EventBus>,
}

/// `Transition::name`, from the one table (`names::table!`): a variant
/// without a row does not compile.
macro_rules! transition_names {
    ($(
        #[doc = $doc:literal]
        $konst:ident = $name:literal, $traced:ident, $transition:ident
        $(=> $event:ident $($before_session:ident)?)?;
    )*) => {
        impl Transition<'_> {
            /// Its one name (see [`crate::names`]): the span's name, the log
            /// event's `event` field, and the lifecycle event's name.
            pub(crate) fn name(&self) -> &'static str {
                match self {
                    $(Self::$transition { .. } => names::$konst,)*
                }
            }
        }
    };
}

names::table!(transition_names);

impl Transition<'_> {
    /// Emits the span, the log event and the lifecycle event. Returns the
    /// span (open until dropped; `Span::none()` for transitions that are
    /// not spans). The log event is emitted inside the transition's span,
    /// or for a transition without one inside its parent span (never in
    /// whatever span is current: the exporter drops events of spans not
    /// its own, an actor's).
    pub(crate) fn record(self, at: At<'_>) -> tracing::Span {
        let span = self.span(at);
        if !span.is_none() {
            match at.parent {
                Parent::Anchor(anchor) => anchor.adopt(&span),
                Parent::Span(parent) => {
                    let _ = span.set_parent(parent.context());
                }
                // A new trace, whatever span is current.
                Parent::Root => {
                    let _ = span.set_parent(opentelemetry::Context::new());
                }
            }
        }
        if let Parent::Span(parent) = at.parent {
            self.finish_onto(parent, at.conversation);
        }
        {
            let within = match at.parent {
                Parent::Span(parent) if span.is_none() => parent,
                _ => &span,
            };
            let _entered = within.enter();
            self.log(at.key);
        }
        if let (Some(bus), Some(event)) = (at.bus, self.lifecycle(at.key)) {
            bus.publish(event);
        }
        span
    }
}

/// Whole milliseconds, saturating, as a signed integer: the OpenTelemetry
/// layer exports an `i64` field as an int64 attribute but a `u64` as a
/// string, which Jaeger's search cannot compare as a number.
pub(super) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// `n` as the signed integer an attribute or log field carries (see
/// [`millis`]), saturating.
pub(super) fn int(n: impl TryInto<i64>) -> i64 {
    n.try_into().unwrap_or(i64::MAX)
}

mod record;
mod span;
#[cfg(test)]
mod tests;
