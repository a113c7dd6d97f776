//! Turns as the server keeps them: each turn's events, numbered from 1,
//! held while it runs and for a while after it ends, so a client that lost
//! its connection re-attaches with `Last-Event-ID` and misses nothing.
//!
//! On a cluster node with a [`TurnStore`] every event is stored before any
//! client sees it (the events that arrive while a write is in flight go in
//! the next one: one write per batch, not per event). A client can only
//! have seen stored events, so the node that re-delivers the turn after
//! this one died numbers on from the last stored one.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use futures_util::FutureExt as _;
use tokio::sync::watch;
use warden_core::cluster::{Arrival, Placement};
use warden_core::store::turn_event::{
    AttemptFailed, ContextFill, Delta, Done, Failed, Queued, Restarting, Started, Tool, ToolState,
};
use warden_core::store::{
    StoredEvent as ServeEvent, StoredTurn, TurnAsked, TurnEventData as Data, TurnStore,
    TurnStoreError,
};
use warden_core::{
    AgentEvent, ContinueFrom, RecoveredTurn, RetryPolicy, SessionKey, TurnCanceller, TurnError,
    TurnEvent, TurnHandle, TurnSummary,
};

/// How far (in events) the slowest attached client may fall behind a
/// running turn's log before the turn stops reading its source — the
/// source is then paused by TCP backpressure, as `warden stream` pauses it
/// for a slow terminal.
pub(crate) const READER_WINDOW: u64 = 1024;

/// At most this many events are handed to a client's stream at once (its
/// copy of the log stays small however far behind it is).
const READ_BATCH: usize = 256;

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
    /// The number of events so far; `ended` once the last one is in (or
    /// the turn moved to another node: no more events here).
    changed: watch::Sender<(usize, bool)>,
    canceller: TurnCanceller,
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
    fn new(
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

    /// The attached clients more than [`READER_WINDOW`] events behind.
    fn lagging(&self) -> Vec<u64> {
        let last = self.lock().last().map_or(0, |e| e.id);
        self.readers
            .lock()
            .seen
            .iter()
            .filter(|&(_, &seen)| last.saturating_sub(seen) > READER_WINDOW)
            .map(|(&id, _)| id)
            .collect()
    }

    /// Waits while an attached client is more than [`READER_WINDOW`]
    /// events behind, at most its `slow_reader_grace`; then cuts the
    /// laggards loose (their streams end; they re-attach).
    async fn wait_for_readers(&self) {
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

    fn lock(&self) -> parking_lot::MutexGuard<'_, Vec<ServeEvent>> {
        self.events.lock()
    }

    /// The next event's number.
    fn next_id(&self) -> u64 {
        self.lock().last().map_or(1, |e| e.id + 1)
    }

    /// Makes `batch` visible to clients; `ended` if the turn ends here.
    fn publish(&self, batch: Vec<ServeEvent>, ended: bool) {
        let n = {
            let mut events = self.lock();
            events.extend(batch);
            events.len()
        };
        self.changed.send_replace((n, ended));
    }

    /// Events after `after` (at most [`READ_BATCH`]), and whether the
    /// turn has ended with the last of them.
    fn after(&self, after: u64) -> (Vec<ServeEvent>, bool) {
        let ended = self.changed.borrow().1;
        let events = self.lock();
        let from = events.partition_point(|e| e.id <= after);
        let to = events.len().min(from + READ_BATCH);
        // `ended` holds once the last event is in this batch.
        (events[from..to].to_vec(), ended && to == events.len())
    }

    /// Cancels the turn; whether it was still pending or running.
    pub(crate) async fn cancel(&self) -> Result<bool, warden_core::ActorError> {
        self.canceller.cancel().await
    }
}

/// Every turn the server knows, by id.
pub(crate) struct Turns {
    map: Mutex<HashMap<String, Arc<TurnLog>>>,
    /// Each kept turn's id by its session and message id (its number in
    /// lifecycle events and session views).
    by_message: Mutex<HashMap<(SessionKey, u64), String>>,
    /// Woken when a turn is registered ([`Turns::id_within`]).
    registered: tokio::sync::Notify,
    /// Turn ids a request is deciding about now ([`Turns::claim`]).
    claims: Arc<Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>>,
    /// Where the events are stored first, on a cluster node.
    pub(crate) store: Option<Arc<dyn TurnStore>>,
    /// [`ServeConfig::slow_client_grace`](crate::ServeConfig).
    slow_reader_grace: Duration,
}

