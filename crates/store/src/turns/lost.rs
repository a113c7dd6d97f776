//! What [`SledStore::turns`] does after the write-ahead log is replayed:
//! turns whose end is missing although nothing will run them again get
//! one, so no client attached to them waits for ever.
//!
//! A turn's log is opened after its message is stored (flushed) as
//! pending, and the message stays pending until answered; a restart
//! re-delivers every pending message, and its turn goes on under its id.
//! So a turn whose log has no end while its message is no longer pending
//! was answered, and its end did not reach the disk: the write-ahead log
//! lost it (damage), or the process died between the session recording
//! the answer and the turn storing its last event. Nothing would ever
//! end it; it ends here with an `error` event, code
//! [`TURN_LOG_DAMAGED`]. The session's conversation holds the reply
//! itself (the agent answered), the log does not.

use std::path::{Path, PathBuf};

use warden_core::store::turn_event::Failed;
use warden_core::store::{StoredEvent, TurnEventData};

use super::{Meta, SledTurns, decode_batch, encode_batch, event_key, events_prefix, now_ms};
use crate::wal::Replay;
use crate::{SledStore, describe};

/// The code of the `error` event that ends a turn whose end was lost.
pub const TURN_LOG_DAMAGED: &str = "ETURN_LOG_DAMAGED";

/// What [`SledTurns::end_lost_turns`] found.
#[derive(Debug, Default)]
pub(crate) struct Lost {
    /// Turns given an `error` end: their message was answered.
    pub(crate) ended: Vec<String>,
    /// Turns whose events skip numbers (a damaged stretch held some).
    pub(crate) gaps: Vec<String>,
}

impl SledTurns {
    /// Ends every turn that has no end while its message is no longer
    /// pending in `sessions` (see the module doc); with `check_gaps`
    /// (the log was damaged), also lists turns whose events skip numbers.
    pub(crate) fn end_lost_turns(
        &self,
        sessions: &SledStore,
        check_gaps: bool,
    ) -> Result<Lost, String> {
        let mut lost = Lost::default();
        for item in self.tree.scan_prefix(b"t") {
            let (k, v) = item.map_err(|e| describe(&e))?;
            let id = String::from_utf8_lossy(&k[1..]).into_owned();
            let Ok(meta) = Meta::decode(&v) else {
                continue; // read as corrupt by whoever asks for it
            };
            let events = match (check_gaps || !meta.ended).then(|| self.all_events(&id)) {
                Some(Ok(events)) => events,
                Some(Err(_)) => continue,
                None => Vec::new(),
            };
            if check_gaps && events.iter().enumerate().any(|(i, e)| e.id != i as u64 + 1) {
                lost.gaps.push(id.clone());
            }
            if meta.ended || still_pending(sessions, &meta) {
                continue;
            }
            if events.last().is_some_and(StoredEvent::is_last) {
                // Its end is there, only the entry's mark of it was lost:
                // mark it, nothing was lost.
                let ended = Meta {
                    ended: true,
                    updated_ms: now_ms(),
                    ..meta
                };
                self.tree
                    .insert(k, ended.encode())
                    .map_err(|e| describe(&e))?;
                continue;
            }
            let next = events.last().map_or(1, |e| e.id + 1);
            let end = StoredEvent::new(
                next,
                TurnEventData::Error(Failed::new(
                    TURN_LOG_DAMAGED,
                    "the end of this turn was lost from the server's turn log (a damaged log, or a crash as it was written); its message was answered, and the session's conversation holds the reply",
                    // `warden chat`'s class for any other failure.
                    1,
                )),
            );
            let ended = Meta {
                ended: true,
                updated_ms: now_ms(),
                ..meta
            };
            let mut batch = sled::Batch::default();
            batch.insert(event_key(&id, next), encode_batch(&[end]));
            batch.insert(k, ended.encode());
            self.tree.apply_batch(batch).map_err(|e| describe(&e))?;
            lost.ended.push(id);
        }
        if !lost.ended.is_empty() {
            self.tree.flush().map_err(|e| describe(&e))?;
        }
        Ok(lost)
    }

    /// Every event of turn `id`, in order.
    fn all_events(&self, id: &str) -> Result<Vec<StoredEvent>, String> {
        let prefix = events_prefix(id);
        let mut out = Vec::new();
        for item in self.tree.scan_prefix(&prefix) {
            let (k, v) = item.map_err(|e| describe(&e))?;
            let first: [u8; 8] = k[prefix.len()..]
                .try_into()
                .map_err(|_| format!("a bad event key in turn {id}"))?;
            decode_batch(u64::from_be_bytes(first), &v, &mut out).map_err(|e| e.to_string())?;
        }
        Ok(out)
    }
}

