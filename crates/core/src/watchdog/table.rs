//! The watchdog's bookkeeping, free of actors and clocks: time is passed in
//! as nanoseconds since the watchdog's epoch, so every rule is unit-tested
//! directly.
//!
//! Layout, chosen for ~90 bytes per watched stream at a million streams:
//! - one [`Cell`] per stream, shared (`Arc`) with the stream's heartbeat:
//!   last-frame stamp, allowance, the deadline of its live heap item, its id
//!   and the slot of its callback — 48 bytes with the `Arc` header;
//! - a min-heap of `(deadline, cell)` items, 16 bytes each; an item is live
//!   only while its deadline equals the cell's `queued_at`, so superseded
//!   items are skipped when popped (and compacted when they pile up);
//! - a slab of expiry callbacks indexed by the cell's slot (16 bytes each),
//!   touched only by the watchdog itself.
//!
//! No hash map: finding a stream is never needed on the hot paths
//! (registration, re-queue, expiry, unwatch all carry the cell).

use std::cmp::Ordering as CmpOrdering;
use std::collections::BinaryHeap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use super::{Expiry, OnExpire, WatchId};

/// `queued_at` of a stream that is no longer watched (removed or expired).
const GONE: u64 = u64::MAX;

/// The cell shared by a stream's reader (writer of `last_ns`) and the
/// watchdog.
#[derive(Debug)]
pub(crate) struct Cell {
    last_ns: AtomicU64,
    timeout_ms: AtomicU32,
    /// Callback slot; written by the watchdog only.
    slot: AtomicU32,
    /// Deadline of the live heap item, or `GONE`; written by the watchdog only.
    queued_at: AtomicU64,
    id: WatchId,
}

impl Cell {
    pub(crate) fn new(id: WatchId, now_ns: u64, timeout: Duration) -> Self {
        Self {
            last_ns: AtomicU64::new(now_ns),
            timeout_ms: AtomicU32::new(duration_ms(timeout)),
            slot: AtomicU32::new(u32::MAX),
            queued_at: AtomicU64::new(GONE),
            id,
        }
    }

    #[inline]
    pub(crate) fn stamp(&self, now_ns: u64) {
        self.last_ns.store(now_ns, Ordering::Release);
    }

    pub(crate) fn timeout(&self) -> Duration {
        Duration::from_millis(u64::from(self.timeout_ms.load(Ordering::Acquire)))
    }

    /// Sets the timeout, returning the previous one.
    pub(crate) fn set_timeout(&self, timeout: Duration) -> Duration {
        let old = self.timeout_ms.swap(duration_ms(timeout), Ordering::AcqRel);
        Duration::from_millis(u64::from(old))
    }

    fn last(&self) -> u64 {
        self.last_ns.load(Ordering::Acquire)
    }

    fn deadline(&self) -> u64 {
        let timeout_ns = u64::from(self.timeout_ms.load(Ordering::Acquire)) * 1_000_000;
        self.last().saturating_add(timeout_ns)
    }

    fn queued_at(&self) -> u64 {
        self.queued_at.load(Ordering::Relaxed)
    }

    fn is_live(&self) -> bool {
        self.queued_at() != GONE
    }
}

/// Allowances are validated to `1 ms ..= 24 h`, which fits in u32 ms.
fn duration_ms(d: Duration) -> u32 {
    u32::try_from(d.as_millis()).unwrap_or(u32::MAX).max(1)
}

/// A heap item: ordered by deadline only (earliest first).
struct Due {
    at: u64,
    cell: Arc<Cell>,
}

impl PartialEq for Due {
    fn eq(&self, other: &Self) -> bool {
        self.at == other.at
    }
}
impl Eq for Due {}
impl PartialOrd for Due {
    fn partial_cmp(&self, other: &Self) -> Option<CmpOrdering> {
        Some(self.cmp(other))
    }
}
impl Ord for Due {
    fn cmp(&self, other: &Self) -> CmpOrdering {
        other.at.cmp(&self.at) // reversed: BinaryHeap is a max-heap
    }
}

/// Deadlines of every watched stream.
#[derive(Default)]
pub(crate) struct WatchTable {
    heap: BinaryHeap<Due>,
    callbacks: Vec<Option<OnExpire>>,
    free: Vec<u32>,
    live: usize,
}