impl std::fmt::Debug for Turns {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Turns")
            .field("store", &self.store.is_some())
            .finish_non_exhaustive()
    }
}

/// How a failing turn store is retried: 50 ms doubling to 2 s, jittered
/// (the nodes of a cluster do not retry in step); opening a turn's log is
/// tried 5 times, then the turn is relayed from memory only. Appending is
/// retried until the store answers or says the session moved: an event is
/// never shown before it is stored, and a node that cannot reach its
/// database loses its leases within their TTL (`Moved`), which ends it.
fn store_retry() -> RetryPolicy {
    RetryPolicy::default()
        .with_backoff(Duration::from_millis(50), Duration::from_secs(2))
        .with_max_attempts(5)
}

/// Retries of a batch of a running turn's events: about a minute of
/// attempts (50 ms doubling to 2 s, jittered). A store down that long has
/// cost this node its leases (a lease lasts seconds), so the session is
/// being stopped here anyway and another node re-delivers the turn; the log
/// then ends here as if the session had moved, instead of waiting for ever.
fn append_retry() -> RetryPolicy {
    store_retry().with_max_attempts(32)
}

impl Turns {
    pub(crate) fn new(store: Option<Arc<dyn TurnStore>>, slow_reader_grace: Duration) -> Self {
        Self {
            map: Mutex::default(),
            by_message: Mutex::default(),
            registered: tokio::sync::Notify::new(),
            claims: Arc::default(),
            store,
            slow_reader_grace,
        }
    }

