//! A turn's log: its events, numbered from 1, and the clients attached to
//! it. A client that falls more than [`READER_WINDOW`] events or
//! [`READER_WINDOW_BYTES`] of text behind holds the turn back
//! (backpressure to its source), for at most the server's slow-client
//! grace; then its stream ends and it re-attaches.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::watch;
use warden_core::store::{StoredEvent as ServeEvent, TurnAsked, TurnEventData};
use warden_core::{SessionKey, TurnCanceller};

/// How far (in events) the slowest attached client may fall behind a
/// running turn's log before the turn stops reading its source — the
/// source is then paused by TCP backpressure, as `warden stream` pauses it
/// for a slow terminal.
pub(crate) const READER_WINDOW: u64 = 1024;

/// The same window in bytes of event text ([`event_bytes`]): an upstream
/// that sends large deltas fills it long before [`READER_WINDOW`] events
/// (8 KiB deltas: 8 MiB, and ~5 times that in memory), so what a client
/// that stops reading costs does not grow with the size of the deltas.
pub(crate) const READER_WINDOW_BYTES: u64 = 256 * 1024;

/// At most this many events are handed to a client's stream at once (its
/// copy of the log stays small however far behind it is)...
const READ_BATCH: usize = 256;

/// ...and at most this many bytes of them (at least one event).
const READ_BATCH_BYTES: u64 = 64 * 1024;

/// What an event weighs in the windows above: its text, and a fixed 64
/// bytes for the rest (every other field is small and bounded).
fn event_bytes(e: &ServeEvent) -> u64 {
    let text = match &e.data {
        TurnEventData::Text(d) | TurnEventData::Thinking(d) => d.text.len(),
        _ => 0,
    };
    64 + text as u64
}

/// `events` numbered as in the log, with the bytes before each
/// ([`event_bytes`]) and their total last: `sizes[i]` is what precedes
/// `events[i]`.
fn running_sizes(events: &[ServeEvent]) -> Vec<u64> {
    let mut sizes = Vec::with_capacity(events.len() + 1);
    let mut total = 0;
    sizes.push(0);
    for e in events {
        total += event_bytes(e);
        sizes.push(total);
    }
    sizes
}

/// A turn's log: its events and whether it has ended.
#[derive(Debug)]
pub(crate) struct TurnLog {
    pub(crate) key: SessionKey,
    /// The fingerprint of the request that sent it (with an idempotency
    /// key: [`StoredTurn::fingerprint`]), if known.
    pub(crate) fingerprint: Option<String>,
    /// What it was asked ([`StoredTurn::asked`]).
    pub(crate) asked: TurnAsked,
    events: Mutex<Vec<ServeEvent>>,
    /// The bytes of the events before each ([`running_sizes`]): taken
    /// after `events` when both are locked.
    sizes: Mutex<Vec<u64>>,
    /// The number of events so far; `ended` once the last one is in (or
    /// the turn moved to another node: no more events here).
    pub(super) changed: watch::Sender<(usize, bool)>,
    pub(super) canceller: TurnCanceller,
    /// The clients attached: the last event each has taken.
    readers: Mutex<Readers>,
    /// Woken when a client takes events or leaves.
    progress: tokio::sync::Notify,
    /// How long the turn waits on a client that stays more than
    /// [`READER_WINDOW`] events behind. Past it the client's event stream
    /// ends (it re-attaches with `Last-Event-ID` and misses nothing: the
    /// log keeps every event) and the turn reads on: a stalled or hostile
    /// client cannot hold a turn for ever.
    slow_reader_grace: Duration,
}

/// The clients attached to a log.
#[derive(Debug, Default)]
struct Readers {
    next: u64,
    /// Reader → the last event id it has taken.
    seen: HashMap<u64, u64>,
    /// Readers cut loose for lagging too long; their streams end.
    detached: std::collections::HashSet<u64>,
}

/// One client attached to a [`TurnLog`]; leaves it when dropped.
#[derive(Debug)]
pub(crate) struct Reader {
    log: Arc<TurnLog>,
    id: u64,
}

impl Reader {
    /// Events after `seen` (at most [`READ_BATCH`]) and whether the turn
    /// has ended with the last of them; waits while there are none.
    /// `None` when this client was cut loose for lagging (it re-attaches).
    pub(crate) async fn after(&self, seen: u64) -> Option<(Vec<ServeEvent>, bool)> {
        loop {
            // Subscribed before looking: an event published after the look
            // still wakes this reader.
            let mut changed = self.log.changed.subscribe();
            {
                let mut readers = self.log.readers.lock();
                if readers.detached.contains(&self.id) {
                    return None;
                }
                readers.seen.insert(self.id, seen);
            }
            self.log.progress.notify_waiters();
            let (batch, ended) = self.log.after(seen);
            if batch.is_empty() && !ended {
                // A new event, the end, or this reader cut loose.
                let _ = changed.changed().await;
                continue;
            }
            return Some((batch, ended));
        }
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        let mut readers = self.log.readers.lock();
        readers.seen.remove(&self.id);
        readers.detached.remove(&self.id);
        drop(readers);
        self.log.progress.notify_waiters();
    }
}

