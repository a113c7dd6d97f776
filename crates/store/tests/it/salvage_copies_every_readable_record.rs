//! `SledStore::salvage`: every readable record into a new database, the
//! rest reported, the source left as it was.

use std::path::Path;

use warden_core::{Durability, SessionKey, SessionRecord, SessionStore, StoreError};
use warden_store::{SalvageError, SledStore, Unreadable};

async fn save(store: &SledStore, key: &str) -> SessionRecord {
    let mut r = SessionRecord::new(&SessionKey::new(key), None);
    r.accept(format!("hello from {key}"));
    store.save(&r, Durability::Flushed).await.expect("save");
    r
}

/// Every file under `dir` with its bytes, to show salvage changed nothing.
fn contents(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("read") {
            let p = e.expect("entry").path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push((p.display().to_string(), std::fs::read(&p).expect("file")));
            }
        }
    }
    out.sort();
    out
}

#[tokio::test]
async fn salvage_copies_good_and_newer_records_and_reports_corrupt_ones_and_bad_keys() {
    let dir = tempfile::tempdir().expect("tempdir");
    let from = dir.path().join("sessions.db");
    let to = dir.path().join("sessions.db.new");
    let (a, b);
    {
        let store = SledStore::open(&from).expect("open");
        a = save(&store, "/work/a").await;
        b = save(&store, "bot-channel-7").await;
        store.put_raw("broken", b"\x00\x01garbage").expect("put");
        let mut newer = 99u16.to_be_bytes().to_vec();
        newer.extend_from_slice(b"a record from a future warden");
        store.put_raw("from-the-future", &newer).expect("put");
        store.flush().await.expect("flush");
    }
    {
        // A key sled stores but that is not UTF-8 (no warden writes one).
        let db = sled::open(&from).expect("sled");
        let tree = db.open_tree("sessions").expect("tree");
        tree.insert(b"\xff\xfekey", b"\x00\x01x".as_slice())
            .expect("insert");
        db.flush().expect("flush");
    }
    let before = contents(&from);

    let report = SledStore::salvage(&from, &to).expect("salvage");
    assert_eq!(report.salvaged, ["/work/a", "bot-channel-7"]);
    assert_eq!(report.kept_newer, ["from-the-future"]);
    assert_eq!(
        report
            .unreadable
            .iter()
            .map(|u| u.key.as_deref().unwrap_or("-"))
            .collect::<Vec<_>>(),
        ["broken", "\\xff\\xfekey"]
    );
    assert!(
        report.unreadable[0].reason.contains("corrupt"),
        "{report:?}"
    );
    assert!(
        report.unreadable[1].reason.contains("not UTF-8"),
        "{report:?}"
    );
    assert!(!report.is_complete());
    assert!(report.recoveries.is_empty());
    assert_eq!(contents(&from), before, "salvage changed the source");

    let salvaged = SledStore::open(&to).expect("open the salvaged database");
    assert_eq!(
        salvaged
            .load(&SessionKey::new("/work/a"))
            .await
            .expect("load"),
        Some(a)
    );
    assert_eq!(
        salvaged
            .load(&SessionKey::new("bot-channel-7"))
            .await
            .expect("load"),
        Some(b)
    );
    assert!(matches!(
        salvaged.load(&SessionKey::new("from-the-future")).await,
        Err(StoreError::NewerSchema { found: 99, .. })
    ));
    assert_eq!(salvaged.list().await.expect("list").len(), 3);
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &Path| std::fs::metadata(p).expect("meta").permissions().mode() & 0o777;
        assert_eq!(mode(&to), 0o700);
        assert_eq!(mode(&to.join("db")), 0o600);
    }
    // No scratch copy left behind.
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .expect("read")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names.len(), 2, "{names:?}");
}

#[tokio::test]
async fn salvage_of_a_database_sled_will_not_open_says_what_sled_said_and_writes_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let from = dir.path().join("sessions.db");
    let to = dir.path().join("sessions.db.new");
    {
        let store = SledStore::open(&from).expect("open");
        save(&store, "k").await;
    }
    std::fs::write(from.join("snap.FFFFFFFFFFFFFFF0"), [0xAB; 64]).expect("plant");
    let error = SledStore::salvage(&from, &to).expect_err("unopenable");
    assert!(
        matches!(&error, SalvageError::Unopenable { message, .. } if message.contains("corrupted data")),
        "{error:?}"
    );
    let text = error.to_string();
    assert!(
        !text.contains("backtrace") && !text.contains('\n'),
        "{text}"
    );
    assert!(!to.exists());
    assert_eq!(std::fs::read_dir(dir.path()).expect("read").count(), 1);
}

#[tokio::test]
async fn salvage_refuses_a_held_database_and_an_existing_destination() {
    let dir = tempfile::tempdir().expect("tempdir");
    let from = dir.path().join("sessions.db");
    let to = dir.path().join("sessions.db.new");
    let held = SledStore::open(&from).expect("open");
    assert!(matches!(
        SledStore::salvage(&from, &to),
        Err(SalvageError::Locked { .. })
    ));
    drop(held);
    std::fs::create_dir(&to).expect("mkdir");
    assert!(matches!(
        SledStore::salvage(&from, &to),
        Err(SalvageError::DestinationExists { .. })
    ));
    assert!(to.exists(), "an existing destination is never removed");
}

#[tokio::test]
async fn salvage_recovers_past_an_unfinished_snapshot_without_touching_the_source() {
    let dir = tempfile::tempdir().expect("tempdir");
    let from = dir.path().join("sessions.db");
    let to = dir.path().join("sessions.db.new");
    {
        let store = SledStore::open(&from).expect("open");
        save(&store, "k").await;
    }
    let leftover = from.join("snap.7FFFFFFFFFFFFFFF.generating");
    std::fs::File::create(&leftover).expect("plant");
    let report = SledStore::salvage(&from, &to).expect("salvage");
    assert_eq!(report.salvaged, ["k"]);
    assert!(report.is_complete());
    assert_eq!(report.recoveries.len(), 1, "{report:?}");
    assert!(leftover.exists(), "salvage changed the source");
    let _: &[Unreadable] = &report.unreadable;
}
