//! A lifecycle event as clients see it: its name on the wire and its JSON
//! (one view, used by `warden serve`'s `/v1/events` and the demo's
//! `--json`).

use super::LifecycleEvent;
use crate::names;
use crate::source::SessionKey;

impl LifecycleEvent {
    /// The event's name on the wire: its transition's one name (see
    /// [`crate::names`]), the snake case of its variant. The SSE event type
    /// of `warden serve`'s `GET /v1/events`, the `event` of the demo's
    /// `--json` lines, its span's name. Stable: a client may match on it.
    pub fn name(&self) -> &'static str {
        use LifecycleEvent as L;
        match self {
            L::SessionSpawned { .. } => names::SESSION_SPAWNED,
            L::SessionStopped { .. } => names::SESSION_STOPPED,
            L::SessionRestarted { .. } => names::SESSION_RESTARTED,
            L::SupervisorEscalated { .. } => names::SUPERVISOR_ESCALATED,
            L::AgentSessionId { .. } => names::AGENT_SESSION_ID,
            L::ResumeFailed { .. } => names::RESUME_FAILED,
            L::FreshFallback { .. } => names::FRESH_FALLBACK,
            L::SessionFailed { .. } => names::SESSION_FAILED,
            L::SessionReaped { .. } => names::SESSION_REAPED,
            L::ContextUsage { .. } => names::CONTEXT_USAGE,
            L::WorkspaceNormalized { .. } => names::WORKSPACE_NORMALIZED,
            L::StoreFailed { .. } => names::STORE_FAILED,
            L::TurnStarted { .. } => names::TURN_STARTED,
            L::AttemptQueued { .. } => names::ATTEMPT_QUEUED,
            L::AttemptAdmitted { .. } => names::ATTEMPT_ADMITTED,
            L::AttemptStarted { .. } => names::ATTEMPT_STARTED,
            L::StreamTimedOut { .. } => names::STREAM_TIMED_OUT,
            L::RetryScheduled { .. } => names::RETRY_SCHEDULED,
            L::ContinueScheduled { .. } => names::CONTINUE_SCHEDULED,
            L::AttemptEnded { .. } => names::ATTEMPT_ENDED,
            L::TurnFinished { .. } => names::TURN_FINISHED,
        }
    }

    /// The session the event is about; `None` for
    /// [`WorkspaceNormalized`](Self::WorkspaceNormalized), which comes
    /// before there is one.
    pub fn key(&self) -> Option<&SessionKey> {
        use LifecycleEvent as L;
        match self {
            L::WorkspaceNormalized { .. } => None,
            L::SessionSpawned { key }
            | L::SessionStopped { key, .. }
            | L::SessionRestarted { key, .. }
            | L::SupervisorEscalated { key, .. }
            | L::AgentSessionId { key, .. }
            | L::ResumeFailed { key, .. }
            | L::FreshFallback { key, .. }
            | L::SessionFailed { key, .. }
            | L::SessionReaped { key, .. }
            | L::ContextUsage { key, .. }
            | L::StoreFailed { key, .. }
            | L::TurnStarted { key, .. }
            | L::AttemptQueued { key, .. }
            | L::AttemptAdmitted { key, .. }
            | L::AttemptStarted { key, .. }
            | L::StreamTimedOut { key, .. }
            | L::RetryScheduled { key, .. }
            | L::ContinueScheduled { key, .. }
            | L::AttemptEnded { key, .. }
            | L::TurnFinished { key, .. } => Some(key),
        }
    }

    /// The event as a JSON object: its [wire fields](Self::to_wire) (`key`
    /// when there is a session, and the event's fields). Carries no prompt
    /// or reply text.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self.to_wire()).unwrap_or(serde_json::Value::Null)
    }
}

#[cfg(test)]
mod tests {
    use super::super::*;
    use super::*;
    use crate::store::StoreError;
    use std::collections::HashSet;