impl TurnLog {
    pub(super) fn new(
        key: SessionKey,
        fingerprint: Option<String>,
        asked: TurnAsked,
        canceller: TurnCanceller,
        events: Vec<ServeEvent>,
        slow_reader_grace: Duration,
    ) -> Self {
        let (changed, _) = watch::channel((events.len(), false));
        Self {
            key,
            fingerprint,
            asked,
            sizes: Mutex::new(running_sizes(&events)),
            events: Mutex::new(events),
            changed,
            canceller,
            readers: Mutex::default(),
            progress: tokio::sync::Notify::new(),
            slow_reader_grace,
        }
    }

    /// Attaches a client that has seen the events up to `seen`.
    pub(crate) fn reader(self: &Arc<Self>, seen: u64) -> Reader {
        let mut readers = self.readers.lock();
        let id = readers.next;
        readers.next += 1;
        readers.seen.insert(id, seen);
        Reader {
            log: Arc::clone(self),
            id,
        }
    }

    /// The attached clients more than [`READER_WINDOW`] events or
    /// [`READER_WINDOW_BYTES`] behind.
    fn lagging(&self) -> Vec<u64> {
        let events = self.lock();
        let sizes = self.sizes.lock();
        let last = events.last().map_or(0, |e| e.id);
        let total = sizes.last().copied().unwrap_or(0);
        let behind = |seen: u64| {
            let from = events.partition_point(|e| e.id <= seen);
            last.saturating_sub(seen) > READER_WINDOW
                || total - sizes.get(from).copied().unwrap_or(total) > READER_WINDOW_BYTES
        };
        self.readers
            .lock()
            .seen
            .iter()
            .filter(|&(_, &seen)| behind(seen))
            .map(|(&id, _)| id)
            .collect()
    }

    /// Waits while an attached client is more than [`READER_WINDOW`]
    /// events behind, at most its `slow_reader_grace`; then cuts the
    /// laggards loose (their streams end; they re-attach).
    pub(super) async fn wait_for_readers(&self) {
        let deadline = tokio::time::Instant::now() + self.slow_reader_grace;
        loop {
            let progressed = self.progress.notified();
            tokio::pin!(progressed);
            progressed.as_mut().enable();
            let lagging = self.lagging();
            if lagging.is_empty() {
                return;
            }
            if tokio::time::timeout_at(deadline, progressed).await.is_err() {
                tracing::warn!(
                    session = %self.key, clients = lagging.len(),
                    "clients too slow to follow the turn; their event streams end (they re-attach)"
                );
                let mut readers = self.readers.lock();
                for id in lagging {
                    readers.seen.remove(&id);
                    readers.detached.insert(id);
                }
                drop(readers);
                // Wakes the detached clients' streams.
                self.changed.send_modify(|_| {});
                return;
            }
        }
    }

    pub(super) fn lock(&self) -> parking_lot::MutexGuard<'_, Vec<ServeEvent>> {
        self.events.lock()
    }

    /// The next event's number.
    pub(super) fn next_id(&self) -> u64 {
        self.lock().last().map_or(1, |e| e.id + 1)
    }

    /// Makes `batch` visible to clients; `ended` if the turn ends here.
    pub(super) fn publish(&self, batch: Vec<ServeEvent>, ended: bool) {
        let n = {
            let mut events = self.lock();
            let mut sizes = self.sizes.lock();
            let mut total = sizes.last().copied().unwrap_or(0);
            for e in &batch {
                total += event_bytes(e);
                sizes.push(total);
            }
            events.extend(batch);
            events.len()
        };
        self.changed.send_replace((n, ended));
    }

    /// Events after `after` (at most [`READ_BATCH`] and
    /// [`READ_BATCH_BYTES`], at least one), and whether the turn has ended
    /// with the last of them.
    fn after(&self, after: u64) -> (Vec<ServeEvent>, bool) {
        let ended = self.changed.borrow().1;
        let events = self.lock();
        let sizes = self.sizes.lock();
        let from = events.partition_point(|e| e.id <= after);
        let within = sizes[from..].partition_point(|&s| s - sizes[from] <= READ_BATCH_BYTES);
        let to = events
            .len()
            .min(from + READ_BATCH)
            .min(from + within.saturating_sub(1).max(1));
        // `ended` holds once the last event is in this batch.
        (events[from..to].to_vec(), ended && to == events.len())
    }

    /// Cancels the turn; whether it was still pending or running.
    pub(crate) async fn cancel(&self) -> Result<bool, warden_core::ActorError> {
        self.canceller.cancel().await
    }
}
