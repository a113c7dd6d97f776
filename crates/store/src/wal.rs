//! The turn logs' write-ahead log: what makes a batch of turn events
//! durable before `warden serve` shows it, at the cost of one append and
//! one `fdatasync` shared by every batch that arrived meanwhile — instead
//! of a flush of sled's whole page cache per group (~60 ms on the bench's
//! disk with 1,000 turns streaming; see docs/performance.md §9c).
//!
//! One writer thread takes every waiting batch, appends them to the
//! current log file as checksummed records, syncs the file once, then
//! applies each batch to the sled tree and answers its caller. A batch is
//! thus in sled (readable) only once it is on disk, and every caller hears
//! back only after that. sled persists the tree on its own (every 500 ms);
//! when a log file passes [`CHECKPOINT_BYTES`] the writer starts another
//! and a checkpoint thread flushes sled, after which the older files hold
//! nothing sled does not and are deleted. On open, the files left by a
//! crash are replayed into the tree in order (replaying a record twice
//! writes the same values), sled is flushed and the files removed.
//!
//! Record: `[len: u32 LE][crc32 of payload: u32 LE][payload]`; payload: a
//! sequence of `[1][key len: u32 LE][key][value len: u32 LE][value]`
//! (insert) or `[0][key len: u32 LE][key]` (remove).
//!
//! A crash mid-append leaves a *torn tail*: a last record cut short (or
//! zeros where it was to be), past the length the file's `NNN.ack` marker
//! says was synced ([`ack`]). It was never acknowledged — a failed append
//! or sync cuts the file back to its last synced length, or, if that fails
//! too, makes the writer move to a new file — so replay drops it without a
//! word. Anything else that does not read is *damage* (a flipped bit, a
//! file cut, deleted, replaced or overwritten by something other than
//! warden): replay skips
//! the bad bytes, finds the next intact record (its length and checksum
//! frame it) and keeps every intact record after them; the file is then
//! kept aside as `NNN.log.damaged`, never deleted, and [`Wal::open`]
//! reports what was skipped ([`Damage`]) for one warning that names the
//! turns it cost.

use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;

use tokio::sync::oneshot;

mod ack;
mod record;

#[cfg(test)]
use record::{Scan, decode_all};
use record::{encode, scan};

/// The directory, inside the database's, holding the log files.
pub(crate) const DIR: &str = "turns.wal";

/// A log file larger than this is closed and checkpointed.
pub(crate) const CHECKPOINT_BYTES: u64 = 16 * 1024 * 1024;

/// At most this many bytes of batches go into one append (the rest wait
/// for the next one), so one sync never carries an unbounded group.
const GROUP_BYTES: usize = 4 * 1024 * 1024;

/// One change to the tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Op {
    /// Set `key` to `value`.
    Insert(Vec<u8>, Vec<u8>),
    /// Remove `key`.
    Remove(Vec<u8>),
}

/// What the writer and checkpointer counted, for the bench.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    /// Batches made durable.
    pub(crate) batches: AtomicU64,
    /// Appends synced (each carries one or more batches).
    pub(crate) syncs: AtomicU64,
    /// Checkpoints completed (sled flushed, older files removed).
    pub(crate) checkpoints: AtomicU64,
}

struct Job {
    ops: Vec<Op>,
    done: oneshot::Sender<Result<(), String>>,
}

/// The handle callers use; the writer thread stops (after a last
/// checkpoint) when every handle is gone.
#[derive(Debug)]
pub(crate) struct Wal {
    jobs: mpsc::Sender<Job>,
    pub(crate) counters: Arc<Counters>,
}

/// What replaying one damaged log file skipped ([`Wal::open`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Damage {
    /// Where the file is kept now (`NNN.log.damaged`).
    pub(crate) kept_as: PathBuf,
    /// Bytes that did not read as records, in all.
    pub(crate) skipped_bytes: usize,
    /// The stretches of them: `(offset, length)`.
    pub(crate) stretches: Vec<(usize, usize)>,
    /// The intact records replayed from the file, before and after them.
    pub(crate) intact_records: usize,
    /// Why the file could not be read at all (missing, a directory, …).
    pub(crate) unreadable: Option<String>,
}

