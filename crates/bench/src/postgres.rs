//! A benchmark's own PostgreSQL databases (on the server `WARDEN_PG_URL`
//! names): a fresh one per measurement, and its committed transactions.

use std::time::Duration;

/// A new empty database on the server of `admin`; its URL.
pub(crate) async fn fresh_db(admin: &str, tag: &str) -> String {
    let (client, conn) = tokio_postgres::connect(admin, tokio_postgres::NoTls)
        .await
        .expect("connect to WARDEN_PG_URL");
    let conn = tokio::spawn(conn);
    let name = format!("warden_bench_{tag}_{}", std::process::id());
    // One statement each: neither may run inside a transaction block.
    for sql in [
        format!("DROP DATABASE IF EXISTS {name}"),
        format!("CREATE DATABASE {name}"),
    ] {
        client.batch_execute(&sql).await.expect("create database");
    }
    drop(client);
    let _ = conn.await;
    let (base, _) = admin.rsplit_once('/').expect("a URL with a database");
    format!("{base}/{name}")
}

/// Transactions committed in `url`'s database so far (the cumulative
/// statistics' count). A busy backend reports its counts every second, but
/// one that went idle reports its last second's only 10 s later
/// (PostgreSQL 15's `PGSTAT_IDLE_INTERVAL`): wait that long first, so a
/// pool's last commits are not missed (nor counted in the next window).
pub(crate) async fn commits(url: &str) -> i64 {
    tokio::time::sleep(Duration::from_millis(11_000)).await;
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    let conn = tokio::spawn(conn);
    let n: i64 = client
        .query_one(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()",
            &[],
        )
        .await
        .expect("pg_stat_database")
        .get(0);
    drop(client);
    let _ = conn.await;
    n
}
