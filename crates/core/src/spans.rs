//! The trace shape. (Span names: [`crate::names`], one per transition.)
//!
//! A session can live for hours, and a span is exported only when it ends,
//! so no span covers a session's life. Instead:
//!
//! - each **incarnation** of a session (first spawn, resume after a reap or
//!   an orchestrator restart, a supervisor restart, a fresh fallback) opens
//!   and immediately closes a short **anchor** span, `session_spawned`, whose
//!   `warden.incarnation` says which (`spawn`, `resume`, `fresh_fallback`),
//!   linked to the previous incarnation's anchor;
//! - each **turn** is a trace of its own: its root `turn_started` (open
//!   while the turn runs) is *linked* to its incarnation's anchor and to the
//!   turn before it (and, for a turn re-delivered after a crash, tagged
//!   `warden.recovered` and linked to the previous incarnation's anchor when
//!   known), so a trace stays short however long the session lives; under
//!   it one `attempt_started` per attempt (a retry is a sibling *linked* to
//!   the failed attempt), before it an `attempt_queued` when the attempt
//!   waited for admission, `stream_timed_out`, `watchdog_killed`,
//!   `retry_scheduled`, `continue_scheduled`, `turn_cancelled`; the turn's
//!   and attempts' events (`attempt_ended`, `agent_session_id`,
//!   `context_usage`, `turn_finished`) are log events of those spans;
//! - `session_reaped`, `resume_failed`, `session_restarted`,
//!   `supervisor_escalated`, `fresh_fallback` and `session_stopped` hang off
//!   the incarnation's anchor; `session_failed`, `store_failed` too when the
//!   anchor is known (else they are roots);
//! - `workspace_normalized` is a root span.
//!
//! Every span carries `warden.session.key` and, once known,
//! `gen_ai.conversation.id`, so a Jaeger tag search finds every turn of
//! every incarnation of a session. Numbers are int64 attributes, not
//! strings. Failures set `error.type` and the span status ERROR
//! (`otel.status_code`). No prompt or completion text is ever recorded.
//! Heartbeats are never spans. Without an OpenTelemetry layer installed all
//! of this costs a few disabled-span checks.

use opentelemetry::trace::{SpanContext, TraceContextExt as _};
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

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

    /// An anchor at `span` (a turn's root, to hang a span under it).
    pub(crate) fn under(span: SpanContext) -> Self {
        Self(opentelemetry::Context::new().with_remote_span_context(span))
    }

    /// Makes `span` a child of this anchor, or a root when the anchor is
    /// unknown (never a child of whatever span is current). Call before
    /// entering `span`.
    pub(crate) fn adopt(&self, span: &tracing::Span) {
        let parent = match self.0.span().span_context().is_valid() {
            true => self.0.clone(),
            false => opentelemetry::Context::new(),
        };
        let _ = span.set_parent(parent);
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
