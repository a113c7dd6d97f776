//! Turns as the server keeps them: each turn's events, numbered from 1,
//! held while it runs and for a while after it ends, so a client that lost
//! its connection re-attaches with `Last-Event-ID` and misses nothing.
//!
//! On a cluster node with a [`TurnStore`] every event is stored before any
//! client sees it (the events that arrive while a write is in flight go in
//! the next one: one write per batch, not per event). A client can only
//! have seen stored events, so the node that re-delivers the turn after
//! this one died numbers on from the last stored one.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures_util::FutureExt as _;
use futures_util::future::BoxFuture;
use serde::Serialize;
use serde_json::{Value, json};
use tokio::sync::watch;
use warden_core::{
    AgentEvent, ContinueFrom, RecoveredTurn, SessionKey, TurnCanceller, TurnError, TurnEvent,
    TurnHandle, TurnSummary,
};

/// One event of a turn, as sent: its number, its type, its JSON.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ServeEvent {
    /// Unique and increasing within the turn, from 1 (the SSE `id:`).
    pub id: u64,
    /// `started`, `queued`, `text`, `thinking`, `tool`, `retrying`,
    /// `continuing`, `restarting`, `done` or `error` (the SSE `event:`).
    #[serde(rename = "type")]
    pub kind: Cow<'static, str>,
    /// The event's fields (the SSE `data:`).
    pub data: Value,
}

impl ServeEvent {
    /// Event `id` of type `kind` with `data`.
    pub fn new(id: u64, kind: impl Into<Cow<'static, str>>, data: Value) -> Self {
        Self {
            id,
            kind: kind.into(),
            data,
        }
    }

    /// Whether it ends its turn (`done` or `error`).
    pub fn is_last(&self) -> bool {
        self.kind == "done" || self.kind == "error"
    }
}

/// A turn's log as a [`TurnStore`] keeps it.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct StoredTurn {
    /// The turn's id.
    pub id: String,
    /// Its session.
    pub key: SessionKey,
    /// Its events (all, or those after the number asked for).
    pub events: Vec<ServeEvent>,
    /// Whether its last event is among the stored ones.
    pub ended: bool,
}

impl StoredTurn {
    /// Turn `id` of session `key` with `events`, `ended` or not.
    pub fn new(
        id: impl Into<String>,
        key: SessionKey,
        events: Vec<ServeEvent>,
        ended: bool,
    ) -> Self {
        Self {
            id: id.into(),
            key,
            events,
            ended,
        }
    }
}

/// Why a [`TurnStore`] could not do it.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum TurnStoreError {
    /// The session is no longer this node's (its lease moved on): stop
    /// relaying the turn here; its new owner re-delivers it.
    #[error("the session moved to another node: {0}")]
    Moved(String),
    /// The store failed (unreachable, …); worth retrying.
    #[error("the turn store failed: {0}")]
    Failed(String),
}

/// Where a node of a cluster keeps its turns' events, so that a turn
/// re-delivered by another node keeps its id and numbers its events on,
/// and a client re-attaches to it on any node (`warden-pg` keeps them in
/// PostgreSQL, fenced like the session's record).
pub trait TurnStore: Send + Sync + 'static {
    /// Opens the log of the turn answering message `message_id` of `key`,
    /// under `id` if the message has none yet; the log as stored (its id
    /// and events: those of an earlier owner for a re-delivered message).
    fn open<'a>(
        &'a self,
        key: &'a SessionKey,
        message_id: u64,
        id: &'a str,
    ) -> BoxFuture<'a, Result<StoredTurn, TurnStoreError>>;

    /// Appends `events` to turn `id` of `key`; `ended` when its last event
    /// is among them.
    fn append<'a>(
        &'a self,
        key: &'a SessionKey,
        id: &'a str,
        events: &'a [ServeEvent],
        ended: bool,
    ) -> BoxFuture<'a, Result<(), TurnStoreError>>;

    /// Turn `id` with its events after number `after`; `None` if unknown.
    fn read<'a>(
        &'a self,
        id: &'a str,
        after: u64,
    ) -> BoxFuture<'a, Result<Option<StoredTurn>, TurnStoreError>>;
}

/// A turn's log: its events and whether it has ended.
#[derive(Debug)]
pub(crate) struct TurnLog {
    pub(crate) key: SessionKey,
    events: Mutex<Vec<ServeEvent>>,
    /// The number of events so far; `ended` once the last one is in (or
    /// the turn moved to another node: no more events here).
    changed: watch::Sender<(usize, bool)>,
    canceller: TurnCanceller,
}

