//! The watchdog's bookkeeping, free of actors and clocks: time is passed in
//! as nanoseconds since the watchdog's epoch, so every rule is unit-tested
//! directly.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::{Expiry, OnExpire, WatchId};

/// The cell shared by a stream's reader (writer of `last_ns`) and the
/// watchdog (reader).
#[derive(Debug)]
pub(crate) struct Liveness {
    last_ns: AtomicU64,
    timeout_ns: AtomicU64,
}

impl Liveness {
    pub(crate) fn new(now_ns: u64, timeout: Duration) -> Self {
        Self {
            last_ns: AtomicU64::new(now_ns),
            timeout_ns: AtomicU64::new(duration_ns(timeout)),
        }
    }

    #[inline]
    pub(crate) fn stamp(&self, now_ns: u64) {
        self.last_ns.store(now_ns, Ordering::Release);
    }

    pub(crate) fn timeout(&self) -> Duration {
        Duration::from_nanos(self.timeout_ns.load(Ordering::Acquire))
    }

    /// Sets the timeout, returning the previous one.
    pub(crate) fn set_timeout(&self, timeout: Duration) -> Duration {
        Duration::from_nanos(self.timeout_ns.swap(duration_ns(timeout), Ordering::AcqRel))
    }

    fn last(&self) -> u64 {
        self.last_ns.load(Ordering::Acquire)
    }

    fn deadline(&self) -> u64 {
        self.last()
            .saturating_add(self.timeout_ns.load(Ordering::Acquire))
    }
}

fn duration_ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

struct Entry {
    live: std::sync::Arc<Liveness>,
    /// The deadline of this entry's live heap item; other heap items for the
    /// same id are stale and skipped.
    queued_at: u64,
    on_expire: OnExpire,
}

/// Deadlines of every watched stream.
#[derive(Default)]
pub(crate) struct WatchTable {
    entries: HashMap<WatchId, Entry>,
    heap: BinaryHeap<Reverse<(u64, WatchId)>>,
}

impl WatchTable {
    pub(crate) fn insert(
        &mut self,
        id: WatchId,
        live: std::sync::Arc<Liveness>,
        on_expire: OnExpire,
    ) {
        let at = live.deadline();
        self.heap.push(Reverse((at, id)));
        self.entries.insert(
            id,
            Entry {
                live,
                queued_at: at,
                on_expire,
            },
        );
    }

    pub(crate) fn remove(&mut self, id: WatchId) -> bool {
        let removed = self.entries.remove(&id).is_some();
        self.compact();
        removed
    }

    /// Re-reads `id`'s deadline after its timeout shrank.
    pub(crate) fn rearm(&mut self, id: WatchId) {
        if let Some(e) = self.entries.get_mut(&id) {
            let at = e.live.deadline();
            if at < e.queued_at {
                e.queued_at = at;
                self.heap.push(Reverse((at, id)));
            }
        }
    }

    pub(crate) fn contains(&self, id: WatchId) -> bool {
        self.entries.contains_key(&id)
    }

    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    pub(crate) fn queued(&self) -> usize {
        self.heap.len()
    }

    /// The earliest live deadline (stale items on top are dropped first).
    pub(crate) fn next_deadline(&mut self) -> Option<u64> {
        while let Some(&Reverse((at, id))) = self.heap.peek() {
            if self.entries.get(&id).is_some_and(|e| e.queued_at == at) {
                return Some(at);
            }
            self.heap.pop();
        }
        None
    }

    /// Pops every deadline due at `now`; re-queues streams that had frames
    /// since, and returns (removed from the table) those silent for their
    /// whole timeout.
    pub(crate) fn expire(&mut self, now: u64) -> Vec<(Expiry, OnExpire)> {
        let mut expired = Vec::new();
        while let Some(&Reverse((at, id))) = self.heap.peek() {
            if at > now {
                break;
            }
            self.heap.pop();
            let Some(entry) = self.entries.get_mut(&id) else {
                continue; // unwatched
            };
            if entry.queued_at != at {
                continue; // superseded by a rearm
            }
            let deadline = entry.live.deadline();
            if deadline > now {
                entry.queued_at = deadline;
                self.heap.push(Reverse((deadline, id)));
                continue;
            }
            if let Some(entry) = self.entries.remove(&id) {
                let expiry = Expiry {
                    id,
                    silent_for: Duration::from_nanos(now.saturating_sub(entry.live.last())),
                    timeout: entry.live.timeout(),
                };
                expired.push((expiry, entry.on_expire));
            }
        }
        expired
    }

