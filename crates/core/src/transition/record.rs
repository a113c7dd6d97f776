//! Each [`Transition`]'s log event and lifecycle event. One arm per
//! transition in each. (Its span: `span.rs`.)

use crate::lifecycle::LifecycleEvent;
use crate::source::SessionKey;
use crate::store::StoreError;

use std::path::Path;

use super::{Incarnation, Transition, int, millis};

impl Transition<'_> {
    /// The log event (emitted inside the transition's span).
    pub(super) fn log(&self, key: &SessionKey) {
        let event = self.name();
        match *self {
            Self::Incarnated {
                incarnation,
                workspace,
                model,
                recovered,
                ..
            } => match incarnation {
                Incarnation::FreshFallback => tracing::warn!(
                    event, session.key = %key, cwd = workspace.map(Path::to_string_lossy).as_deref(), recovered = int(recovered),
                    "starting fresh after a resume failure"
                ),
                Incarnation::Resume => tracing::info!(
                    event, session.key = %key, cwd = workspace.map(Path::to_string_lossy).as_deref(), recovered = int(recovered),
                    "resuming stored session"
                ),
                Incarnation::Spawn => tracing::info!(
                    event, session.key = %key, cwd = workspace.map(Path::to_string_lossy).as_deref(), model,
                    recovered = int(recovered),
                    "new session"
                ),
            },
            Self::TurnStarted { turn, .. } => {
                tracing::info!(event, session.key = %key, turn = int(turn), "turn started")
            }
            Self::TurnRedelivered {
                turn,
                cause,
                events_delivered,
                ..
            } => tracing::info!(
                event, session.key = %key, turn = int(turn), cause,
                events_delivered = int(events_delivered),
                "turn re-delivered after its session stopped without answering it"
            ),
            Self::AttemptStarted {
                attempt, timeout, ..
            } => tracing::debug!(
                event, session.key = %key, turn = int(attempt.turn), attempt = int(attempt.attempt),
                timeout_ms = millis(timeout), "stream attempt started"
            ),
            Self::AttemptQueued { attempt, pool } => tracing::info!(
                event, session.key = %key, turn = int(attempt.turn), attempt = int(attempt.attempt), pool,
                "waiting for admission"
            ),
            Self::AttemptAdmitted { attempt, waited } => tracing::info!(
                event, session.key = %key, turn = int(attempt.turn), attempt = int(attempt.attempt),
                wait_ms = millis(waited), "admitted"
            ),
            Self::WatchdogKill { watch_id, .. } => {
                tracing::debug!(event, session.key = %key, watch_id = int(watch_id), "watchdog killed the stream")
            }
            Self::StreamTimedOut {
                attempt,
                silent_for,
                phase,
                ..
            } => tracing::warn!(
                event, session.key = %key, turn = int(attempt.turn), attempt = int(attempt.attempt),
                stream.phase = phase.as_str(),
                error.r#type = "ESTREAM_TIMEOUT", silent_ms = millis(silent_for),
                "Connection lost during streaming"
            ),
            Self::AttemptEnded {
                attempt,
                outcome,
                error_code,
            } => tracing::debug!(
                event, session.key = %key, turn = int(attempt.turn), attempt = int(attempt.attempt),
                outcome = outcome.as_str(), error.r#type = error_code,
                "stream attempt ended"
            ),
            Self::RetryScheduled {
                failed,
                delay,
                error_code,
                ..
            } => tracing::info!(
                event, session.key = %key, turn = int(failed.turn), attempt = int(failed.attempt + 1),
                delay_ms = millis(delay), error.r#type = error_code,
                "retrying turn from scratch"
            ),
            Self::ContinueScheduled {
                failed,
                delay,
                error_code,
                kept_bytes,
                ..
            } => tracing::info!(
                event, session.key = %key, turn = int(failed.turn), attempt = int(failed.attempt + 1),
                delay_ms = millis(delay), error.r#type = error_code, kept_bytes = int(kept_bytes),
                "continuing the broken reply"
            ),
            Self::TurnCancelled { turn } => {
                tracing::info!(event, session.key = %key, turn = int(turn), "turn cancelled by user")
            }
            Self::TurnDeadline { turn, after } => tracing::warn!(
                event, session.key = %key, turn = int(turn), deadline_ms = millis(after),
                error.r#type = "ETURN_DEADLINE", "turn exceeded its deadline; stopped"
            ),
            Self::TurnTooLarge { turn, limit } => tracing::warn!(
                event, session.key = %key, turn = int(turn), limit_bytes = int(limit),
                error.r#type = "EREPLY_TOO_LARGE", "turn's reply passed its size cap; stopped"
            ),
            Self::AgentSessionId {
                session_id,
                previous,
            } => tracing::info!(
                event, session.key = %key, gen_ai.conversation.id = session_id, previous,
                "agent session id stored"
            ),
            Self::ContextUsage(c) => tracing::info!(
                event, session.key = %key, input_tokens = int(c.tokens), sdk_pct = int(c.percent),
                self_reported_pct = c.self_reported.map(int),
                drift_pct = c.self_reported.map(|s| i64::from(s) - i64::from(c.percent)),
                "context usage"
            ),
            Self::TurnFinished {
                turn,
                attempts,
                error_code,
                ..
            } => tracing::info!(
                event, session.key = %key, turn = int(turn), attempts = int(attempts),
                error.r#type = error_code, "turn finished"
            ),
            Self::Reaped {
                idle_for,
                context_tokens,
                workspace,
            } => tracing::info!(
                event, session.key = %key, cwd = workspace.map(Path::to_string_lossy).as_deref(),
                idle_ms = millis(idle_for), context_tokens = context_tokens.map(int), "reaping idle session"
            ),
            Self::SessionStopped { reason, abnormal } => {
                tracing::debug!(event, session.key = %key, reason, abnormal, "session stopped")
            }
            Self::Restarted {
                restarts_in_window,
                cause,
            } => tracing::warn!(
                event, session.key = %key, restarts_in_window = int(restarts_in_window), cause, "restarting session"
            ),
            Self::GivenUp { cause } => tracing::error!(
                event, session.key = %key, cause,
                "restart intensity exceeded; giving up on session"
            ),
            Self::ResumeFailed {
                failed_id,
                cause,
                error,
                workspace,
                diagnostics,
            } => tracing::error!(
                event, session.key = %key, gen_ai.conversation.id = failed_id,
                error.r#type = error.code(), error = %error, cause = cause.as_str(),
                cwd = workspace.map(Path::to_string_lossy).as_deref(),
                stderr_tail = diagnostics.stderr_tail.as_deref(),
                transcript = diagnostics.transcript_path.as_deref().map(Path::to_string_lossy).as_deref(),
                transcript_bytes = diagnostics.transcript_bytes.map(int),
                "resume failed; starting fresh"
            ),
            Self::FreshFallback {
                failed_id,
                redelivered,
            } => tracing::warn!(
                event, session.key = %key, failed_id, redelivered = int(redelivered),
                "session restarted fresh; messages re-delivered"
            ),
            Self::SessionFailed { reason } => {
                tracing::error!(event, session.key = %key, reason, "session failed")
            }
            // A lease lost is a cluster doing its job (another node took
            // the session over, or this node gave it up in a database
            // outage, which its node warns of once): expected, not an error
            // of this record, and not said to have moved when it may not.
            Self::StoreFailed {
                error: error @ StoreError::LeaseLost { .. },
            } => tracing::info!(
                event, session.key = %key, error = %error,
                "this node no longer holds the session's lease; stopped here"
            ),
            Self::StoreFailed { error } => tracing::error!(
                event, session.key = %key, error = %error,
                "session record unusable; left untouched"
            ),
            Self::WorkspaceNormalized {
                original,
                normalized,
            } => tracing::debug!(
                event, original = %original.display(), normalized = %normalized.display(),
                "workspace normalized"
            ),
        }
    }

    /// The lifecycle event, if the transition has one.
    pub(super) fn lifecycle(&self, key: &SessionKey) -> Option<LifecycleEvent> {
        let key = key.clone();
        Some(match *self {
            Self::Incarnated { .. } => LifecycleEvent::SessionSpawned { key },
            Self::TurnStarted { turn, .. } => LifecycleEvent::TurnStarted { key, turn },
            Self::AttemptStarted {
                attempt, timeout, ..
            } => LifecycleEvent::AttemptStarted {
                key,
                attempt,
                timeout,
            },
            Self::AttemptQueued { attempt, pool } => LifecycleEvent::AttemptQueued {
                key,
                attempt,
                pool: pool.to_owned(),
            },
            Self::AttemptAdmitted { attempt, waited } => LifecycleEvent::AttemptAdmitted {
                key,
                attempt,
                waited,
            },
            Self::StreamTimedOut {
                attempt,
                silent_for,
                ..
            } => LifecycleEvent::StreamTimedOut {
                key,
                attempt,
                silent_for,
            },
            Self::AttemptEnded {
                attempt,
                outcome,
                error_code,
            } => LifecycleEvent::AttemptEnded {
                key,
                attempt,
                outcome,
                error_code,
            },
            Self::RetryScheduled {
                failed,
                delay,
                error_code,
                ..
            } => LifecycleEvent::RetryScheduled {
                key,
                failed,
                delay,
                error_code,
            },
            Self::ContinueScheduled {
                failed,
                delay,
                error_code,
                kept_bytes,
                ..
            } => LifecycleEvent::ContinueScheduled {
                key,
                failed,
                delay,
                error_code,
                kept_bytes,
            },
            Self::AgentSessionId { session_id, .. } => LifecycleEvent::AgentSessionId {
                key,
                session_id: session_id.to_owned(),
            },
            Self::ContextUsage(c) => LifecycleEvent::ContextUsage {
                key,
                tokens: c.tokens,
                window: c.window,
                percent: c.percent,
                self_reported: c.self_reported,
            },
            Self::TurnFinished {
                turn,
                attempts,
                error_code,
                ..
            } => LifecycleEvent::TurnFinished {
                key,
                turn,
                attempts,
                error_code,
            },
            Self::Reaped {
                idle_for,
                context_tokens,
                ..
            } => LifecycleEvent::SessionReaped {
                key,
                idle_for,
                context_tokens,
            },
            Self::SessionStopped { reason, abnormal } => LifecycleEvent::SessionStopped {
                key,
                reason: Some(reason.to_owned()),
                abnormal,
            },
            Self::Restarted {
                restarts_in_window,
                cause,
            } => LifecycleEvent::SessionRestarted {
                key,
                restarts_in_window,
                cause: cause.to_owned(),
            },
            Self::GivenUp { cause } => LifecycleEvent::SupervisorEscalated {
                key,
                cause: cause.to_owned(),
            },
            Self::ResumeFailed {
                failed_id, cause, ..
            } => LifecycleEvent::ResumeFailed {
                key,
                failed_id: failed_id.to_owned(),
                cause,
            },
            Self::FreshFallback {
                failed_id,
                redelivered,
            } => LifecycleEvent::FreshFallback {
                key,
                failed_id: failed_id.to_owned(),
                redelivered,
            },
            Self::SessionFailed { reason } => LifecycleEvent::SessionFailed {
                key,
                reason: reason.to_owned(),
            },
            Self::StoreFailed { error } => LifecycleEvent::StoreFailed {
                key,
                error: error.clone(),
            },
            Self::WorkspaceNormalized {
                original,
                normalized,
            } => LifecycleEvent::WorkspaceNormalized {
                original: original.to_path_buf(),
                normalized: normalized.to_path_buf(),
            },
            Self::WatchdogKill { .. }
            | Self::TurnRedelivered { .. }
            | Self::TurnCancelled { .. }
            | Self::TurnDeadline { .. }
            | Self::TurnTooLarge { .. } => {
                return None;
            }
        })
    }
}
