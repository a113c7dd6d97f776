//! # warden-store
//!
//! The durable [`SessionStore`] of warden: [sled] 0.34 on disk, one tree of
//! [`SessionRecord`]s keyed by session key, each value a schema-versioned
//! bincode 2 encoding of the record.
//!
//! - **Encoding**: `[version: u16 big-endian][bincode(serde) record]`.
//!   A record whose version is newer than [`SCHEMA_VERSION`](warden_core::store::SCHEMA_VERSION) is
//!   [`StoreError::NewerSchema`]; one that does not decode is
//!   [`StoreError::Corrupt`]. Both are errors *for that key only*: listing
//!   reports them per slot, and nothing overwrites them silently.
//! - **Durability**: every write goes to sled before the call returns;
//!   [`Durability::Flushed`] writes are also flushed to disk (fsync) before
//!   it returns. sled flushes the rest within `flush_every_ms` (500 ms).
//!   Flushes run on tokio's blocking pool, one at a time, with group
//!   commit: a flush that starts after a write covers it, so concurrent
//!   durable writes share one fsync. (sled 0.34's own `flush_async` runs on
//!   sled's small I/O pool and deadlocks when many sessions flush at once;
//!   it is not used.)
//! - **Privacy**: the database directory is created (or narrowed) to mode
//!   0700 and the files in it to 0600. Files sled creates later are
//!   protected by the directory's mode.
//! - **One owner**: sled holds an exclusive lock on its files; opening a
//!   database another live process (or this one) holds is
//!   [`StoreError::Locked`]. sled releases the lock from its own I/O
//!   threads, which may still be finishing a write (or failing one, on a
//!   full disk) just after a store is dropped, so [`SledStore::open`] waits
//!   up to [`LOCK_WAIT`] for a held lock before it reports it.
//! - **Recovery on open**: a disk that filled up while sled wrote its
//!   startup snapshot leaves an unfinished `snap.*.generating` file that
//!   makes every later open fail as "corrupted". [`SledStore::open`]
//!   removes such files (sled regenerates them from its log), logs a
//!   warning and lists what it did in [`SledStore::recoveries`]; see
//!   [`OpenRepair`].
//! - **Repair**: [`SledStore::salvage`] copies every readable record of a
//!   damaged database into a new one and reports the rest
//!   ([`SalvageReport`]); `warden sessions --repair` is built on it.
//! - **Errors** are one line: sled's own `Display` of corruption appends
//!   `backtrace ()`, which is dropped here.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use warden_core::{Durability, SessionKey, SessionRecord, SessionStore};
//! use warden_store::SledStore;
//!
//! let dir = tempfile::tempdir()?;
//! let store = SledStore::open(dir.path().join("db"))?;
//! let key = SessionKey::new("/work/repo");
//! let mut record = SessionRecord::new(&key, None);
//! record.set_agent_session_id("9753c268-0000-4000-8000-000000000000");
//! store.save(&record, Durability::Flushed).await?;
//! assert_eq!(store.load(&key).await?, Some(record));
//! # Ok(())
//! # }
//! ```
//!
//! - **Turn logs** ([`SledStore::turns`], for `warden serve`) are made
//!   durable by a write-ahead log of their own (`turns.wal/`), one
//!   `fdatasync` per group of batches, not by sled's flush; see
//!   [`SledTurns`].
//!
//! Dependencies: `sled` (embedded, crash-safe log-structured store),
//! `crc32fast` (the turn log's record checksums; sled uses it too),
//! `bincode` 2 with its serde feature (compact record encoding; 3.0.0 is a
//! deliberately broken release), `serde` (the record's derive).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use futures_util::future::BoxFuture;
use warden_core::{Durability, SessionKey, SessionRecord, SessionStore, StoreError};

mod codec;
mod labels;
mod recovery;
mod salvage;
mod turns;
mod wal;

pub use codec::{MAX_RECORD_BYTES, decode, encode};
pub use labels::SledLabels;
pub use recovery::OpenRepair;
pub use salvage::{SalvageError, SalvageReport, Unreadable};
pub use turns::{SledTurns, TURN_LOG_DAMAGED, TurnLogDamage};

/// The sled tree holding session records.
const TREE: &str = "sessions";

/// A [`SessionStore`] on a sled database directory.
#[derive(Debug, Clone)]
pub struct SledStore {
    db: sled::Db,
    tree: sled::Tree,
    path: PathBuf,
    commit: Arc<GroupCommit>,
    recoveries: Arc<[OpenRepair]>,
    /// The turn logs, once [`turns`](Self::turns) opened them (one writer
    /// per database).
    turns: Arc<parking_lot::Mutex<Option<SledTurns>>>,
}

