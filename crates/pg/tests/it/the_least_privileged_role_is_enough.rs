//! `deploy/postgres/warden-role.sql` gives warden all it needs and no
//! more, on a real PostgreSQL (`WARDEN_PG_URL`; skipped with a message
//! without it, failed under `WARDEN_REQUIRE_POSTGRES=1`): a node connecting
//! as that role migrates the schema into its own schema and stores
//! sessions, and the role can create nothing outside it.

use tokio_postgres::NoTls;
use warden_core::{Durability, SessionKey, SessionRecord, SessionStore};
use warden_pg::low_level::PgStore;

use crate::common::{admin_url, unique, within};

const SCRIPT: &str = include_str!("../../../../deploy/postgres/warden-role.sql");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_runs_as_the_role_the_script_makes_and_nothing_more() {
    let Some(url) = admin_url() else {
        return;
    };
    let admin: tokio_postgres::Config = url.parse().expect("WARDEN_PG_URL parses");
    let (client, conn) = within("connect", admin.connect(NoTls))
        .await
        .expect("admin connection");
    tokio::spawn(conn);
    // A fresh database; the role is cluster-wide, so a name of its own.
    let db = unique("warden_role");
    let role = unique("warden_r");
    within(
        "create database",
        client.batch_execute(&format!("CREATE DATABASE {db}")),
    )
    .await
    .expect("create database");
    let mut in_db = admin.clone();
    in_db.dbname(&db);
    let (owner, conn) = within("connect", in_db.connect(NoTls))
        .await
        .expect("connect to the new database");
    tokio::spawn(conn);
    let script = SCRIPT
        .replace("warden LOGIN", &format!("{role} LOGIN"))
        .replace("TO warden'", &format!("TO {role}'"))
        .replace("ROLE warden IN", &format!("ROLE {role} IN"))
        .replace("AUTHORIZATION warden", &format!("AUTHORIZATION {role}"));
    assert_ne!(script, SCRIPT, "the role's name was substituted");
    within("the script", owner.batch_execute(&script))
        .await
        .expect("the script runs");

    // A node as that role: migrations and writes work.
    let mut as_role = in_db.clone();
    as_role.user(&role);
    let store = within(
        "connect as the role",
        PgStore::connect_config(as_role.clone()),
    )
    .await
    .expect("migrates as the least-privileged role");
    let mut record = SessionRecord::new(&SessionKey::new("s1"), None);
    record.accept("hello");
    store
        .save(&record, Durability::Flushed)
        .await
        .expect("writes a session");
    let back = store
        .load(&SessionKey::new("s1"))
        .await
        .expect("reads it")
        .expect("present");
    assert_eq!(back.pending.len(), 1);
    let tables = owner
        .query(
            "SELECT table_schema FROM information_schema.tables WHERE table_name = 'warden_sessions'",
            &[],
        )
        .await
        .expect("catalog");
    let schemas: Vec<String> = tables.iter().map(|r| r.get(0)).collect();
    assert_eq!(schemas, ["warden"], "the tables live in the role's schema");

    // Nothing outside its schema.
    let (mine, conn) = within("connect as the role", as_role.connect(NoTls))
        .await
        .expect("connect");
    tokio::spawn(conn);
    let refused = mine
        .batch_execute("CREATE TABLE public.elsewhere (x int)")
        .await
        .expect_err("no CREATE in public");
    assert!(
        refused.to_string().contains("permission denied")
            || format!("{refused:?}").contains("permission denied"),
        "{refused:?}"
    );
}
