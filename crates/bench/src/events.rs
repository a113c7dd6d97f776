//! Heap per kept turn event: the typed event `warden serve` keeps and
//! stores now (`StoredEvent` with `TurnEventData`) against the JSON value
//! it kept before (a `serde_json::Value` object per event, without `at`), both measured
//! here in the same run, for text deltas of ~100 bytes (a streamed reply's
//! usual piece) and for the rest of a turn's events.

use warden_core::store::turn_event::{AttemptFailed, Delta, Done, Started};
use warden_core::store::{StoredEvent, TurnEventData};

use crate::live_bytes;

/// Bytes of heap per item that `make` builds, over `n` of them kept alive.
fn per_item<T>(n: usize, make: impl Fn(usize) -> T) -> f64 {
    let before = live_bytes();
    let kept: Vec<T> = (0..n).map(make).collect();
    let after = live_bytes();
    drop(kept);
    (after.saturating_sub(before)) as f64 / n as f64
}

/// A mix of a turn's events: mostly deltas, a few markers.
fn event(i: usize, text: &str) -> TurnEventData {
    match i % 50 {
        0 => TurnEventData::Started(Started::new(1)),
        1 => TurnEventData::Retrying(AttemptFailed::new(1, 500, "ETIMEDOUT", true)),
        2 => TurnEventData::Done(Done::new(1, "done", 1, 0)),
        _ => TurnEventData::Text(Delta::new(text)),
    }
}

/// Prints heap per event, typed and as the JSON value, and their ratio.
pub(crate) fn bench_events(quick: bool) {
    let n = if quick { 20_000 } else { 200_000 };
    let text = "x".repeat(100);
    println!("\n## events: heap per kept turn event ({n} events, ~100-byte deltas)");
    for (what, mix) in [("text deltas", false), ("a turn's mix", true)] {
        let data = |i: usize| match mix {
            true => event(i, &text),
            false => TurnEventData::Text(Delta::new(text.as_str())),
        };
        let typed = per_item(n, |i| StoredEvent::new(i as u64, data(i)));
        let json = per_item(n, |i| {
            let e = StoredEvent::new(i as u64, data(i));
            (e.id, e.kind(), e.data.to_value(None))
        });
        println!(
            "{what}: typed {typed:.0} B/event, JSON value (before) {json:.0} B/event: {:.2}x less",
            json / typed.max(1.0)
        );
    }
}