/// Serializes flushes and lets one flush cover every write before it.
///
/// A write takes its sequence number *after* its insert returned, and a
/// flush reads the last sequence number *before* it calls sled's flush,
/// which makes stable everything inserted before the call. So a flush that
/// read `covers` has all of writes `..=covers` inserted before it started;
/// a write that lands while the flush runs gets a number above `covers` and
/// is not reported covered (`a_write_landing_during_a_flush_is_not_reported_covered_by_it`).
#[derive(Debug, Default)]
struct GroupCommit {
    /// Sequence number of the last write.
    written: AtomicU64,
    /// Every write up to this sequence number is on disk.
    flushed: AtomicU64,
    /// Flushes run (fsyncs), for [`SledStore::flushes`].
    runs: AtomicU64,
    lock: tokio::sync::Mutex<()>,
    /// Runs on the flush thread just before sled's flush (tests only).
    #[cfg(test)]
    during_flush: tests::FlushHook,
}

impl SledStore {
    /// Opens (creating if needed) the database at `dir`.
    ///
    /// If sled reports corruption and the directory holds an unfinished
    /// snapshot (`snap.*.generating`, left by a full disk or a crash while
    /// sled wrote it), the file is removed and the open retried; the removal
    /// is logged (`warn`) and listed in [`recoveries`](Self::recoveries).
    pub fn open(dir: impl AsRef<Path>) -> Result<Self, StoreError> {
        let path = dir.as_ref().to_path_buf();
        make_private_dir(&path)?;
        let (db, recoveries) = open_waiting_for_the_lock(&path, LOCK_WAIT)?;
        make_files_private(&path)?;
        let tree = db.open_tree(TREE).map_err(|e| backend(describe(&e)))?;
        Ok(Self {
            db,
            tree,
            path,
            commit: Arc::default(),
            recoveries: recoveries.into(),
            turns: Arc::default(),
        })
    }

    /// What [`open`](Self::open) had to repair before the database would
    /// open; empty almost always.
    pub fn recoveries(&self) -> &[OpenRepair] {
        &self.recoveries
    }

    /// The database directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes raw bytes under `key`, bypassing encoding. For tests and
    /// repair tools only: this is how a corrupt record is simulated.
    #[doc(hidden)]
    pub fn put_raw(&self, key: &str, bytes: &[u8]) -> Result<(), StoreError> {
        self.insert(key.as_bytes(), bytes).map(|_| ())
    }

    /// Inserts, then numbers the write (in that order: see [`GroupCommit`]).
    fn insert(&self, key: &[u8], bytes: &[u8]) -> Result<u64, StoreError> {
        self.tree
            .insert(key, bytes)
            .map_err(|e| backend(describe(&e)))?;
        Ok(self.commit.written.fetch_add(1, Ordering::SeqCst) + 1)
    }

    /// How many flushes (fsyncs) this store has run; with
    /// [`writes`](Self::writes), how well durable writes share them.
    pub fn flushes(&self) -> u64 {
        self.commit.runs.load(Ordering::Relaxed)
    }

    /// How many record writes this store has taken (the turn logs count
    /// theirs in [`SledTurns::commits`]).
    pub fn writes(&self) -> u64 {
        self.commit.written.load(Ordering::SeqCst)
    }

    /// Flushes everything written so far to disk.
    pub async fn flush(&self) -> Result<(), StoreError> {
        let seq = self.commit.written.load(Ordering::SeqCst);
        self.flush_through(seq).await
    }

