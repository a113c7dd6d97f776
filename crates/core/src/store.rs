//! Session records and the [`SessionStore`] trait.
//!
//! A [`SessionRecord`] is what survives the orchestrator: the agent session
//! id (and the ids it had before), usage and context, status, restart count,
//! and the messages accepted but not yet answered. The supervisor writes the
//! record *before* it acknowledges a transition; the durable points (a
//! message accepted, agent id set, agent id cleared, session failed) are
//! flushed to disk before the acknowledgement.
//!
//! `warden-store` provides the sled implementation; [`MemoryStore`] here is
//! for unit tests and ephemeral use.
//!
//! The other ports a store implements live here too: a node's turn event
//! logs ([`TurnStore`]) and the conversations of stateless HTTP APIs
//! ([`ConversationStore`]). `warden-pg` implements all three on PostgreSQL.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;

use futures_util::future::BoxFuture;
use serde::{Deserialize, Serialize};

use crate::event::Usage;
use crate::source::SessionKey;

mod conversations;
pub mod turn_event;
mod turn_kind;
mod turns;

pub use conversations::{ConversationStore, Entry, Role, unknown_conversation};
pub use turn_event::{EventTime, TurnEventData};
pub use turn_kind::{TurnEventKind, UnknownEventKind};
pub use turns::{PROMPT_HEAD_BYTES, StoredEvent, StoredTurn, TurnAsked, TurnStore, TurnStoreError};

/// The schema version this build writes and the newest it reads. 2 added
/// [`PendingMessage::model`], 3 [`PendingMessage::idempotency_key`]; older
/// records still read (without them).
pub const SCHEMA_VERSION: u16 = 3;

/// Lifecycle status of a stored session.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum RecordStatus {
    /// Created, no turn run yet.
    #[default]
    New,
    /// Its actor is running (or its process died without stopping it).
    Active,
    /// Not running: reaped for idleness or stopped with its supervisor; the
    /// next message resumes it.
    Idle,
    /// Given up; `reason` says why (both causes after a failed fallback).
    Failed {
        /// Why.
        reason: String,
    },
}

/// A message accepted from the user and not yet answered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingMessage {
    /// Id unique within the session, increasing.
    pub id: u64,
    /// The message text (stored so it is never lost; the store's files are
    /// private to the user).
    pub text: String,
    /// When it was accepted, Unix milliseconds.
    pub accepted_at_ms: u64,
    /// The model its turn asks for ([`SendOptions::model`](crate::SendOptions));
    /// `None`: the source's own.
    #[serde(default)]
    pub model: Option<String>,
    /// The key its sender chose to recognise a retried send
    /// ([`SendOptions::idempotency_key`](crate::SendOptions)).
    #[serde(default)]
    pub idempotency_key: Option<String>,
}

/// Last usage and context of a session.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredUsage {
    /// Input tokens of the last usage report.
    pub input_tokens: u64,
    /// Cache-creation tokens of the last usage report.
    pub cache_creation_input_tokens: u64,
    /// Cache-read tokens of the last usage report.
    pub cache_read_input_tokens: u64,
    /// Output tokens of the last usage report.
    pub output_tokens: u64,
    /// Context window used for the percentage.
    pub context_window: u64,
    /// Context in use, percent (rounded).
    pub context_percent: u32,
}

impl StoredUsage {
    /// Tokens in context: input + cache creation + cache read.
    pub fn context_tokens(&self) -> u64 {
        self.input_tokens + self.cache_creation_input_tokens + self.cache_read_input_tokens
    }

    /// From a usage report and the window it is measured against.
    pub fn from_usage(u: Usage, window: u64) -> Self {
        Self {
            input_tokens: u.input_tokens,
            cache_creation_input_tokens: u.cache_creation_input_tokens,
            cache_read_input_tokens: u.cache_read_input_tokens,
            output_tokens: u.output_tokens,
            context_window: window,
            context_percent: crate::context::percent(u.context_tokens(), window),
        }
    }
}

