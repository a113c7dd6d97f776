//! Turn event logs: each turn's events as `warden serve` sent them, so a
//! turn re-delivered on another node keeps its id and its event ids
//! continue there, and a client re-attaching to any node with
//! `Last-Event-ID` misses and repeats nothing.
//!
//! A turn is a row of `warden_turns` (its id, its session and the message
//! it answers: one turn per message) and its events rows of
//! `warden_turn_events` numbered from 1; a turn sent with an idempotency
//! key keeps its request's fingerprint (`request_fingerprint`, NULL when
//! unknown). Every write goes through the session's fence in the same
//! statement, like a record's: the lease row is read `FOR SHARE`, so a
//! takeover (which updates that row) waits for an append in flight, and
//! once it has committed no append of the old epoch can land. The new owner reads the log after its takeover and
//! numbers on from its last event: two owners never write the same number.
//!
//! Events carry text the model wrote: the database's access control is
//! its protection, as for the conversations.

use std::time::Duration;

use serde_json::{Value, json};
use warden_core::store::{StoredEvent, StoredTurn, TurnAsked};
use warden_core::{SessionKey, StoreError};

use crate::{Lease, PgStore, backend, from_db, secs, to_db};

/// The fence as a CTE: the session's lease row, if `lease` still holds it,
/// locked `FOR SHARE` until the statement's transaction ends.
const FENCE: &str = "fence AS (SELECT 1 FROM warden_sessions \
                     WHERE key = $1 AND owner = $2 AND epoch = $3 FOR SHARE)";

/// How stale a running turn's `updated_at` may get before an append
/// refreshes it (its end always does). `updated_at` is indexed, so touching
/// it is a new row version and three index entries: per event batch that
/// was most of an append's writing. Expiry keeps a turn that never ended a
/// day past its retention, so a minute's staleness never expires one that
/// still runs.
/// (A macro, so that the group append's `const` statement can `concat!`
/// it in too.)
macro_rules! touch_every {
    () => {
        "interval '1 minute'"
    };
}
pub(crate) use touch_every;

impl PgStore {
    /// Opens the log of the turn answering message `message_id` of
    /// `lease`'s session, under the id `id` if it has none yet: the turn's
    /// log as stored (its own id and every event, for a turn re-delivered
    /// after another node began it). [`StoreError::LeaseLost`] when
    /// `lease` is no longer the session's.
    pub async fn open_turn(
        &self,
        lease: &Lease,
        message_id: u64,
        id: &str,
    ) -> Result<StoredTurn, StoreError> {
        let asked = TurnAsked::default();
        self.open_keyed_turn(lease, message_id, id, None, &asked)
            .await
    }

    /// [`open_turn`](Self::open_turn), keeping `fingerprint` (the
    /// request's: [`StoredTurn::fingerprint`]) and `asked`
    /// ([`StoredTurn::asked`]) with a turn that has none yet, in the same
    /// statement; stored ones are never replaced.
    pub async fn open_keyed_turn(
        &self,
        lease: &Lease,
        message_id: u64,
        id: &str,
        fingerprint: Option<&str>,
        asked: &TurnAsked,
    ) -> Result<StoredTurn, StoreError> {
        let asked_json = (!asked.is_empty()).then(|| json!(asked));
        let client = self.client().await?;
        let row = client
            .query_opt(
                &format!(
                    "WITH {FENCE} \
                     INSERT INTO warden_turns (id, key, message_id, request_fingerprint, asked) \
                     SELECT $4, $1, $5, $6, $7 WHERE EXISTS (SELECT 1 FROM fence) \
                     ON CONFLICT (key, message_id) DO UPDATE SET updated_at = now(), \
                       request_fingerprint = COALESCE(warden_turns.request_fingerprint, \
                                                      EXCLUDED.request_fingerprint), \
                       asked = COALESCE(warden_turns.asked, EXCLUDED.asked) \
                     RETURNING id, ended, xmax = 0, request_fingerprint, asked"
                ),
                &[
                    &lease.key,
                    &lease.node,
                    &to_db(lease.epoch),
                    &id,
                    &to_db(message_id),
                    &fingerprint,
                    &asked_json,
                ],
            )
            .await
            .map_err(backend)?;
        let Some(row) = row else {
            return Err(StoreError::LeaseLost {
                key: lease.key.clone(),
                epoch: lease.epoch,
            });
        };
        let id: String = row.get(0);
        let ended: bool = row.get(1);
        // A row just inserted (`xmax` 0: PostgreSQL's mark of a tuple no
        // transaction has updated) has no events yet: no second round trip
        // for the common case, a new turn.
        let inserted: bool = row.get(2);
        let fingerprint: Option<String> = row.get(3);
        let asked = read_asked(row.get(4));
        let events = if inserted {
            Vec::new()
        } else {
            self.turn_events(&client, &id, 0).await?
        };
        let key = SessionKey::new(lease.key.clone());
        Ok(StoredTurn::new(id, key, message_id, events, ended)
            .with_fingerprint(fingerprint)
            .with_asked(asked))
    }

