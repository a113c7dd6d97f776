//! Repairs [`SledStore::open`](crate::SledStore::open) makes before a
//! database will open.
//!
//! sled 0.34 writes a snapshot of its page table each time it opens a
//! database that changed since the last snapshot (`write_snapshot` in
//! `pagecache/snapshot.rs`): it creates `snap.<lsn, 16 hex digits>.generating`,
//! writes the snapshot and a checksum, fsyncs, renames it to
//! `snap.<lsn>`, and only then deletes older snapshots. A snapshot is a
//! cache: on open sled reads the newest one and replays its log from the
//! snapshot's LSN (with no snapshot at all it replays the whole log).
//!
//! When the disk is full (or the process dies) before the rename, the
//! `.generating` file stays behind, empty or cut short. sled's snapshot
//! lookup does not skip it, and because the name sorts after the previous
//! complete `snap.<lsn>` it is the one read: every later open fails with
//! "Read corrupted data at file offset None", although the log and the
//! previous snapshot are intact. Removing the leftover brings back exactly
//! the state the failed open started from; sled then writes the snapshot
//! again.

use std::path::{Path, PathBuf};

use warden_core::StoreError;

use crate::backend;

/// Something [`SledStore::open`](crate::SledStore::open) repaired.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum OpenRepair {
    /// An unfinished sled snapshot (`snap.*.generating`) was removed; sled
    /// rebuilt it from its log. No record is lost by this.
    RemovedUnfinishedSnapshot {
        /// The file removed.
        path: PathBuf,
        /// Its size in bytes (0 when the disk was full before sled wrote
        /// anything).
        len: u64,
    },
}

impl std::fmt::Display for OpenRepair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OpenRepair::RemovedUnfinishedSnapshot { path, len } => write!(
                f,
                "removed the unfinished sled snapshot {} ({len} bytes, left by a full disk or a crash); sled rebuilt it from its log",
                path.display()
            ),
        }
    }
}

/// Whether `name` is a snapshot sled was still writing:
/// `snap.` + 16 hexadecimal digits + `.generating`, exactly.
fn is_unfinished_snapshot(name: &str) -> bool {
    name.strip_prefix("snap.")
        .and_then(|rest| rest.strip_suffix(".generating"))
        .is_some_and(|lsn| lsn.len() == 16 && lsn.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// Removes the unfinished snapshots in the database directory `dir`, holding
/// sled's own lock on the data file meanwhile so that no other process is
/// opening the database (and writing a snapshot) at the same time.
pub(crate) fn remove_unfinished_snapshots(dir: &Path) -> Result<Vec<OpenRepair>, StoreError> {
    let leftovers = unfinished_snapshots(dir)?;
    if leftovers.is_empty() {
        return Ok(Vec::new());
    }
    let _lock = lock_database(dir)?;
    let mut done = Vec::new();
    for path in leftovers {
        let len = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        std::fs::remove_file(&path)
            .map_err(|e| backend(format!("removing {}: {e}", path.display())))?;
        let recovery = OpenRepair::RemovedUnfinishedSnapshot { path, len };
        tracing::warn!(database = %dir.display(), "{recovery}");
        done.push(recovery);
    }
    Ok(done)
}

fn unfinished_snapshots(dir: &Path) -> Result<Vec<PathBuf>, StoreError> {
    let entries =
        std::fs::read_dir(dir).map_err(|e| backend(format!("reading {}: {e}", dir.display())))?;
    let mut found = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| backend(format!("reading {}: {e}", dir.display())))?;
        let is_file = entry.file_type().is_ok_and(|t| t.is_file());
        if is_file
            && entry
                .file_name()
                .to_str()
                .is_some_and(is_unfinished_snapshot)
        {
            found.push(entry.path());
        }
    }
    found.sort();
    Ok(found)
}

/// Takes sled's lock: an exclusive `flock` on the data file `db`, as sled's
/// `Config::open` does (through `fs2`). Released when the file is dropped.
/// A lock held elsewhere is waited for up to [`LOCK_WAIT`](crate::LOCK_WAIT)
/// (sled releases it from its own threads a moment after a store of this
/// process is dropped), then [`StoreError::Locked`].
pub(crate) fn lock_database(dir: &Path) -> Result<std::fs::File, StoreError> {
    use fs2::FileExt;
    let data = dir.join("db");
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&data)
        .map_err(|e| backend(format!("opening {}: {e}", data.display())))?;
    let until = std::time::Instant::now() + crate::LOCK_WAIT;
    while file.try_lock_exclusive().is_err() {
        if std::time::Instant::now() >= until {
            return Err(StoreError::Locked {
                path: dir.display().to_string(),
            });
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::is_unfinished_snapshot;

    #[test]
    fn only_sled_snapshots_in_progress_count_as_unfinished() {
        assert!(is_unfinished_snapshot("snap.000000000007FBD5.generating"));
        for name in [
            "snap.000000000007FBD5",
            "snap.7FBD5.generating",
            "snap.000000000007FBDZ.generating",
            "snap.000000000007FBD5.generating.bak",
            "db",
            "conf",
        ] {
            assert!(!is_unfinished_snapshot(name), "{name}");
        }
    }
}
