//! Group commit of turn events: one transaction per node at a time carries
//! the pending event batches of every turn on the node.
//!
//! A running turn stores each batch of its events before any client sees
//! them. Committed one by one, that is a transaction per batch — with
//! events 50 ms apart, one per event, and thousands a second on a busy
//! node. Here every batch a node's turns hand in while a transaction is in
//! flight waits for it to finish and then goes into the next one, together:
//! the tick adapts to the load (an idle node commits a lone batch at once;
//! a busy one commits as often as the database answers, each commit
//! carrying every batch that arrived meanwhile), and at most one
//! transaction is in flight per node.
//!
//! Each batch is still fenced by its own session's lease (owner and epoch,
//! the lease row locked `FOR SHARE` for the transaction) in the same
//! statement: a batch whose fence fails is refused alone
//! ([`StoreError::LeaseLost`]) and the others commit. A batch hears back
//! only once the transaction holding it has committed, so no client sees
//! an event before it is stored. Should the shared statement fail as a
//! whole (an event number already stored: two writers, which fencing
//! rules out), each batch is tried again alone, so one bad batch cannot
//! fail the others.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};
use warden_core::StoreError;
use warden_core::store::StoredEvent;

use crate::{Lease, PgStore, backend, to_db};

/// The shared append: every batch through its own session's fence (the
/// lease row `FOR SHARE`), its events inserted if its turn is there, its
/// turn marked (ended, or touched when stale: see `turns::touch_every`);
/// per batch whether its fence held and its turn was there.
const GROUP_APPEND: &str = concat!(
    "WITH b AS (SELECT * FROM jsonb_to_recordset($1::jsonb) AS b(i int, key text, \
                   node text, epoch bigint, turn_id text, events jsonb, ended boolean)), \
                 fenced AS (SELECT b.* FROM b JOIN warden_sessions s \
                   ON s.key = b.key AND s.owner = b.node AND s.epoch = b.epoch FOR SHARE OF s), \
                 added AS (INSERT INTO warden_turn_events (turn_id, seq, epoch, kind, data) \
                   SELECT f.turn_id, e.seq, f.epoch, e.kind, e.data FROM fenced f \
                   JOIN warden_turns t ON t.id = f.turn_id AND t.key = f.key \
                   CROSS JOIN LATERAL jsonb_to_recordset(f.events) AS e(seq bigint, kind text, data jsonb) \
                   RETURNING 1), \
                 marked AS (UPDATE warden_turns t SET ended = t.ended OR f.ended, updated_at = now() \
                   FROM fenced f WHERE t.id = f.turn_id AND t.key = f.key \
                     AND (f.ended OR t.updated_at < now() - ",
    crate::turns::touch_every!(),
    ") RETURNING f.i), \
                 present AS (SELECT f.i FROM fenced f JOIN warden_turns t \
                   ON t.id = f.turn_id AND t.key = f.key) \
                 SELECT b.i, EXISTS (SELECT 1 FROM fenced f WHERE f.i = b.i), \
                   EXISTS (SELECT 1 FROM present p WHERE p.i = b.i), (SELECT count(*) FROM added) \
                 FROM b ORDER BY b.i"
);

/// Batches carried by one transaction at most (the rest wait for the
/// next): keeps a statement's size bounded under a burst.
const MAX_GROUP: usize = 512;

/// One turn's batch of events, as handed in.
pub struct TurnBatch {
    /// The lease its session is written under.
    pub lease: Lease,
    /// The turn's id.
    pub id: String,
    /// The events, numbered.
    pub events: Vec<StoredEvent>,
    /// Whether the turn's last event is among them.
    pub ended: bool,
}

/// A batch waiting for its transaction, and who waits for it.
struct Pending {
    batch: TurnBatch,
    reply: oneshot::Sender<Result<(), StoreError>>,
}

/// What a node's group commit did since it started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct GroupStats {
    /// Transactions committed (or tried).
    pub transactions: u64,
    /// Batches they carried.
    pub batches: u64,
}

#[derive(Default)]
struct Counters {
    transactions: AtomicU64,
    batches: AtomicU64,
}

/// A node's group commit: [`append`](Self::append) hands a batch in and
/// returns once the transaction holding it has committed.
#[derive(Clone)]
pub(crate) struct GroupCommit {
    pg: PgStore,
    tx: Arc<std::sync::OnceLock<mpsc::UnboundedSender<Pending>>>,
    counters: Arc<Counters>,
}

impl GroupCommit {
    pub(crate) fn new(pg: PgStore) -> Self {
        Self {
            pg,
            tx: Arc::default(),
            counters: Arc::default(),
        }
    }

