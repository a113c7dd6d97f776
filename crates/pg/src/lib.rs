//! # warden-pg
//!
//! warden's sessions on PostgreSQL, for several warden nodes sharing one
//! database (sled stays the embedded single-node default).
//!
//! **A cluster user starts at [`cluster::Node`]**: one node of the
//! cluster (its fenced session store, placement, membership heartbeats,
//! turn-log expiry, stopping a session whose lease is lost, taking over a
//! dead node's sessions), reporting through `tracing` and typed events:
//! what `warden serve --store postgres://…` runs, for a binary of your own.
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use warden_pg::cluster::Node;
//! let node = Node::connect("postgres://warden@127.0.0.1:5432/warden", "node-a", Duration::from_secs(10))
//!     .await?
//!     .with_advertise("http://10.0.0.5:8080");
//! // Give `node.store()` to the supervisor as its store, then `node.join(&supervisor)`.
//! # Ok(()) }
//! ```
//!
//! What a node is made of is in [`low_level`], documented for tests, tools
//! and a node assembled differently; going around [`cluster::Node`] means
//! doing its work yourself (renewal, heartbeats, stopping a session whose
//! lease is lost, takeover). In short:
//!
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
//! - [`low_level::PgStore`]: the session records (a
//!   [`SessionStore`](warden_core::SessionStore)), schema migrated on connect, leases and node membership; alone, the
//!   store of one process.
//! - [`low_level::NodeStore`]: the [`SessionStore`](warden_core::SessionStore) one node of a cluster
//!   uses: it takes a session's lease at its first write, writes through
//!   the fence, renews its leases at a third of their TTL, and reports
//!   every lease it loses so the node stops its copy at once.
//! - **Turn event logs**: what `warden serve` sent of each turn, written
//!   through the same fence, so a turn re-delivered by another node keeps
//!   its id and numbers its events on ([`cluster::Node::turns`]).
//! - [`PgConversations`]: the HTTP agents' conversations (a
//!   [`ConversationStore`](warden_core::store::ConversationStore)), so a
//!   session taken over resumes its conversation
//!   ([`cluster::Node::conversations`]).
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

pub mod cluster;
mod conversations;
mod group;
mod lease;
mod migrate;
mod node;
mod node_turns;
mod orphans;
mod store;
mod stranded;
mod tls;
mod turns;

use std::time::Duration;

use warden_core::{RetryPolicy, StoreError};

pub use conversations::PgConversations;
// Crate-internal paths of what [`low_level`] and [`cluster`] make public.
pub(crate) use low_level::*;
pub(crate) use node::NodeState;

pub mod low_level;

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
pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
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

/// Whether `e` (or an error it comes from) says the database cannot be
/// reached now, which waiting mends: a connection refused, reset or
/// closed (`connection closed`: the server went away mid-query), a
/// connection exception (SQLSTATE class 08), or the server shutting down
/// or starting up — `57P01` admin shutdown ("terminating connection due
/// to administrator command", a `pg_ctl restart -m fast`), `57P02` crash
/// shutdown, `57P03` cannot connect now ("the database system is shutting
/// down" / "is starting up") — its connection slots full (`53300`, the
/// reconnecting after a restart), or the database not taking connections
/// (`55000`, `ALTER DATABASE … ALLOW_CONNECTIONS false`: maintenance, and
/// the outages the tests make). Everything else (a statement refused, a
/// record that does not decode, a certificate that does not verify) is
/// not: waiting would only repeat it.
pub(crate) fn unreachable(e: &(dyn std::error::Error + 'static)) -> bool {
    use tokio_postgres::error::SqlState;
    let mut next = Some(e);
    while let Some(e) = next {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            // Bad data (a TLS certificate refused, a garbled message) is
            // not mended by waiting; a connection refused or cut is.
            return io.kind() != std::io::ErrorKind::InvalidData;
        }
        if let Some(pg) = e.downcast_ref::<tokio_postgres::Error>() {
            if pg.is_closed() {
                return true;
            }
            if let Some(code) = pg.code() {
                return code.code().starts_with("08")
                    || [
                        SqlState::ADMIN_SHUTDOWN,
                        SqlState::CRASH_SHUTDOWN,
                        SqlState::CANNOT_CONNECT_NOW,
                        SqlState::TOO_MANY_CONNECTIONS,
                        SqlState::OBJECT_NOT_IN_PREREQUISITE_STATE,
                    ]
                    .contains(code);
            }
        }
        next = e.source();
    }
    false
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

    #[test]
    fn a_connection_refused_or_cut_is_unreachable_and_bad_data_is_not() {
        use std::io::{Error, ErrorKind};
        for kind in [
            ErrorKind::ConnectionRefused,
            ErrorKind::ConnectionReset,
            ErrorKind::UnexpectedEof,
        ] {
            assert!(unreachable(&Error::from(kind)), "{kind:?}");
        }
        // As a source too (deadpool's error wraps the driver's).
        #[derive(Debug, thiserror::Error)]
        #[error("cannot connect")]
        struct Wrapped(#[source] Error);
        let cut = Wrapped(Error::from(ErrorKind::ConnectionRefused));
        assert!(unreachable(&cut));
        // A certificate refused, a garbled message, any other failure.
        assert!(!unreachable(&Error::new(
            ErrorKind::InvalidData,
            "bad certificate"
        )));
        assert!(!unreachable(&PgError::Url("nope".into())));
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