/// What [`Wal::open`] replayed.
#[derive(Debug, Default)]
pub(crate) struct Replay {
    /// Records replayed, from every file.
    pub(crate) records: u64,
    /// The files that were damaged (not merely torn at the end).
    pub(crate) damaged: Vec<Damage>,
}

impl Wal {
    /// Replays what `dir` holds into `tree`, flushes it, removes the files
    /// (keeps a damaged one aside) and starts the writer on a new file.
    /// Returns the handle and what was replayed.
    pub(crate) fn open(dir: &Path, tree: sled::Tree) -> Result<(Self, Replay), String> {
        create_private_dir(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        let files = log_files(dir).map_err(|e| format!("listing {}: {e}", dir.display()))?;
        let mut replay = Replay::default();
        for (_, path) in &files {
            let acked = ack::read(path);
            let bytes = match read_log(path) {
                Ok(bytes) => bytes,
                Err(None) if acked.unwrap_or(0) == 0 => continue, // nothing acknowledged
                Err(why) => {
                    // Acknowledged records are gone with it.
                    let lost = acked.unwrap_or(0);
                    replay.damaged.push(Damage {
                        kept_as: damaged_path(path),
                        skipped_bytes: lost,
                        stretches: vec![(0, lost)],
                        intact_records: 0,
                        unreadable: Some(why.unwrap_or_else(|| "missing".to_owned())),
                    });
                    continue;
                }
            };
            let mut scan = scan(&bytes);
            // Acknowledged bytes that are not there or did not read: the
            // file was cut or overwritten, not torn by a crash.
            let readable = bytes.len() - scan.torn_tail;
            if let Some(acked) = acked.filter(|&acked| acked > readable) {
                scan.skipped.push((readable, acked - readable));
                scan.torn_tail = 0;
            }
            if scan.torn_tail > 0 {
                tracing::debug!(
                    file = %path.display(),
                    bytes = scan.torn_tail,
                    "the turn log ends in an unfinished record (a crash mid-append; never acknowledged)"
                );
            }
            let intact = scan.records.len();
            for ops in scan.records {
                tree.apply_batch(batch_of(ops)).map_err(|e| {
                    format!("replaying {}: {}", path.display(), crate::describe(&e))
                })?;
                replay.records += 1;
            }
            if !scan.skipped.is_empty() {
                replay.damaged.push(Damage {
                    kept_as: damaged_path(path),
                    skipped_bytes: scan.skipped.iter().map(|(_, n)| n).sum(),
                    stretches: scan.skipped,
                    intact_records: intact,
                    unreadable: None,
                });
            }
        }
        if !files.is_empty() {
            tree.flush()
                .map_err(|e| format!("flushing the replayed turn log: {}", crate::describe(&e)))?;
            for (_, path) in &files {
                let damage = replay
                    .damaged
                    .iter()
                    .find(|d| d.kept_as == damaged_path(path));
                let there = std::fs::symlink_metadata(path).is_ok();
                match damage {
                    // Kept for whoever looks into it; not replayed again.
                    Some(d) if there => std::fs::rename(path, &d.kept_as)
                        .map_err(|e| format!("keeping {} aside: {e}", path.display()))?,
                    None if there => std::fs::remove_file(path)
                        .map_err(|e| format!("removing {}: {e}", path.display()))?,
                    _ => {}
                }
                ack::remove(path);
            }
        }

        let next = files.last().map_or(1, |(n, _)| n + 1);
        let counters = Arc::new(Counters::default());
        let (tx, rx) = mpsc::channel();
        let writer = Writer {
            dir: dir.to_path_buf(),
            tree,
            next,
            file: None,
            marker: None,
            written: 0,
            counters: Arc::clone(&counters),
            checkpoints: None,
        };
        std::thread::Builder::new()
            .name("warden-turn-log".into())
            .spawn(move || writer.run(&rx))
            .map_err(|e| format!("starting the turn log's writer: {e}"))?;
        Ok((Self { jobs: tx, counters }, replay))
    }

    /// Makes `ops` durable, then applies them to the tree (atomically, as
    /// one sled batch).
    pub(crate) async fn commit(&self, ops: Vec<Op>) -> Result<(), String> {
        if ops.is_empty() {
            // Nothing to make durable (and a record is never empty: see
            // `decode_one`).
            return Ok(());
        }
        let (done, answer) = oneshot::channel();
        self.jobs
            .send(Job { ops, done })
            .map_err(|_| "the turn log's writer has stopped".to_owned())?;
        answer
            .await
            .map_err(|_| "the turn log's writer has stopped".to_owned())?
    }
}

struct Writer {
    dir: PathBuf,
    tree: sled::Tree,
    /// Number of the next file to create.
    next: u64,
    /// The open file and its number.
    file: Option<(u64, File)>,
    /// The open file's acknowledged-length marker ([`ack`]).
    marker: Option<File>,
    /// Bytes appended to the open file.
    written: u64,
    counters: Arc<Counters>,
    /// Files to checkpoint (flush sled, then remove them).
    checkpoints: Option<mpsc::Sender<PathBuf>>,
}

impl Writer {
    fn run(mut self, jobs: &mpsc::Receiver<Job>) {
        let mut buf = Vec::new();
        let mut group = Vec::new();
        while let Ok(first) = jobs.recv() {
            let mut size = encode(&mut buf, &first.ops);
            group.push(first);
            while size < GROUP_BYTES {
                let Ok(more) = jobs.try_recv() else { break };
                size = encode(&mut buf, &more.ops);
                group.push(more);
            }
            let result = self.append(&buf);
            buf.clear();
            for job in group.drain(..) {
                let answer = match &result {
                    Ok(()) => self
                        .tree
                        .apply_batch(batch_of(job.ops))
                        .map_err(|e| format!("applying a turn log batch: {}", crate::describe(&e))),
                    Err(e) => Err(e.clone()),
                };
                if answer.is_ok() {
                    self.counters.batches.fetch_add(1, Ordering::Relaxed);
                }
                let _ = job.done.send(answer);
            }
            if result.is_ok() && self.written >= CHECKPOINT_BYTES {
                self.rotate();
            }
        }
        // Every handle is gone: the store is closing. Flush once so the
        // next open has nothing to replay.
        if let Some((_, file)) = self.file.take() {
            drop(file);
        }
        self.marker = None;
        drop(self.checkpoints.take()); // the checkpointer finishes its queue
        if self.tree.flush().is_ok() {
            if let Ok(files) = log_files(&self.dir) {
                for (_, path) in files {
                    ack::remove(&path);
                    let _ = std::fs::remove_file(path);
                }
            }
        }
    }