    /// Appends `events` to turn `id` of `lease`'s session, through the
    /// fence; `ended` when the turn's last event is among them. One
    /// statement, one round trip. [`StoreError::LeaseLost`] when `lease`
    /// is no longer the session's; an event number already stored is an
    /// error too (it would mean two writers).
    pub async fn append_turn(
        &self,
        lease: &Lease,
        id: &str,
        events: &[StoredEvent],
        ended: bool,
    ) -> Result<(), StoreError> {
        let batch: Vec<Value> = events
            .iter()
            .map(|e| json!({"seq": e.id, "kind": e.kind().as_str(), "data": e.data_value()}))
            .collect();
        let client = self.client().await?;
        let row = client
            .query_one(
                &format!(
                    "WITH {FENCE}, \
                     added AS (INSERT INTO warden_turn_events (turn_id, seq, epoch, kind, data) \
                       SELECT $4, e.seq, $3, e.kind, e.data \
                       FROM jsonb_to_recordset($5::jsonb) AS e(seq bigint, kind text, data jsonb) \
                       WHERE EXISTS (SELECT 1 FROM fence) \
                         AND EXISTS (SELECT 1 FROM warden_turns WHERE id = $4 AND key = $1) \
                       RETURNING 1), \
                     marked AS (UPDATE warden_turns SET ended = ended OR $6, updated_at = now() \
                       WHERE id = $4 AND key = $1 AND EXISTS (SELECT 1 FROM fence) \
                         AND ($6 OR updated_at < now() - {touch}) RETURNING 1), \
                     present AS (SELECT 1 FROM warden_turns WHERE id = $4 AND key = $1) \
                     SELECT EXISTS (SELECT 1 FROM fence), (SELECT count(*) FROM present)",
                    touch = touch_every!()
                ),
                &[
                    &lease.key,
                    &lease.node,
                    &to_db(lease.epoch),
                    &id,
                    &Value::Array(batch),
                    &ended,
                ],
            )
            .await
            .map_err(backend)?;
        let fenced_in: bool = row.get(0);
        let present: i64 = row.get(1);
        if !fenced_in {
            return Err(StoreError::LeaseLost {
                key: lease.key.clone(),
                epoch: lease.epoch,
            });
        }
        if present != 1 {
            return Err(StoreError::Backend {
                message: format!("no turn {id} of session {} to append to", lease.key),
            });
        }
        Ok(())
    }

    /// Turn `id`'s log with its events after number `after` (all for 0);
    /// `None` if no such turn is stored (or it expired).
    pub async fn read_turn(&self, id: &str, after: u64) -> Result<Option<StoredTurn>, StoreError> {
        let client = self.client().await?;
        // `ended` first: if it is set, every event is already there.
        let Some(row) = client
            .query_opt(
                "SELECT key, message_id, ended, request_fingerprint, asked FROM warden_turns \
                 WHERE id = $1",
                &[&id],
            )
            .await
            .map_err(backend)?
        else {
            return Ok(None);
        };
        let events = self.turn_events(&client, id, after).await?;
        let key = SessionKey::new(row.get::<_, String>(0));
        let (message_id, ended) = (from_db(row.get(1)), row.get(2));
        let turn = StoredTurn::new(id, key, message_id, events, ended);
        Ok(Some(
            turn.with_fingerprint(row.get(3))
                .with_asked(read_asked(row.get(4))),
        ))
    }

