//! The schema, as numbered migrations applied in order, once each.
//!
//! Written here rather than with a migration crate: there are few, they
//! are plain SQL, and applying them needs one thing a generic tool does
//! not give for free here — several nodes starting at once against a fresh
//! database must not race, so the whole run holds a transaction-scoped
//! advisory lock.

use crate::PgError;

/// Every migration, oldest first: `(version, SQL)`.
pub const MIGRATIONS: &[(i32, &str)] = &[
    (
        1,
        "CREATE TABLE warden_sessions (
         key            TEXT PRIMARY KEY,
         schema_version SMALLINT NOT NULL DEFAULT 1,
         record         JSONB,
         owner          TEXT,
         epoch          BIGINT NOT NULL DEFAULT 0,
         lease_until    TIMESTAMPTZ,
         updated_at     TIMESTAMPTZ NOT NULL DEFAULT now()
     );
     CREATE INDEX warden_sessions_owner ON warden_sessions (owner);
     CREATE TABLE warden_nodes (
         node_id      TEXT PRIMARY KEY,
         advertise    TEXT NOT NULL,
         started_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
         heartbeat_at TIMESTAMPTZ NOT NULL DEFAULT now()
     );",
    ),
    (
        2,
        "CREATE TABLE warden_conversations (
         id         TEXT PRIMARY KEY,
         created_at TIMESTAMPTZ NOT NULL DEFAULT now()
     );
     CREATE TABLE warden_conversation_turns (
         id        TEXT NOT NULL,
         seq       BIGSERIAL,
         turn      BIGINT NOT NULL,
         user_text TEXT NOT NULL,
         reply     TEXT NOT NULL,
         PRIMARY KEY (id, seq)
     );
     CREATE UNIQUE INDEX warden_conversation_turns_once
         ON warden_conversation_turns (id, turn, md5(user_text));",
    ),
    (
        3,
        "CREATE TABLE warden_turns (
         id         TEXT PRIMARY KEY,
         key        TEXT NOT NULL,
         message_id BIGINT NOT NULL,
         ended      BOOLEAN NOT NULL DEFAULT false,
         created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
         updated_at TIMESTAMPTZ NOT NULL DEFAULT now(),
         UNIQUE (key, message_id)
     );
     CREATE INDEX warden_turns_updated ON warden_turns (updated_at);
     CREATE TABLE warden_turn_events (
         turn_id TEXT NOT NULL,
         seq     BIGINT NOT NULL,
         epoch   BIGINT NOT NULL,
         kind    TEXT NOT NULL,
         data    JSONB NOT NULL,
         PRIMARY KEY (turn_id, seq)
     );",
    ),
    (
        4,
        "ALTER TABLE warden_sessions
         ADD COLUMN moved_from  TEXT,
         ADD COLUMN moved_at    TIMESTAMPTZ,
         ADD COLUMN moved_kind  TEXT,
         ADD COLUMN moved_epoch BIGINT;
     CREATE INDEX warden_sessions_moved ON warden_sessions (moved_at)
         WHERE moved_at IS NOT NULL;",
    ),
    (
        // Sessions with messages waiting for an answer, indexed: the orphan
        // scan every node runs twice a second read every record's JSON
        // (~100 ms of the server's CPU at 10,000 sessions); now it reads the
        // few that wait. Computed by the database from the record, so
        // every writer (an older node's too) keeps it true.
        5,
        "ALTER TABLE warden_sessions
         ADD COLUMN waiting BOOLEAN NOT NULL GENERATED ALWAYS AS (
             CASE WHEN jsonb_typeof(record -> 'pending') = 'array'
                  THEN jsonb_array_length(record -> 'pending') > 0
                  ELSE false END) STORED;
     CREATE INDEX warden_sessions_waiting ON warden_sessions (key) WHERE waiting;",
    ),
    (
        // The fingerprint of the request that sent a keyed turn's message
        // (its message, model and agent): the same Idempotency-Key with
        // another body is refused on any node. NULL (every turn stored
        // before, and turns sent without a key): unknown.
        6,
        "ALTER TABLE warden_turns ADD COLUMN request_fingerprint TEXT;",
    ),
    (
        // What a turn was asked (its prompt's head, model, when it was
        // opened, its trace), for the people looking at it later. NULL
        // (every turn stored before): unknown.
        7,
        "ALTER TABLE warden_turns ADD COLUMN asked JSONB;",
    ),
    (
        // Each node's lease TTL, stored with its heartbeat, so a node is
        // dead once its heartbeat is a TTL old (not after a fixed 30 s,
        // long after its sessions were taken over), and when it left
        // cleanly (a drain): `left`, not `alive` then `dead`. NULL (a node
        // of an older version): TTL unknown, not left.
        8,
        "ALTER TABLE warden_nodes
         ADD COLUMN lease_ttl_ms BIGINT,
         ADD COLUMN left_at      TIMESTAMPTZ;",
    ),
    (
        // Every move of a session between nodes, not only each session's
        // latest: `GET /v1/cluster` counts the last hour's failovers and
        // handovers from it (a session that failed over twice is two
        // failovers). Written by the database whenever a take records a
        // move (a new `moved_epoch`), so every writer — an older node's
        // too — keeps it; the nodes delete the rows over an hour old.
        9,
        "CREATE TABLE warden_moves (
         at         TIMESTAMPTZ NOT NULL,
         key        TEXT NOT NULL,
         moved_from TEXT NOT NULL,
         moved_to   TEXT NOT NULL,
         kind       TEXT NOT NULL
     );
     CREATE INDEX warden_moves_at ON warden_moves (at);
     CREATE FUNCTION warden_record_move() RETURNS trigger LANGUAGE plpgsql AS $$
     BEGIN
         INSERT INTO warden_moves (at, key, moved_from, moved_to, kind)
         VALUES (NEW.moved_at, NEW.key, NEW.moved_from, NEW.owner, NEW.moved_kind);
         RETURN NULL;
     END $$;
     CREATE TRIGGER warden_sessions_move AFTER UPDATE ON warden_sessions
         FOR EACH ROW
         WHEN (NEW.moved_epoch IS DISTINCT FROM OLD.moved_epoch
               AND NEW.moved_from IS NOT NULL AND NEW.owner IS NOT NULL
               AND NEW.moved_at IS NOT NULL AND NEW.moved_kind IS NOT NULL)
         EXECUTE FUNCTION warden_record_move();",
    ),
];