    fn lock(&self) -> parking_lot::MutexGuard<'_, HashMap<String, Arc<TurnLog>>> {
        self.map.lock()
    }

    pub(crate) fn get(&self, id: &str) -> Option<Arc<TurnLog>> {
        self.lock().get(id).cloned()
    }

    /// The id of the turn answering message `message_id` of `key`, while
    /// this process keeps it.
    pub(crate) fn id_of(&self, key: &SessionKey, message_id: u64) -> Option<String> {
        self.by_message
            .lock()
            .get(&(key.clone(), message_id))
            .cloned()
    }

    /// [`id_of`](Self::id_of), waiting up to `wait` for the turn to be
    /// registered: a session announces a turn as soon as its message is
    /// stored, a moment before this process has opened the turn's log.
    pub(crate) async fn id_within(
        &self,
        key: &SessionKey,
        message_id: u64,
        wait: Duration,
    ) -> Option<String> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let registered = self.registered.notified();
            tokio::pin!(registered);
            registered.as_mut().enable();
            if let Some(id) = self.id_of(key, message_id) {
                return Some(id);
            }
            if tokio::time::timeout_at(deadline, registered).await.is_err() {
                return None;
            }
        }
    }

    /// Waits until no other request holds turn id `id`, and holds it until
    /// the claim is dropped: two requests with one idempotency key decide
    /// one after the other whether its turn exists.
    pub(crate) async fn claim(&self, id: &str) -> Claim {
        let lock = self.claims.lock().entry(id.to_owned()).or_default().clone();
        Claim {
            guard: Some(lock.lock_owned().await),
            claims: Arc::clone(&self.claims),
            id: id.to_owned(),
        }
    }

    /// The newest `limit` turns of `key` still kept, newest first, each
    /// with its last event only: from the store when there is one (it has
    /// them all, on any node), else from this process.
    pub(crate) async fn recent(
        &self,
        key: &SessionKey,
        limit: usize,
    ) -> Result<Vec<StoredTurn>, TurnStoreError> {
        if let Some(store) = &self.store {
            return store.recent(key, limit).await;
        }
        let mut turns: Vec<StoredTurn> = self
            .lock()
            .iter()
            .filter(|(_, log)| &log.key == key)
            .map(|(id, log)| {
                let last: Vec<ServeEvent> = log.lock().last().cloned().into_iter().collect();
                let ended = log.changed.borrow().1;
                StoredTurn::new(id.clone(), key.clone(), log.canceller.turn(), last, ended)
                    .with_asked(log.asked.clone())
            })
            .collect();
        turns.sort_by_key(|t| std::cmp::Reverse(t.message_id));
        turns.truncate(limit);
        Ok(turns)
    }

    /// Turn `id` as kept here (its last event only), or from the store.
    pub(crate) async fn one(&self, id: &str) -> Result<Option<StoredTurn>, TurnStoreError> {
        if let Some(log) = self.get(id) {
            let last: Vec<ServeEvent> = log.lock().last().cloned().into_iter().collect();
            let ended = log.changed.borrow().1;
            let turn = StoredTurn::new(id, log.key.clone(), log.canceller.turn(), last, ended);
            return Ok(Some(turn.with_asked(log.asked.clone())));
        }
        let Some(store) = &self.store else {
            return Ok(None);
        };
        let Some(mut turn) = store.read(id, 0).await? else {
            return Ok(None);
        };
        turn.events.drain(..turn.events.len().saturating_sub(1));
        Ok(Some(turn))
    }

    /// Registers `turn` of session `key` under `named` (the id its
    /// idempotency key names, and its request's fingerprint) or a new id
    /// (or, with a store, the id its message already has) and starts
    /// pumping its events into its log; the log is forgotten `keep` after
    /// the turn ends. A recovered turn comes with its `continue_from`
    /// port: the text an earlier node streamed of it is offered there.
    pub(crate) async fn start(
        self: &Arc<Self>,
        key: SessionKey,
        turn: TurnHandle,
        keep: Duration,
        node: Option<&str>,
        opening: Opening,
    ) -> String {
        let Opening {
            named,
            continue_from,
            asked,
            arrival,
        } = opening;
        let (fresh, fingerprint) = match named {
            Some(Named { id, fingerprint }) => (id, fingerprint),
            None => (crate::ids::turn_id(node), None),
        };
        let message_id = turn.canceller().turn();
        let stored = match &self.store {
            Some(store) => {
                let fp = fingerprint.as_deref();
                open(store.as_ref(), &key, message_id, &fresh, fp, &asked).await
            }
            None => None,
        };
        // A stored turn's fingerprint is its first request's.
        let (id, events, fingerprint, asked) = match &stored {
            Some(t) => (
                t.id.clone(),
                t.events.clone(),
                t.fingerprint.clone(),
                t.asked.clone(),
            ),
            None => (fresh, Vec::new(), fingerprint, asked),
        };
        let log = Arc::new(TurnLog::new(
            key.clone(),
            fingerprint,
            asked,
            turn.canceller(),
            events,
            self.slow_reader_grace,
        ));
        let mut marker = None;
        // Attempts an earlier node made of this turn: this node's attempts
        // are numbered on from them, so `done.attempts` counts them all.
        let mut prior_attempts = 0;
        if let Some(t) = &stored
            && t.ended
        {
            // Its last event is stored: the message was answered by a node
            // that died before it could say so. Not run a second time.
            log.publish(Vec::new(), true);
            let canceller = turn.canceller();
            tokio::spawn(async move {
                let _ = canceller.cancel().await;
            });
        } else if let Some(t) = &stored
            && let Some(last) = t.events.last()
        {
            // An earlier node began it and died. The text its clients have
            // of the broken attempt is continued if the session can (its
            // source continues replies), else they discard it, as after
            // any retry.
            let (kept, attempt) = kept_text(&t.events);
            let continued = match (continue_from, kept) {
                (Some(port), Some(text)) => {
                    let broken = u32::try_from(attempt).unwrap_or(u32::MAX);
                    port.offer(warden_core::Continuation::new(text, broken))
                }
                _ => false,
            };
            // One code per cause: a node lost, a drain, a database outage.
            let code = arrival.unwrap_or(Arrival::NodeLost).code();
            let failed = |discard| AttemptFailed::new(attempt, 0, code, discard);
            let failed = match continued {
                // The session numbers the continuation on from the broken
                // attempt itself.
                true => Data::Continuing(failed(false)),
                // A fresh run starts at attempt 1 here: number it on.
                false => {
                    prior_attempts = attempt;
                    Data::Retrying(failed(true))
                }
            };
            let failed = match (failed, node) {
                (Data::Continuing(f), Some(n)) => Data::Continuing(f.on_node(n)),
                (Data::Retrying(f), Some(n)) => Data::Retrying(f.on_node(n)),
                (other, _) => other,
            };
            // Stored with the first batch, sent before the new attempt.
            marker = Some(ServeEvent::new(last.id + 1, failed));
        }
        self.lock().insert(id.clone(), log.clone());
        self.by_message
            .lock()
            .insert((key.clone(), message_id), id.clone());
        self.registered.notify_waiters();
        let turns = Arc::clone(self);
        let forget = id.clone();
        let persist = stored.is_some().then(|| self.store.clone()).flatten();
        let turn_id = id.clone();
        tokio::spawn(async move {
            if !log.changed.borrow().1 {
                pump(
                    turn,
                    &log,
                    persist.as_deref(),
                    &turn_id,
                    marker,
                    prior_attempts,
                )
                .await;
            }
            if log.changed.borrow().1 && log.lock().last().is_some_and(ServeEvent::is_last) {
                tokio::time::sleep(keep).await;
            }
            // Ended here, or moved elsewhere: its store (if any) serves it.
            let mut map = turns.lock();
            if map.get(&forget).is_some_and(|l| Arc::ptr_eq(l, &log)) {
                map.remove(&forget);
                let mut ids = turns.by_message.lock();
                let entry = (log.key.clone(), message_id);
                if ids.get(&entry) == Some(&forget) {
                    ids.remove(&entry);
                }
            }
        });
        id
    }

    /// Takes the turns a session re-delivers (their callers are gone) and
    /// relays them like new ones, until `rx` closes.
    pub(crate) fn adopt(
        self: &Arc<Self>,
        mut rx: tokio::sync::mpsc::UnboundedReceiver<RecoveredTurn>,
        keep: Duration,
        node: Option<String>,
        placement: Option<Arc<dyn Placement>>,
    ) {
        let turns = Arc::clone(self);
        tokio::spawn(async move {
            while let Some(turn) = rx.recv().await {
                let RecoveredTurn {
                    key,
                    message_id,
                    idempotency_key,
                    handle,
                    continue_from,
                    ..
                } = turn;
                // Under the id its key names, as when it was sent: a client
                // retrying its request finds it. Its request's fingerprint
                // is the one its stored log has (none if the crash came
                // before the log was opened: unknown).
                let named = idempotency_key.as_deref().map(|k| Named {
                    id: crate::ids::idempotent_turn_id(&key, k),
                    fingerprint: None,
                });
                // Why the session came here, for the marker of a turn an
                // earlier node began.
                let arrival = match &placement {
                    Some(p) => p.arrival(&key).await,
                    None => None,
                };
                let id = turns
                    .start(
                        key.clone(),
                        handle,
                        keep,
                        node.as_deref(),
                        Opening {
                            named,
                            continue_from: Some(continue_from),
                            // Its stored log keeps what the first request asked.
                            asked: TurnAsked::default(),
                            arrival,
                        },
                    )
                    .await;
                tracing::info!(session = %key, turn = %id, message = message_id, "relaying a re-delivered turn");
            }
        });
    }
}