    /// The newest `limit` turns of `key`, newest first, each with its last
    /// event (if any).
    pub async fn recent_turns(
        &self,
        key: &SessionKey,
        limit: usize,
    ) -> Result<Vec<StoredTurn>, StoreError> {
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT t.id, t.message_id, t.ended, e.seq, e.kind, e.data, t.asked \
                 FROM warden_turns t \
                 LEFT JOIN LATERAL (SELECT seq, kind, data FROM warden_turn_events \
                   WHERE turn_id = t.id ORDER BY seq DESC LIMIT 1) e ON true \
                 WHERE t.key = $1 ORDER BY t.message_id DESC LIMIT $2",
                &[&key.as_str(), &i64::try_from(limit).unwrap_or(i64::MAX)],
            )
            .await
            .map_err(backend)?;
        rows.into_iter()
            .map(|r| {
                let id: String = r.get(0);
                let last = match r.get::<_, Option<i64>>(3) {
                    Some(seq) => {
                        let kind: String = r.get(4);
                        let event = StoredEvent::from_stored(from_db(seq), &kind, r.get(5))
                            .map_err(|e| StoreError::Backend {
                                message: format!("turn {id}: event {seq}: {e}"),
                            })?;
                        vec![event]
                    }
                    None => Vec::new(),
                };
                let turn = StoredTurn::new(id, key.clone(), from_db(r.get(1)), last, r.get(2));
                Ok(turn.with_asked(read_asked(r.get(6))))
            })
            .collect()
    }

    async fn turn_events(
        &self,
        client: &deadpool_postgres::Object,
        id: &str,
        after: u64,
    ) -> Result<Vec<StoredEvent>, StoreError> {
        let rows = client
            .query(
                "SELECT seq, kind, data FROM warden_turn_events \
                 WHERE turn_id = $1 AND seq > $2 ORDER BY seq",
                &[&id, &to_db(after)],
            )
            .await
            .map_err(backend)?;
        rows.into_iter()
            .map(|r| {
                let kind: String = r.get(1);
                StoredEvent::from_stored(from_db(r.get(0)), &kind, r.get(2)).map_err(|e| {
                    StoreError::Backend {
                        message: format!("turn {id}: event {}: {e}", from_db(r.get(0))),
                    }
                })
            })
            .collect()
    }

    /// Deletes the logs of ended turns untouched for `keep`, and of turns
    /// that never ended (their session was given up) untouched for `keep`
    /// plus a day — a turn still running is never deleted under its node,
    /// however long a tool runs; how many.
    pub async fn expire_turns(&self, keep: Duration) -> Result<u64, StoreError> {
        let client = self.client().await?;
        let row = client
            .query_one(
                "WITH gone AS (DELETE FROM warden_turns \
                   WHERE updated_at < now() - make_interval(secs => $1) \
                     AND (ended OR updated_at < now() - make_interval(secs => $1) - interval '1 day') \
                   RETURNING id), \
                 events AS (DELETE FROM warden_turn_events \
                   WHERE turn_id IN (SELECT id FROM gone)) \
                 SELECT count(*) FROM gone",
                &[&secs(keep)],
            )
            .await
            .map_err(backend)?;
        Ok(from_db(row.get(0)))
    }
}

/// A turn's `asked` column as stored: empty when NULL (stored before it was
/// kept) or unreadable (a display field, not worth refusing the turn for).
fn read_asked(v: Option<Value>) -> TurnAsked {
    v.and_then(|v| serde_json::from_value(v).ok())
        .unwrap_or_default()
}
