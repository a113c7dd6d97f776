//! JSON views of sessions and lifecycle events, as the API sends them.
//! Never prompt or completion text: records and events carry none.

use serde_json::{Value, json};
use warden_core::{LifecycleEvent, RecordStatus, SessionRecord, SessionStatus};

/// A session: its stored record, and while it runs, what it is doing.
pub(crate) fn session(
    record: Option<&SessionRecord>,
    running: Option<&SessionStatus>,
    turn_id: Option<&str>,
) -> Value {
    let record = record.or(running.map(|s| &s.record));
    let mut v = json!({
        "key": record.map(|r| r.key.as_str()),
        "running": running.is_some(),
    });
    if let Some(r) = record {
        v["workspace"] = json!(r.workspace.as_ref().map(|w| w.display().to_string()));
        v["conversation"] = json!(r.agent_session_id);
        v["model"] = json!(r.model);
        v["status"] = json!(status(&r.status));
        if let RecordStatus::Failed { reason } = &r.status {
            v["failure"] = json!(reason);
        }
        v["pending"] = json!(r.pending.len());
        v["restarts"] = json!(r.restart_count);
        v["context"] = json!(r.usage.map(|u| json!({
            "tokens": u.context_tokens(),
            "window": u.context_window,
            "percent": u.context_percent,
        })));
        v["last_active_ms"] = json!(r.last_active_ms);
    }
    if let Some(s) = running {
        v["turn"] = json!({
            "id": s.turn,
            "turn_id": turn_id,
            "streaming_attempt": s.streaming.map(|a| a.attempt),
            "backing_off": s.backing_off,
            "waiting_for_admission": s.admitting,
            "running_ms": s.turn_running_for.map(|d| d.as_millis() as u64),
        });
        v["queued"] = json!(s.queued);
        v["turns_finished"] = json!(s.turns_finished);
    }
    v
}

fn status(s: &RecordStatus) -> &'static str {
    match s {
        RecordStatus::New => "new",
        RecordStatus::Active => "active",
        RecordStatus::Idle => "idle",
        RecordStatus::Failed { .. } => "failed",
        _ => "unknown",
    }
}

/// A lifecycle event: its type and its fields (core's one view of it,
/// [`LifecycleEvent::to_json`]); `None` for events that carry nothing a
/// client needs: the conversation id and the normalized workspace are in
/// the session's view, store errors are the operator's (logged), and
/// admission is announced by `attempt_queued` / `attempt_started`.
pub(crate) fn lifecycle(e: &LifecycleEvent) -> Option<(&'static str, Value)> {
    use LifecycleEvent as L;
    match e {
        L::AgentSessionId { .. }
        | L::WorkspaceNormalized { .. }
        | L::StoreFailed { .. }
        | L::AttemptAdmitted { .. } => None,
        _ => Some((e.name(), e.to_json())),
    }
}