    /// Makes every write up to sequence number `seq` durable.
    async fn flush_through(&self, seq: u64) -> Result<(), StoreError> {
        let _turn = self.commit.lock.lock().await;
        if self.commit.flushed.load(Ordering::SeqCst) >= seq {
            return Ok(()); // a flush that started after our write covered it
        }
        let covers = self.commit.written.load(Ordering::SeqCst);
        let db = self.db.clone();
        #[cfg(test)]
        let hook = self.commit.during_flush.get();
        tokio::task::spawn_blocking(move || {
            #[cfg(test)]
            if let Some(hook) = hook {
                hook()?;
            }
            db.flush()
        })
        .await
        .map_err(|e| backend(format!("flush task: {e}")))?
        .map_err(|e| backend(format!("flushing: {}", describe(&e))))?;
        self.commit.flushed.fetch_max(covers, Ordering::SeqCst);
        self.commit.runs.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

fn backend(message: String) -> StoreError {
    StoreError::Backend { message }
}

fn open_sled(path: &Path) -> sled::Result<sled::Db> {
    sled::Config::new().path(path).open()
}

/// How long [`SledStore::open`] waits for a database lock held elsewhere
/// (by another process, or by sled's I/O threads of a store this process
/// just dropped) before it reports [`StoreError::Locked`].
pub const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// [`open_recovering`], retried every 20 ms while the database is locked,
/// for at most `wait`.
fn open_waiting_for_the_lock(
    path: &Path,
    wait: std::time::Duration,
) -> Result<(sled::Db, Vec<OpenRepair>), StoreError> {
    let until = std::time::Instant::now() + wait;
    loop {
        let error = match open_recovering(path) {
            Ok(opened) => return Ok(opened),
            Err(OpenFailure::Sled(e)) => open_error(path, &e),
            Err(OpenFailure::Store(e)) => e,
        };
        if !matches!(error, StoreError::Locked { .. }) || std::time::Instant::now() >= until {
            return Err(error);
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Why [`open_recovering`] failed: sled's own error, or one of the repair.
enum OpenFailure {
    Sled(sled::Error),
    Store(StoreError),
}

/// Opens the sled database at `path`; if sled reports corruption and an
/// unfinished snapshot is found, removes it and tries once more.
fn open_recovering(path: &Path) -> Result<(sled::Db, Vec<OpenRepair>), OpenFailure> {
    match open_sled(path) {
        Ok(db) => Ok((db, Vec::new())),
        Err(e @ sled::Error::Corruption { .. }) => {
            let recoveries =
                recovery::remove_unfinished_snapshots(path).map_err(OpenFailure::Store)?;
            if recoveries.is_empty() {
                return Err(OpenFailure::Sled(e));
            }
            let db = open_sled(path).map_err(OpenFailure::Sled)?;
            Ok((db, recoveries))
        }
        Err(e) => Err(OpenFailure::Sled(e)),
    }
}

fn open_error(path: &Path, error: &sled::Error) -> StoreError {
    let message = describe(error);
    if message.contains("could not acquire lock") {
        StoreError::Locked {
            path: path.display().to_string(),
        }
    } else {
        backend(format!("opening {}: {message}", path.display()))
    }
}

/// One line for a sled error. sled 0.34's `Display` of
/// [`sled::Error::Corruption`] ends in `backtrace ()` (a placeholder for a
/// backtrace it only captures in its own tests); that part is dropped.
pub(crate) fn describe(error: &sled::Error) -> String {
    let text = match error {
        sled::Error::Corruption { at: Some(at), .. } => {
            format!("sled read corrupted data at {at:?}")
        }
        sled::Error::Corruption { at: None, .. } => "sled read corrupted data".to_owned(),
        other => other.to_string(),
    };
    text.replace('\n', " ")
}

#[cfg(unix)]
fn make_private_dir(path: &Path) -> Result<(), StoreError> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path)
        .map_err(|e| backend(format!("creating {}: {e}", path.display())))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700))
        .map_err(|e| backend(format!("chmod {}: {e}", path.display())))
}

#[cfg(not(unix))]
fn make_private_dir(path: &Path) -> Result<(), StoreError> {
    std::fs::create_dir_all(path).map_err(|e| backend(format!("creating {}: {e}", path.display())))
}

#[cfg(unix)]
fn make_files_private(dir: &Path) -> Result<(), StoreError> {
    use std::os::unix::fs::PermissionsExt;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let entries =
            std::fs::read_dir(&d).map_err(|e| backend(format!("reading {}: {e}", d.display())))?;
        for entry in entries.flatten() {
            let p = entry.path();
            let mode = if p.is_dir() {
                stack.push(p.clone());
                0o700
            } else {
                0o600
            };
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode))
                .map_err(|e| backend(format!("chmod {}: {e}", p.display())))?;
        }
    }
    Ok(())
}

#[cfg(not(unix))]
fn make_files_private(_dir: &Path) -> Result<(), StoreError> {
    Ok(())
}

impl SessionStore for SledStore {
    fn load(&self, key: &SessionKey) -> BoxFuture<'_, Result<Option<SessionRecord>, StoreError>> {
        let result = self
            .tree
            .get(key.as_str().as_bytes())
            .map_err(|e| backend(describe(&e)))
            .and_then(|v| v.map(|b| decode(key.as_str(), &b)).transpose());
        Box::pin(async move { result })
    }

    fn save<'a>(
        &'a self,
        record: &'a SessionRecord,
        durability: Durability,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let bytes = encode(record)?;
            let seq = self.insert(record.key.as_bytes(), &bytes)?;
            if durability == Durability::Flushed {
                self.flush_through(seq).await?;
            }
            Ok(())
        })
    }

    fn list(&self) -> BoxFuture<'_, Result<Vec<Result<SessionRecord, StoreError>>, StoreError>> {
        let mut out = Vec::new();
        for item in self.tree.iter() {
            match item {
                Ok((k, v)) => {
                    let key = String::from_utf8_lossy(&k).into_owned();
                    out.push(decode(&key, &v));
                }
                Err(e) => {
                    let e = backend(describe(&e));
                    return Box::pin(async move { Err(e) });
                }
            }
        }
        Box::pin(async move { Ok(out) })
    }
}

