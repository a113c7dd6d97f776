//! A turn's events as an SSE response: one builder for a turn kept here
//! and for one read from the cluster's store.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::response::sse::{Event, KeepAlive, Sse};
use futures_util::Stream;
use warden_core::store::{StoredEvent, StoredTurn, TurnStore};

use crate::turns::{Reader, TurnLog};

/// How often a turn served from the store (its node died, or another node
/// runs it) is read again for new events.
const STORE_POLL: Duration = Duration::from_millis(100);

/// Where a turn's events come from.
pub(crate) enum Feed {
    /// A turn this node keeps: woken as events arrive; the turn waits for
    /// this client when it lags (see [`crate::turns::log::READER_WINDOW`]).
    Local(Reader),
    /// A turn in the cluster's store, as whichever node runs it writes it:
    /// polled.
    Stored {
        /// The cluster's turn store, polled for the turn's new events.
        store: Arc<dyn TurnStore>,
        /// The turn.
        id: String,
    },
}

impl Feed {
    /// The events after `seen` and whether the turn has ended, waiting
    /// while there are none yet; `None` when the turn is gone (expired, or
    /// the store failed, or the client lagged too long: it re-attaches).
    async fn after(&self, seen: u64) -> Option<(Vec<StoredEvent>, bool)> {
        match self {
            Self::Local(reader) => reader.after(seen).await,
            Self::Stored { store, id } => loop {
                tokio::time::sleep(STORE_POLL).await;
                match store.read(id, seen).await {
                    Ok(Some(turn)) if turn.events.is_empty() && !turn.ended => continue,
                    Ok(Some(turn)) => return Some((turn.events, turn.ended)),
                    Ok(None) | Err(_) => return None,
                }
            },
        }
    }
}

/// A turn's event as an SSE event: its number, type and JSON.
fn sse_event(e: &StoredEvent) -> Event {
    Event::default()
        .id(e.id.to_string())
        .event(e.kind().as_str())
        .data(e.data.to_wire(e.at))
}

/// The events of a turn kept here after `after`, then its later ones as
/// they come, until its last.
pub(crate) fn local(
    log: Arc<TurnLog>,
    after: u64,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let reader = log.reader(after);
    events(Feed::Local(reader), after, VecDeque::new())
}

/// A turn read from the store: `turn`'s events (read after `after`), then
/// its later ones as its current node stores them, until its last.
pub(crate) fn stored(
    store: Arc<dyn TurnStore>,
    turn: StoredTurn,
    after: u64,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let feed = Feed::Stored { store, id: turn.id };
    events(feed, after, turn.events.into())
}

/// The SSE stream of `feed` after event `after`, `first` already read: each
/// event once, in order, ending after the last (`done` or `error`) or when
/// the turn ends without one (it moved to another node).
fn events(
    feed: Feed,
    after: u64,
    first: VecDeque<StoredEvent>,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let stream = futures_util::stream::unfold(
        (feed, after, first, false),
        |(feed, mut seen, mut queue, mut ended)| async move {
            loop {
                if let Some(e) = queue.pop_front() {
                    seen = e.id;
                    ended |= e.is_last();
                    return Some((Ok(sse_event(&e)), (feed, seen, queue, ended)));
                }
                if ended {
                    return None;
                }
                let (batch, last) = feed.after(seen).await?;
                if batch.is_empty() && last {
                    return None;
                }
                queue.extend(batch);
            }
        },
    );
    Sse::new(stream).keep_alive(KeepAlive::default())
}