/// The id a turn's idempotency key names, and the fingerprint of the
/// request that sent it ([`StoredTurn::fingerprint`]; `None`: unknown).
pub(crate) struct Named {
    pub(crate) id: String,
    pub(crate) fingerprint: Option<String>,
}

/// How a turn is opened ([`Turns::start`]): the id its idempotency key
/// names, the port a recovered turn's earlier text is offered on, and what
/// it was asked.
#[derive(Default)]
pub(crate) struct Opening {
    pub(crate) named: Option<Named>,
    pub(crate) continue_from: Option<ContinueFrom>,
    pub(crate) asked: TurnAsked,
    /// For a re-delivered turn: why its session came to this node (the
    /// code of its `continuing` or `retrying` marker); `None`: unknown,
    /// `ENODE_LOST`.
    pub(crate) arrival: Option<Arrival>,
}

/// A request's hold on a turn id ([`Turns::claim`]), let go when dropped.
pub(crate) struct Claim {
    guard: Option<tokio::sync::OwnedMutexGuard<()>>,
    claims: Arc<Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>>,
    id: String,
}

impl Drop for Claim {
    fn drop(&mut self) {
        self.guard.take();
        let mut claims = self.claims.lock();
        // Nobody else holds or waits for it (each of them holds a clone,
        // taken under this lock): forget it.
        if claims
            .get(&self.id)
            .is_some_and(|l| Arc::strong_count(l) == 1)
        {
            claims.remove(&self.id);
        }
    }
}

