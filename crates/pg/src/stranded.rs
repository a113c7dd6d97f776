//! Turns whose end was lost with their node's lease: the session answered
//! the message (its record says so: the message is no longer pending) but
//! the turn's last batch of events never reached the database — its node
//! gave the lease up in a database outage between the two writes (the
//! answer is written first, then the turn's end), or died between them.
//! No node re-delivers an answered message, so nothing would ever end that
//! turn and a client attached to it would wait for ever. Once no node runs
//! the session (its lease expired past the takeover grace, or given back),
//! such a turn gets an `error` end, code [`TURN_END_LOST`]; the session's
//! conversation holds the reply itself. (The single-node store does the
//! same for a turn log that lost its end: `ETURN_LOG_DAMAGED`.)

use warden_core::store::turn_event::Failed;
use warden_core::store::{EventTime, TurnEventData};
use warden_core::{SessionKey, StoreError};

use crate::{PgStore, TAKEOVER_GRACE, backend, secs};

/// The code of the `error` event that ends a turn whose end was lost with
/// its node's lease: the session answered the message (no longer pending
/// in its record) but the turn's last batch never reached the database,
/// its node having given the session up (a database outage, or it died)
/// between the two writes. No node re-delivers an answered message, so
/// nothing else would ever end that turn. The session's conversation
/// holds the reply.
pub const TURN_END_LOST: &str = "ETURN_END_LOST";

impl PgStore {
    /// Ends every turn of `keys` (of every session when `None`) that has
    /// no end although its message was answered and no node runs its
    /// session (see [`TURN_END_LOST`]): an `error` event numbered
    /// after its last one, code [`TURN_END_LOST`], in one statement. The
    /// session's epoch goes up with it, so a write of the last owner still
    /// in flight is fenced out and cannot land after that end; a session
    /// whose lease row is being written is skipped (for the next call).
    /// Returns the turns ended.
    pub async fn end_stranded_turns(
        &self,
        keys: Option<&[SessionKey]>,
    ) -> Result<Vec<String>, StoreError> {
        let keys: Option<Vec<&str>> = keys.map(|k| k.iter().map(SessionKey::as_str).collect());
        let end = TurnEventData::Error(Failed::new(
            TURN_END_LOST,
            "the end of this turn was lost: its node gave the session up (a database outage, or it died) after the message was answered and before the turn's end was stored; the session's conversation holds the reply",
            // `warden chat`'s class for any other failure.
            1,
        ))
        .to_value(Some(EventTime::now()));
        let client = self.client().await?;
        let rows = client
            .query(
                "WITH stranded AS ( \
                   SELECT t.id, t.key FROM warden_turns t \
                   JOIN warden_sessions s ON s.key = t.key \
                   WHERE NOT t.ended \
                     AND ($1::text[] IS NULL OR t.key = ANY($1)) \
                     AND (s.lease_until IS NULL \
                       OR s.lease_until < now() - make_interval(secs => $2)) \
                     AND NOT EXISTS ( \
                       SELECT 1 FROM jsonb_array_elements(CASE \
                         WHEN jsonb_typeof(s.record -> 'pending') = 'array' \
                         THEN s.record -> 'pending' ELSE '[]'::jsonb END) AS p \
                       WHERE p ->> 'id' = t.message_id::text) \
                   FOR UPDATE OF s SKIP LOCKED), \
                 fenced AS ( \
                   UPDATE warden_sessions s SET epoch = s.epoch + 1 \
                   FROM (SELECT DISTINCT key FROM stranded) AS x WHERE s.key = x.key \
                   RETURNING s.key, s.epoch), \
                 marked AS ( \
                   UPDATE warden_turns t SET ended = true, updated_at = now() \
                   FROM stranded WHERE t.id = stranded.id RETURNING t.id) \
                 INSERT INTO warden_turn_events (turn_id, seq, epoch, kind, data) \
                 SELECT st.id, \
                   COALESCE((SELECT max(e.seq) FROM warden_turn_events e \
                     WHERE e.turn_id = st.id), 0) + 1, \
                   f.epoch, 'error', $3::jsonb \
                 FROM stranded st JOIN fenced f ON f.key = st.key \
                 RETURNING turn_id",
                &[&keys, &secs(TAKEOVER_GRACE), &end],
            )
            .await
            .map_err(backend)?;
        let ended: Vec<String> = rows.into_iter().map(|r| r.get(0)).collect();
        for id in &ended {
            tracing::warn!(
                event = "pg.turn_end_lost",
                turn = %id,
                "a turn's message was answered but its end was never stored (its node gave the session up); ended it with {TURN_END_LOST}"
            );
        }
        Ok(ended)
    }
}
