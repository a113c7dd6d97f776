//! # warden-pg
//!
//! warden's sessions on PostgreSQL, for several warden nodes sharing one
//! database (sled stays the embedded single-node default).
//!
//! - [`PgStore`]: the session records (a [`SessionStore`]), schema
//!   migrated on connect, leases and node membership.
//! - **Leases with fencing epochs** (the pattern Temporal uses for shard
//!   ownership and DBOS for executor recovery): a node runs a session only
//!   while it holds the session's lease. Taking it is one statement,
//!
//!   ```sql
//!   UPDATE … SET owner = $node, epoch = epoch + 1, lease_until = now() + ttl
//!    WHERE key = $k AND (lease_until < now() OR owner = $node) RETURNING epoch
//!   ```
//!
//!   and every write of the session's data carries `AND owner = $node AND
//!   epoch = $mine` in the same statement: a write that matches no row
//!   means another node has taken the session over, and fails with
//!   [`StoreError::LeaseLost`]. Time is the database's `now()`, never a
//!   node's clock, so clock skew between nodes cannot extend a lease; a
//!   node paused past its lease (GC, SIGSTOP, a VM migration) wakes up to a
//!   rejected write, never to a silent double owner.
//! - [`NodeStore`]: the [`SessionStore`] one node of a cluster uses: it
//!   takes a session's lease at its first write, writes through the fence,
//!   renews its leases at a third of their TTL, and reports every lease it
//!   loses ([`NodeStore::lost`]) so the node stops its copy at once.
//! - **Turn event logs** ([`PgStore::open_turn`], [`PgStore::append_turn`],
//!   [`PgStore::read_turn`]): what `warden serve` sent of each turn,
//!   written through the same fence, so a turn re-delivered by another
//!   node keeps its id and numbers its events on; [`NodeTurns`] is the
//!   [`TurnStore`](warden_core::store::TurnStore) a node hands to
//!   `warden serve`.
//! - [`cluster::Node`]: a whole node (placement, membership heartbeats,
//!   turn-log expiry, stopping a session whose lease is lost, taking over
//!   a dead node's sessions), reporting through `tracing` and typed
//!   events: what `warden serve --store postgres://…` runs, for a binary of
//!   your own.
//! - [`PgConversations`]: the HTTP agents' conversations (a
//!   [`ConversationStore`](warden_core::store::ConversationStore)), so a
//!   session taken over resumes its conversation.
//!
//! This crate depends on `warden-core` alone: the ports it implements are
//! core's.
//!
//! # TLS
//!
//! `sslmode=require` (also `verify-ca` and `verify-full`) in the URL
//! connects over TLS (rustls) and always verifies the server's certificate
//! chain and host name, against the PEM file `sslrootcert=PATH` names or
//! else the public web roots: `require` here means libpq's `verify-full`.
//! Without it (`disable`, `prefer`, or no `sslmode`) the connection is
//! plaintext: use it only on a network you trust.
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use warden_pg::{NodeStore, PgStore};
//! let pg = PgStore::connect("postgres://warden@127.0.0.1:5432/warden").await?;
//! let node = NodeStore::new(pg, "node-a", Duration::from_secs(10));
//! let _renewing = node.spawn_renewer();
//! // Give `node` to the supervisor as its store.
//! # Ok(()) }
//! ```

pub mod cluster;
mod conversations;
mod group;
mod lease;
mod migrate;
mod node;
mod node_turns;
mod orphans;
mod stranded;
mod tls;
mod turns;

use std::time::Duration;

use futures_util::future::BoxFuture;
use serde_json::Value;
use warden_core::store::SCHEMA_VERSION;
use warden_core::{Durability, RetryPolicy, SessionKey, SessionRecord, SessionStore, StoreError};

pub use conversations::PgConversations;
pub use group::{GroupStats, TurnBatch};
pub use lease::{Lease, LeaseInfo, Patience, TAKEOVER_GRACE};
pub use migrate::MIGRATIONS;
pub use node::{
    DEAD_AFTER_UNKNOWN_TTL, DEFAULT_RETURN_GRACE, NodeInfo, NodeState, NodeStore, RETAKE_COOLDOWN,
    TakeOver,
};
pub use node_turns::NodeTurns;
pub use orphans::Orphans;
pub use stranded::TURN_END_LOST;

/// Why the store could not be opened.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PgError {
    /// The URL is not a PostgreSQL connection string.
    #[error("invalid PostgreSQL URL: {0}")]
    Url(String),
    /// The database cannot be reached or refused the connection.
    #[error("cannot connect to PostgreSQL: {0}")]
    Connect(String),
    /// The schema could not be created or migrated.
    #[error("cannot migrate the warden schema: {0}")]
    Migrate(String),
    /// TLS was asked for (`sslmode=require`) but cannot be set up: an
    /// unreadable or empty `sslrootcert`, or no usable protocol version.
    #[error("PostgreSQL TLS: {0}")]
    Tls(String),
    /// The database was migrated by a newer warden.
    #[error(
        "the database has warden schema version {found}, newer than the supported {supported}; upgrade warden"
    )]
    NewerSchema {
        /// Version found.
        found: i32,
        /// Newest version this build knows.
        supported: i32,
    },
}