    /// One of every variant.
    fn every_event() -> Vec<LifecycleEvent> {
        use LifecycleEvent as L;
        let key = || SessionKey::new("k");
        let attempt = AttemptId {
            turn: 3,
            attempt: 2,
        };
        let d = Duration::from_millis(1500);
        vec![
            L::SessionSpawned { key: key() },
            L::SessionStopped {
                key: key(),
                reason: Some("stop".into()),
                abnormal: false,
            },
            L::SessionRestarted {
                key: key(),
                restarts_in_window: 1,
                cause: "boom".into(),
            },
            L::SupervisorEscalated {
                key: key(),
                cause: "boom".into(),
            },
            L::AgentSessionId {
                key: key(),
                session_id: "conv_1".into(),
            },
            L::ResumeFailed {
                key: key(),
                failed_id: "conv_1".into(),
                cause: ResumeCause::PromptTooLong,
            },
            L::FreshFallback {
                key: key(),
                failed_id: "conv_1".into(),
                redelivered: 1,
            },
            L::SessionFailed {
                key: key(),
                reason: "both".into(),
            },
            L::SessionReaped {
                key: key(),
                idle_for: d,
                context_tokens: Some(7),
            },
            L::ContextUsage {
                key: key(),
                tokens: 50,
                window: 100,
                percent: 50,
                self_reported: None,
            },
            L::WorkspaceNormalized {
                original: "/a/".into(),
                normalized: "/a".into(),
            },
            L::StoreFailed {
                key: key(),
                error: StoreError::Backend {
                    message: "down".into(),
                },
            },
            L::TurnStarted {
                key: key(),
                turn: 3,
            },
            L::AttemptQueued {
                key: key(),
                attempt,
                pool: "p".into(),
            },
            L::AttemptAdmitted {
                key: key(),
                attempt,
                waited: d,
            },
            L::AttemptStarted {
                key: key(),
                attempt,
                timeout: d,
            },
            L::StreamTimedOut {
                key: key(),
                attempt,
                silent_for: d,
            },
            L::RetryScheduled {
                key: key(),
                failed: attempt,
                delay: d,
                error_code: "ESTREAM_TIMEOUT",
            },
            L::ContinueScheduled {
                key: key(),
                failed: attempt,
                delay: d,
                error_code: "ESTREAM_TIMEOUT",
                kept_bytes: 12,
            },
            L::AttemptEnded {
                key: key(),
                attempt,
                outcome: super::super::AttemptOutcome::Failed,
                error_code: Some("ESTREAM_TIMEOUT"),
            },
            L::TurnFinished {
                key: key(),
                turn: 3,
                attempts: 2,
                error_code: None,
            },
        ]
    }

    #[test]
    fn every_event_has_its_own_name_and_carries_its_session() {
        let events = every_event();
        let names: HashSet<&str> = events.iter().map(LifecycleEvent::name).collect();
        assert_eq!(names.len(), events.len(), "names are unique: {names:?}");
        for e in &events {
            let v = e.to_json();
            assert!(v.is_object(), "{v}");
            match e.key() {
                Some(_) => assert_eq!(v["key"], "k", "{}", e.name()),
                None => assert!(v.get("key").is_none(), "{}", e.name()),
            }
        }
    }

    #[test]
    fn the_fields_clients_read_keep_their_names() {
        let events = every_event();
        let find = |name: &str| {
            events
                .iter()
                .find(|e| e.name() == name)
                .map(LifecycleEvent::to_json)
                .unwrap_or_else(|| panic!("no {name}"))
        };
        let retry = find("retry_scheduled");
        assert_eq!(retry["code"], "ESTREAM_TIMEOUT");
        assert_eq!(retry["delay_ms"], 1500);
        assert_eq!(retry["failed_attempt"], 2);
        assert_eq!(retry["turn"], 3);
        assert_eq!(find("continue_scheduled")["kept_bytes"], 12);
        assert_eq!(find("stream_timed_out")["silent_ms"], 1500);
        assert_eq!(find("attempt_started")["timeout_ms"], 1500);
        assert_eq!(find("session_reaped")["idle_ms"], 1500);
        let resume = find("resume_failed");
        assert_eq!(resume["conversation"], "conv_1");
        assert_eq!(resume["cause"], ResumeCause::PromptTooLong.as_str());
        let finished = find("turn_finished");
        assert!(finished["code"].is_null(), "{finished}");
        assert_eq!(finished["attempts"], 2);
        assert_eq!(find("context_usage")["percent"], 50);
        assert_eq!(find("workspace_normalized")["normalized"], "/a");
    }
}
