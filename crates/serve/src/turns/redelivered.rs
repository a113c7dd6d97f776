//! A turn re-delivered here after its session stopped without answering
//! it says so in its new trace: a `turn_redelivered` span
//! ([`Redelivery`]) under the trace's root.

use std::time::Duration;

use warden_core::cluster::Arrival;
use warden_core::store::{StoredEvent as ServeEvent, StoredTurn};
use warden_core::{Redelivery, TurnHandle};

/// How long a re-delivered turn may wait to start (behind other turns of
/// its session) before its `turn_redelivered` span is given up.
const REDELIVERY_WAIT: Duration = Duration::from_secs(600);

/// Says, in the new trace of `t`, re-delivered here, what happened before
/// ([`Redelivery`]): the cause its clients were told, the trace it was
/// accepted in, and how many events they had — the last one stored (or
/// held here), before the `retrying` / `continuing` marker at the end of
/// `first`.
pub(super) fn say(
    t: &StoredTurn,
    first: &[ServeEvent],
    turn: &TurnHandle,
    arrival: Option<Arrival>,
    node: Option<&str>,
) {
    let marker = usize::from(!first.is_empty() || !t.events.is_empty());
    let had = first
        .len()
        .checked_sub(marker)
        .and_then(|n| first[..n].last())
        .or(t.events.last())
        .map_or(0, |e| e.id);
    let code = arrival.unwrap_or(Arrival::NodeLost).code();
    let before = Redelivery::new(code, had)
        .after(t.asked.trace_id.clone(), t.asked.span_id.clone())
        .on_node(node.map(str::to_owned));
    let (canceller, key) = (turn.canceller(), t.key.clone());
    tokio::spawn(async move {
        let say = canceller.record_redelivery(&key, &before);
        let _ = tokio::time::timeout(REDELIVERY_WAIT, say).await;
    });
}
