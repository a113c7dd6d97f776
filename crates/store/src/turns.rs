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
//!   "updated_ms"}`, JSON, and `"fingerprint"` when the request that sent
//!   it had an idempotency key: [`StoredTurn::fingerprint`]; an entry
//!   written before it was kept has none, which reads as unknown);
//! - `e` + turn id + `0x00` + number of its first event (big-endian): one
//!   appended batch of events (`[{"id", "kind", "data"}, …]`, JSON); a
//!   database written before batches were stored whole holds one event per
//!   key (`{"kind", "data"}`), which reads the same.
//!
//! The turn's entry is rewritten when the turn ends and otherwise at most
//! once a minute (its time is what expires a turn that never ends), so a
//! streaming turn costs one write per batch.
//!
//! A batch of events is on disk before [`append`](TurnStore::append)
//! returns, and `warden serve` shows no event before its batch is stored:
//! each batch goes through the turn logs' write-ahead log (`turns.wal/` in
//! the database directory: one append and one `fdatasync` shared by every
//! batch waiting at that moment), then into the tree; sled persists the
//! tree on its own and the log is trimmed after each of its checkpoints.
//! A crash leaves the log's files behind, and the next
//! [`SledStore::turns`] replays them before anything is read.
//!
//! Removals by [`SledTurns::expire`] go to the tree directly: one lost in
//! a crash is made again at the next expiry.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures_util::future::BoxFuture;
use serde_json::{Value, json};
use warden_core::SessionKey;
use warden_core::store::{StoredEvent, StoredTurn, TurnAsked, TurnStore, TurnStoreError};

use crate::wal::{self, Op, Wal};

mod lost;

use crate::{SledStore, describe};
pub use lost::{TURN_LOG_DAMAGED, TurnLogDamage};

/// The sled tree holding the turn logs.
pub(crate) const TREE: &str = "turns";

/// How often a turn still streaming has its entry's time refreshed.
const TOUCH_EVERY: Duration = Duration::from_secs(60);

/// How much longer than `keep` an unfinished turn is kept (its process
/// died for good and nothing will end it).
const UNFINISHED_EXTRA: Duration = Duration::from_secs(24 * 60 * 60);

/// The turn event logs of one `warden serve` in its sled database
/// ([`SledStore::turns`]). Cheap to clone.
#[derive(Debug, Clone)]
pub struct SledTurns {
    tree: sled::Tree,
    wal: Arc<Wal>,
}

impl SledStore {
    /// This database's turn event logs, for `warden serve`
    /// (`ServeConfig::with_turn_store`). The first call replays what a
    /// crash left in the write-ahead log; later calls return the same
    /// logs.
    pub fn turns(&self) -> Result<SledTurns, warden_core::StoreError> {
        let mut cached = self.turns.lock();
        if let Some(turns) = &*cached {
            return Ok(turns.clone());
        }
        let tree = self
            .db
            .open_tree(TREE)
            .map_err(|e| crate::backend(describe(&e)))?;
        let (wal, replay) =
            Wal::open(&self.path.join(wal::DIR), tree.clone()).map_err(crate::backend)?;
        if replay.records > 0 {
            tracing::info!(
                batches = replay.records,
                "turn log batches replayed from the write-ahead log"
            );
        }
        let turns = SledTurns {
            tree,
            wal: Arc::new(wal),
        };
        // Before any session runs: every unended turn is either re-run
        // (its message pending) or ended here.
        let lost = turns
            .end_lost_turns(self, !replay.damaged.is_empty())
            .map_err(crate::backend)?;
        lost::report(&replay, &lost);
        *cached = Some(turns.clone());
        Ok(turns)
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
    /// The fingerprint of the request that sent it, if known.
    fingerprint: Option<String>,
    /// What it was asked (empty: unknown).
    asked: TurnAsked,
}

impl Meta {
    fn encode(&self) -> Vec<u8> {
        let mut v = json!({"key": self.key, "message_id": self.message_id, "ended": self.ended, "updated_ms": self.updated_ms});
        if let Some(f) = &self.fingerprint {
            v["fingerprint"] = json!(f);
        }
        if !self.asked.is_empty() {
            v["asked"] = json!(self.asked);
        }
        v.to_string().into_bytes()
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
            // Absent (written before it was kept): unknown.
            fingerprint: v
                .get("fingerprint")
                .and_then(Value::as_str)
                .map(str::to_owned),
            // Absent (written before it was kept): unknown. Unreadable: a
            // display field only, not worth refusing the turn for.
            asked: v
                .get("asked")
                .and_then(|a| serde_json::from_value(a.clone()).ok())
                .unwrap_or_default(),
        })
    }
}

