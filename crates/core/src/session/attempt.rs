//! The running attempt's span, which publishes the attempt's end once:
//! when the session hears it ended, or else when it is dropped with its
//! turn (a cancel, a recover, the turn's caps, the session stopping).

use crate::error::TurnError;
use crate::lifecycle::{AttemptOutcome, EventBus};
use crate::source::{AttemptId, SessionKey};
use crate::spans::Lasting;
use crate::transition::{At, Parent, Transition};

/// `attempt_started` of the running attempt, open until it ends.
pub(super) struct RunningAttempt {
    span: Option<Lasting>,
    attempt: AttemptId,
    key: SessionKey,
    bus: EventBus,
}

impl RunningAttempt {
    /// The attempt `attempt` of session `key`, measured by `span`.
    pub(super) fn new(
        span: tracing::Span,
        attempt: AttemptId,
        key: SessionKey,
        bus: EventBus,
    ) -> Self {
        Self {
            span: Some(Lasting::new(span)),
            attempt,
            key,
            bus,
        }
    }

    /// Its span.
    pub(super) fn span(&self) -> &tracing::Span {
        static ENDED: tracing::Span = tracing::Span::none();
        self.span.as_deref().unwrap_or(&ENDED)
    }

    /// Publishes its end (`attempt_ended`, onto its span), then ends the
    /// span.
    pub(super) fn end(mut self, outcome: AttemptOutcome, error_code: Option<&'static str>) {
        self.record(outcome, error_code);
    }

    fn record(&mut self, outcome: AttemptOutcome, error_code: Option<&'static str>) {
        let Some(span) = self.span.take() else {
            return;
        };
        Transition::AttemptEnded {
            attempt: self.attempt,
            outcome,
            error_code,
        }
        .record(At {
            key: &self.key,
            conversation: None,
            parent: Parent::Span(&span),
            bus: Some(&self.bus),
        });
    }
}

impl Drop for RunningAttempt {
    fn drop(&mut self) {
        self.record(AttemptOutcome::Cancelled, Some(TurnError::Cancelled.code()));
    }
}
