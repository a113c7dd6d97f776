//! Each [`Transition`]'s span, and what a turn's span records when the
//! turn ends. One arm per transition. (Its log event and lifecycle event:
//! `record.rs`.)

use tracing::field::Empty;

use crate::error::TurnError;
use crate::names;
use crate::spans;
use crate::store::StoreError;

use super::{At, Transition, int, millis};

impl Transition<'_> {
    /// The transition's span, not yet parented.
    pub(super) fn span(&self, at: At<'_>) -> tracing::Span {
        let key = at.key.as_str();
        let conv = at.conversation.unwrap_or("");
        match *self {
            Self::Incarnated {
                incarnation,
                restart_count,
                ..
            } => {
                let span = tracing::info_span!(
                    names::SESSION_SPAWNED,
                    warden.session.key = key,
                    warden.incarnation = incarnation.as_str(),
                    gen_ai.conversation.id = Empty,
                    warden.workspace = Empty,
                    warden.restart_count = int(restart_count),
                );
                if let Some(c) = at.conversation {
                    span.record("gen_ai.conversation.id", c);
                }
                if let Self::Incarnated {
                    workspace: Some(w), ..
                } = self
                {
                    span.record("warden.workspace", w.display().to_string());
                }
                if let Self::Incarnated {
                    previous: Some(p), ..
                } = self
                {
                    spans::link(&span, &p.span_context());
                }
                span
            }
            // Its conversation is recorded once, when the turn ends (a
            // field recorded twice is two attributes of one key, and
            // Jaeger's search matches only the first).
            Self::TurnStarted {
                turn,
                provider,
                anchor,
                follows,
                recovered,
                previous,
            } => {
                let span = tracing::info_span!(
                    names::TURN_STARTED,
                    warden.session.key = key,
                    gen_ai.conversation.id = Empty,
                    gen_ai.operation.name = "chat",
                    gen_ai.provider.name = provider,
                    warden.turn = int(turn),
                    warden.recovered = Empty,
                    warden.attempts = Empty,
                    warden.ctx_pct = Empty,
                    gen_ai.usage.input_tokens = Empty,
                    gen_ai.usage.output_tokens = Empty,
                    error.r#type = Empty,
                    otel.status_code = Empty,
                );
                if recovered {
                    span.record("warden.recovered", true);
                }
                spans::link(&span, &anchor.span_context());
                if let Some(before) = follows {
                    spans::link(&span, before);
                }
                if let Some(p) = previous.filter(|_| recovered) {
                    spans::link(&span, &p.span_context());
                }
                span
            }
            Self::AttemptStarted {
                attempt,
                timeout,
                provider,
                retries,
            } => {
                let span = tracing::info_span!(
                    names::ATTEMPT_STARTED,
                    warden.session.key = key,
                    gen_ai.conversation.id = conv,
                    gen_ai.provider.name = provider,
                    warden.turn = int(attempt.turn),
                    warden.attempt = int(attempt.attempt),
                    warden.timeout_ms = millis(timeout),
                    error.r#type = Empty,
                    otel.status_code = Empty,
                );
                if let Some(prev) = retries {
                    spans::link(&span, prev);
                }
                span
            }
            Self::AttemptQueued { attempt, pool } => tracing::info_span!(
                names::ATTEMPT_QUEUED,
                warden.session.key = key,
                gen_ai.conversation.id = conv,
                warden.turn = int(attempt.turn),
                warden.attempt = int(attempt.attempt),
                warden.pool = pool,
                warden.wait_ms = Empty,
            ),
            Self::WatchdogKill {
                watch_id,
                silent_for,
                timeout,
            } => tracing::warn_span!(
                names::WATCHDOG_KILLED,
                warden.session.key = key,
                gen_ai.conversation.id = conv,
                warden.watch_id = int(watch_id),
                warden.silent_ms = millis(silent_for),
                warden.timeout_ms = millis(timeout),
                error.r#type = "ESTREAM_TIMEOUT",
                otel.status_code = "ERROR",
            ),
            Self::StreamTimedOut {
                attempt,
                phase,
                silent_for,
                timeout,
            } => tracing::info_span!(
                names::STREAM_TIMED_OUT,
                warden.session.key = key,
                gen_ai.conversation.id = conv,
                warden.attempt = int(attempt.attempt),
                stream.phase = phase.as_str(),
                warden.silent_ms = millis(silent_for),
                warden.timeout_ms = millis(timeout),
                error.r#type = "ESTREAM_TIMEOUT",
                otel.status_code = "ERROR",
            ),
            Self::RetryScheduled {
                failed,
                delay,
                error_code,
                retries,
            } => {
                let span = tracing::info_span!(
                    names::RETRY_SCHEDULED,
                    warden.session.key = key,
                    gen_ai.conversation.id = conv,
                    warden.attempt = int(failed.attempt + 1),
                    warden.delay_ms = millis(delay),
                    error.r#type = error_code,
                );
                if let Some(prev) = retries {
                    spans::link(&span, prev);
                }
                span
            }
            Self::ContinueScheduled {
                failed,
                delay,
                error_code,
                kept_bytes,
                retries,
            } => {
                let span = tracing::info_span!(
                    names::CONTINUE_SCHEDULED,
                    warden.session.key = key,
                    gen_ai.conversation.id = conv,
                    warden.attempt = int(failed.attempt + 1),
                    warden.delay_ms = millis(delay),
                    warden.kept_bytes = int(kept_bytes),
                    error.r#type = error_code,
                );
                if let Some(prev) = retries {
                    spans::link(&span, prev);
                }
                span
            }
            Self::TurnRedelivered {
                turn,
                cause,
                previous_trace,
                previous,
                events_delivered,
                node,
            } => {
                let span = tracing::info_span!(
                    names::TURN_REDELIVERED,
                    warden.session.key = key,
                    warden.turn = int(turn),
                    warden.cause = cause,
                    warden.events_delivered = int(events_delivered),
                    warden.previous_trace = previous_trace,
                    warden.node = node,
                );
                if let Some(p) = previous {
                    spans::link(&span, p);
                }
                span
            }
            Self::TurnCancelled { turn } => tracing::info_span!(
                names::TURN_CANCELLED,
                warden.session.key = key,
                gen_ai.conversation.id = conv,
                warden.turn = int(turn),
            ),
            Self::TurnDeadline { turn, after } => tracing::warn_span!(
                names::TURN_DEADLINE_EXCEEDED,
                warden.session.key = key,
                gen_ai.conversation.id = conv,
                warden.turn = int(turn),
                warden.deadline_ms = millis(after),
                error.r#type = "ETURN_DEADLINE",
                otel.status_code = "ERROR",
            ),
            Self::TurnTooLarge { turn, limit } => tracing::warn_span!(
                names::REPLY_TOO_LARGE,
                warden.session.key = key,
                gen_ai.conversation.id = conv,
                warden.turn = int(turn),
                warden.limit_bytes = int(limit),
                error.r#type = "EREPLY_TOO_LARGE",
                otel.status_code = "ERROR",
            ),
            Self::Reaped {
                idle_for,
                context_tokens,
                ..
            } => tracing::info_span!(
                names::SESSION_REAPED,
                warden.session.key = key,
                gen_ai.conversation.id = conv,
                warden.idle_ms = millis(idle_for),
                warden.context_tokens = int(context_tokens.unwrap_or(0)),
            ),
            Self::Restarted {
                restarts_in_window, ..
            } => tracing::warn_span!(
                names::SESSION_RESTARTED,
                warden.session.key = key,
                warden.restarts_in_window = int(restarts_in_window),
                error.r#type = "ESESSION_FAILED",
            ),
            Self::GivenUp { .. } => tracing::error_span!(
                names::SUPERVISOR_ESCALATED,
                warden.session.key = key,
                error.r#type = "EESCALATED",
                otel.status_code = "ERROR",
            ),
            Self::ResumeFailed {
                failed_id,
                cause,
                error,
                workspace,
                diagnostics,
            } => tracing::error_span!(
                names::RESUME_FAILED,
                warden.session.key = key,
                gen_ai.conversation.id = failed_id,
                warden.cause = cause.as_str(),
                warden.workspace = workspace
                    .map(|w| w.display().to_string())
                    .unwrap_or_default(),
                warden.transcript_bytes = int(diagnostics.transcript_bytes.unwrap_or(0)),
                error.r#type = error.code(),
                otel.status_code = "ERROR",
            ),
            Self::WorkspaceNormalized {
                original,
                normalized,
            } => tracing::debug_span!(
                names::WORKSPACE_NORMALIZED,
                warden.session.key = key,
                warden.workspace.original = original.to_string_lossy().as_ref(),
                warden.workspace = normalized.to_string_lossy().as_ref(),
            ),
            Self::FreshFallback {
                failed_id,
                redelivered,
            } => tracing::warn_span!(
                names::FRESH_FALLBACK,
                warden.session.key = key,
                gen_ai.conversation.id = failed_id,
                warden.redelivered = int(redelivered),
            ),
            Self::SessionFailed { .. } => tracing::error_span!(
                names::SESSION_FAILED,
                warden.session.key = key,
                error.r#type = TurnError::SessionFailed {
                    reason: String::new()
                }
                .code(),
                otel.status_code = "ERROR",
            ),
            Self::StoreFailed { error } => {
                let span = tracing::info_span!(
                    names::STORE_FAILED,
                    warden.session.key = key,
                    otel.status_code = Empty,
                );
                // A lease lost is a cluster doing its job, not a failure.
                if !matches!(error, StoreError::LeaseLost { .. }) {
                    span.record("otel.status_code", "ERROR");
                }
                span
            }
            Self::SessionStopped { abnormal, .. } => {
                let span = tracing::info_span!(
                    names::SESSION_STOPPED,
                    warden.session.key = key,
                    warden.abnormal = abnormal,
                    otel.status_code = Empty,
                );
                if abnormal {
                    span.record("otel.status_code", "ERROR");
                }
                span
            }
            Self::AgentSessionId { .. }
            | Self::AttemptAdmitted { .. }
            | Self::AttemptEnded { .. }
            | Self::ContextUsage(_)
            | Self::TurnFinished { .. } => tracing::Span::none(),
        }
    }

    /// Records what a transition without its own span adds to its parent:
    /// a finished turn's outcome onto `turn_started`, an admission's wait
    /// onto `attempt_queued`.
    pub(super) fn finish_onto(&self, turn_span: &tracing::Span, conversation: Option<&str>) {
        if let Self::AttemptAdmitted { waited, .. } = *self {
            turn_span.record("warden.wait_ms", millis(waited));
            return;
        }
        let Self::TurnFinished {
            attempts,
            error_code,
            usage,
            context,
            ..
        } = *self
        else {
            return;
        };
        turn_span.record("warden.attempts", int(attempts));
        turn_span.record("gen_ai.conversation.id", conversation.unwrap_or(""));
        if let Some(u) = usage {
            turn_span.record("gen_ai.usage.output_tokens", int(u.output_tokens));
        }
        if let Some(c) = context {
            turn_span.record("gen_ai.usage.input_tokens", int(c.tokens));
            turn_span.record("warden.ctx_pct", int(c.percent));
        }
        if let Some(code) = error_code {
            spans::fail(turn_span, code);
        }
    }
}
