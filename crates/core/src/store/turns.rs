//! Turn event logs: each turn's events as a node sent them to its clients,
//! numbered from 1, so a client that lost its connection re-attaches with
//! `Last-Event-ID` and misses nothing — and, where the log is shared
//! ([`TurnStore`]), a turn re-delivered by another node keeps its id and
//! numbers its events on.
//!
//! `warden-serve` keeps the logs in memory and, given a [`TurnStore`],
//! stores every batch of events before any client sees it; `warden-pg`'s
//! `NodeTurns` keeps them in PostgreSQL, fenced like the session's record.

use derive_setters::Setters;
use futures_util::future::BoxFuture;
use serde::Serialize;
use serde_json::Value;

use crate::source::SessionKey;

use super::turn_event::{EventTime, TurnEventData};
use super::turn_kind::{TurnEventKind, UnknownEventKind};

/// One event of a turn, as sent and stored: its number, when it was made,
/// its type and fields.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredEvent {
    /// Unique and increasing within the turn, from 1 (the SSE `id:`).
    pub id: u64,
    /// When it was made (`None`: stored by a warden that did not keep it).
    pub at: Option<EventTime>,
    /// Its type and fields (the SSE `event:` and `data:`).
    pub data: TurnEventData,
}

impl StoredEvent {
    /// Event `id` carrying `data`, made now.
    pub fn new(id: u64, data: TurnEventData) -> Self {
        Self {
            id,
            at: Some(EventTime::now()),
            data,
        }
    }

    /// The same, made at `at` (as stored).
    pub fn made_at(mut self, at: Option<EventTime>) -> Self {
        self.at = at;
        self
    }

    /// Event `id` of type `kind` read back from its stored `data` (see
    /// [`TurnEventData::from_value`]).
    pub fn from_stored(id: u64, kind: &str, data: Value) -> Result<Self, String> {
        let kind: TurnEventKind = kind.parse().map_err(|e: UnknownEventKind| e.to_string())?;
        let (data, at) = TurnEventData::from_value(kind, data)
            .map_err(|e| format!("a {kind} event that does not read: {e}"))?;
        Ok(Self { id, at, data })
    }

    /// Its type (the SSE `event:`).
    pub fn kind(&self) -> TurnEventKind {
        self.data.kind()
    }

    /// Its fields and time as JSON (the SSE `data:`, and what stores keep).
    pub fn data_value(&self) -> Value {
        self.data.to_value(self.at)
    }

    /// Whether it ends its turn (`done` or `error`).
    pub fn is_last(&self) -> bool {
        self.kind().is_last()
    }
}

impl Serialize for StoredEvent {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut e = s.serialize_struct("StoredEvent", 3)?;
        e.serialize_field("id", &self.id)?;
        e.serialize_field("type", &self.kind())?;
        e.serialize_field("data", &self.data_value())?;
        e.end()
    }
}

/// A turn's log as a [`TurnStore`] keeps it.
#[derive(Debug, Clone, PartialEq, Setters)]
#[setters(prefix = "with_", strip_option)]
#[non_exhaustive]
pub struct StoredTurn {
    /// The turn's id.
    #[setters(skip)]
    pub id: String,
    /// Its session.
    #[setters(skip)]
    pub key: SessionKey,
    /// The id of the session's message it answers (one turn per message).
    #[setters(skip)]
    pub message_id: u64,
    /// Its events (all, or those after the number asked for).
    #[setters(skip)]
    pub events: Vec<StoredEvent>,
    /// Whether its last event is among the stored ones.
    #[setters(skip)]
    pub ended: bool,
    /// The fingerprint of the request that sent the turn's message (a
    /// digest `warden-serve` makes of a keyed request's message, model and
    /// agent, given to [`TurnStore::open`]): a request repeating its
    /// idempotency key with another body is refused. `None`: unknown (a
    /// turn sent without a key, re-delivered before its log was opened, or
    /// stored by a warden that did not keep it).
    #[setters(strip_option = false)]
    pub fingerprint: Option<String>,
    /// What it was asked and when (its prompt's head, model, when it was
    /// opened, its trace): kept with the log when the node that opened it
    /// said; empty for turns stored by a warden that did not keep it.
    pub asked: TurnAsked,
}

/// The longest head of a turn's prompt kept with its log
/// ([`TurnAsked::prompt`]), in bytes.
pub const PROMPT_HEAD_BYTES: usize = 2048;