#[cfg(test)]
mod tests {
    use parking_lot::Mutex;

    use super::*;

    type Hook = Arc<dyn Fn() -> sled::Result<()> + Send + Sync>;

    /// A function the next flush runs on its thread just before sled's
    /// flush; an `Err` fails that flush instead.
    #[derive(Default)]
    pub(super) struct FlushHook(Mutex<Option<Hook>>);

    impl std::fmt::Debug for FlushHook {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("FlushHook")
        }
    }

    impl FlushHook {
        /// Takes the hook: it runs for one flush only.
        pub(super) fn get(&self) -> Option<Hook> {
            self.0.lock().take()
        }

        fn set(&self, hook: impl Fn() -> sled::Result<()> + Send + Sync + 'static) {
            *self.0.lock() = Some(Arc::new(hook));
        }
    }

    fn record(key: &str) -> SessionRecord {
        let mut r = SessionRecord::new(&SessionKey::new(key), None);
        r.accept(format!("a message for {key}"));
        r
    }

    #[tokio::test]
    async fn a_write_landing_during_a_flush_is_not_reported_covered_by_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = SledStore::open(dir.path().join("db")).expect("open");
        let late_seq = Arc::new(AtomicU64::new(0));
        {
            let store = store.clone();
            let late_seq = late_seq.clone();
            let bytes = encode(&record("late")).expect("encode");
            store.commit.during_flush.set({
                let store = store.clone();
                move || {
                    let seq = store.insert(b"late", &bytes).expect("the late write");
                    late_seq.store(seq, Ordering::SeqCst);
                    Ok(())
                }
            });
        }
        store
            .save(&record("early"), Durability::Flushed)
            .await
            .expect("save");
        let late = late_seq.load(Ordering::SeqCst);
        assert!(late > 0, "the hook did not run during the flush");
        let flushed = store.commit.flushed.load(Ordering::SeqCst);
        assert!(
            flushed < late,
            "the write numbered {late} landed during the flush, yet the flush reported every write up to {flushed} on disk"
        );
        // The late write's own durable point flushes again and covers it.
        store
            .flush_through(late)
            .await
            .expect("flush the late write");
        assert!(store.commit.flushed.load(Ordering::SeqCst) >= late);
    }

    #[tokio::test]
    async fn a_failed_flush_is_an_error_and_covers_nothing() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = SledStore::open(dir.path().join("db")).expect("open");
        store
            .commit
            .during_flush
            .set(|| Err(sled::Error::Io(std::io::Error::from_raw_os_error(28))));
        let error = store
            .save(&record("lost"), Durability::Flushed)
            .await
            .expect_err("a save whose flush failed must not be acknowledged");
        let text = error.to_string();
        assert!(text.contains("flushing"), "{text}");
        assert_eq!(store.commit.flushed.load(Ordering::SeqCst), 0);
        // The next durable save flushes for real (the hook ran once).
        store
            .save(&record("kept"), Durability::Flushed)
            .await
            .expect("save");
        assert_eq!(store.commit.flushed.load(Ordering::SeqCst), 2);
    }

    /// Holds sled's lock on the database at `dir` from another file
    /// description (as another process, or sled's I/O threads, would) for
    /// `hold`, on a thread; returns once the lock is taken.
    fn hold_the_lock(dir: &Path, hold: std::time::Duration) -> std::thread::JoinHandle<()> {
        // (Waits for the store just dropped to release it.)
        let lock = recovery::lock_database(dir).expect("take the lock");
        std::thread::spawn(move || {
            std::thread::sleep(hold);
            drop(lock);
        })
    }

    #[test]
    fn open_waits_for_a_lock_released_shortly_after() {
        let dir = tempfile::tempdir().expect("tempdir");
        drop(SledStore::open(dir.path()).expect("create"));
        let hold = std::time::Duration::from_millis(300);
        let holder = hold_the_lock(dir.path(), hold);
        let started = std::time::Instant::now();
        let store = SledStore::open(dir.path()).expect("open once the lock is released");
        assert!(started.elapsed() >= hold - std::time::Duration::from_millis(50));
        drop(store);
        holder.join().expect("holder");
    }

    #[test]
    fn a_lock_held_past_the_wait_is_reported_locked() {
        let dir = tempfile::tempdir().expect("tempdir");
        drop(SledStore::open(dir.path()).expect("create"));
        let wait = std::time::Duration::from_millis(100);
        let holder = hold_the_lock(dir.path(), wait * 5);
        let started = std::time::Instant::now();
        let refused = open_waiting_for_the_lock(dir.path(), wait).expect_err("held");
        assert!(matches!(refused, StoreError::Locked { .. }), "{refused:?}");
        assert!(started.elapsed() >= wait, "gave up before the wait");
        holder.join().expect("holder");
    }
}
