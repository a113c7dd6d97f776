//! [`SledTurns`]: a single node's turn event logs in its sled database, so
//! a turn survives a restart of `warden serve` (SIGTERM or kill -9): the
//! re-sent message keeps its turn id, and a client re-attaching with
//! `Last-Event-ID` gets the events after the last one it saw — none
//! repeated, none missing.
//!
//! One tree, `turns`, three kinds of keys (one [`sled::Batch`] writes a
//! turn's change atomically):
//! - `m` + session key + `0x00` + message id (big-endian): the turn id
//!   answering that message (one turn per message);
//! - `t` + turn id: the turn (`{"key", "message_id", "ended",
//!   "updated_ms"}`, JSON);
//! - `e` + turn id + `0x00` + event number (big-endian): one event
//!   (`{"kind", "data"}`, JSON).
//!
//! A batch of events is flushed (fsync, shared with the other writes of
//! the database: one flush covers every write before it) before
//! [`append`](TurnStore::append) returns, and `warden serve` shows no
//! event before its batch is stored.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures_util::future::BoxFuture;
use serde_json::{Value, json};
use warden_core::SessionKey;
use warden_core::store::{StoredEvent, StoredTurn, TurnStore, TurnStoreError};

use crate::{SledStore, describe};

/// The sled tree holding the turn logs.
const TREE: &str = "turns";

/// How much longer than `keep` an unfinished turn is kept (its process
/// died for good and nothing will end it).
const UNFINISHED_EXTRA: Duration = Duration::from_secs(24 * 60 * 60);

/// The turn event logs of one `warden serve` in its sled database
/// ([`SledStore::turns`]). Cheap to clone.
#[derive(Debug, Clone)]
pub struct SledTurns {
    store: SledStore,
    tree: sled::Tree,
}

impl SledStore {
    /// This database's turn event logs, for `warden serve`
    /// (`ServeConfig::with_turn_store`).
    pub fn turns(&self) -> Result<SledTurns, warden_core::StoreError> {
        let tree = self
            .db
            .open_tree(TREE)
            .map_err(|e| crate::backend(describe(&e)))?;
        Ok(SledTurns {
            store: self.clone(),
            tree,
        })
    }
}

fn failed(e: &sled::Error) -> TurnStoreError {
    TurnStoreError::Failed(describe(e))
}