/// What a turn was asked, kept with its log for the people looking at it
/// later (the console, `GET /v1/sessions/{key}/turns`): the head of its
/// prompt, its model, when it was opened and the trace it runs in.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, serde::Deserialize, Setters)]
#[setters(prefix = "with_", strip_option)]
#[non_exhaustive]
pub struct TurnAsked {
    /// The message's first [`PROMPT_HEAD_BYTES`] bytes (cut at a
    /// character boundary).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[setters(skip)]
    pub prompt: Option<String>,
    /// The model the turn asked for, if it named one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[setters(strip_option = false)]
    pub model: Option<String>,
    /// When its log was opened (the message accepted, or re-delivered).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[setters(skip)]
    pub opened_at: Option<EventTime>,
    /// The trace the turn was accepted in (its session incarnation's;
    /// the turn's own trace once it runs, where the node running it says).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[setters(strip_option = false)]
    pub trace_id: Option<String>,
    /// The span of that trace the turn was accepted under: its
    /// incarnation's anchor (hex), which a re-delivery links to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[setters(strip_option = false)]
    pub span_id: Option<String>,
    /// Every trace the turn ran in, oldest first (two when it started
    /// again in a fresh session), as the node running it knows them (not
    /// stored: empty in a turn read from a store).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[setters(skip)]
    pub trace_ids: Vec<String>,
}

impl TurnAsked {
    /// A turn asked `message` (its head is kept), opened now.
    pub fn new(message: &str) -> Self {
        let mut end = message.len().min(PROMPT_HEAD_BYTES);
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        Self {
            prompt: Some(message[..end].to_owned()),
            model: None,
            opened_at: Some(EventTime::now()),
            trace_id: None,
            span_id: None,
            trace_ids: Vec::new(),
        }
    }

    /// Whether nothing is known.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

impl StoredTurn {
    /// Turn `id` of session `key`, answering message `message_id`, with
    /// `events`, `ended` or not.
    pub fn new(
        id: impl Into<String>,
        key: SessionKey,
        message_id: u64,
        events: Vec<StoredEvent>,
        ended: bool,
    ) -> Self {
        Self {
            id: id.into(),
            key,
            message_id,
            events,
            ended,
            fingerprint: None,
            asked: TurnAsked::default(),
        }
    }
}

/// Why a [`TurnStore`] could not do it.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum TurnStoreError {
    /// The session is no longer this node's (its lease moved on): stop
    /// relaying the turn here; its new owner re-delivers it. Fatal for this
    /// node's copy of the turn.
    #[error("this node no longer holds the session's lease: {0}")]
    Moved(String),
    /// The store failed (unreachable, …). Retryable.
    #[error("the turn store failed: {0}")]
    Failed(String),
}

/// Where a node keeps its turns' events, so that a turn re-delivered by
/// another node keeps its id and numbers its events on, and a client
/// re-attaches to it on any node (`warden-pg` keeps them in PostgreSQL,
/// fenced like the session's record).
pub trait TurnStore: Send + Sync + 'static {
    /// Opens the log of the turn answering message `message_id` of `key`,
    /// under `id` if the message has none yet; the log as stored (its id
    /// and events: those of an earlier owner for a re-delivered message).
    /// `fingerprint` (the request's, [`StoredTurn::fingerprint`]) and
    /// `asked` ([`StoredTurn::asked`]) are kept with a log that has none
    /// yet; stored ones are never replaced.
    fn open<'a>(
        &'a self,
        key: &'a SessionKey,
        message_id: u64,
        id: &'a str,
        fingerprint: Option<&'a str>,
        asked: &'a TurnAsked,
    ) -> BoxFuture<'a, Result<StoredTurn, TurnStoreError>>;

    /// Appends `events` to turn `id` of `key`; `ended` when its last event
    /// is among them.
    fn append<'a>(
        &'a self,
        key: &'a SessionKey,
        id: &'a str,
        events: &'a [StoredEvent],
        ended: bool,
    ) -> BoxFuture<'a, Result<(), TurnStoreError>>;

    /// The newest `limit` turns of session `key` still kept, newest first,
    /// each with its last event only (its outcome, when it has ended) or
    /// none yet.
    fn recent<'a>(
        &'a self,
        key: &'a SessionKey,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<StoredTurn>, TurnStoreError>>;

    /// Turn `id` with its events after number `after` (and its
    /// [`fingerprint`](StoredTurn::fingerprint)); `None` if unknown.
    fn read<'a>(
        &'a self,
        id: &'a str,
        after: u64,
    ) -> BoxFuture<'a, Result<Option<StoredTurn>, TurnStoreError>>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_reads_back_from_its_wire_name() {
        for kind in TurnEventKind::ALL {
            assert_eq!(kind.as_str().parse::<TurnEventKind>(), Ok(kind));
            let json = serde_json::to_value(kind).expect("serialises");
            assert_eq!(json, Value::String(kind.as_str().to_owned()));
        }
        assert_eq!(
            "finished".parse::<TurnEventKind>(),
            Err(UnknownEventKind("finished".into()))
        );
        let last: Vec<_> = TurnEventKind::ALL
            .into_iter()
            .filter(|k| k.is_last())
            .collect();
        assert_eq!(last, [TurnEventKind::Done, TurnEventKind::Error]);
    }
}