impl WatchTable {
    pub(crate) fn insert(&mut self, cell: Arc<Cell>, on_expire: OnExpire) {
        if cell.is_live() {
            return; // registered twice: keep the first
        }
        let slot = match self.free.pop() {
            Some(s) => {
                self.callbacks[s as usize] = Some(on_expire);
                s
            }
            None => {
                self.callbacks.push(Some(on_expire));
                u32::try_from(self.callbacks.len() - 1).unwrap_or(u32::MAX)
            }
        };
        cell.slot.store(slot, Ordering::Relaxed);
        let at = cell.deadline();
        cell.queued_at.store(at, Ordering::Relaxed);
        self.heap.push(Due { at, cell });
        self.live += 1;
    }

    /// Stops watching; the callback is dropped now, the heap item lazily.
    pub(crate) fn remove(&mut self, cell: &Cell) -> bool {
        if !cell.is_live() {
            return false;
        }
        drop(self.release(cell));
        self.compact();
        true
    }

    /// Marks `cell` gone and returns its callback.
    fn release(&mut self, cell: &Cell) -> Option<OnExpire> {
        cell.queued_at.store(GONE, Ordering::Relaxed);
        self.live -= 1;
        let slot = cell.slot.swap(u32::MAX, Ordering::Relaxed);
        let f = self.callbacks.get_mut(slot as usize).and_then(Option::take);
        if (slot as usize) < self.callbacks.len() {
            self.free.push(slot);
        }
        f
    }

    /// Re-reads the deadline after the allowance shrank.
    pub(crate) fn rearm(&mut self, cell: &Arc<Cell>) {
        if !cell.is_live() {
            return;
        }
        let at = cell.deadline();
        if at < cell.queued_at() {
            cell.queued_at.store(at, Ordering::Relaxed);
            self.heap.push(Due {
                at,
                cell: cell.clone(),
            });
        }
    }

    /// Whether `id` is watched. Scans the heap: for diagnostics and tests.
    pub(crate) fn contains(&self, id: WatchId) -> bool {
        self.heap
            .iter()
            .any(|d| d.cell.id == id && d.cell.queued_at() == d.at)
    }

    pub(crate) fn len(&self) -> usize {
        self.live
    }

    pub(crate) fn queued(&self) -> usize {
        self.heap.len()
    }

    /// The earliest live deadline (superseded items on top are dropped).
    pub(crate) fn next_deadline(&mut self) -> Option<u64> {
        while let Some(top) = self.heap.peek() {
            if top.cell.queued_at() == top.at {
                return Some(top.at);
            }
            self.heap.pop();
        }
        None
    }

    /// Pops every deadline due at `now`; re-queues streams that had frames
    /// since, and returns (no longer watched) those silent for their whole
    /// allowance.
    pub(crate) fn expire(&mut self, now: u64) -> Vec<(Expiry, OnExpire)> {
        let mut expired = Vec::new();
        while let Some(top) = self.heap.peek() {
            if top.at > now {
                break;
            }
            let Some(Due { at, cell }) = self.heap.pop() else {
                break;
            };
            if cell.queued_at() != at {
                continue; // unwatched, expired or superseded by a rearm
            }
            let deadline = cell.deadline();
            if deadline > now {
                cell.queued_at.store(deadline, Ordering::Relaxed);
                self.heap.push(Due { at: deadline, cell });
                continue;
            }
            let expiry = Expiry {
                id: cell.id,
                silent_for: Duration::from_nanos(now.saturating_sub(cell.last())),
                timeout: cell.timeout(),
            };
            if let Some(f) = self.release(&cell) {
                expired.push((expiry, f));
            }
        }
        expired
    }