fn corrupt(what: &str, detail: impl std::fmt::Display) -> TurnStoreError {
    TurnStoreError::Failed(format!("corrupt turn log entry ({what}): {detail}"))
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn message_key(key: &SessionKey, message_id: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(key.as_str().len() + 10);
    k.push(b'm');
    k.extend_from_slice(key.as_str().as_bytes());
    k.push(0);
    k.extend_from_slice(&message_id.to_be_bytes());
    k
}

fn turn_key(id: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(id.len() + 1);
    k.push(b't');
    k.extend_from_slice(id.as_bytes());
    k
}

fn events_prefix(id: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(id.len() + 2);
    k.push(b'e');
    k.extend_from_slice(id.as_bytes());
    k.push(0);
    k
}

fn event_key(id: &str, seq: u64) -> Vec<u8> {
    let mut k = events_prefix(id);
    k.extend_from_slice(&seq.to_be_bytes());
    k
}

/// A turn's entry.
struct Meta {
    key: String,
    message_id: u64,
    ended: bool,
    updated_ms: u64,
}

impl Meta {
    fn encode(&self) -> Vec<u8> {
        json!({"key": self.key, "message_id": self.message_id, "ended": self.ended, "updated_ms": self.updated_ms})
            .to_string()
            .into_bytes()
    }

    fn decode(bytes: &[u8]) -> Result<Self, TurnStoreError> {
        let v: Value = serde_json::from_slice(bytes).map_err(|e| corrupt("turn", e))?;
        let field = |name: &str| v.get(name).ok_or_else(|| corrupt("turn", name));
        Ok(Self {
            key: field("key")?
                .as_str()
                .ok_or_else(|| corrupt("turn", "key"))?
                .to_owned(),
            message_id: field("message_id")?
                .as_u64()
                .ok_or_else(|| corrupt("turn", "message_id"))?,
            ended: field("ended")?
                .as_bool()
                .ok_or_else(|| corrupt("turn", "ended"))?,
            updated_ms: field("updated_ms")?
                .as_u64()
                .ok_or_else(|| corrupt("turn", "updated_ms"))?,
        })
    }
}

impl SledTurns {
    fn meta(&self, id: &str) -> Result<Option<Meta>, TurnStoreError> {
        self.tree
            .get(turn_key(id))
            .map_err(|e| failed(&e))?
            .map(|b| Meta::decode(&b))
            .transpose()
    }

    fn events(&self, id: &str, after: u64) -> Result<Vec<StoredEvent>, TurnStoreError> {
        let from = event_key(id, after.saturating_add(1));
        let prefix = events_prefix(id);
        let mut out = Vec::new();
        for item in self.tree.range(from..) {
            let (k, v) = item.map_err(|e| failed(&e))?;
            if !k.starts_with(&prefix) {
                break;
            }
            let seq_bytes: [u8; 8] = k[prefix.len()..]
                .try_into()
                .map_err(|_| corrupt("event key", id))?;
            let seq = u64::from_be_bytes(seq_bytes);
            let v: Value = serde_json::from_slice(&v).map_err(|e| corrupt("event", e))?;
            let kind = v["kind"]
                .as_str()
                .ok_or_else(|| corrupt("event", "kind"))?
                .parse()
                .map_err(|e| corrupt("event", e))?;
            out.push(StoredEvent::new(seq, kind, v["data"].clone()));
        }
        Ok(out)
    }

    /// Writes `batch`, then makes it durable (one flush may cover many
    /// writers).
    async fn commit(&self, batch: sled::Batch) -> Result<(), TurnStoreError> {
        self.tree.apply_batch(batch).map_err(|e| failed(&e))?;
        let seq = self.store.note_write();
        self.store
            .flush_through(seq)
            .await
            .map_err(|e| TurnStoreError::Failed(e.to_string()))
    }

    /// Removes the turns that ended more than `keep` ago, and the
    /// unfinished ones untouched for a day longer; how many.
    pub fn expire(&self, keep: Duration) -> Result<usize, TurnStoreError> {
        let now = now_ms();
        let keep_ms = u64::try_from(keep.as_millis()).unwrap_or(u64::MAX);
        let extra_ms = u64::try_from(UNFINISHED_EXTRA.as_millis()).unwrap_or(u64::MAX);
        let mut gone = 0;
        for item in self.tree.scan_prefix(b"t") {
            let (k, v) = item.map_err(|e| failed(&e))?;
            let id = String::from_utf8_lossy(&k[1..]).into_owned();
            let meta = Meta::decode(&v)?;
            let age = now.saturating_sub(meta.updated_ms);
            let due = if meta.ended {
                age > keep_ms
            } else {
                age > keep_ms.saturating_add(extra_ms)
            };
            if !due {
                continue;
            }
            let mut batch = sled::Batch::default();
            for e in self.tree.scan_prefix(events_prefix(&id)).keys() {
                batch.remove(e.map_err(|e| failed(&e))?);
            }
            batch.remove(turn_key(&id));
            batch.remove(message_key(&SessionKey::new(meta.key), meta.message_id));
            self.tree.apply_batch(batch).map_err(|e| failed(&e))?;
            gone += 1;
        }
        Ok(gone)
    }
}

impl TurnStore for SledTurns {
    fn open<'a>(
        &'a self,
        key: &'a SessionKey,
        message_id: u64,
        id: &'a str,
    ) -> BoxFuture<'a, Result<StoredTurn, TurnStoreError>> {
        Box::pin(async move {
            let by_message = message_key(key, message_id);
            let existing = self.tree.get(&by_message).map_err(|e| failed(&e))?;
            let id = match existing {
                Some(stored) => String::from_utf8_lossy(&stored).into_owned(),
                None => id.to_owned(),
            };
            let mut meta = self.meta(&id)?.unwrap_or(Meta {
                key: key.as_str().to_owned(),
                message_id,
                ended: false,
                updated_ms: 0,
            });
            meta.updated_ms = now_ms();
            let mut batch = sled::Batch::default();
            batch.insert(by_message, id.as_bytes());
            batch.insert(turn_key(&id), meta.encode());
            self.commit(batch).await?;
            let events = self.events(&id, 0)?;
            Ok(StoredTurn::new(
                id,
                key.clone(),
                message_id,
                events,
                meta.ended,
            ))
        })
    }

    fn append<'a>(
        &'a self,
        key: &'a SessionKey,
        id: &'a str,
        events: &'a [StoredEvent],
        ended: bool,
    ) -> BoxFuture<'a, Result<(), TurnStoreError>> {
        Box::pin(async move {
            let Some(mut meta) = self.meta(id)? else {
                return Err(TurnStoreError::Failed(format!(
                    "turn {id} of {key} is not in the store (expired?)"
                )));
            };
            meta.ended |= ended;
            meta.updated_ms = now_ms();
            let mut batch = sled::Batch::default();
            for e in events {
                let value = json!({"kind": e.kind.as_str(), "data": e.data});
                batch.insert(event_key(id, e.id), value.to_string().into_bytes());
            }
            batch.insert(turn_key(id), meta.encode());
            self.commit(batch).await
        })
    }

    fn recent<'a>(
        &'a self,
        key: &'a SessionKey,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<StoredTurn>, TurnStoreError>> {
        Box::pin(async move {
            let mut prefix = message_key(key, 0);
            prefix.truncate(prefix.len() - 8);
            let mut out = Vec::new();
            // Message ids are big-endian: the newest last.
            for item in self.tree.scan_prefix(&prefix).rev().take(limit) {
                let (k, id) = item.map_err(|e| failed(&e))?;
                let message_id = k[prefix.len()..]
                    .try_into()
                    .map(u64::from_be_bytes)
                    .map_err(|_| corrupt("message key", key))?;
                let id = String::from_utf8_lossy(&id).into_owned();
                let Some(meta) = self.meta(&id)? else {
                    continue;
                };
                let last = match self.tree.scan_prefix(events_prefix(&id)).next_back() {
                    Some(item) => {
                        let (k, _) = item.map_err(|e| failed(&e))?;
                        let seq_bytes: [u8; 8] = k[events_prefix(&id).len()..]
                            .try_into()
                            .map_err(|_| corrupt("event key", &id))?;
                        self.events(&id, u64::from_be_bytes(seq_bytes) - 1)?
                    }
                    None => Vec::new(),
                };
                out.push(StoredTurn::new(
                    id,
                    key.clone(),
                    message_id,
                    last,
                    meta.ended,
                ));
            }
            Ok(out)
        })
    }

    fn read<'a>(
        &'a self,
        id: &'a str,
        after: u64,
    ) -> BoxFuture<'a, Result<Option<StoredTurn>, TurnStoreError>> {
        Box::pin(async move {
            // The entry first: if it says ended, every event is there.
            let Some(meta) = self.meta(id)? else {
                return Ok(None);
            };
            let events = self.events(id, after)?;
            Ok(Some(StoredTurn::new(
                id,
                SessionKey::new(meta.key),
                meta.message_id,
                events,
                meta.ended,
            )))
        })
    }
}
