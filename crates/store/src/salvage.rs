//! Salvage: copy every readable record of a damaged database into a new
//! one, like sqlite's `.recover`.

use std::path::{Path, PathBuf};

use warden_core::StoreError;

use crate::{OpenFailure, OpenRepair, SledStore, TREE, decode, describe, open_recovering};

/// A record [`SledStore::salvage`] could not copy. It stays in the source
/// database, which salvage never changes.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Unreadable {
    /// The key as text (bytes that are not UTF-8 written as `\xNN`);
    /// `None` when sled stopped reading the tree and cannot say which keys
    /// follow.
    pub key: Option<String>,
    /// Why it could not be read.
    pub reason: String,
}

/// What [`SledStore::salvage`] copied and what it could not.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SalvageReport {
    /// Keys of the records copied (they decode with this build).
    pub salvaged: Vec<String>,
    /// Keys of records written by a newer warden, copied byte for byte
    /// (this build cannot decode them; a newer one can).
    pub kept_newer: Vec<String>,
    /// What could not be read.
    pub unreadable: Vec<Unreadable>,
    /// What opening (a copy of) the source needed; see [`OpenRepair`].
    pub recoveries: Vec<OpenRepair>,
}

impl SalvageReport {
    /// Whether every record was carried over (nothing unreadable).
    pub fn is_complete(&self) -> bool {
        self.unreadable.is_empty()
    }
}

/// Why [`SledStore::salvage`] could not run at all.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SalvageError {
    /// sled will not open the source database; nothing could be read.
    /// Fatal; `message` is what sled said.
    #[error("sled cannot open {}: {message}", path.display())]
    Unopenable {
        /// The source database.
        path: PathBuf,
        /// sled's error, one line.
        message: String,
    },
    /// Another live process holds the source database (still, after
    /// waiting [`LOCK_WAIT`](crate::LOCK_WAIT) for it). Retryable once it
    /// stops.
    #[error("the session database {} is in use by another process", path.display())]
    Locked {
        /// The source database.
        path: PathBuf,
    },
    /// The destination exists; salvage only writes a new database. Fatal.
    #[error("{} already exists; salvage writes only into a new database", path.display())]
    DestinationExists {
        /// The destination.
        path: PathBuf,
    },
    /// Reading the source's files or writing the new database failed
    /// (I/O, disk full). Retryable.
    #[error("{message}")]
    Io {
        /// What failed, one line.
        message: String,
    },
}

impl From<StoreError> for SalvageError {
    fn from(error: StoreError) -> Self {
        SalvageError::Io {
            message: error.to_string(),
        }
    }
}

impl SledStore {
    /// Copies every readable record of the database at `from` into a new
    /// database at `to` (which must not exist) and reports what could not
    /// be read.
    ///
    /// `from` is never changed: salvage works on a copy of its files, made
    /// while holding sled's lock on it, next to `to`, and removed at the
    /// end. Records that decode are copied; records from a newer schema are
    /// copied byte for byte; records that do not decode, keys that are not
    /// UTF-8, and whatever follows a point where sled stops reading are
    /// [`Unreadable`]. The new database is flushed and private to the user.
    pub fn salvage(from: &Path, to: &Path) -> Result<SalvageReport, SalvageError> {
        if to.exists() {
            return Err(SalvageError::DestinationExists {
                path: to.to_path_buf(),
            });
        }
        let scratch = scratch_path(to);
        let result = salvage_via(from, &scratch, to);
        let _ = std::fs::remove_dir_all(&scratch);
        if result.is_err() {
            // Only a database this call created.
            let _ = std::fs::remove_dir_all(to);
        }
        result
    }
}

/// `<to>.salvage-source-<pid>`: the copy of the source salvage reads.
fn scratch_path(to: &Path) -> PathBuf {
    let mut name = to.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".salvage-source-{}", std::process::id()));
    to.with_file_name(name)
}

fn salvage_via(from: &Path, scratch: &Path, to: &Path) -> Result<SalvageReport, SalvageError> {
    let unopenable = |message: String| SalvageError::Unopenable {
        path: from.to_path_buf(),
        message,
    };
    if !from.join("db").is_file() {
        return Err(unopenable("no sled data file (db) in it".into()));
    }
    {
        let _lock = crate::recovery::lock_database(from).map_err(|e| match e {
            StoreError::Locked { .. } => SalvageError::Locked {
                path: from.to_path_buf(),
            },
            other => other.into(),
        })?;
        let _ = std::fs::remove_dir_all(scratch);
        crate::make_private_dir(scratch)?;
        copy_dir(from, scratch)?;
    }
    let mut report = SalvageReport::default();
    let (source, recoveries) = open_recovering(scratch).map_err(|e| match e {
        OpenFailure::Sled(e) => unopenable(describe(&e)),
        OpenFailure::Store(e) => e.into(),
    })?;
    report.recoveries = recoveries
        .into_iter()
        .map(|r| match r {
            OpenRepair::RemovedUnfinishedSnapshot { path, len } => {
                OpenRepair::RemovedUnfinishedSnapshot {
                    path: from.join(path.file_name().unwrap_or_default()),
                    len,
                }
            }
        })
        .collect();
    let tree = source
        .open_tree(TREE)
        .map_err(|e| unopenable(describe(&e)))?;
    let target = SledStore::open(to)?;
    let mut last: Option<String> = None;
    for item in tree.iter() {
        let (key, value) = match item {
            Ok(kv) => kv,
            Err(e) => {
                let after = last.as_deref().map_or_else(
                    || "before the first record".to_owned(),
                    |k| format!("after {k:?}"),
                );
                report.unreadable.push(Unreadable {
                    key: None,
                    reason: format!("sled stopped reading the records {after}: {}", describe(&e)),
                });
                break;
            }
        };
        let Ok(text) = std::str::from_utf8(&key) else {
            report.unreadable.push(Unreadable {
                key: Some(escape(&key)),
                reason: "the key is not UTF-8".into(),
            });
            continue;
        };
        last = Some(text.to_owned());
        match decode(text, &value) {
            Ok(_) => {
                target.put_raw(text, &value)?;
                report.salvaged.push(text.to_owned());
            }
            Err(StoreError::NewerSchema { .. }) => {
                target.put_raw(text, &value)?;
                report.kept_newer.push(text.to_owned());
            }
            Err(e) => report.unreadable.push(Unreadable {
                key: Some(text.to_owned()),
                reason: e.to_string(),
            }),
        }
    }
    target.db.flush().map_err(|e| SalvageError::Io {
        message: format!("flushing {}: {}", to.display(), describe(&e)),
    })?;
    drop(target);
    crate::make_files_private(to)?;
    Ok(report)
}

/// Bytes as text, `\xNN` for what is not printable ASCII.
fn escape(bytes: &[u8]) -> String {
    bytes.escape_ascii().to_string()
}

/// Copies the files under `from` into the existing directory `to`.
fn copy_dir(from: &Path, to: &Path) -> Result<(), SalvageError> {
    let io = |what: &str, path: &Path, e: std::io::Error| SalvageError::Io {
        message: format!("{what} {}: {e}", path.display()),
    };
    let entries = std::fs::read_dir(from).map_err(|e| io("reading", from, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| io("reading", from, e))?;
        let source = entry.path();
        let target = to.join(entry.file_name());
        let kind = entry.file_type().map_err(|e| io("reading", &source, e))?;
        if kind.is_dir() {
            crate::make_private_dir(&target)?;
            copy_dir(&source, &target)?;
        } else if kind.is_file() {
            std::fs::copy(&source, &target).map_err(|e| io("copying", &source, e))?;
        }
    }
    Ok(())
}
