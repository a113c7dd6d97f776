//! [`LifecycleEvent::to_wire`]: each event as clients receive it.

use std::time::Duration;

use super::*;

fn ms(d: &Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl LifecycleEvent {
    /// The event's fields as clients receive them.
    pub fn to_wire(&self) -> LifecycleData {
        use LifecycleData as W;
        use LifecycleEvent as L;
        let key = self
            .key()
            .map(|k| k.as_str().to_owned())
            .unwrap_or_default();
        match self {
            L::SessionSpawned { .. } => W::SessionSpawned(SessionSpawned { key }),
            L::SessionStopped {
                reason, abnormal, ..
            } => W::SessionStopped(SessionStopped {
                key,
                reason: reason.clone(),
                abnormal: *abnormal,
            }),
            L::SessionRestarted {
                restarts_in_window,
                cause,
                ..
            } => W::SessionRestarted(SessionRestarted {
                key,
                restarts_in_window: *restarts_in_window,
                cause: cause.clone(),
            }),
            L::SupervisorEscalated { cause, .. } => W::SupervisorEscalated(SupervisorEscalated {
                key,
                cause: cause.clone(),
            }),
            L::AgentSessionId { session_id, .. } => W::AgentSessionId(AgentSessionId {
                key,
                conversation: session_id.clone(),
            }),
            L::ResumeFailed {
                failed_id, cause, ..
            } => W::ResumeFailed(ResumeFailed {
                key,
                conversation: failed_id.clone(),
                cause: cause.as_str().to_owned(),
            }),
            L::FreshFallback {
                failed_id,
                redelivered,
                ..
            } => W::FreshFallback(FreshFallback {
                key,
                conversation: failed_id.clone(),
                redelivered: *redelivered as u64,
            }),
            L::SessionFailed { reason, .. } => W::SessionFailed(SessionFailed {
                key,
                reason: reason.clone(),
            }),
            L::SessionReaped {
                idle_for,
                context_tokens,
                ..
            } => W::SessionReaped(SessionReaped {
                key,
                idle_ms: ms(idle_for),
                context_tokens: *context_tokens,
            }),
            L::ContextUsage {
                tokens,
                window,
                percent,
                self_reported,
                ..
            } => W::ContextUsage(ContextUsage {
                key,
                tokens: *tokens,
                window: *window,
                percent: *percent,
                self_reported: *self_reported,
            }),
            L::WorkspaceNormalized {
                original,
                normalized,
            } => W::WorkspaceNormalized(WorkspaceNormalized {
                original: original.display().to_string(),
                normalized: normalized.display().to_string(),
            }),
            L::StoreFailed { error, .. } => W::StoreFailed(StoreFailed {
                key,
                error: error.to_string(),
            }),
            L::TurnStarted { turn, .. } => W::TurnStarted(TurnStarted {
                key,
                turn_id: None,
                turn: *turn,
            }),
            L::AttemptQueued { attempt, pool, .. } => W::AttemptQueued(AttemptQueued {
                key,
                turn_id: None,
                turn: attempt.turn,
                attempt: attempt.attempt,
                pool: pool.clone(),
            }),
            L::AttemptAdmitted {
                attempt, waited, ..
            } => W::AttemptAdmitted(AttemptAdmitted {
                key,
                turn_id: None,
                turn: attempt.turn,
                attempt: attempt.attempt,
                waited_ms: ms(waited),
            }),
            L::AttemptStarted {
                attempt, timeout, ..
            } => W::AttemptStarted(AttemptStarted {
                key,
                turn_id: None,
                turn: attempt.turn,
                attempt: attempt.attempt,
                timeout_ms: ms(timeout),
            }),
            L::StreamTimedOut {
                attempt,
                silent_for,
                ..
            } => W::StreamTimedOut(StreamTimedOut {
                key,
                turn_id: None,
                turn: attempt.turn,
                attempt: attempt.attempt,
                silent_ms: ms(silent_for),
            }),
            L::RetryScheduled {
                failed,
                delay,
                error_code,
                ..
            } => W::RetryScheduled(RetryScheduled {
                key,
                turn_id: None,
                turn: failed.turn,
                failed_attempt: failed.attempt,
                delay_ms: ms(delay),
                code: (*error_code).to_owned(),
            }),
            L::ContinueScheduled {
                failed,
                delay,
                error_code,
                kept_bytes,
                ..
            } => W::ContinueScheduled(ContinueScheduled {
                key,
                turn_id: None,
                turn: failed.turn,
                failed_attempt: failed.attempt,
                delay_ms: ms(delay),
                code: (*error_code).to_owned(),
                kept_bytes: *kept_bytes as u64,
            }),
            L::AttemptEnded {
                attempt,
                outcome,
                error_code,
                ..
            } => W::AttemptEnded(AttemptEnded {
                key,
                turn_id: None,
                turn: attempt.turn,
                attempt: attempt.attempt,
                outcome: *outcome,
                code: error_code.map(str::to_owned),
            }),
            L::TurnFinished {
                turn,
                attempts,
                error_code,
                ..
            } => W::TurnFinished(TurnFinished {
                key,
                turn_id: None,
                turn: *turn,
                attempts: *attempts,
                code: error_code.map(str::to_owned),
            }),
        }
    }
}