/// Whether the message `meta`'s turn answers may still be re-delivered
/// (a restart re-delivers a pending message, and its turn goes on). Only
/// a record that has the message's number behind it and no longer lists
/// it as pending says it was answered; a record that is missing, cannot
/// be read or does not know the message decides nothing.
fn still_pending(sessions: &SledStore, meta: &Meta) -> bool {
    match sessions.tree.get(meta.key.as_bytes()) {
        Ok(Some(bytes)) => match crate::decode(&meta.key, &bytes) {
            Ok(record) => {
                meta.message_id >= record.next_message_id
                    || record.pending.iter().any(|m| m.id == meta.message_id)
            }
            Err(_) => true,
        },
        Ok(None) | Err(_) => true,
    }
}

/// What a damaged turn log cost, as [`SledStore::turns`] found it: kept
/// beside the file it kept aside (`NNN.log.damaged.json`), and listed by
/// [`SledStore::turn_log_damage`] (`warden sessions` prints it).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct TurnLogDamage {
    /// The damaged file, kept aside (`turns.wal/NNN.log.damaged`).
    pub file: PathBuf,
    /// When it was found (Unix milliseconds).
    pub found_ms: u64,
    /// Bytes that did not read as records and were skipped.
    pub skipped_bytes: usize,
    /// The intact records replayed from it.
    pub intact_records: usize,
    /// Turns ended with [`TURN_LOG_DAMAGED`]: their end was lost.
    pub turns_ended: Vec<String>,
    /// Turns whose events skip numbers (the skipped bytes held some).
    pub turns_missing_events: Vec<String>,
}

const REPORT_SUFFIX: &str = ".json";

/// Writes, beside each damaged file kept aside, what it cost, and logs
/// [`warn`].
pub(crate) fn report(replay: &Replay, lost: &Lost) {
    warn(replay, lost);
    for d in &replay.damaged {
        let damage = TurnLogDamage {
            file: d.kept_as.clone(),
            found_ms: now_ms(),
            skipped_bytes: d.skipped_bytes,
            intact_records: d.intact_records,
            turns_ended: lost.ended.clone(),
            turns_missing_events: lost.gaps.clone(),
        };
        let mut path = d.kept_as.clone().into_os_string();
        path.push(REPORT_SUFFIX);
        let written = serde_json::to_vec(&damage)
            .map_err(std::io::Error::other)
            .and_then(|bytes| write_private(Path::new(&path), &bytes));
        if let Err(e) = written {
            tracing::warn!(file = ?path, error = %e, "could not write the turn log's damage report");
        }
    }
}

impl SledStore {
    /// The damaged turn logs found in the database at `dir` so far
    /// (oldest first): what [`turns`](Self::turns) skipped and which
    /// turns it cost. Reads only the reports, not the database, so it
    /// works while a server holds the database.
    pub fn turn_log_damage(dir: &Path) -> std::io::Result<Vec<TurnLogDamage>> {
        let wal_dir = dir.join(crate::wal::DIR);
        let entries = match std::fs::read_dir(&wal_dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        let mut out = Vec::new();
        for entry in entries {
            let path = entry?.path();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if !name.ends_with(&format!(".damaged{REPORT_SUFFIX}")) {
                continue;
            }
            let damage: TurnLogDamage = serde_json::from_slice(&std::fs::read(&path)?)
                .map_err(|e| std::io::Error::other(format!("{}: {e}", path.display())))?;
            out.push(damage);
        }
        out.sort_by(|a, b| a.file.cmp(&b.file));
        Ok(out)
    }
}

fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .mode(0o600)
        .open(path)?
        .write_all(bytes)
}

/// The one warning a damaged log is worth, at the default level: the
/// files, what was skipped, the turns it cost.
fn warn(replay: &Replay, lost: &Lost) {
    for d in &replay.damaged {
        tracing::warn!(
            file = %d.kept_as.display(),
            skipped_bytes = d.skipped_bytes,
            stretches = ?d.stretches,
            intact_records = d.intact_records,
            unreadable = d.unreadable.as_deref().unwrap_or("no"),
            turns_ended = ?lost.ended,
            turns_missing_events = ?lost.gaps,
            "the turn log was damaged: {} bytes that did not read were skipped and every intact record kept; the file is kept aside; {} turn(s) whose end was lost end with {TURN_LOG_DAMAGED}, {} turn(s) miss events",
            d.skipped_bytes,
            lost.ended.len(),
            lost.gaps.len(),
        );
    }
    if replay.damaged.is_empty() && !lost.ended.is_empty() {
        tracing::warn!(
            turns_ended = ?lost.ended,
            "{} turn(s) whose message was answered had no end in the turn log (the server stopped as it was written); they end with {TURN_LOG_DAMAGED}",
            lost.ended.len(),
        );
    }
}
