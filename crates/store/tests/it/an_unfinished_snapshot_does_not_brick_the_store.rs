//! A full disk while sled writes its startup snapshot leaves an empty
//! `snap.<lsn>.generating` file; sled then refuses every later open with
//! "Read corrupted data". `SledStore::open` removes the leftover and every
//! record is still there.

use std::path::{Path, PathBuf};

use warden_core::{Durability, SessionKey, SessionRecord, SessionStore};
use warden_store::{OpenRepair, SledStore};

/// The snapshot files (`snap.<16 hex digits>`) in a database directory.
fn snapshots(db: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(db)
        .expect("read the database directory")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("snap."))
        .collect();
    names.sort();
    names
}

/// Plants what sled's `write_snapshot` leaves when `write_all` fails with
/// ENOSPC: the file created under the name of the next snapshot, empty.
/// The next snapshot's LSN is past the last one's (sled writes one only
/// when its stable LSN advanced), so the name sorts after it.
fn plant_unfinished_snapshot(db: &Path) -> PathBuf {
    let last = snapshots(db)
        .into_iter()
        .filter_map(|n| u64::from_str_radix(n.strip_prefix("snap.")?, 16).ok())
        .max()
        .expect("sled wrote a snapshot when the database was opened");
    let path = db.join(format!("snap.{:016X}.generating", last + 0x1000));
    std::fs::File::create(&path).expect("plant the leftover");
    path
}

#[tokio::test]
async fn an_empty_unfinished_snapshot_is_removed_on_open_and_every_record_survives() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("sessions.db");
    let mut saved = Vec::new();
    {
        let store = SledStore::open(&db).expect("open");
        for i in 0..50 {
            let key = SessionKey::new(format!("/work/repo-{i}"));
            let mut record = SessionRecord::new(&key, None);
            record.set_agent_session_id(&format!("9753c268-0000-4000-8000-{i:012}"));
            record.accept(format!("message {i}"));
            store
                .save(&record, Durability::Flushed)
                .await
                .expect("save");
            saved.push(record);
        }
    }
    // Reopen once so that sled writes a snapshot covering the writes (it
    // writes one on open when its log moved past the last snapshot).
    drop(SledStore::open(&db).expect("reopen"));
    let leftover = plant_unfinished_snapshot(&db);

    // The real failure: sled itself will not open the database any more.
    let refused = sled::open(&db)
        .map(|_| ())
        .expect_err("sled refuses the database");
    assert!(
        matches!(refused, sled::Error::Corruption { .. }),
        "sled said {refused:?}"
    );

    let store = SledStore::open(&db).expect("open after the disk filled up");
    assert_eq!(
        store.recoveries(),
        [OpenRepair::RemovedUnfinishedSnapshot {
            path: leftover.clone(),
            len: 0
        }]
    );
    assert!(!leftover.exists());
    for record in &saved {
        let key = SessionKey::new(&record.key);
        assert_eq!(store.load(&key).await.expect("load").as_ref(), Some(record));
    }
    assert_eq!(store.list().await.expect("list").len(), saved.len());
    drop(store);

    // Nothing left to repair on the next open.
    let store = SledStore::open(&db).expect("open again");
    assert!(store.recoveries().is_empty(), "{:?}", store.recoveries());
}

#[test]
fn a_database_with_other_corruption_is_still_an_error_and_no_file_is_removed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("sessions.db");
    drop(SledStore::open(&db).expect("create"));
    // A *complete* snapshot name with garbage in it: not something sled
    // leaves behind, so it is not ours to remove.
    let bad = db.join("snap.FFFFFFFFFFFFFFF0");
    std::fs::write(&bad, [0xAB; 64]).expect("plant");
    let error = SledStore::open(&db).expect_err("corrupt");
    let text = error.to_string();
    assert!(text.contains("corrupted data"), "{text}");
    assert!(!text.contains("backtrace"), "{text}");
    assert!(!text.contains('\n'), "{text}");
    assert!(bad.exists());
}