    /// Drops superseded heap items once they outnumber live ones, bounding
    /// memory under heavy churn.
    fn compact(&mut self) {
        if self.heap.len() > 2 * self.live + 4096 {
            self.heap.retain(|d| d.cell.queued_at() == d.at);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use parking_lot::Mutex;

    const MS: u64 = 1_000_000;

    fn setup(timeout_ms: u64) -> (WatchTable, Arc<Cell>, Arc<Mutex<Vec<Expiry>>>) {
        let mut t = WatchTable::default();
        let cell = Arc::new(Cell::new(WatchId(1), 0, Duration::from_millis(timeout_ms)));
        let fired = Arc::new(Mutex::new(Vec::new()));
        let f = fired.clone();
        t.insert(cell.clone(), Box::new(move |e| f.lock().push(e)));
        (t, cell, fired)
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
        let (mut t, _cell, fired) = setup(1000);
        assert_eq!(t.next_deadline(), Some(1000 * MS));
        assert_eq!(run(&mut t, 1000 * MS - 1), 0);
        assert_eq!(run(&mut t, 1000 * MS), 1);
        let e = fired.lock()[0];
        assert_eq!(e.silent_for, Duration::from_millis(1000));
        assert_eq!(e.timeout, Duration::from_millis(1000));
        assert_eq!(e.id, WatchId(1));
        assert!(!t.contains(WatchId(1)));
        assert_eq!(t.len(), 0);
    }

    #[test]
    fn contains_sees_exactly_the_live_streams() {
        let (mut t, cell, _) = setup(1000);
        assert!(t.contains(WatchId(1)));
        assert!(!t.contains(WatchId(2)));
        // A superseded heap item is not a second entry, and a removed
        // stream is gone even while its item is still in the heap.
        cell.set_timeout(Duration::from_millis(10));
        t.rearm(&cell);
        assert!(t.contains(WatchId(1)));
        assert!(t.remove(&cell));
        assert!(!t.contains(WatchId(1)));
        assert!(t.queued() > 0, "the stale items are dropped lazily");
    }

    #[test]
    fn a_frame_moves_the_deadline() {
        let (mut t, cell, _) = setup(1000);
        cell.stamp(800 * MS);
        assert_eq!(run(&mut t, 1000 * MS), 0);
        assert_eq!(t.next_deadline(), Some(1800 * MS));
        assert_eq!(run(&mut t, 1800 * MS - 1), 0);
        assert_eq!(run(&mut t, 1800 * MS), 1);
    }

    #[test]
    fn many_frames_leave_one_deadline() {
        let (t, cell, _) = setup(1000);
        for i in 0..100 {
            cell.stamp(i * MS / 10);
        }
        assert_eq!(t.queued(), 1);
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn removed_streams_never_fire_and_their_items_are_dropped() {
        let (mut t, cell, fired) = setup(1000);
        assert!(t.remove(&cell));
        assert!(!t.remove(&cell), "second remove is a no-op");
        assert_eq!(t.len(), 0);
        assert_eq!(run(&mut t, 5000 * MS), 0);
        assert_eq!(t.queued(), 0);
        assert!(fired.lock().is_empty());
    }

    #[test]
    fn shrinking_the_timeout_requeues_earlier() {
        let (mut t, cell, _) = setup(10_000);
        cell.set_timeout(Duration::from_millis(100));
        t.rearm(&cell);
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
        let (mut t, cell, _) = setup(100);
        cell.set_timeout(Duration::from_millis(600_000));
        assert_eq!(run(&mut t, 100 * MS), 0);
        assert_eq!(t.next_deadline(), Some(600_000 * MS));
    }

    #[test]
    fn churn_reuses_callback_slots_and_compacts_stale_items() {
        let mut t = WatchTable::default();
        for i in 0..10_000u64 {
            let cell = Arc::new(Cell::new(WatchId(i), 0, Duration::from_secs(45)));
            t.insert(cell.clone(), Box::new(|_| {}));
            t.remove(&cell);
        }
        assert!(t.queued() <= 4096 + 1, "{} stale items kept", t.queued());
        assert_eq!(t.callbacks.len(), 1, "slots are reused");
        assert_eq!(t.len(), 0);
    }

    #[test]
    fn expiry_order_follows_deadlines_and_callbacks_run_once() {
        let mut t = WatchTable::default();
        let order = Arc::new(Mutex::new(Vec::new()));
        for (i, ms) in [(1u64, 300u64), (2, 100), (3, 200)] {
            let o = order.clone();
            let cell = Arc::new(Cell::new(WatchId(i), 0, Duration::from_millis(ms)));
            t.insert(cell, Box::new(move |e| o.lock().push(e.id)));
        }
        assert_eq!(run(&mut t, 1000 * MS), 3);
        assert_eq!(run(&mut t, 2000 * MS), 0);
        let got: Vec<u64> = order.lock().iter().map(|i| i.get()).collect();
        assert_eq!(got, [2, 3, 1]);
    }
}
