//! Turns as the server keeps them: each turn's events, numbered from 1,
//! held while it runs and for a while after it ends, so a client that lost
//! its connection re-attaches with `Last-Event-ID` and misses nothing.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use serde::Serialize;
use serde_json::{Value, json};
use tokio::sync::watch;
use warden_core::{
    AgentEvent, SessionKey, TurnCanceller, TurnError, TurnEvent, TurnHandle, TurnSummary,
};

/// One event of a turn, as sent: its number, its type, its JSON.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ServeEvent {
    /// Unique and increasing within the turn, from 1 (the SSE `id:`).
    pub id: u64,
    /// `started`, `queued`, `text`, `thinking`, `tool`, `retrying`,
    /// `continuing`, `restarting`, `done` or `error` (the SSE `event:`).
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// The event's fields (the SSE `data:`).
    pub data: Value,
}

/// A turn's log: its events and whether it has ended.
#[derive(Debug)]
pub(crate) struct TurnLog {
    pub(crate) key: SessionKey,
    events: Mutex<Vec<ServeEvent>>,
    /// The number of events so far; `ended` once the last one is in.
    changed: watch::Sender<(usize, bool)>,
    canceller: TurnCanceller,
}

impl TurnLog {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<ServeEvent>> {
        self.events.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn push(&self, kind: &'static str, data: Value, last: bool) {
        let n = {
            let mut events = self.lock();
            let id = events.len() as u64 + 1;
            events.push(ServeEvent { id, kind, data });
            events.len()
        };
        self.changed.send_replace((n, last));
    }

    /// Events after `after` (all for 0), and whether the turn has ended
    /// with the last of them.
    pub(crate) fn after(&self, after: u64) -> (Vec<ServeEvent>, bool) {
        let ended = self.changed.borrow().1;
        let events = self.lock();
        let from = usize::try_from(after)
            .unwrap_or(usize::MAX)
            .min(events.len());
        (events[from..].to_vec(), ended)
    }

    /// Waits until there is an event after `seen` or the turn has ended.
    pub(crate) async fn wait_past(&self, seen: u64) {
        let mut rx = self.changed.subscribe();
        let _ = rx.wait_for(|(n, ended)| *n as u64 > seen || *ended).await;
    }

    /// Cancels the turn; whether it was still pending or running.
    pub(crate) async fn cancel(&self) -> Result<bool, warden_core::ActorError> {
        self.canceller.cancel().await
    }
}

/// Every turn the server knows, by id.
#[derive(Debug, Default)]
pub(crate) struct Turns {
    map: Mutex<HashMap<String, Arc<TurnLog>>>,
}

impl Turns {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<TurnLog>>> {
        self.map.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn get(&self, id: &str) -> Option<Arc<TurnLog>> {
        self.lock().get(id).cloned()
    }

    /// Registers `turn` of session `key` under a new id and starts pumping
    /// its events into its log; the log is forgotten `keep` after the turn
    /// ends.
    pub(crate) fn start(
        self: &Arc<Self>,
        key: SessionKey,
        turn: TurnHandle,
        keep: Duration,
        node: Option<&str>,
    ) -> String {
        let id = crate::cluster::turn_id(node);
        let (changed, _) = watch::channel((0, false));
        let log = Arc::new(TurnLog {
            key,
            events: Mutex::default(),
            changed,
            canceller: turn.canceller(),
        });
        self.lock().insert(id.clone(), log.clone());
        let turns = Arc::clone(self);
        let forget = id.clone();
        tokio::spawn(async move {
            pump(turn, &log).await;
            tokio::time::sleep(keep).await;
            turns.lock().remove(&forget);
        });
        id
    }
}

/// Copies the turn's events into its log until it finishes.
async fn pump(mut turn: TurnHandle, log: &TurnLog) {
    while let Some(event) = turn.recv().await {
        let (kind, data, last) = describe(event);
        if let Some(kind) = kind {
            log.push(kind, data, last);
        }
        if last {
            return;
        }
    }
    // The session went away without answering.
    log.push(
        "error",
        json!({"code": "ESESSION_STOPPED", "message": "the session stopped before the turn ended", "exit": 1}),
        true,
    );
}

/// The event's type and fields, and whether it is the last. `None` for
/// events not sent to clients (usage reports, keep-alive-like ones).
fn describe(event: TurnEvent) -> (Option<&'static str>, Value, bool) {
    match event {
        TurnEvent::Queued(a) => (Some("queued"), json!({"attempt": a.attempt}), false),
        TurnEvent::Started(a) => (Some("started"), json!({"attempt": a.attempt}), false),
        TurnEvent::Event(AgentEvent::TextDelta(t)) => (Some("text"), json!({"text": t}), false),
        TurnEvent::Event(AgentEvent::ThinkingDelta(t)) => {
            (Some("thinking"), json!({"text": t}), false)
        }
        TurnEvent::Event(AgentEvent::ToolUseStarted { id, name }) => (
            Some("tool"),
            json!({"id": id, "name": name, "state": "started"}),
            false,
        ),
        TurnEvent::Event(AgentEvent::ToolUseFinished { id }) => {
            (Some("tool"), json!({"id": id, "state": "finished"}), false)
        }
        TurnEvent::Retrying {
            failed,
            delay,
            error,
        } => (
            Some("retrying"),
            json!({"failed_attempt": failed.attempt, "delay_ms": millis(delay), "code": error.code(), "discard": true}),
            false,
        ),
        TurnEvent::Continuing {
            failed,
            delay,
            error,
        } => (
            Some("continuing"),
            json!({"failed_attempt": failed.attempt, "delay_ms": millis(delay), "code": error.code(), "discard": false}),
            false,
        ),
        TurnEvent::Restarting { cause } => (
            Some("restarting"),
            json!({"cause": cause.as_str(), "notice": "the conversation could not be resumed; the message moves to a fresh session"}),
            false,
        ),
        TurnEvent::Finished(Ok(summary)) => (Some("done"), done(&summary), true),
        TurnEvent::Finished(Err(error)) => (Some("error"), failed(&error), true),
        _ => (None, Value::Null, false),
    }
}

fn done(s: &TurnSummary) -> Value {
    json!({
        "turn": s.turn,
        "text": s.text,
        "attempts": s.attempts,
        "continuations": s.continuations,
        "context": s.context.map(|c| json!({"tokens": c.tokens, "window": c.window, "percent": c.percent})),
        "output_tokens": s.usage.map(|u| u.output_tokens),
    })
}

/// An error event: the code, the message and the exit-code class the CLI
/// uses for it (`warden chat`: 4 timeout, 5 unavailable, 3 API, 130
/// cancelled, 1 otherwise).
fn failed(e: &TurnError) -> Value {
    let exit = match e {
        TurnError::Cancelled => 130,
        TurnError::DeadlineExceeded { .. } => 4,
        TurnError::RetriesExhausted { last, .. } | TurnError::Fatal(last) => match last {
            warden_core::StreamError::InactivityTimeout { .. }
            | warden_core::StreamError::NoProgress { .. } => 4,
            e if e.is_retryable() => 5,
            warden_core::StreamError::Internal { .. } => 1,
            _ => 3,
        },
        _ => 1,
    };
    json!({"code": e.code(), "message": e.to_string(), "exit": exit})
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
