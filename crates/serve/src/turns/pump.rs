//! Copying a running turn's events into its log: with a store each batch is
//! stored before clients see it, a failing store retried
//! ([`store_retry`], [`append_retry`]); a session that moved away ends the
//! log here for the node that re-delivers the turn, and what this node had
//! of it but could not store is held for the session's return
//! ([`HeldTurns`]).

use std::time::Duration;

use futures_util::FutureExt as _;
use warden_core::store::{
    StoredEvent as ServeEvent, StoredTurn, TurnAsked, TurnStore, TurnStoreError,
};
use warden_core::{RetryPolicy, Retryable as _, SessionKey, TurnError, TurnEvent, TurnHandle};

use super::encode::describe;
use super::held::{HeldTurns, Reply};
use super::log::TurnLog;

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

/// Opens the turn's stored log, retrying a failing store a few times;
/// `None` when it cannot (the turn is then relayed from memory only).
pub(super) async fn open(
    store: &dyn TurnStore,
    key: &SessionKey,
    message_id: u64,
    id: &str,
    fingerprint: Option<&str>,
    asked: &TurnAsked,
) -> Option<StoredTurn> {
    let opened = store_retry()
        .retry_if(
            |why: &TurnStoreError| {
                let retry = why.is_retryable();
                if retry {
                    // An outage: the node's heartbeat warns of it once.
                    tracing::debug!(session = %key, %why, "cannot store the turn; retrying");
                }
                retry
            },
            || store.open(key, message_id, id, fingerprint, asked),
        )
        .await;
    match opened {
        Ok(t) => Some(t),
        Err(TurnStoreError::Moved(why)) => {
            tracing::info!(session = %key, %why, "this node no longer holds the session's lease: its turn is not stored here");
            None
        }
        Err(_) => {
            tracing::warn!(session = %key, turn = id, "the turn is kept in this node's memory only");
            None
        }
    }
}

/// Copies the turn's events into its log until it finishes: with a store,
/// each batch is stored before it is published (`first`, already numbered,
/// goes with the first batch); a session that moved away (its lease lost,
/// or it stopped here with the message still pending) ends the log here
/// without a last event, for the node that re-delivers it, and the events
/// not stored go to `held`.
pub(super) async fn pump(
    mut turn: TurnHandle,
    log: &TurnLog,
    store: Option<&dyn TurnStore>,
    id: &str,
    first: Vec<ServeEvent>,
    prior_attempts: u64,
    held: Option<&HeldTurns>,
) {
    let mut staged = first;
    let mut reply = Reply::default();
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
            reply.saw(&event);
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
        let mut stored = true;
        if !staged.is_empty() || last {
            if let Some(store) = store
                && !store_batch(store, &log.key, id, &staged, last).await
            {
                moved = true;
                stored = false;
            }
            if !moved {
                log.publish(std::mem::take(&mut staged), last);
            }
        }
        if moved {
            log.publish(Vec::new(), true);
            if let Some(held) = held {
                // The last event stored, and what was not.
                let after = match (stored, staged.first(), staged.last()) {
                    (true, _, Some(e)) => e.id,
                    (false, Some(e), _) => e.id - 1,
                    _ => log.next_id() - 1,
                };
                let unstored = if stored { Vec::new() } else { staged };
                held.keep(id, after, unstored, reply, turn, prior_attempts)
                    .await;
            }
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
    let appended = policy
        .retry_if(
            |why: &TurnStoreError| {
                let retry = why.is_retryable();
                if retry {
                    // An outage: the node's heartbeat warns of it once.
                    tracing::debug!(session = %key, turn = id, %why, "cannot store the turn's events; retrying");
                }
                retry
            },
            || store.append(key, id, batch, last),
        )
        .await;
    match appended {
        Ok(()) => true,
        Err(TurnStoreError::Moved(why)) => {
            // Taken by another node, or given up here in an outage:
            // either way it stops here, and is not "moved" until a node
            // takes it.
            tracing::info!(session = %key, turn = id, %why, "this node no longer holds the session's lease: the turn stops here and is re-delivered by the session's next node");
            false
        }
        Err(why) => {
            // A long outage: expected, and the turn is re-delivered.
            tracing::warn!(
                session = %key, turn = id, %why, attempts = policy.max_attempts,
                "cannot store the turn's events; giving up: its stream ends here and the node that runs the session next re-delivers it"
            );
            false
        }
    }
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