/// Decodes the value stored under a turn's event key `first`: a batch
/// (`[{"id", "kind", "data"}, …]`, one key per appended batch) or, as
/// databases written before batches were stored whole hold it, one event
/// (`{"kind", "data"}`, numbered by its key).
fn decode_batch(
    first: u64,
    bytes: &[u8],
    out: &mut Vec<StoredEvent>,
) -> Result<(), TurnStoreError> {
    let v: Value = serde_json::from_slice(bytes).map_err(|e| corrupt("event", e))?;
    let one = |v: &Value, id: u64| -> Result<StoredEvent, TurnStoreError> {
        let kind = v["kind"].as_str().ok_or_else(|| corrupt("event", "kind"))?;
        StoredEvent::from_stored(id, kind, v["data"].clone()).map_err(|e| corrupt("event", e))
    };
    match &v {
        Value::Array(events) => {
            for e in events {
                let id = e["id"].as_u64().ok_or_else(|| corrupt("event", "id"))?;
                out.push(one(e, id)?);
            }
        }
        _ => out.push(one(&v, first)?),
    }
    Ok(())
}

/// A batch of events as stored under its first event's key.
fn encode_batch(events: &[StoredEvent]) -> Vec<u8> {
    Value::Array(
        events
            .iter()
            .map(|e| json!({"id": e.id, "kind": e.kind().as_str(), "data": e.data_value()}))
            .collect(),
    )
    .to_string()
    .into_bytes()
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
        let prefix = events_prefix(id);
        let wanted = after.saturating_add(1);
        // The batch holding event `after + 1` may start before it: begin
        // at the last batch starting at or before it.
        let start = match self
            .tree
            .range(prefix.clone()..=event_key(id, wanted))
            .next_back()
        {
            Some(item) => item.map_err(|e| failed(&e))?.0.to_vec(),
            None => prefix.clone(),
        };
        let mut out = Vec::new();
        for item in self.tree.range(start..) {
            let (k, v) = item.map_err(|e| failed(&e))?;
            if !k.starts_with(&prefix) {
                break;
            }
            let first: [u8; 8] = k[prefix.len()..]
                .try_into()
                .map_err(|_| corrupt("event key", id))?;
            decode_batch(u64::from_be_bytes(first), &v, &mut out)?;
        }
        out.retain(|e| e.id >= wanted);
        Ok(out)
    }

    /// Makes `ops` durable (one sync may cover many writers), then
    /// applies them to the tree as one batch.
    async fn commit(&self, ops: Vec<Op>) -> Result<(), TurnStoreError> {
        self.wal.commit(ops).await.map_err(TurnStoreError::Failed)
    }

    /// How many batches (a turn opened, or events appended) are stored,
    /// and how many syncs of the write-ahead log carried them: with many
    /// turns streaming, one sync carries many batches.
    pub fn commits(&self) -> (u64, u64) {
        let c = &self.wal.counters;
        (
            c.batches.load(Ordering::Relaxed),
            c.syncs.load(Ordering::Relaxed),
        )
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
        fingerprint: Option<&'a str>,
        asked: &'a TurnAsked,
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
                fingerprint: None,
                asked: TurnAsked::default(),
            });
            meta.updated_ms = now_ms();
            // The first request's, never replaced (a re-delivery has none).
            if meta.fingerprint.is_none() {
                meta.fingerprint = fingerprint.map(str::to_owned);
            }
            if meta.asked.is_empty() {
                meta.asked = asked.clone();
            }
            self.commit(vec![
                Op::Insert(by_message, id.as_bytes().to_vec()),
                Op::Insert(turn_key(&id), meta.encode()),
            ])
            .await?;
            let events = self.events(&id, 0)?;
            Ok(
                StoredTurn::new(id, key.clone(), message_id, events, meta.ended)
                    .with_fingerprint(meta.fingerprint)
                    .with_asked(meta.asked),
            )
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
            // The entry is rewritten when the turn ends, or when its
            // last mark is older than `TOUCH_EVERY` (expiry of a turn that
            // never ends counts from it): not at every batch.
            let now = now_ms();
            let touch = (ended && !meta.ended)
                || now.saturating_sub(meta.updated_ms) >= TOUCH_EVERY.as_millis() as u64;
            let mut ops = Vec::with_capacity(2);
            if let Some(first) = events.first() {
                ops.push(Op::Insert(event_key(id, first.id), encode_batch(events)));
            }
            if touch {
                meta.ended |= ended;
                meta.updated_ms = now;
                ops.push(Op::Insert(turn_key(id), meta.encode()));
            }
            if ops.is_empty() {
                return Ok(());
            }
            self.commit(ops).await
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
                // The last event: the end of the last batch.
                let mut last = Vec::new();
                if let Some(item) = self.tree.scan_prefix(events_prefix(&id)).next_back() {
                    let (k, v) = item.map_err(|e| failed(&e))?;
                    let first: [u8; 8] = k[events_prefix(&id).len()..]
                        .try_into()
                        .map_err(|_| corrupt("event key", &id))?;
                    decode_batch(u64::from_be_bytes(first), &v, &mut last)?;
                    last.drain(..last.len().saturating_sub(1));
                }
                out.push(
                    StoredTurn::new(id, key.clone(), message_id, last, meta.ended)
                        .with_asked(meta.asked),
                );
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
            let turn = StoredTurn::new(
                id,
                SessionKey::new(meta.key),
                meta.message_id,
                events,
                meta.ended,
            );
            Ok(Some(
                turn.with_fingerprint(meta.fingerprint)
                    .with_asked(meta.asked),
            ))
        })
    }
}
