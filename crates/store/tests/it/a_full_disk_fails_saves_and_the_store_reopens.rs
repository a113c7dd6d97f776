//! A real full disk: the store lives on a 4 MiB tmpfs this test mounts and
//! fills. A durable save that cannot reach the disk must be an error (never
//! an acknowledgement), opening while the disk is still full fails the way
//! sled fails in the field (an unfinished snapshot left behind), and once
//! space returns the store opens with every acknowledged record.
//!
//! Needs root and `mount`. Without them the test prints why and passes,
//! unless `WARDEN_REQUIRE_TMPFS=1` (for CI) makes that a failure.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use warden_core::{Durability, SessionKey, SessionRecord, SessionStore};
use warden_store::{OpenRepair, SledStore};

const TEST: &str = "a_durable_save_on_a_full_disk_is_an_error_and_acknowledged_records_survive";

/// A tmpfs mounted for the test, unmounted when dropped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(at: &Path, size: &str) -> Result<Self, String> {
        std::fs::create_dir_all(at).map_err(|e| e.to_string())?;
        let out = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0700"),
                "tmpfs",
            ])
            .arg(at)
            .output()
            .map_err(|e| format!("mount: {e}"))?;
        if out.status.success() {
            Ok(Self(at.to_path_buf()))
        } else {
            Err(format!(
                "mount -t tmpfs failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Fills the file system holding `path` to the last page.
fn fill(path: &Path) {
    let mut file = std::fs::File::create(path).expect("create the filler");
    for chunk in [64 * 1024, 4096] {
        let bytes = vec![0u8; chunk];
        // At most the whole 4 MiB, so this loop ends even if ENOSPC never comes.
        for _ in 0..(4 << 20) / chunk + 1 {
            if file.write_all(&bytes).is_err() {
                break;
            }
        }
    }
    assert!(
        file.write_all(&[0u8; 4096]).is_err(),
        "the tmpfs did not fill up"
    );
}

fn record(i: usize) -> SessionRecord {
    let mut r = SessionRecord::new(&SessionKey::new(format!("/work/repo-{i}")), None);
    // Big enough to need fresh log space soon, small enough to stay inline.
    r.accept("x".repeat(2000));
    r
}

#[tokio::test]
async fn a_durable_save_on_a_full_disk_is_an_error_and_acknowledged_records_survive() {
    let base = tempfile::tempdir().expect("tempdir");
    let disk = match Tmpfs::mount(&base.path().join("disk"), "4m") {
        Ok(disk) => disk,
        Err(why) => {
            assert!(
                std::env::var("WARDEN_REQUIRE_TMPFS").as_deref() != Ok("1"),
                "WARDEN_REQUIRE_TMPFS=1 but {why}"
            );
            println!("SKIPPED {TEST}: {why}");
            return;
        }
    };
    let db = disk.0.join("sessions.db");
    let filler = disk.0.join("filler");
    let mut acknowledged = Vec::new();
    {
        let store = SledStore::open(&db).expect("open");
        for i in 0..5 {
            let r = record(i);
            store.save(&r, Durability::Flushed).await.expect("save");
            acknowledged.push(r);
        }
        fill(&filler);
        let mut refused = None;
        for i in 5..2000 {
            let r = record(i);
            match store.save(&r, Durability::Flushed).await {
                Ok(()) => acknowledged.push(r),
                Err(e) => {
                    refused = Some(e);
                    break;
                }
            }
        }
        let error = refused.expect("2000 durable saves acknowledged on a full 4 MiB disk");
        let text = error.to_string();
        assert!(text.contains("No space left on device"), "{text}");
        assert!(
            !text.contains('\n') && !text.contains("backtrace"),
            "{text}"
        );
    }

    // Space returns: every acknowledged record is there.
    std::fs::remove_file(&filler).expect("free the disk");
    let store = SledStore::open(&db).expect("open once space returned");
    assert_all_there(&store, &acknowledged).await;

    // More durable writes, then the disk fills up while nothing runs: the
    // next open cannot write sled's startup snapshot and leaves it
    // unfinished, which bricked stores in the field.
    for i in 2000..2005 {
        let r = record(i);
        store.save(&r, Durability::Flushed).await.expect("save");
        acknowledged.push(r);
    }
    drop(store);
    fill(&filler);
    let while_full = SledStore::open(&db).expect_err("the disk is full");
    let text = while_full.to_string();
    assert!(text.contains("No space left on device"), "{text}");
    assert!(
        !text.contains('\n') && !text.contains("backtrace"),
        "{text}"
    );
    let leftovers: Vec<_> = std::fs::read_dir(&db)
        .expect("read the database directory")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".generating"))
        .collect();
    assert_eq!(leftovers.len(), 1, "sled left no unfinished snapshot");
    std::fs::remove_file(&filler).expect("free the disk");
    let refused = sled::open(&db)
        .map(|_| ())
        .expect_err("sled alone stays bricked");
    assert!(
        matches!(refused, sled::Error::Corruption { .. }),
        "{refused:?}"
    );

    let store = SledStore::open(&db).expect("open once space returned");
    assert!(
        matches!(
            store.recoveries(),
            [OpenRepair::RemovedUnfinishedSnapshot { len: 0, .. }]
        ),
        "{:?}",
        store.recoveries()
    );
    assert_all_there(&store, &acknowledged).await;
    drop(store);
    drop(disk);
}

async fn assert_all_there(store: &SledStore, acknowledged: &[SessionRecord]) {
    for r in acknowledged {
        let loaded = store.load(&SessionKey::new(&r.key)).await.expect("load");
        assert_eq!(
            loaded.as_ref(),
            Some(r),
            "{} was acknowledged but is not on disk",
            r.key
        );
    }
}
