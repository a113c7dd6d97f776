//! A lifecycle event as clients see it: its name on the wire and its JSON
//! (one view, used by `warden serve`'s `/v1/events` and the demo's
//! `--json`).

use super::LifecycleEvent;
use crate::names;
use crate::source::SessionKey;

/// The session of a variant that has one; `None` of the one marked
/// `before_session`.
macro_rules! key_of {
    ($e:expr, $event:ident) => {
        match $e {
            LifecycleEvent::$event { key, .. } => Some(key),
            _ => None,
        }
    };
    ($e:expr, $event:ident $before_session:ident) => {
        None
    };
}

/// `name` and `key`, from the one table (`names::table!`): a variant
/// without a row does not compile.
macro_rules! event_names {
    ($(
        #[doc = $doc:literal]
        $konst:ident = $name:literal, $traced:ident, $transition:ident
        $(=> $event:ident $($before_session:ident)?)?;
    )*) => {
        impl LifecycleEvent {
            /// The event's name on the wire: its transition's one name (see
            /// [`crate::names`]), the snake case of its variant. The SSE event
            /// type of `warden serve`'s `GET /v1/events`, the `event` of the
            /// demo's `--json` lines, its span's name. Stable: a client may
            /// match on it.
            pub fn name(&self) -> &'static str {
                match self {
                    $($(Self::$event { .. } => names::$konst,)?)*
                }
            }

            /// The session the event is about; `None` for
            /// [`WorkspaceNormalized`](Self::WorkspaceNormalized), which comes
            /// before there is one.
            pub fn key(&self) -> Option<&SessionKey> {
                match self {
                    $($(Self::$event { .. } => key_of!(self, $event $($before_session)?),)?)*
                }
            }
        }
    };
}

names::table!(event_names);

impl LifecycleEvent {
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

    /// Every published row of the one table has an event here, converted
    /// to the wire type of its own name, with its session unless it comes
    /// before one, and a turn (and the server's turn id once set) exactly
    /// when its wire type is a turn's.
    #[test]
    fn every_published_transition_reaches_the_wire_as_its_own_type() {
        let events = every_event();
        let published: HashSet<&str> = names::TRANSITIONS
            .iter()
            .filter(|t| t.published)
            .map(|t| t.name)
            .collect();
        let here: HashSet<&str> = events.iter().map(LifecycleEvent::name).collect();
        assert_eq!(
            here, published,
            "every_event() is every published transition"
        );
        for e in &events {
            let mut wire = e.to_wire();
            assert_eq!(wire.name(), e.name(), "{e:?} converts to another type");
            assert_eq!(
                e.key().is_none(),
                e.name() == names::WORKSPACE_NORMALIZED,
                "{} has a session unless it comes before one",
                e.name()
            );
            let of_turn = wire.turn().is_some();
            wire.set_turn_id("t_1".into());
            let json = serde_json::to_value(&wire).expect("serialises");
            assert_eq!(
                json.get("turn_id").is_some(),
                of_turn,
                "{}: a turn id exactly on a turn's event: {json}",
                e.name()
            );
            assert_eq!(
                json.get("turn").is_some(),
                of_turn,
                "{}: a turn exactly on a turn's event: {json}",
                e.name()
            );
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
