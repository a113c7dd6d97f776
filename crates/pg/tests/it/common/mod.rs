//! What the PostgreSQL tests share: a bound on every wait, and a fresh
//! database per test on the server `WARDEN_PG_URL` names (an admin URL;
//! `.ci/run` starts a throwaway cluster and sets it). Without the variable
//! a test says why and passes, unless `WARDEN_REQUIRE_POSTGRES=1` (CI)
//! makes it fail.
#![allow(dead_code, unreachable_pub)]

use std::time::Duration;

use tokio_postgres::NoTls;
use warden_pg::low_level::PgStore;

/// Every wait in these tests is bounded by this.
pub const BOUND: Duration = Duration::from_secs(30);

/// `fut`, or a failure naming `what` after [`BOUND`].
pub async fn within<T>(what: &str, fut: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(BOUND, fut)
        .await
        .unwrap_or_else(|_| panic!("timed out: {what}"))
}

/// The admin URL, or `None` (with the reason printed) when no PostgreSQL
/// is configured.
pub fn admin_url() -> Option<String> {
    match std::env::var("WARDEN_PG_URL") {
        Ok(url) => Some(url),
        Err(_) => {
            assert!(
                std::env::var("WARDEN_REQUIRE_POSTGRES").as_deref() != Ok("1"),
                "WARDEN_REQUIRE_POSTGRES=1 but WARDEN_PG_URL is unset"
            );
            eprintln!("skipped: set WARDEN_PG_URL to a PostgreSQL admin URL to run this test");
            None
        }
    }
}

/// A name no other test uses: `prefix`, the process, the time and a count
/// of the names this process made (its tests run as threads of one process).
pub fn unique(prefix: &str) -> String {
    static MADE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("{prefix}_{}_{nanos}_{n}", std::process::id())
}

/// A fresh database: its config, or `None` when no PostgreSQL is
/// configured.
pub async fn fresh_db() -> Option<tokio_postgres::Config> {
    let url = admin_url()?;
    let admin: tokio_postgres::Config = url.parse().expect("WARDEN_PG_URL parses");
    let (client, conn) = within("connect", admin.connect(NoTls))
        .await
        .expect("connect to WARDEN_PG_URL");
    tokio::spawn(conn);
    let name = unique("warden_t");
    within(
        "create database",
        client.batch_execute(&format!("CREATE DATABASE {name}")),
    )
    .await
    .expect("create database");
    let mut config = admin.clone();
    config.dbname(&name);
    Some(config)
}

/// A store on `config`, its schema migrated.
pub async fn store(config: &tokio_postgres::Config) -> PgStore {
    within("connect", PgStore::connect_config(config.clone()))
        .await
        .expect("PgStore connects and migrates")
}

/// A database outage as in a restart: database `db` refuses new
/// connections and its open ones are cut, until [`end`](Self::end).
pub struct Outage {
    client: tokio_postgres::Client,
    db: String,
}

impl Outage {
    /// Starts it, through the admin URL `admin`.
    pub async fn begin(admin: &str, db: &str) -> Self {
        let (client, conn) = admin
            .parse::<tokio_postgres::Config>()
            .expect("admin URL")
            .connect(NoTls)
            .await
            .expect("admin");
        tokio::spawn(conn);
        // Two statements, the refusal committed first: in one batch they
        // share a transaction, and a pool reconnecting between the
        // terminate and the commit would keep its connection through the
        // whole outage. Then cut until nothing of `db` is left (a backend
        // past its login check when the refusal committed still counts).
        client
            .batch_execute(&format!("ALTER DATABASE {db} ALLOW_CONNECTIONS false"))
            .await
            .expect("outage");
        within("the database's connections to be cut", async {
            loop {
                let left: i64 = client
                    .query_one(
                        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
                         WHERE datname = $1",
                        &[&db],
                    )
                    .await
                    .expect("terminate")
                    .get(0);
                if left == 0 {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
        Self {
            client,
            db: db.to_owned(),
        }
    }

    /// The database takes connections again.
    pub async fn end(self) {
        self.client
            .batch_execute(&format!(
                "ALTER DATABASE {} ALLOW_CONNECTIONS true",
                self.db
            ))
            .await
            .expect("back");
    }
}
