//! `warden sessions --repair`: salvages every readable record into a new
//! database, keeps the damaged one aside, and says what could not be read.

use crate::common;

use std::path::{Path, PathBuf};

use common::*;
use warden_core::{Durability, SessionKey, SessionRecord, SessionStore, StoreError};
use warden_store::SledStore;

fn entries(dir: &Path, prefix: &str) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("read the data directory")
        .map(|e| e.expect("entry").path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(prefix))
        })
        .collect();
    found.sort();
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repair_salvages_readable_records_keeps_the_damaged_database_and_names_what_was_lost() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("sessions.db");
    {
        let store = SledStore::open(&db).expect("open");
        for key in ["/work/a", "bot-channel-42"] {
            let mut record = SessionRecord::new(&SessionKey::new(key), None);
            record.accept("keep me");
            store
                .save(&record, Durability::Flushed)
                .await
                .expect("save");
        }
        store.put_raw("broken", b"\x00\x01garbage").expect("put");
        store.flush().await.expect("flush");
    }

    let out = run(&["sessions", "--repair", "--data-dir", arg(dir.path())]).await;
    assert_eq!(code(&out), 1, "a record was lost: {}", stderr(&out));
    assert!(
        stdout(&out).contains("salvaged 2 record(s)"),
        "{}",
        stdout(&out)
    );
    assert!(stdout(&out).contains("1 unreadable"), "{}", stdout(&out));
    assert!(
        stderr(&out).contains("unreadable \"broken\""),
        "{}",
        stderr(&out)
    );
    let damaged = entries(dir.path(), "sessions.db.damaged-");
    assert_eq!(damaged.len(), 1, "{damaged:?}");
    assert!(stdout(&out).contains(arg(&damaged[0])), "{}", stdout(&out));
    assert!(entries(dir.path(), "sessions.db.repaired-").is_empty());

    // The damaged database is kept, with the unreadable record in it.
    {
        let old = SledStore::open(&damaged[0]).expect("open the damaged database");
        assert!(matches!(
            old.load(&SessionKey::new("broken")).await,
            Err(StoreError::Corrupt { .. })
        ));
    }
    // The new one lists cleanly.
    let out = run(&["sessions", "--json", "--data-dir", arg(dir.path())]).await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let list: Vec<serde_json::Value> = serde_json::from_str(&stdout(&out)).expect("JSON");
    assert_eq!(list.len(), 2);

    // Repairing a healthy database salvages everything: exit 0.
    let out = run(&["sessions", "--repair", "--data-dir", arg(dir.path())]).await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(stdout(&out).contains("0 unreadable"), "{}", stdout(&out));
    assert_eq!(entries(dir.path(), "sessions.db.damaged-").len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_sled_refuses_is_one_clean_line_and_repair_changes_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("sessions.db");
    drop(SledStore::open(&db).expect("create"));
    std::fs::write(db.join("snap.FFFFFFFFFFFFFFF0"), [0xAB; 64]).expect("damage");

    let out = run(&["sessions", "--data-dir", arg(dir.path())]).await;
    assert_eq!(code(&out), 1);
    assert_one_line_error(&out, "corrupted data");
    assert_one_line_error(&out, "--repair");
    assert!(!stderr(&out).contains("backtrace"), "{}", stderr(&out));

    let out = run(&["sessions", "--repair", "--data-dir", arg(dir.path())]).await;
    assert_eq!(code(&out), 1);
    assert_one_line_error(&out, "sled cannot open");
    assert_one_line_error(&out, "nothing was changed");
    assert!(!stderr(&out).contains("backtrace"), "{}", stderr(&out));
    assert_eq!(
        entries(dir.path(), "sessions.db").len(),
        1,
        "only the original"
    );

    let help = run(&["sessions", "--help"]).await;
    assert!(stdout(&help).contains("--repair"), "{}", stdout(&help));
}
