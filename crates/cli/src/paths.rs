//! Where warden keeps its state, and opening it with errors a user can act
//! on.

use std::path::{Path, PathBuf};

use warden_core::StoreError;
use warden_store::SledStore;

use crate::exit::CliError;

/// Overrides the default data directory (`--data-dir` wins over it).
pub(crate) const DATA_DIR_ENV: &str = "WARDEN_DATA_DIR";

/// The sled database inside a data directory.
pub(crate) const DATABASE: &str = "sessions.db";

/// Conversation transcripts of the HTTP agents inside a data directory.
pub(crate) const TRANSCRIPTS: &str = "transcripts";

/// The data directory's record of the agent processes (Codex, Gemini) a
/// warden process started, so that the next one ends those a crash left
/// running (`warden_claude::end_orphaned_children`).
pub(crate) const CHILDREN: &str = "children";

/// `--data-dir`, else `WARDEN_DATA_DIR`, else the user's data directory
/// (`$XDG_DATA_HOME/warden` or `~/.local/share/warden` on Linux).
pub(crate) fn data_dir(flag: Option<PathBuf>) -> Result<PathBuf, CliError> {
    if let Some(dir) = flag {
        return Ok(dir);
    }
    if let Some(dir) = std::env::var_os(DATA_DIR_ENV).filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(dir));
    }
    dirs::data_dir()
        .map(|d| d.join("warden"))
        .ok_or_else(|| {
            CliError::usage(format!(
                "cannot tell where your data directory is (no HOME?); pass --data-dir or set {DATA_DIR_ENV}"
            ))
        })
}

/// Opens (creating, private to the user) the session database of `dir`.
pub(crate) fn open_store(dir: &Path) -> Result<SledStore, CliError> {
    SledStore::open(dir.join(DATABASE)).map_err(|e| store_error(dir, e, CLIENT_HINT))
}

/// [`open_store`] for `warden serve`, whose error says what a server can
/// do about a database in use (it has no `--server`).
pub(crate) fn open_store_to_serve(dir: &Path) -> Result<SledStore, CliError> {
    SledStore::open(dir.join(DATABASE)).map_err(|e| {
        store_error(
            dir,
            e,
            "another `warden serve` (or `warden chat`) is using this data directory: stop it, \
             or give this server its own --data-dir",
        )
    })
}

/// What a client command can do about a database in use.
const CLIENT_HINT: &str = "for a running `warden serve`, pass --server URL to talk to it; \
                           else stop the other process or pass another --data-dir";

/// The database of `dir` if one exists; `None` without creating anything.
pub(crate) fn open_existing_store(dir: &Path) -> Result<Option<SledStore>, CliError> {
    let db = dir.join(DATABASE);
    match std::fs::metadata(&db) {
        Ok(_) => open_store(dir).map(Some),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            // Distinguish "nothing stored yet" from "cannot look".
            match std::fs::metadata(dir) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(CliError::failure(
                    format!("cannot read the data directory {}: {e}", dir.display()),
                )),
                _ => Ok(None),
            }
        }
        Err(e) => Err(CliError::failure(format!(
            "cannot read the session database {}: {e}",
            db.display()
        ))),
    }
}

fn store_error(dir: &Path, error: StoreError, hint: &str) -> CliError {
    match error {
        StoreError::Locked { path } => CliError::failure(format!(
            "the session database {path} is in use by another warden process ({hint})"
        )),
        other => CliError::failure(format!(
            "cannot open the session database in {}: {}",
            dir.display(),
            other
        )),
    }
}