/// Everything warden keeps about one session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct SessionRecord {
    /// The session key.
    pub key: String,
    /// The normalized workspace path, if the session is bound to one.
    pub workspace: Option<PathBuf>,
    /// The agent's conversation id to resume, if any.
    pub agent_session_id: Option<String>,
    /// Ids the session had before (forks on resume, cleared ids), oldest first.
    pub past_session_ids: Vec<String>,
    /// The model, when known.
    pub model: Option<String>,
    /// The last usage and context.
    pub usage: Option<StoredUsage>,
    /// Whether it runs, rests, or was given up (and why).
    pub status: RecordStatus,
    /// Restarts by the supervisor after a crash, over the session's life.
    /// Not counted: a fresh start after a resume failure (each one moves
    /// the failed conversation id to
    /// [`past_session_ids`](Self::past_session_ids) and is a `FreshFallback`
    /// lifecycle event), and a resume after a reap or an orchestrator
    /// restart (the same conversation goes on).
    pub restart_count: u32,
    /// Creation time, Unix milliseconds.
    pub created_at_ms: u64,
    /// Last activity (message accepted or turn finished), Unix milliseconds.
    pub last_active_ms: u64,
    /// Accepted, unanswered messages, in order.
    pub pending: Vec<PendingMessage>,
    /// The next [`PendingMessage::id`].
    pub next_message_id: u64,
}

impl SessionRecord {
    /// A fresh record for `key`.
    pub fn new(key: &SessionKey, workspace: Option<PathBuf>) -> Self {
        let now = now_ms();
        Self {
            key: key.as_str().to_owned(),
            workspace,
            agent_session_id: None,
            past_session_ids: Vec::new(),
            model: None,
            usage: None,
            status: RecordStatus::New,
            restart_count: 0,
            created_at_ms: now,
            last_active_ms: now,
            pending: Vec::new(),
            next_message_id: 1,
        }
    }

    /// Sets the agent session id, keeping a different previous one in
    /// `past_session_ids`. Returns whether it changed.
    pub fn set_agent_session_id(&mut self, id: &str) -> bool {
        if self.agent_session_id.as_deref() == Some(id) {
            return false;
        }
        if let Some(old) = self.agent_session_id.take() {
            self.past_session_ids.push(old);
        }
        self.agent_session_id = Some(id.to_owned());
        true
    }

    /// Accepts a user message: appends it to [`pending`](Self::pending)
    /// with the next id and marks the record active now. Save the record
    /// (flushed) before acknowledging the message. Returns the id.
    pub fn accept(&mut self, text: impl Into<String>) -> u64 {
        self.accept_for(text, None)
    }

    /// [`accept`](Self::accept), the turn asking for `model`.
    pub fn accept_for(&mut self, text: impl Into<String>, model: Option<String>) -> u64 {
        self.accept_with(
            text,
            crate::SendOptions {
                model,
                idempotency_key: None,
            },
        )
    }

    /// [`accept`](Self::accept) with the turn's options, stored with it.
    pub fn accept_with(&mut self, text: impl Into<String>, options: crate::SendOptions) -> u64 {
        let crate::SendOptions {
            model,
            idempotency_key,
        } = options;
        let id = self.next_message_id;
        let accepted_at_ms = now_ms();
        self.pending.push(PendingMessage {
            id,
            text: text.into(),
            accepted_at_ms,
            model,
            idempotency_key,
        });
        self.next_message_id += 1;
        self.last_active_ms = accepted_at_ms;
        id
    }

    /// Takes back the message [`accept`](Self::accept) just added (its
    /// save failed): it was never acknowledged, and its id is reused.
    pub fn unaccept(&mut self, id: u64) {
        self.pending.retain(|m| m.id != id);
        if self.next_message_id == id + 1 {
            self.next_message_id = id;
        }
    }

    /// Message `id` was answered (with a reply or an error): it is no longer
    /// pending. Returns whether it was.
    pub fn answered(&mut self, id: u64) -> bool {
        let before = self.pending.len();
        self.pending.retain(|m| m.id != id);
        self.last_active_ms = now_ms();
        self.pending.len() != before
    }

    /// Clears the agent session id, keeping it in `past_session_ids`.
    pub fn clear_agent_session_id(&mut self) -> Option<String> {
        let old = self.agent_session_id.take();
        if let Some(o) = &old {
            self.past_session_ids.push(o.clone());
        }
        old
    }
}

