//! How much of a log file was acknowledged: beside each `NNN.log`, an
//! `NNN.ack` holding the file's length (`u64` LE) as of its last sync.
//!
//! The writer overwrites it after every sync, before any caller hears
//! back, without a sync of its own: a killed process leaves it in the
//! page cache, a power cut may leave an older length (never a longer one:
//! the log was synced first). So on replay the bytes up to it were
//! acknowledged, and whatever of them does not read — a file cut short,
//! deleted, replaced by a directory — is damage, never a torn tail. An
//! absent or unreadable marker (a log written before markers were kept)
//! acknowledges nothing: replay then tells a torn tail by its shape alone.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};

/// The marker beside log file `log` (`NNN.log` → `NNN.ack`).
pub(crate) fn path_of(log: &Path) -> PathBuf {
    log.with_extension("ack")
}

/// Creates (or empties) the marker of `log`.
pub(crate) fn create(log: &Path) -> std::io::Result<File> {
    OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .mode(0o600)
        .open(path_of(log))
}

/// Records that `len` bytes of the log are synced. A failure only makes
/// replay less sure of what was acknowledged.
pub(crate) fn record(marker: &File, len: u64) {
    if let Err(e) = marker.write_all_at(&len.to_le_bytes(), 0) {
        tracing::debug!(error = %e, "could not record the turn log's synced length");
    }
}

/// The acknowledged length of `log`, if its marker reads.
pub(crate) fn read(log: &Path) -> Option<usize> {
    let bytes: [u8; 8] = std::fs::read(path_of(log)).ok()?.try_into().ok()?;
    usize::try_from(u64::from_le_bytes(bytes)).ok()
}

/// Removes the marker of `log` (before the log itself: a marker without
/// its log reads as a deleted log).
pub(crate) fn remove(log: &Path) {
    let _ = std::fs::remove_file(path_of(log));
}