/// An arbitrary constant naming warden's migration lock.
const LOCK: i64 = 0x7761_7264_656e; // "warden"

pub(crate) async fn run(client: &mut deadpool_postgres::Object) -> Result<(), PgError> {
    let fail = |e: tokio_postgres::Error| PgError::Migrate(e.to_string());
    let tx = client.transaction().await.map_err(fail)?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&LOCK])
        .await
        .map_err(fail)?;
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS warden_schema_migrations (
             version    INTEGER PRIMARY KEY,
             applied_at TIMESTAMPTZ NOT NULL DEFAULT now()
         )",
    )
    .await
    .map_err(fail)?;
    let current: i32 = tx
        .query_one(
            "SELECT COALESCE(MAX(version), 0) FROM warden_schema_migrations",
            &[],
        )
        .await
        .map_err(fail)?
        .get(0);
    let latest = MIGRATIONS.last().map_or(0, |(v, _)| *v);
    if current > latest {
        return Err(PgError::NewerSchema {
            found: current,
            supported: latest,
        });
    }
    for (version, sql) in MIGRATIONS.iter().filter(|(v, _)| *v > current) {
        tx.batch_execute(sql).await.map_err(fail)?;
        tx.execute(
            "INSERT INTO warden_schema_migrations (version) VALUES ($1)",
            &[version],
        )
        .await
        .map_err(fail)?;
        tracing::info!(event = "pg.migrated", version, "applied a schema migration");
    }
    tx.commit().await.map_err(fail)
}