    /// Drops stale heap items once they outnumber live ones, bounding memory
    /// under heavy churn.
    fn compact(&mut self) {
        if self.heap.len() > 2 * self.entries.len() + 4096 {
            let entries = &self.entries;
            self.heap
                .retain(|Reverse((at, id))| entries.get(id).is_some_and(|e| e.queued_at == *at));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    const MS: u64 = 1_000_000;

    fn setup(timeout_ms: u64) -> (WatchTable, Arc<Liveness>, Arc<Mutex<Vec<Expiry>>>) {
        let mut t = WatchTable::default();
        let live = Arc::new(Liveness::new(0, Duration::from_millis(timeout_ms)));
        let fired = Arc::new(Mutex::new(Vec::new()));
        let f = fired.clone();
        t.insert(
            WatchId(1),
            live.clone(),
            Box::new(move |e| f.lock().expect("lock").push(e)),
        );
        (t, live, fired)
    }

    fn run(t: &mut WatchTable, now: u64) -> usize {
        let due = t.expire(now);
        let n = due.len();
        for (e, f) in due {
            f(e);
        }
        n
    }

    #[test]
    fn fires_after_the_timeout_with_no_frames_and_not_before() {
        let (mut t, _live, fired) = setup(1000);
        assert_eq!(t.next_deadline(), Some(1000 * MS));
        assert_eq!(run(&mut t, 1000 * MS - 1), 0);
        assert_eq!(run(&mut t, 1000 * MS), 1);
        let e = fired.lock().expect("lock")[0];
        assert_eq!(e.silent_for, Duration::from_millis(1000));
        assert!(!t.contains(WatchId(1)));
    }

    #[test]
    fn a_frame_moves_the_deadline() {
        let (mut t, live, _) = setup(1000);
        live.stamp(800 * MS);
        assert_eq!(run(&mut t, 1000 * MS), 0);
        assert_eq!(t.next_deadline(), Some(1800 * MS));
        assert_eq!(run(&mut t, 1800 * MS - 1), 0);
        assert_eq!(run(&mut t, 1800 * MS), 1);
    }

    #[test]
    fn many_frames_leave_one_deadline() {
        let (t, live, _) = setup(1000);
        for i in 0..100 {
            live.stamp(i * MS / 10);
        }
        assert_eq!(t.queued(), 1);
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn removed_streams_never_fire_and_stale_items_are_dropped() {
        let (mut t, _live, fired) = setup(1000);
        assert!(t.remove(WatchId(1)));
        assert_eq!(run(&mut t, 5000 * MS), 0);
        assert_eq!(t.queued(), 0);
        assert!(fired.lock().expect("lock").is_empty());
    }

    #[test]
    fn shrinking_the_timeout_requeues_earlier() {
        let (mut t, live, _) = setup(10_000);
        live.set_timeout(Duration::from_millis(100));
        t.rearm(WatchId(1));
        assert_eq!(t.next_deadline(), Some(100 * MS));
        assert_eq!(run(&mut t, 100 * MS), 1);
        assert_eq!(
            run(&mut t, 10_000 * MS),
            0,
            "the stale item must not fire twice"
        );
    }

    #[test]
    fn growing_the_timeout_is_honoured_at_recheck() {
        let (mut t, live, _) = setup(100);
        live.set_timeout(Duration::from_millis(600_000));
        assert_eq!(run(&mut t, 100 * MS), 0);
        assert_eq!(t.next_deadline(), Some(600_000 * MS));
    }

    #[test]
    fn compaction_bounds_stale_items() {
        let mut t = WatchTable::default();
        for i in 0..10_000u64 {
            let live = Arc::new(Liveness::new(0, Duration::from_secs(45)));
            t.insert(WatchId(i), live, Box::new(|_| {}));
            t.remove(WatchId(i));
        }
        assert!(t.queued() <= 4096 + 1, "{} stale items kept", t.queued());
    }
}
