//! TLS to a real PostgreSQL with `ssl=on` (`.ci/postgres` makes a CA and a
//! server certificate for 127.0.0.1; `WARDEN_PG_URL` and `WARDEN_PG_CA`
//! name them): `sslmode=require` with `sslrootcert` connects encrypted, a
//! server the CA file does not vouch for is refused, and a URL without
//! `sslmode` stays plaintext. Skipped with a message without PostgreSQL;
//! failed under `WARDEN_REQUIRE_POSTGRES=1`.

use tokio_postgres::NoTls;
use warden_pg::PgError;
use warden_pg::low_level::PgStore;

use crate::common::{unique, within};

/// The admin URL, the CA file and an admin client, or `None` (with the
/// reason printed) when no PostgreSQL is configured.
async fn setup() -> Option<(String, String, tokio_postgres::Client)> {
    let (Ok(url), Ok(ca)) = (
        std::env::var("WARDEN_PG_URL"),
        std::env::var("WARDEN_PG_CA"),
    ) else {
        assert!(
            std::env::var("WARDEN_REQUIRE_POSTGRES").as_deref() != Ok("1"),
            "WARDEN_REQUIRE_POSTGRES=1 but WARDEN_PG_URL or WARDEN_PG_CA is unset"
        );
        eprintln!(
            "skipped: set WARDEN_PG_URL and WARDEN_PG_CA (see .ci/postgres) to run this test"
        );
        return None;
    };
    let (client, conn) = within("connect", tokio_postgres::connect(&url, NoTls))
        .await
        .expect("connect to WARDEN_PG_URL");
    tokio::spawn(conn);
    Some((url, ca, client))
}

/// A fresh database's URL (the admin URL with its name).
async fn fresh(admin_url: &str, client: &tokio_postgres::Client, tag: &str) -> (String, String) {
    let name = unique(&format!("warden_tls_{tag}"));
    within(
        "create database",
        client.batch_execute(&format!("CREATE DATABASE {name}")),
    )
    .await
    .expect("create database");
    let base = admin_url
        .rsplit_once('/')
        .map(|(b, _)| b)
        .expect("a URL with a database");
    (format!("{base}/{name}"), name)
}

/// Whether the open connections to database `name` are encrypted: `None`
/// when there is none.
async fn encrypted(client: &tokio_postgres::Client, name: &str) -> Option<bool> {
    let rows = client
        .query(
            "SELECT s.ssl FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) WHERE a.datname = $1",
            &[&name],
        )
        .await
        .expect("pg_stat_ssl");
    let all: Vec<bool> = rows.iter().map(|r| r.get(0)).collect();
    (!all.is_empty()).then(|| all.iter().all(|s| *s))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn require_with_the_servers_ca_is_encrypted() {
    let Some((admin, ca, client)) = setup().await else {
        return;
    };
    let (url, name) = fresh(&admin, &client, "ok").await;
    let ca = ca.replace('/', "%2F");
    let store = within(
        "a TLS connection",
        PgStore::connect(&format!("{url}?sslmode=verify-full&sslrootcert={ca}")),
    )
    .await
    .expect("connects over TLS and migrates");
    assert!(store.nodes().await.expect("a query").is_empty());
    assert_eq!(encrypted(&client, &name).await, Some(true));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn require_refuses_a_server_its_roots_do_not_vouch_for() {
    let Some((admin, _ca, client)) = setup().await else {
        return;
    };
    let (url, name) = fresh(&admin, &client, "refused").await;
    // The public web roots: the test CA is not among them.
    let refused = within(
        "a refused connection",
        PgStore::connect(&format!("{url}?sslmode=require")),
    )
    .await;
    match refused {
        Err(PgError::Connect(message)) => {
            assert!(message.to_lowercase().contains("certificate"), "{message}");
        }
        other => panic!("expected a refused certificate, got {other:?}"),
    }
    assert_eq!(
        encrypted(&client, &name).await,
        None,
        "nothing stayed connected"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_sslmode_the_connection_stays_plaintext() {
    let Some((admin, _ca, client)) = setup().await else {
        return;
    };
    let (url, name) = fresh(&admin, &client, "plain").await;
    let store = within("a plaintext connection", PgStore::connect(&url))
        .await
        .expect("connects");
    assert!(store.nodes().await.expect("a query").is_empty());
    assert_eq!(encrypted(&client, &name).await, Some(false));
}