impl TurnLog {
    fn new(key: SessionKey, canceller: TurnCanceller, events: Vec<ServeEvent>) -> Self {
        let (changed, _) = watch::channel((events.len(), false));
        Self {
            key,
            events: Mutex::new(events),
            changed,
            canceller,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<ServeEvent>> {
        self.events.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The next event's number.
    fn next_id(&self) -> u64 {
        self.lock().last().map_or(1, |e| e.id + 1)
    }

    /// Makes `batch` visible to clients; `ended` if the turn ends here.
    fn publish(&self, batch: Vec<ServeEvent>, ended: bool) {
        let n = {
            let mut events = self.lock();
            events.extend(batch);
            events.len()
        };
        self.changed.send_replace((n, ended));
    }

    /// Events after `after` (all for 0), and whether the turn has ended
    /// with the last of them.
    pub(crate) fn after(&self, after: u64) -> (Vec<ServeEvent>, bool) {
        let ended = self.changed.borrow().1;
        let events = self.lock();
        let from = events.partition_point(|e| e.id <= after);
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
#[derive(Default)]
pub(crate) struct Turns {
    map: Mutex<HashMap<String, Arc<TurnLog>>>,
    /// Where the events are stored first, on a cluster node.
    pub(crate) store: Option<Arc<dyn TurnStore>>,
}

impl std::fmt::Debug for Turns {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Turns")
            .field("store", &self.store.is_some())
            .finish_non_exhaustive()
    }
}

/// How long a store write is retried at most between two tries.
const MAX_BACKOFF: Duration = Duration::from_secs(2);

impl Turns {
    pub(crate) fn new(store: Option<Arc<dyn TurnStore>>) -> Self {
        Self {
            map: Mutex::default(),
            store,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<TurnLog>>> {
        self.map.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn get(&self, id: &str) -> Option<Arc<TurnLog>> {
        self.lock().get(id).cloned()
    }

    /// Registers `turn` of session `key` under a new id (or, with a store,
    /// the id its message already has) and starts pumping its events into
    /// its log; the log is forgotten `keep` after the turn ends. A
    /// recovered turn comes with its `continue_from` port: the text an
    /// earlier node streamed of it is offered there.
    pub(crate) async fn start(
        self: &Arc<Self>,
        key: SessionKey,
        turn: TurnHandle,
        keep: Duration,
        node: Option<&str>,
        continue_from: Option<ContinueFrom>,
    ) -> String {
        let fresh = crate::cluster::turn_id(node);
        let message_id = turn.canceller().turn();
        let stored = match &self.store {
            Some(store) => open(store.as_ref(), &key, message_id, &fresh).await,
            None => None,
        };
        let (id, events) = match &stored {
            Some(t) => (t.id.clone(), t.events.clone()),
            None => (fresh, Vec::new()),
        };
        let log = Arc::new(TurnLog::new(key.clone(), turn.canceller(), events));
        let mut marker = None;
        if let Some(t) = &stored
            && t.ended
        {
            // Its last event is stored: the message was answered by a node
            // that died before it could say so. Not run a second time.
            log.publish(Vec::new(), true);
            let canceller = turn.canceller();
            tokio::spawn(async move {
                let _ = canceller.cancel().await;
            });
        } else if let Some(t) = &stored
            && let Some(last) = t.events.last()
        {
            // An earlier node began it and died. The text its clients have
            // of the broken attempt is continued if the session can (its
            // source continues replies), else they discard it, as after
            // any retry.
            let (kept, attempt) = kept_text(&t.events);
            let continued = match (continue_from, kept) {
                (Some(port), Some(text)) => {
                    let broken = u32::try_from(attempt).unwrap_or(u32::MAX);
                    port.offer(warden_core::Continuation::new(text, broken))
                }
                _ => false,
            };
            let (kind, discard) = match continued {
                true => ("continuing", false),
                false => ("retrying", true),
            };
            // Stored with the first batch, sent before the new attempt.
            marker = Some(ServeEvent::new(
                last.id + 1,
                kind,
                json!({"failed_attempt": attempt, "delay_ms": 0, "code": "ENODE_LOST", "discard": discard, "node": node}),
            ));
        }
        self.lock().insert(id.clone(), log.clone());
        let turns = Arc::clone(self);
        let forget = id.clone();
        let persist = stored.is_some().then(|| self.store.clone()).flatten();
        let turn_id = id.clone();
        tokio::spawn(async move {
            if !log.changed.borrow().1 {
                pump(turn, &log, persist.as_deref(), &turn_id, marker).await;
            }
            if log.changed.borrow().1 && log.lock().last().is_some_and(ServeEvent::is_last) {
                tokio::time::sleep(keep).await;
            }
            // Ended here, or moved elsewhere: its store (if any) serves it.
            let mut map = turns.lock();
            if map.get(&forget).is_some_and(|l| Arc::ptr_eq(l, &log)) {
                map.remove(&forget);
            }
        });
        id
    }

    /// Takes the turns a session re-delivers (their callers are gone) and
    /// relays them like new ones, until `rx` closes.
    pub(crate) fn adopt(
        self: &Arc<Self>,
        mut rx: tokio::sync::mpsc::UnboundedReceiver<RecoveredTurn>,
        keep: Duration,
        node: Option<String>,
    ) {
        let turns = Arc::clone(self);
        tokio::spawn(async move {
            while let Some(turn) = rx.recv().await {
                let RecoveredTurn {
                    key,
                    message_id,
                    handle,
                    continue_from,
                    ..
                } = turn;
                let id = turns
                    .start(
                        key.clone(),
                        handle,
                        keep,
                        node.as_deref(),
                        Some(continue_from),
                    )
                    .await;
                tracing::info!(session = %key, turn = %id, message = message_id, "relaying a re-delivered turn");
            }
        });
    }
}

/// The reply text a turn's clients hold from its events — the text of the
/// attempts since the last one they were told to discard (`retrying`,
/// `restarting`), `continuing` keeping it — if the last of it is text (not
/// inside thinking or a tool call, which cannot be continued); and the
/// last attempt started.
fn kept_text(events: &[ServeEvent]) -> (Option<String>, u64) {
    let mut text = String::new();
    let mut attempt = 0;
    let mut last_is_text = false;
    for e in events {
        match e.kind.as_ref() {
            "started" => attempt = e.data["attempt"].as_u64().unwrap_or(attempt),
            "retrying" | "restarting" => {
                text.clear();
                last_is_text = false;
            }
            "text" => {
                text.push_str(e.data["text"].as_str().unwrap_or(""));
                last_is_text = true;
            }
            "thinking" | "tool" => last_is_text = false,
            _ => {}
        }
    }
    let kept = (last_is_text && !text.is_empty()).then_some(text);
    (kept, attempt)
}

/// Opens the turn's stored log, retrying a failing store a few times;
/// `None` when it cannot (the turn is then relayed from memory only).
async fn open(
    store: &dyn TurnStore,
    key: &SessionKey,
    message_id: u64,
    id: &str,
) -> Option<StoredTurn> {
    let mut delay = Duration::from_millis(50);
    for _ in 0..5 {
        match store.open(key, message_id, id).await {
            Ok(t) => return Some(t),
            Err(TurnStoreError::Moved(why)) => {
                tracing::warn!(session = %key, %why, "the session moved before its turn was stored");
                return None;
            }
            Err(TurnStoreError::Failed(why)) => {
                tracing::warn!(session = %key, %why, "cannot store the turn; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(MAX_BACKOFF);
            }
        }
    }
    tracing::warn!(session = %key, turn = id, "the turn is kept in this node's memory only");
    None
}

/// Copies the turn's events into its log until it finishes: with a store,
/// each batch is stored before it is published; a session that moved away
/// (its lease lost, or it stopped here with the message still pending) ends
/// the log here without a last event, for the node that re-delivers it.
async fn pump(
    mut turn: TurnHandle,
    log: &TurnLog,
    store: Option<&dyn TurnStore>,
    id: &str,
    marker: Option<ServeEvent>,
) {
    let mut staged: Vec<ServeEvent> = marker.into_iter().collect();
    loop {
        let Some(first) = turn.recv().await else {
            // Only after `Finished`, which ends this loop: never here, but
            // a log left open would hold its clients forever.
            log.publish(Vec::new(), true);
            return;
        };
        let mut events = vec![first];
        // Everything already waiting joins this batch.
        while !matches!(events.last(), Some(TurnEvent::Finished(_))) {
            match turn.recv().now_or_never() {
                Some(Some(e)) => events.push(e),
                _ => break,
            }
        }
        let mut last = false;
        let mut moved = false;
        for event in events {
            if store.is_some()
                && matches!(
                    event,
                    TurnEvent::Finished(Err(TurnError::SessionStopped { .. }))
                )
            {
                // Stopped here with its message still pending: another
                // node (or this one, later) re-delivers it under this id.
                moved = true;
                break;
            }
            let (kind, data, end) = describe(event);
            if let Some(kind) = kind {
                let next = staged.last().map_or_else(|| log.next_id(), |e| e.id + 1);
                staged.push(ServeEvent::new(next, kind, data));
            }
            last |= end;
        }
        if !staged.is_empty() || last {
            if let Some(store) = store
                && !store_batch(store, log, id, &staged, last).await
            {
                moved = true;
            }
            if !moved {
                log.publish(std::mem::take(&mut staged), last);
            }
        }
        if moved {
            log.publish(Vec::new(), true);
            return;
        }
        if last {
            return;
        }
    }
}

/// Stores a batch, retrying a failing store; `false` if the session moved.
async fn store_batch(
    store: &dyn TurnStore,
    log: &TurnLog,
    id: &str,
    batch: &[ServeEvent],
    last: bool,
) -> bool {
    let mut delay = Duration::from_millis(50);
    loop {
        match store.append(&log.key, id, batch, last).await {
            Ok(()) => return true,
            Err(TurnStoreError::Moved(why)) => {
                tracing::info!(session = %log.key, turn = id, %why, "the turn moved to another node");
                return false;
            }
            Err(TurnStoreError::Failed(why)) => {
                tracing::warn!(session = %log.key, turn = id, %why, "cannot store the turn's events; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(MAX_BACKOFF);
            }
        }
    }
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
            json!({"cause": cause.as_str(), "notice": "the conversation could not be resumed; the message moves to a fresh session", "discard": true}),
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