/// The session store on PostgreSQL. Cheap to clone (a pool).
#[derive(Clone)]
pub struct PgStore {
    pool: deadpool_postgres::Pool,
    /// Two connections of their own for what keeps a node's leases and
    /// membership alive (renewals, heartbeats): never queued behind the
    /// data traffic of a busy node, whose leases would otherwise lapse
    /// under load.
    control: deadpool_postgres::Pool,
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore").finish_non_exhaustive()
    }
}

pub(crate) fn backend(e: impl std::error::Error) -> StoreError {
    // tokio-postgres says only "db error" itself; the server's message is
    // its source.
    let mut message = format!("PostgreSQL: {e}");
    let mut source = e.source();
    while let Some(s) = source {
        message.push_str(&format!(": {s}"));
        source = s.source();
    }
    StoreError::Backend { message }
}

/// An error and its sources, `: `-joined: a TLS refusal says why (the
/// pool's message alone is "error performing TLS handshake").
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}

/// How long a write waits for the database to answer again before it
/// fails: an outage shorter than this pauses the session (and its turn)
/// instead of failing it.
pub(crate) const WRITE_PATIENCE: Duration = Duration::from_secs(30);

/// Runs `op` until it succeeds, fails in a way `waits_out` says waiting
/// cannot mend, or [`WRITE_PATIENCE`] has passed ([`write_retry`]'s
/// backoff, no wait begun that could end past it): for writes that may be
/// sent again, while the database does not answer.
pub(crate) async fn patiently<T, E, F, Fut>(waits_out: impl Fn(&E) -> bool, op: F) -> Result<T, E>
where
    E: std::fmt::Display,
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
{
    let policy = write_retry();
    let deadline = tokio::time::Instant::now() + WRITE_PATIENCE;
    let retryable = |e: &E| {
        // No wait is begun that could end past the deadline (a wait is at
        // most the backoff's cap).
        let retry = waits_out(e) && tokio::time::Instant::now() + policy.max_backoff < deadline;
        if retry {
            tracing::debug!(error = %e, "the database does not answer; retrying");
        }
        retry
    };
    policy.retry_if(retryable, op).await
}

/// How [`patiently`] waits between attempts: 50 ms doubling to 2 s,
/// jittered (the nodes of a cluster do not retry in step); its budget is
/// [`WRITE_PATIENCE`], not a number of attempts.
fn write_retry() -> RetryPolicy {
    RetryPolicy::default()
        .with_backoff(Duration::from_millis(50), Duration::from_secs(2))
        .with_max_attempts(u32::MAX)
}