    /// Appends `bytes` to the current file and syncs it. On failure the
    /// file is abandoned (its tail may hold part of this append), so
    /// nothing is ever appended after a torn record.
    fn append(&mut self, bytes: &[u8]) -> Result<(), String> {
        if self.file.is_none() {
            let n = self.next;
            let path = file_path(&self.dir, n);
            let file = OpenOptions::new()
                .create_new(true)
                .append(true)
                .mode(0o600)
                .open(&path)
                .map_err(|e| format!("creating the turn log {}: {e}", path.display()))?;
            self.next += 1;
            self.written = 0;
            self.marker = ack::create(&path)
                .map_err(|e| tracing::debug!(error = %e, "could not create the turn log's marker"))
                .ok();
            self.file = Some((n, file));
        }
        let Some((_, file)) = self.file.as_mut() else {
            unreachable!("opened above")
        };
        let result = file.write_all(bytes).and_then(|()| file.sync_data());
        match result {
            Ok(()) => {
                self.written += bytes.len() as u64;
                if let Some(marker) = &self.marker {
                    ack::record(marker, self.written);
                }
                self.counters.syncs.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            Err(e) => {
                // Cut the file back to what was synced before (a full disk
                // leaves part of this append behind); if even that fails,
                // leave the file as it is (replay stops at its torn tail)
                // and write on in a new one.
                if file.set_len(self.written).is_err() {
                    self.rotate();
                }
                Err(format!("writing the turn log: {e}"))
            }
        }
    }

    /// Closes the current file and hands it to the checkpointer.
    fn rotate(&mut self) {
        let Some((n, file)) = self.file.take() else {
            return;
        };
        drop(file);
        self.marker = None;
        let path = file_path(&self.dir, n);
        if self.checkpoints.is_none() {
            let (tx, rx) = mpsc::channel::<PathBuf>();
            let tree = self.tree.clone();
            let counters = Arc::clone(&self.counters);
            let started = std::thread::Builder::new()
                .name("warden-turn-log-checkpoint".into())
                .spawn(move || checkpoint(&tree, &rx, &counters));
            match started {
                Ok(_) => self.checkpoints = Some(tx),
                Err(e) => {
                    // The file stays; it is replayed (and removed) at the
                    // next open.
                    tracing::warn!(error = %e, "could not start the turn log's checkpoint thread");
                    return;
                }
            }
        }
        if let Some(tx) = &self.checkpoints {
            let _ = tx.send(path);
        }
    }
}

/// Flushes sled, then removes the files whose every record was applied
/// before the flush started.
fn checkpoint(tree: &sled::Tree, files: &mpsc::Receiver<PathBuf>, counters: &Counters) {
    while let Ok(first) = files.recv() {
        let mut done = vec![first];
        done.extend(files.try_iter());
        match tree.flush() {
            Ok(_) => {
                for path in done {
                    ack::remove(&path);
                    if let Err(e) = std::fs::remove_file(&path)
                        && e.kind() != std::io::ErrorKind::NotFound
                    {
                        tracing::warn!(file = %path.display(), error = %e, "could not remove a checkpointed turn log");
                    }
                }
                counters.checkpoints.fetch_add(1, Ordering::Relaxed);
            }
            // The files stay and are replayed at the next open.
            Err(e) => tracing::warn!(error = %crate::describe(&e), "turn log checkpoint failed"),
        }
    }
}

fn file_path(dir: &Path, n: u64) -> PathBuf {
    dir.join(format!("{n:020}.log"))
}

/// The log files in `dir`, oldest first: each `NNN.log`, whatever it is
/// now, and the log of each `NNN.ack` marker, whether it is there or not.
fn log_files(dir: &Path) -> std::io::Result<Vec<(u64, PathBuf)>> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let number = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".log").or_else(|| n.strip_suffix(".ack")))
            .and_then(|n| n.parse::<u64>().ok());
        if let Some(n) = number {
            files.push((n, file_path(dir, n)));
        }
    }
    files.sort_unstable();
    files.dedup();
    Ok(files)
}

/// A log file's bytes; `Err(None)` when it is not there, `Err(Some(why))`
/// when it is there but cannot be read as a file.
fn read_log(path: &Path) -> Result<Vec<u8>, Option<String>> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.is_file() => std::fs::read(path).map_err(|e| Some(e.to_string())),
        Ok(meta) if meta.is_dir() => Err(Some("a directory, not a file".to_owned())),
        Ok(_) => Err(Some("not a regular file".to_owned())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(None),
        Err(e) => Err(Some(e.to_string())),
    }
}

fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt as _, PermissionsExt as _};
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        }
        Err(e) => Err(e),
    }
}

fn batch_of(ops: Vec<Op>) -> sled::Batch {
    let mut batch = sled::Batch::default();
    for op in ops {
        match op {
            Op::Insert(k, v) => batch.insert(k, v),
            Op::Remove(k) => batch.remove(k),
        }
    }
    batch
}

/// Where a damaged log file is kept: its name with `.damaged` added.
fn damaged_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".damaged");
    PathBuf::from(name)
}

#[cfg(test)]
#[path = "wal_tests.rs"]
mod tests;