/// The reply text a turn's clients hold from its events — the text of the
/// attempts since the last one they were told to discard (`retrying`,
/// `restarting`), `continuing` keeping it — if the last of it is text (not
/// inside thinking or a tool call, which cannot be continued); and the
/// last attempt started.
fn kept_text(events: &[ServeEvent]) -> (Option<String>, u64) {
    let mut text = String::new();
    let mut attempt = 0;
    let mut last_is_text = false;
    for e in events {
        match &e.data {
            Data::Started(s) => attempt = s.attempt,
            Data::Retrying(_) | Data::Restarting(_) => {
                text.clear();
                last_is_text = false;
            }
            Data::Text(t) => {
                text.push_str(&t.text);
                last_is_text = true;
            }
            Data::Thinking(_) | Data::Tool(_) => last_is_text = false,
            _ => {}
        }
    }
    let kept = (last_is_text && !text.is_empty()).then_some(text);
    (kept, attempt)
}

/// Opens the turn's stored log, retrying a failing store a few times;
/// `None` when it cannot (the turn is then relayed from memory only).
async fn open(
    store: &dyn TurnStore,
    key: &SessionKey,
    message_id: u64,
    id: &str,
    fingerprint: Option<&str>,
    asked: &TurnAsked,
) -> Option<StoredTurn> {
    let policy = store_retry();
    for attempt in 1..=policy.max_attempts {
        match store.open(key, message_id, id, fingerprint, asked).await {
            Ok(t) => return Some(t),
            Err(TurnStoreError::Moved(why)) => {
                tracing::info!(session = %key, %why, "this node no longer holds the session's lease: its turn is not stored here");
                return None;
            }
            Err(why) => {
                // An outage: the node's heartbeat warns of it once.
                tracing::debug!(session = %key, %why, "cannot store the turn; retrying");
                if attempt < policy.max_attempts {
                    let delay = policy.jittered_delay(attempt, &mut rand::rng());
                    tokio::time::sleep(delay).await;
                }
            }
        }
    }
    tracing::warn!(session = %key, turn = id, "the turn is kept in this node's memory only");
    None
}

/// Copies the turn's events into its log until it finishes: with a store,
/// each batch is stored before it is published; a session that moved away
/// (its lease lost, or it stopped here with the message still pending) ends
/// the log here without a last event, for the node that re-delivers it.
async fn pump(
    mut turn: TurnHandle,
    log: &TurnLog,
    store: Option<&dyn TurnStore>,
    id: &str,
    marker: Option<ServeEvent>,
    prior_attempts: u64,
) {
    let mut staged: Vec<ServeEvent> = marker.into_iter().collect();
    loop {
        // Backpressure: while a client lags too far, the turn's events are
        // not read, so its source is not either.
        log.wait_for_readers().await;
        let Some(first) = turn.recv().await else {
            // Only after `Finished`, which ends this loop: never here, but
            // a log left open would hold its clients forever.
            log.publish(Vec::new(), true);
            return;
        };
        let mut events = vec![first];
        // Everything already waiting joins this batch.
        while !matches!(events.last(), Some(TurnEvent::Finished(_))) {
            match turn.recv().now_or_never() {
                Some(Some(e)) => events.push(e),
                _ => break,
            }
        }
        let mut last = false;
        let mut moved = false;
        for event in events {
            if store.is_some()
                && matches!(
                    event,
                    TurnEvent::Finished(Err(TurnError::SessionStopped { .. }))
                )
            {
                // Stopped here with its message still pending: another
                // node (or this one, later) re-delivers it under this id.
                moved = true;
                break;
            }
            if let Some(mut data) = describe(event) {
                data.number_on(prior_attempts);
                last |= data.kind().is_last();
                let next = staged.last().map_or_else(|| log.next_id(), |e| e.id + 1);
                staged.push(ServeEvent::new(next, data));
            }
        }
        if !staged.is_empty() || last {
            if let Some(store) = store
                && !store_batch(store, &log.key, id, &staged, last).await
            {
                moved = true;
            }
            if !moved {
                log.publish(std::mem::take(&mut staged), last);
            }
        }
        if moved {
            log.publish(Vec::new(), true);
            return;
        }
        if last {
            return;
        }
    }
}

