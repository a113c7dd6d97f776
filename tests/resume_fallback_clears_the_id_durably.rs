//! The resume fallback's durable point, on the real sled store: once the
//! fresh session runs, the failed agent id is cleared *on disk* (kept among
//! the past ids), even if the process is SIGKILLed right then. A child
//! process (this test's own binary) runs the fallback and is killed as soon
//! as the fresh attempt opens; the parent then reads the database.
//!
//! A binary of its own, not a module of `tests/it`: the child re-runs this
//! binary by test name and is SIGKILLed, so the binary holds this test alone.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use warden_core::{Durability, SessionKey, SessionRecord, SessionStore, StreamError};
use warden_store::SledStore;

const CHILD_ENV: &str = "WARDEN_RESUME_FALLBACK_CHILD_DB";
const OLD: &str = "11111111-1111-4111-8111-111111111111";
const MARKER: &str = "FRESH_ATTEMPT_OPENED";

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

#[test]
fn the_cleared_id_is_on_disk_when_the_fresh_session_starts() {
    if let Some(db) = std::env::var_os(CHILD_ENV) {
        child(db.into());
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("db");
    runtime().block_on(async {
        let store = SledStore::open(&db).expect("open");
        let mut r = SessionRecord::new(&SessionKey::new("ws"), None);
        r.set_agent_session_id(OLD);
        store.save(&r, Durability::Flushed).await.expect("save");
    });

    let mut child = Command::new(std::env::current_exe().expect("exe"))
        .args([
            "the_cleared_id_is_on_disk_when_the_fresh_session_starts",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, &db)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn child");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if line.contains(MARKER) {
                let _ = tx.send(());
                return;
            }
        }
    });
    let opened = rx.recv_timeout(Duration::from_secs(60));
    child.kill().expect("SIGKILL"); // no clean shutdown, no sled flush on drop
    let status = child.wait().expect("wait");
    assert!(opened.is_ok(), "the child never opened the fresh attempt");
    assert!(!status.success(), "the child must have been killed");

    runtime().block_on(async {
        let store = SledStore::open(&db).expect("reopen after the kill");
        let r = store
            .load(&SessionKey::new("ws"))
            .await
            .expect("readable")
            .expect("record");
        assert_eq!(r.agent_session_id, None, "the failed id is cleared on disk");
        assert_eq!(r.past_session_ids, [OLD], "and kept among the past ids");
        assert_eq!(r.pending.len(), 1, "the message is still pending");
    });
}

/// The child: resume fails at start, the supervisor falls back, and the
/// fresh attempt opening is announced; then it waits to be killed.
fn child(db: std::path::PathBuf) {
    runtime().block_on(async move {
        let store = Arc::new(SledStore::open(&db).expect("open"));
        let (sup, source, ctl, _notices) = supervisor_with_store(config(), store).await;
        source.fail_next_open(StreamError::UnknownSession {
            session_id: OLD.into(),
            message: format!("No conversation found with session ID: {OLD}"),
        });
        let _turn = sup.send("ws", "keep this message").await.expect("send");
        let fresh = ctl
            .next_attempt()
            .within("the fresh attempt")
            .await
            .expect("fresh attempt");
        assert_eq!(fresh.request.resume_id, None);
        println!("{MARKER}");
        std::future::pending::<()>().await;
    });
}
