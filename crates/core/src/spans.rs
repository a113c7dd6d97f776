//! Span names and the trace shape.
//!
//! A session can live for hours, and a span is exported only when it ends,
//! so no span covers a session's life. Instead:
//!
//! - each **incarnation** of a session (first spawn, resume after a reap or
//!   an orchestrator restart, a supervisor restart, a fresh fallback) opens
//!   and immediately closes a short **anchor** span (`session.spawn`,
//!   `session.resume` or `session.fresh_fallback`), linked to the previous
//!   incarnation's anchor;
//! - every transition of the incarnation is a span whose parent is that
//!   anchor: `session.turn` (open while the turn runs), under it one
//!   `stream.attempt` per attempt (a retry is a sibling *linked* to the
//!   failed attempt), before it a `stream.queued` when the attempt waited
//!   for admission, `stream.timeout`, `watchdog.kill`, `stream.retry`,
//!   `stream.cancel`; `session.reap`, `session.resume_failed`,
//!   `supervisor.restart`, `supervisor.escalate` hang off the anchor too;
//! - `workspace.normalize` is a root span.
//!
//! Every span carries `warden.session.key` and, once known,
//! `gen_ai.conversation.id`, so a Jaeger tag search finds every incarnation
//! of a session. Failures set `error.type` and the span status ERROR
//! (`otel.status_code`). No prompt or completion text is ever recorded.
//! Heartbeats are never spans. Without an OpenTelemetry layer installed all
//! of this costs a few disabled-span checks.

use opentelemetry::trace::{SpanContext, TraceContextExt as _};
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

/// Span names, as exported, and the `event` names of the log events of
/// transitions that are not spans. Every transition records its span and
/// its log event under the same name.
pub mod names {
    /// Anchor of a new session's first incarnation.
    pub const SESSION_SPAWN: &str = "session.spawn";
    /// Anchor of an incarnation resuming a stored conversation.
    pub const SESSION_RESUME: &str = "session.resume";
    /// A stored conversation could not be resumed.
    pub const SESSION_RESUME_FAILED: &str = "session.resume_failed";
    /// Anchor of the fresh incarnation after a resume failure.
    pub const SESSION_FRESH_FALLBACK: &str = "session.fresh_fallback";
    /// An idle session was stopped.
    pub const SESSION_REAP: &str = "session.reap";
    /// One turn (user message → answer).
    pub const SESSION_TURN: &str = "session.turn";
    /// One attempt of a turn (one stream).
    pub const STREAM_ATTEMPT: &str = "stream.attempt";
    /// An attempt waiting for admission (open while it waits; its
    /// `warden.wait_ms` is set when it is admitted).
    pub const STREAM_QUEUED: &str = "stream.queued";
    /// Log event: a queued attempt was admitted.
    pub const STREAM_ADMITTED: &str = "stream.admitted";
    /// An attempt ended by the watchdog.
    pub const STREAM_TIMEOUT: &str = "stream.timeout";
    /// A failed attempt is retried.
    pub const STREAM_RETRY: &str = "stream.retry";
    /// The user cancelled the turn.
    pub const STREAM_CANCEL: &str = "stream.cancel";
    /// A reply broken mid-text is continued (not replayed).
    pub const STREAM_CONTINUE: &str = "stream.continue";
    /// A turn ran past its wall-clock cap and was stopped.
    pub const SESSION_TURN_DEADLINE: &str = "session.turn_deadline";
    /// A turn's reply passed its size cap and was stopped.
    pub const SESSION_REPLY_TOO_LARGE: &str = "session.reply_too_large";
    /// The watchdog killed a silent stream.
    pub const WATCHDOG_KILL: &str = "watchdog.kill";
    /// The supervisor restarted a session.
    pub const SUPERVISOR_RESTART: &str = "supervisor.restart";
    /// The supervisor gave up on a session.
    pub const SUPERVISOR_ESCALATE: &str = "supervisor.escalate";
    /// A workspace path was normalized.
    pub const WORKSPACE_NORMALIZE: &str = "workspace.normalize";
    /// Log event: the agent's session id was stored.
    pub const SESSION_AGENT_ID: &str = "session.agent_id";
    /// Log event: context usage at the end of a turn.
    pub const CONTEXT_USAGE: &str = "context_usage";
    /// Log event: a turn ended (recorded onto its `session.turn` span).
    pub const SESSION_TURN_FINISHED: &str = "session.turn_finished";
    /// Log event: a session actor stopped.
    pub const SESSION_STOPPED: &str = "session.stopped";
    /// Log event: the supervisor restarted a session fresh with its
    /// unanswered messages.
    pub const SUPERVISOR_FRESH_START: &str = "supervisor.fresh_start";
    /// Log event: a session failed for good.
    pub const SESSION_FAILED: &str = "session.failed";
    /// Log event: a session's record could not be read or written.
    pub const STORE_FAILED: &str = "store.failed";
}

/// The trace context of one session incarnation's anchor span: the parent
/// of its transition spans and the link target of the next incarnation.
#[derive(Clone, Debug, Default)]
pub struct TraceAnchor(pub(crate) opentelemetry::Context);

impl TraceAnchor {
    /// The anchor's span context (invalid when no OpenTelemetry layer is
    /// installed).
    pub fn span_context(&self) -> SpanContext {
        self.0.span().span_context().clone()
    }

    /// The anchor of `span` (an incarnation's anchor span).
    pub(crate) fn of(span: &tracing::Span) -> Self {
        Self(span.context())
    }

    /// Makes `span` a child of this anchor. Call before entering `span`.
    pub(crate) fn adopt(&self, span: &tracing::Span) {
        if self.0.span().span_context().is_valid() {
            let _ = span.set_parent(self.0.clone());
        }
    }
}

/// A span that lasts as long as what it measures (a turn, an attempt, a
/// wait): ends when this is dropped. The OpenTelemetry layer dates a span's
/// end by its last exit, and these spans are entered once, when their
/// start is logged; entering it once more as it is dropped dates its end
/// to now, so Jaeger shows how long the turn or attempt really took.
#[derive(Debug)]
pub(crate) struct Lasting(tracing::Span);

impl Lasting {
    /// Measures until dropped with `span`.
    pub(crate) fn new(span: tracing::Span) -> Self {
        Self(span)
    }
}

impl std::ops::Deref for Lasting {
    type Target = tracing::Span;

    fn deref(&self) -> &tracing::Span {
        &self.0
    }
}

impl Drop for Lasting {
    fn drop(&mut self) {
        drop(self.0.enter());
    }
}

/// Links `span` to `to` when `to` is a real span.
pub(crate) fn link(span: &tracing::Span, to: &SpanContext) {
    if to.is_valid() {
        span.add_link(to.clone());
    }
}

/// The OpenTelemetry span context of a tracing span.
pub(crate) fn context_of(span: &tracing::Span) -> SpanContext {
    span.context().span().span_context().clone()
}

/// Marks `span` failed with `code` (`error.type` + status ERROR).
pub(crate) fn fail(span: &tracing::Span, code: &str) {
    span.record("error.type", code);
    span.record("otel.status_code", "ERROR");
}
