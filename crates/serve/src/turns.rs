//! Turns as the server keeps them: each turn's events, numbered from 1,
//! held while it runs and for a while after it ends, so a client that lost
//! its connection re-attaches with `Last-Event-ID` and misses nothing.
//!
//! On a cluster node with a [`TurnStore`] every event is stored before any
//! client sees it (the events that arrive while a write is in flight go in
//! the next one: one write per batch, not per event). A client can only
//! have seen stored events, so the node that re-delivers the turn after
//! this one died numbers on from the last stored one.

//!
//! One file per job: [`log`] a turn's events and its clients (the
//! backpressure a slow client puts on the turn), this file the registry of
//! turns and their idempotency claims, `pump` copying a turn's events into
//! its log (through the store first, retrying it), `held` what a stopped
//! turn had and could not store, `encode` the events as clients see them.

mod encode;
mod held;
pub(crate) mod log;
mod pump;
mod redelivered;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use warden_core::cluster::{Arrival, Placement};
use warden_core::store::turn_event::AttemptFailed;
use warden_core::store::{
    StoredEvent as ServeEvent, StoredTurn, TurnAsked, TurnEventData as Data, TurnStore,
    TurnStoreError,
};
use warden_core::{ContinueFrom, RecoveredTurn, SessionKey, TurnHandle};

use held::HeldTurns;
pub(crate) use log::{Reader, TurnLog};
use pump::{open, pump};

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
    /// What turns stopped here had and could not store, for their
    /// sessions' return.
    held: HeldTurns,
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

impl Turns {
    pub(crate) fn new(store: Option<Arc<dyn TurnStore>>, slow_reader_grace: Duration) -> Self {
        Self {
            map: Mutex::default(),
            by_message: Mutex::default(),
            registered: tokio::sync::Notify::new(),
            claims: Arc::default(),
            store,
            held: HeldTurns::default(),
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
            let mut turns = store.recent(key, limit).await?;
            // The trace each ran in, where this process knows it.
            for t in &mut turns {
                if let Some(log) = self.get(&t.id) {
                    let live = asked_of(&log);
                    (t.asked.trace_id, t.asked.trace_ids) = (live.trace_id, live.trace_ids);
                }
            }
            return Ok(turns);
        }
        let mut turns: Vec<StoredTurn> = self
            .lock()
            .iter()
            .filter(|(_, log)| &log.key == key)
            .map(|(id, log)| {
                let last: Vec<ServeEvent> = log.lock().last().cloned().into_iter().collect();
                let ended = log.changed.borrow().1;
                StoredTurn::new(id.clone(), key.clone(), log.canceller.turn(), last, ended)
                    .with_asked(asked_of(log))
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
            return Ok(Some(turn.with_asked(asked_of(&log))));
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
        // Re-delivered after its session stopped (a recovered turn has
        // the port).
        let redelivery = continue_from.is_some();
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
        // What this node had of the turn and could not store when it gave
        // the session up (a database outage): stored first, so the
        // upstream is not asked for it again.
        let held = stored.as_ref().and_then(|t| {
            let stored_last = t.events.last().map_or(0, |e| e.id);
            self.held.take(&t.id, stored_last).filter(|_| !t.ended)
        });
        let complete = held.as_ref().is_some_and(|h| h.complete);
        let mut first: Vec<ServeEvent> = held.map(|h| h.events).unwrap_or_default();
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
            && let Some(last) = first.last().or(t.events.last()).cloned()
        {
            // An earlier node began it and died (or this one stopped it).
            // The text its clients have of the broken attempt is continued
            // if the session can (its source continues replies), else they
            // discard it, as after any retry; a reply the upstream had
            // finished is said to be whole.
            let (kept, attempt) = kept_text(t.events.iter().chain(&first));
            let continued = match (continue_from, kept) {
                (Some(port), Some(text)) => {
                    let broken = u32::try_from(attempt).unwrap_or(u32::MAX);
                    let c = warden_core::Continuation::new(text, broken).with_complete(complete);
                    port.offer(c)
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
            first.push(ServeEvent::new(last.id + 1, failed));
        }
        if let Some(t) = stored.as_ref().filter(|t| redelivery && !t.ended) {
            redelivered::say(t, &first, &turn, arrival, node);
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
                let held = persist.is_some().then_some(&turns.held);
                pump(
                    turn,
                    &log,
                    persist.as_deref(),
                    &turn_id,
                    first,
                    prior_attempts,
                    held,
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
fn kept_text<'a>(events: impl IntoIterator<Item = &'a ServeEvent>) -> (Option<String>, u64) {
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

/// What `log`'s turn was asked, in the trace where it runs: its own (each
/// turn is a trace), known once it started, in place of the session's
/// trace stored when it was accepted.
fn asked_of(log: &TurnLog) -> TurnAsked {
    let mut asked = log.asked.clone();
    if let Some(trace) = log.canceller.trace_id() {
        asked.trace_id = Some(trace);
        asked.trace_ids = log.canceller.trace_ids();
    }
    asked
}