/// Stores a batch, retrying a failing store ([`append_retry`]); `false` if
/// the session moved, or the store kept failing past the retries.
async fn store_batch(
    store: &dyn TurnStore,
    key: &SessionKey,
    id: &str,
    batch: &[ServeEvent],
    last: bool,
) -> bool {
    let policy = append_retry();
    for attempt in 1..=policy.max_attempts {
        match store.append(key, id, batch, last).await {
            Ok(()) => return true,
            Err(TurnStoreError::Moved(why)) => {
                // Taken by another node, or given up here in an outage:
                // either way it stops here, and is not "moved" until a node
                // takes it.
                tracing::info!(session = %key, turn = id, %why, "this node no longer holds the session's lease: the turn stops here and is re-delivered by the session's next node");
                return false;
            }
            Err(why) if attempt < policy.max_attempts => {
                // An outage: the node's heartbeat warns of it once.
                tracing::debug!(session = %key, turn = id, %why, "cannot store the turn's events; retrying");
                let delay = policy.jittered_delay(attempt, &mut rand::rng());
                tokio::time::sleep(delay).await;
            }
            Err(why) => {
                // A long outage: expected, and the turn is re-delivered.
                tracing::warn!(
                    session = %key, turn = id, %why, attempts = attempt,
                    "cannot store the turn's events; giving up: its stream ends here and the node that runs the session next re-delivers it"
                );
            }
        }
    }
    false
}

/// The event as clients see it; `None` for events not sent to them (usage
/// reports, keep-alive-like ones).
fn describe(event: TurnEvent) -> Option<Data> {
    let failed =
        |failed: warden_core::AttemptId, delay, error: &warden_core::StreamError, discard| {
            AttemptFailed::new(
                u64::from(failed.attempt),
                millis(delay),
                error.code(),
                discard,
            )
        };
    let discard = event.discards_shown_text();
    Some(match event {
        TurnEvent::Waiting { behind } => Data::Queued(Queued::new(1, Some(behind as u64))),
        TurnEvent::Queued(a) => Data::Queued(Queued::new(u64::from(a.attempt), None)),
        TurnEvent::Started(a) => Data::Started(Started::new(u64::from(a.attempt))),
        TurnEvent::Event(AgentEvent::TextDelta(t)) => Data::Text(Delta::new(t)),
        TurnEvent::Event(AgentEvent::ThinkingDelta(t)) => Data::Thinking(Delta::new(t)),
        TurnEvent::Event(AgentEvent::ToolUseStarted { id, name }) => {
            Data::Tool(Tool::new(id, Some(name), ToolState::Started))
        }
        TurnEvent::Event(AgentEvent::ToolUseFinished { id }) => {
            Data::Tool(Tool::new(id, None, ToolState::Finished))
        }
        TurnEvent::Retrying {
            failed: f,
            delay,
            error,
        } => Data::Retrying(failed(f, delay, &error, discard)),
        TurnEvent::Continuing {
            failed: f,
            delay,
            error,
        } => Data::Continuing(failed(f, delay, &error, discard)),
        TurnEvent::Restarting { cause } => Data::Restarting(Restarting::new(cause.as_str())),
        TurnEvent::Finished(Ok(summary)) => Data::Done(done(&summary)),
        TurnEvent::Finished(Err(error)) => Data::Error(failure(&error)),
        _ => return None,
    })
}