/// Unix time in milliseconds.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// How durable a write must be before it is acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// Written to the store; reaches disk with the store's next flush.
    Buffered,
    /// On disk before the call returns (the durable points).
    Flushed,
}

/// A store failure, per key where it concerns one record.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The record cannot be decoded. Fatal for that key; never overwritten
    /// silently.
    #[error("session record {key:?} is corrupt: {message}")]
    Corrupt {
        /// The session key whose record it is.
        key: String,
        /// Decoder message.
        message: String,
    },
    /// The record was written by a newer warden. Fatal for that key.
    #[error(
        "session record {key:?} has schema version {found}, newer than the supported {supported}; upgrade warden"
    )]
    NewerSchema {
        /// The session key whose record it is.
        key: String,
        /// Version found.
        found: u16,
        /// Newest version this build reads.
        supported: u16,
    },
    /// Another live process holds the database.
    #[error("the session database {path} is in use by another process")]
    Locked {
        /// The database directory.
        path: String,
    },
    /// A write was refused by the fence: this process no longer holds the
    /// session's lease (another node took the session over, or the lease
    /// expired while the process was paused). Fatal for this process's copy
    /// of the session: stop it, and let the owner run it.
    #[error(
        "session {key:?} is no longer ours: its lease moved past epoch {epoch} (another node owns it now)"
    )]
    LeaseLost {
        /// The session key another node holds now.
        key: String,
        /// The epoch this process held.
        epoch: u64,
    },
    /// I/O or backend failure. Retryable at the caller's discretion.
    #[error("session store error: {message}")]
    Backend {
        /// Backend message.
        message: String,
    },
}

/// Where session records live. Implementations must be safe to call from
/// many sessions at once.
pub trait SessionStore: Send + Sync + 'static {
    /// The record for `key`, if any.
    fn load(&self, key: &SessionKey) -> BoxFuture<'_, Result<Option<SessionRecord>, StoreError>>;

    /// Writes `record` (keyed by `record.key`) with the given durability.
    fn save<'a>(
        &'a self,
        record: &'a SessionRecord,
        durability: Durability,
    ) -> BoxFuture<'a, Result<(), StoreError>>;

    /// Every record, each decoded on its own (a corrupt one is an `Err` in
    /// its slot, not a failure of the listing).
    fn list(&self) -> BoxFuture<'_, Result<Vec<Result<SessionRecord, StoreError>>, StoreError>>;
}

/// An in-memory [`SessionStore`] (for tests and ephemeral orchestrators).
#[derive(Debug, Clone, Default)]
pub struct MemoryStore {
    records: Arc<Mutex<HashMap<String, SessionRecord>>>,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }
}

impl SessionStore for MemoryStore {
    fn load(&self, key: &SessionKey) -> BoxFuture<'_, Result<Option<SessionRecord>, StoreError>> {
        let r = self.records.lock().get(key.as_str()).cloned();
        Box::pin(async move { Ok(r) })
    }

    fn save<'a>(
        &'a self,
        record: &'a SessionRecord,
        _durability: Durability,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        self.records
            .lock()
            .insert(record.key.clone(), record.clone());
        Box::pin(async move { Ok(()) })
    }

    fn list(&self) -> BoxFuture<'_, Result<Vec<Result<SessionRecord, StoreError>>, StoreError>> {
        let mut v: Vec<_> = self.records.lock().values().cloned().collect();
        v.sort_by(|a, b| a.key.cmp(&b.key));
        Box::pin(async move { Ok(v.into_iter().map(Ok).collect()) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepted_messages_stay_pending_until_answered() {
        let mut r = SessionRecord::new(&SessionKey::new("k"), None);
        let a = r.accept("one");
        let b = r.accept("two");
        assert_eq!((a, b, r.next_message_id), (1, 2, 3));
        assert_eq!(r.pending.iter().map(|m| m.id).collect::<Vec<_>>(), [1, 2]);
        // A failed save takes the last one back and reuses its id.
        r.unaccept(b);
        assert_eq!(r.next_message_id, 2);
        assert!(r.answered(a));
        assert!(!r.answered(a), "already answered");
        assert!(r.pending.is_empty());
    }
}