/// A count or an epoch as PostgreSQL's BIGINT (saturating).
pub(crate) fn to_db(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// A BIGINT count or epoch read back (a negative one, never written, as 0).
pub(crate) fn from_db(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

/// Seconds, as PostgreSQL's `make_interval` takes them.
pub(crate) fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

impl PgStore {
    /// Connects to `url` (`postgres://USER[:PASSWORD]@HOST:PORT/DB`, or the
    /// key=value form) with a pool of 16 connections, and creates or
    /// migrates the schema. `sslmode=require` (or `verify-ca`,
    /// `verify-full`) connects over TLS and verifies the server against
    /// `sslrootcert` (a PEM file), else the public web roots; without it the
    /// connection is plaintext (see [`tls`](crate#tls)).
    pub async fn connect(url: &str) -> Result<Self, PgError> {
        let tls::TlsOptions { rest, root_cert } = tls::split(url);
        let config: tokio_postgres::Config = rest.parse().map_err(|e: tokio_postgres::Error| {
            // The URL may hold a password: the parser's message does not.
            PgError::Url(e.to_string())
        })?;
        Self::open(config, root_cert.as_deref()).await
    }

    /// [`connect`](Self::connect) with a parsed configuration (TLS, when it
    /// requires it, verified against the public web roots).
    pub async fn connect_config(config: tokio_postgres::Config) -> Result<Self, PgError> {
        Self::open(config, None).await
    }

    async fn open(
        mut config: tokio_postgres::Config,
        root_cert: Option<&std::path::Path>,
    ) -> Result<Self, PgError> {
        let connector = tls::connector(&mut config, root_cert)?;
        let pool = |size: usize| {
            let manager = deadpool_postgres::Manager::from_config(
                config.clone(),
                connector.clone(),
                deadpool_postgres::ManagerConfig {
                    recycling_method: deadpool_postgres::RecyclingMethod::Fast,
                },
            );
            deadpool_postgres::Pool::builder(manager)
                .max_size(size)
                .runtime(deadpool_postgres::Runtime::Tokio1)
                .build()
                .map_err(|e| PgError::Connect(e.to_string()))
        };
        let store = Self {
            pool: pool(16)?,
            control: pool(2)?,
        };
        let mut client = store
            .pool
            .get()
            .await
            .map_err(|e| PgError::Connect(error_chain(&e)))?;
        migrate::run(&mut client).await?;
        Ok(store)
    }

    /// One round trip to the database (`SELECT 1`): whether it answers.
    pub async fn ping(&self) -> Result<(), StoreError> {
        let client = self.client().await?;
        client.simple_query("SELECT 1").await.map_err(backend)?;
        Ok(())
    }

    pub(crate) async fn client(&self) -> Result<deadpool_postgres::Object, StoreError> {
        self.pool.get().await.map_err(backend)
    }

    /// A connection of the control pool (lease renewals, heartbeats).
    pub(crate) async fn control_client(&self) -> Result<deadpool_postgres::Object, StoreError> {
        self.control.get().await.map_err(backend)
    }

    /// The record of `key`, decoded: `None` when there is none yet.
    fn decode(
        key: &str,
        version: i16,
        record: Option<Value>,
    ) -> Result<Option<SessionRecord>, StoreError> {
        let Some(record) = record.filter(|r| !r.is_null()) else {
            return Ok(None);
        };
        let version = u16::try_from(version).unwrap_or(u16::MAX);
        if version > SCHEMA_VERSION {
            return Err(StoreError::NewerSchema {
                key: key.to_owned(),
                found: version,
                supported: SCHEMA_VERSION,
            });
        }
        serde_json::from_value(record)
            .map(Some)
            .map_err(|e| StoreError::Corrupt {
                key: key.to_owned(),
                message: e.to_string(),
            })
    }

    pub(crate) fn encode(record: &SessionRecord) -> Result<Value, StoreError> {
        serde_json::to_value(record).map_err(|e| StoreError::Backend {
            message: format!("cannot encode session record {:?}: {e}", record.key),
        })
    }
}

impl SessionStore for PgStore {
    fn load(&self, key: &SessionKey) -> BoxFuture<'_, Result<Option<SessionRecord>, StoreError>> {
        let key = key.as_str().to_owned();
        Box::pin(async move {
            let client = self.client().await?;
            let row = client
                .query_opt(
                    "SELECT schema_version, record FROM warden_sessions WHERE key = $1",
                    &[&key],
                )
                .await
                .map_err(backend)?;
            match row {
                None => Ok(None),
                Some(row) => Self::decode(&key, row.get(0), row.get(1)),
            }
        })
    }

    /// Writes without a lease: for one process alone on the database.
    /// Nodes of a cluster write through [`NodeStore`] instead. Every
    /// commit is durable (PostgreSQL's `synchronous_commit`), whatever
    /// `durability` asks.
    fn save<'a>(
        &'a self,
        record: &'a SessionRecord,
        _durability: Durability,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let value = Self::encode(record)?;
            let client = self.client().await?;
            client
                .execute(
                    "INSERT INTO warden_sessions (key, schema_version, record) VALUES ($1, $2, $3) \
                     ON CONFLICT (key) DO UPDATE SET record = EXCLUDED.record, \
                     schema_version = EXCLUDED.schema_version, updated_at = now()",
                    &[&record.key, &(SCHEMA_VERSION as i16), &value],
                )
                .await
                .map_err(backend)?;
            Ok(())
        })
    }

    fn list(&self) -> BoxFuture<'_, Result<Vec<Result<SessionRecord, StoreError>>, StoreError>> {
        Box::pin(async move {
            let client = self.client().await?;
            let rows = client
                .query(
                    "SELECT key, schema_version, record FROM warden_sessions \
                     WHERE record IS NOT NULL AND record <> 'null'::jsonb ORDER BY key",
                    &[],
                )
                .await
                .map_err(backend)?;
            Ok(rows
                .into_iter()
                .filter_map(|row| {
                    let key: String = row.get(0);
                    Self::decode(&key, row.get(1), row.get(2)).transpose()
                })
                .collect())
        })
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_write_is_retried_for_its_patience_then_its_error_returned() {
        let calls = Cell::new(0u32);
        let t0 = tokio::time::Instant::now();
        let got: Result<(), &str> = patiently(
            |_| true,
            || {
                calls.set(calls.get() + 1);
                std::future::ready(Err("down"))
            },
        )
        .await;
        assert_eq!(got, Err("down"));
        let waited = t0.elapsed();
        // 50 ms doubling to 2 s (jittered down by up to a quarter), never
        // past the patience.
        assert!(waited < WRITE_PATIENCE, "{waited:?}");
        assert!(
            waited >= WRITE_PATIENCE - Duration::from_secs(3),
            "{waited:?}"
        );
        assert!((16..=30).contains(&calls.get()), "{} calls", calls.get());
    }

    #[tokio::test(start_paused = true)]
    async fn an_error_waiting_cannot_mend_is_returned_at_once() {
        let calls = Cell::new(0u32);
        let got: Result<(), &str> = patiently(
            |e| *e == "down",
            || {
                calls.set(calls.get() + 1);
                std::future::ready(Err("fenced"))
            },
        )
        .await;
        assert_eq!((got, calls.get()), (Err("fenced"), 1));
    }
}