    /// Stores `batch` in the next transaction; its outcome once that has
    /// committed.
    pub(crate) async fn append(&self, batch: TurnBatch) -> Result<(), StoreError> {
        let tx = self.tx.get_or_init(|| {
            let (tx, rx) = mpsc::unbounded_channel();
            tokio::spawn(run(self.pg.clone(), rx, Arc::clone(&self.counters)));
            tx
        });
        let (reply, answer) = oneshot::channel();
        tx.send(Pending { batch, reply })
            .map_err(|_| StoreError::Backend {
                message: "the node's group commit has stopped".into(),
            })?;
        answer.await.map_err(|_| StoreError::Backend {
            message: "the node's group commit dropped a batch".into(),
        })?
    }

    pub(crate) fn stats(&self) -> GroupStats {
        GroupStats {
            transactions: self.counters.transactions.load(Ordering::Relaxed),
            batches: self.counters.batches.load(Ordering::Relaxed),
        }
    }
}

/// The committer: one transaction at a time, each with every batch that
/// arrived while the one before was in flight. Ends when every sender is
/// gone.
async fn run(pg: PgStore, mut rx: mpsc::UnboundedReceiver<Pending>, counters: Arc<Counters>) {
    while let Some(first) = rx.recv().await {
        let mut group = vec![first];
        while group.len() < MAX_GROUP {
            match rx.try_recv() {
                Ok(p) => group.push(p),
                Err(_) => break,
            }
        }
        let batches: Vec<&TurnBatch> = group.iter().map(|p| &p.batch).collect();
        let results = match pg.append_turns(&batches).await {
            Ok(results) => results,
            // The shared statement failed as a whole: each batch alone, so
            // one bad batch (or the connection) answers for itself.
            Err(_) => {
                let mut results = Vec::with_capacity(group.len());
                for b in &batches {
                    results.push(pg.append_turn(&b.lease, &b.id, &b.events, b.ended).await);
                }
                results
            }
        };
        counters.transactions.fetch_add(1, Ordering::Relaxed);
        counters
            .batches
            .fetch_add(group.len() as u64, Ordering::Relaxed);
        for (p, result) in group.into_iter().zip(results) {
            let _ = p.reply.send(result);
        }
    }
}

impl PgStore {
    /// Appends each of `batches` to its turn in one statement (one
    /// transaction), each through its own session's fence: per batch, `Ok`,
    /// [`StoreError::LeaseLost`] when its lease is no longer the session's
    /// (nothing of it is written; the others are), or an error when its
    /// turn does not exist. `Err` when the statement failed as a whole
    /// (then nothing was written).
    pub async fn append_turns(
        &self,
        batches: &[&TurnBatch],
    ) -> Result<Vec<Result<(), StoreError>>, StoreError> {
        let rows: Vec<Value> = batches
            .iter()
            .enumerate()
            .map(|(i, b)| {
                let events: Vec<Value> = b
                    .events
                    .iter()
                    .map(
                        |e| json!({"seq": e.id, "kind": e.kind().as_str(), "data": e.data_value()}),
                    )
                    .collect();
                json!({
                    "i": i,
                    "key": b.lease.key,
                    "node": b.lease.node,
                    "epoch": to_db(b.lease.epoch),
                    "turn_id": b.id,
                    "events": events,
                    "ended": b.ended,
                })
            })
            .collect();
        let client = self.client().await?;
        // Prepared once per connection: one round trip per transaction,
        // not a parse and then an execute.
        let statement = client.prepare_cached(GROUP_APPEND).await.map_err(backend)?;
        let answers = client
            .query(&statement, &[&Value::Array(rows)])
            .await
            .map_err(backend)?;
        let mut results: Vec<Result<(), StoreError>> = batches
            .iter()
            .map(|b| {
                Err(StoreError::Backend {
                    message: format!("no answer for turn {}", b.id),
                })
            })
            .collect();
        for row in answers {
            let i: i32 = row.get(0);
            let (fenced_in, marked): (bool, bool) = (row.get(1), row.get(2));
            let Some(b) = usize::try_from(i).ok().and_then(|i| batches.get(i)) else {
                continue;
            };
            results[i as usize] = if !fenced_in {
                Err(StoreError::LeaseLost {
                    key: b.lease.key.clone(),
                    epoch: b.lease.epoch,
                })
            } else if !marked {
                Err(StoreError::Backend {
                    message: format!("no turn {} of session {} to append to", b.id, b.lease.key),
                })
            } else {
                Ok(())
            };
        }
        Ok(results)
    }
}
