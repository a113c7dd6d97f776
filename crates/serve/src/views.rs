//! JSON views of sessions and lifecycle events, as the API sends them.
//! Never prompt or completion text: records and events carry none.

use warden_core::lifecycle::wire::LifecycleData;
use warden_core::{LifecycleEvent, RecordStatus, SessionRecord, SessionStatus};

use crate::api::{ContextFill, RunningTurn, SessionDetail, SessionState};

/// A session: its stored record, and while it runs, what it is doing.
pub(crate) fn session(
    record: Option<&SessionRecord>,
    running: Option<&SessionStatus>,
    turn_id: Option<&str>,
) -> SessionDetail {
    let record = record.or(running.map(|s| &s.record));
    let mut v = SessionDetail {
        running: running.is_some(),
        ..SessionDetail::default()
    };
    if let Some(r) = record {
        v.workspace = r.workspace.as_ref().map(|w| w.display().to_string());
        v.conversation = r.agent_session_id.clone();
        v.model = r.model.clone();
        v.status = Some(status(&r.status));
        if let RecordStatus::Failed { reason } = &r.status {
            v.failure = Some(reason.clone());
        }
        v.pending = Some(r.pending.len() as u64);
        v.restarts = Some(r.restart_count);
        v.context = r.usage.map(|u| {
            ContextFill::new(
                u.context_tokens(),
                u.context_window,
                u64::from(u.context_percent),
            )
        });
        v.last_active_ms = Some(r.last_active_ms);
    }
    if let Some(s) = running {
        v.turn = Some(RunningTurn {
            id: s.turn,
            turn_id: turn_id.map(str::to_owned),
            streaming_attempt: s.streaming.map(|a| a.attempt),
            backing_off: s.backing_off,
            waiting_for_admission: s.admitting,
            running_ms: s.turn_running_for.map(|d| d.as_millis() as u64),
        });
        v.queued = Some(s.queued as u64);
        v.turns_finished = Some(s.turns_finished);
    }
    v
}

fn status(s: &RecordStatus) -> SessionState {
    match s {
        RecordStatus::New => SessionState::New,
        RecordStatus::Active => SessionState::Active,
        RecordStatus::Idle => SessionState::Idle,
        RecordStatus::Failed { .. } => SessionState::Failed,
        _ => SessionState::Unknown,
    }
}

/// A lifecycle event: its type and its fields (core's one view of it,
/// [`LifecycleEvent::to_json`]). Every lifecycle event is one of
/// `warden_core::names::TRANSITIONS` marked published, and every one is
/// sent: the list `/v1/events` serves, the API document's
/// `LifecycleEvents` and the docs' table are that one declaration.
pub(crate) fn lifecycle(e: &LifecycleEvent) -> (&'static str, LifecycleData) {
    (e.name(), e.to_wire())
}