fn done(s: &TurnSummary) -> Done {
    let context = s
        .context
        .map(|c| ContextFill::new(c.tokens, c.window, u64::from(c.percent)));
    Done::new(
        s.turn,
        s.text.clone(),
        u64::from(s.attempts),
        u64::from(s.continuations),
    )
    .with_usage(context, s.usage.map(|u| u.output_tokens))
}

/// An error event: the code, the message and the exit-code class the CLI
/// uses for it (`warden chat`: 4 timeout, 5 unavailable, 3 API, 6 deferred
/// — the message stays pending and is answered later, do not re-send it —
/// 130 cancelled, 1 otherwise).
fn failure(e: &TurnError) -> Failed {
    let exit = match e {
        TurnError::Cancelled => 130,
        TurnError::SessionStopped { .. } => 6,
        TurnError::DeadlineExceeded { .. } => 4,
        TurnError::ReplyTooLarge { .. } => 3,
        TurnError::RetriesExhausted { last, .. } | TurnError::Fatal(last) => match last {
            warden_core::StreamError::InactivityTimeout { .. }
            | warden_core::StreamError::NoProgress { .. } => 4,
            e if e.is_retryable() => 5,
            warden_core::StreamError::Internal { .. } => 1,
            _ => 3,
        },
        _ => 1,
    };
    Failed::new(e.code(), e.to_string(), exit)
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use futures_util::future::BoxFuture;
    use warden_core::store::StoredTurn;

    use super::*;

    /// A store whose appends fail (or, with `moved`, say the session moved).
    #[derive(Default)]
    struct Failing {
        appends: AtomicU32,
        moved: bool,
    }

    impl TurnStore for Failing {
        fn open<'a>(
            &'a self,
            _: &'a SessionKey,
            _: u64,
            _: &'a str,
            _: Option<&'a str>,
            _: &'a TurnAsked,
        ) -> BoxFuture<'a, Result<StoredTurn, TurnStoreError>> {
            Box::pin(async { Err(TurnStoreError::Failed("down".into())) })
        }

        fn append<'a>(
            &'a self,
            _: &'a SessionKey,
            _: &'a str,
            _: &'a [ServeEvent],
            _: bool,
        ) -> BoxFuture<'a, Result<(), TurnStoreError>> {
            self.appends.fetch_add(1, Ordering::SeqCst);
            let moved = self.moved;
            Box::pin(async move {
                Err(if moved {
                    TurnStoreError::Moved("lease lost".into())
                } else {
                    TurnStoreError::Failed("down".into())
                })
            })
        }

        fn read<'a>(
            &'a self,
            _: &'a str,
            _: u64,
        ) -> BoxFuture<'a, Result<Option<StoredTurn>, TurnStoreError>> {
            Box::pin(async { Ok(None) })
        }

        fn recent<'a>(
            &'a self,
            _: &'a SessionKey,
            _: usize,
        ) -> BoxFuture<'a, Result<Vec<StoredTurn>, TurnStoreError>> {
            Box::pin(async { Ok(Vec::new()) })
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_store_that_keeps_failing_is_given_up_after_about_a_minute() {
        let store = Failing::default();
        let key = SessionKey::new("k");
        let t0 = tokio::time::Instant::now();
        let stored = tokio::time::timeout(
            Duration::from_secs(600),
            store_batch(&store, &key, "turn_1", &[], false),
        )
        .await
        .expect("gives up rather than retrying for ever");
        assert!(!stored);
        assert_eq!(store.appends.load(Ordering::SeqCst), 32);
        let waited = t0.elapsed();
        assert!(
            waited >= Duration::from_secs(30) && waited <= Duration::from_secs(120),
            "{waited:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_moved_session_ends_the_batch_at_once() {
        let store = Failing {
            moved: true,
            ..Failing::default()
        };
        let stored = store_batch(&store, &SessionKey::new("k"), "turn_1", &[], false).await;
        assert!(!stored);
        assert_eq!(store.appends.load(Ordering::SeqCst), 1);
    }
}
