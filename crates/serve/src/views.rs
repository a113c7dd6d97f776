//! JSON views of sessions and lifecycle events, as the API sends them.
//! Never prompt or completion text: records and events carry none.

use serde_json::{Value, json};
use warden_core::{LifecycleEvent, RecordStatus, SessionRecord, SessionStatus};

/// A session: its stored record, and while it runs, what it is doing.
pub(crate) fn session(record: Option<&SessionRecord>, running: Option<&SessionStatus>) -> Value {
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

/// A lifecycle event: its type and its fields; `None` for events that
/// carry nothing a client needs.
pub(crate) fn lifecycle(e: &LifecycleEvent) -> Option<(&'static str, Value)> {
    use LifecycleEvent as L;
    let ms = |d: std::time::Duration| d.as_millis() as u64;
    Some(match e {
        L::SessionSpawned { key } => ("session_spawned", json!({"key": key.as_str()})),
        L::SessionStopped {
            key,
            reason,
            abnormal,
        } => (
            "session_stopped",
            json!({"key": key.as_str(), "reason": reason, "abnormal": abnormal}),
        ),
        L::SessionRestarted {
            key,
            restarts_in_window,
            cause,
        } => (
            "session_restarted",
            json!({"key": key.as_str(), "restarts_in_window": restarts_in_window, "cause": cause}),
        ),
        L::SupervisorEscalated { key, cause } => (
            "session_given_up",
            json!({"key": key.as_str(), "cause": cause}),
        ),
        L::ResumeFailed {
            key,
            failed_id,
            cause,
        } => (
            "resume_failed",
            json!({"key": key.as_str(), "conversation": failed_id, "cause": cause.as_str()}),
        ),
        L::FreshFallback {
            key, redelivered, ..
        } => (
            "fresh_fallback",
            json!({"key": key.as_str(), "redelivered": redelivered}),
        ),
        L::SessionFailed { key, reason } => (
            "session_failed",
            json!({"key": key.as_str(), "reason": reason}),
        ),
        L::SessionReaped {
            key,
            idle_for,
            context_tokens,
        } => (
            "session_reaped",
            json!({"key": key.as_str(), "idle_ms": ms(*idle_for), "context_tokens": context_tokens}),
        ),
        L::ContextUsage {
            key,
            tokens,
            window,
            percent,
            ..
        } => (
            "context",
            json!({"key": key.as_str(), "tokens": tokens, "window": window, "percent": percent}),
        ),
        L::TurnStarted { key, turn } => {
            ("turn_started", json!({"key": key.as_str(), "turn": turn}))
        }
        L::AttemptQueued { key, attempt, pool } => (
            "attempt_queued",
            json!({"key": key.as_str(), "turn": attempt.turn, "attempt": attempt.attempt, "pool": pool}),
        ),
        L::AttemptStarted {
            key,
            attempt,
            timeout,
        } => (
            "attempt_started",
            json!({"key": key.as_str(), "turn": attempt.turn, "attempt": attempt.attempt, "timeout_ms": ms(*timeout)}),
        ),
        L::StreamTimedOut {
            key,
            attempt,
            silent_for,
        } => (
            "stream_timed_out",
            json!({"key": key.as_str(), "turn": attempt.turn, "attempt": attempt.attempt, "silent_ms": ms(*silent_for)}),
        ),
        L::RetryScheduled {
            key,
            failed,
            delay,
            error_code,
        } => (
            "retry_scheduled",
            json!({"key": key.as_str(), "turn": failed.turn, "failed_attempt": failed.attempt, "delay_ms": ms(*delay), "code": error_code}),
        ),
        L::ContinueScheduled {
            key,
            failed,
            delay,
            error_code,
            kept_bytes,
        } => (
            "continue_scheduled",
            json!({"key": key.as_str(), "turn": failed.turn, "failed_attempt": failed.attempt, "delay_ms": ms(*delay), "code": error_code, "kept_bytes": kept_bytes}),
        ),
        L::TurnFinished {
            key,
            turn,
            attempts,
            error_code,
        } => (
            "turn_finished",
            json!({"key": key.as_str(), "turn": turn, "attempts": attempts, "code": error_code}),
        ),
        _ => return None,
    })
}
