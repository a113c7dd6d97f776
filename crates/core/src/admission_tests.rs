use std::time::Duration;

use tokio::time::{Instant, advance, timeout};

use super::*;

const BOUND: Duration = Duration::from_secs(3600);

fn limited(n: usize) -> Admission {
    Admission::new(
        AdmissionConfig::default()
            .with_max_streams(n)
            .with_release_jitter(Duration::ZERO),
    )
}

/// Lets spawned tasks (the hold's wake-up) run.
async fn settle() {
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test(start_paused = true)]
async fn turns_beyond_the_limit_wait_and_are_admitted_in_order() {
    let a = limited(1);
    let mut first = a.enqueue("p");
    let mut second = a.enqueue("p");
    let mut third = a.enqueue("p");
    let p1 = first.try_take().expect("the first fits the limit");
    assert!(second.try_take().is_none(), "the second waits");
    assert_eq!(a.stats().queued, 2);
    drop(p1);
    assert!(third.try_take().is_none(), "FIFO: the third is not next");
    let p2 = second.try_take().expect("the second is next");
    drop(p2);
    let p3 = timeout(BOUND, third).await.expect("the third is admitted");
    assert_eq!(a.stats().running, 1);
    drop(p3);
    assert_eq!(a.stats(), AdmissionStats::default());
}

#[tokio::test(start_paused = true)]
async fn a_pool_at_its_limit_does_not_hold_back_another_pool() {
    let a = Admission::new(AdmissionConfig::default().with_pool_limit("anthropic", 1));
    let _busy = a
        .enqueue("anthropic")
        .try_take()
        .expect("first of its pool");
    let mut same = a.enqueue("anthropic");
    let mut other = a.enqueue("openai");
    assert!(same.try_take().is_none(), "its pool is full");
    assert!(other.try_take().is_some(), "another pool has no limit");
}

#[tokio::test(start_paused = true)]
async fn a_dropped_ticket_leaves_the_queue_at_once() {
    let a = limited(1);
    let p1 = a.enqueue("p").try_take().expect("first");
    let gone = a.enqueue("p");
    let mut next = a.enqueue("p");
    drop(gone);
    assert_eq!(a.stats().queued, 1, "the dropped ticket is not counted");
    drop(p1);
    assert!(
        next.try_take().is_some(),
        "the slot skips the dropped ticket"
    );
}

#[tokio::test(start_paused = true)]
async fn a_granted_ticket_dropped_untaken_gives_its_slot_back() {
    let a = limited(1);
    let granted = a.enqueue("p");
    let mut next = a.enqueue("p");
    assert_eq!(a.stats().running, 1);
    drop(granted);
    assert!(next.try_take().is_some(), "the slot came back");
}

#[tokio::test(start_paused = true)]
async fn a_hold_keeps_every_turn_of_the_pool_waiting_until_it_passes() {
    let a = Admission::new(AdmissionConfig::default().with_release_jitter(Duration::ZERO));
    let start = Instant::now();
    a.hold("p", Duration::from_secs(2));
    assert_eq!(a.held_until("p"), Some(start + Duration::from_secs(2)));
    let mut held = a.enqueue("p");
    let mut other = a.enqueue("q");
    assert!(held.try_take().is_none(), "held");
    assert!(other.try_take().is_some(), "another pool is not held");
    advance(Duration::from_millis(1999)).await;
    settle().await;
    assert!(held.try_take().is_none(), "still held 1 ms before the end");
    let p = timeout(BOUND, held).await.expect("released");
    assert_eq!(Instant::now() - start, Duration::from_secs(2));
    assert_eq!(p.pool(), "p");
    assert_eq!(a.held_until("p"), None);
}

#[tokio::test(start_paused = true)]
async fn a_longer_hold_extends_and_a_shorter_one_does_not_shorten() {
    let a = Admission::new(AdmissionConfig::default().with_release_jitter(Duration::ZERO));
    let start = Instant::now();
    a.hold("p", Duration::from_secs(5));
    a.hold("p", Duration::from_secs(1));
    assert_eq!(a.held_until("p"), Some(start + Duration::from_secs(5)));
    timeout(BOUND, a.admit("p")).await.expect("released");
    assert_eq!(Instant::now() - start, Duration::from_secs(5));
}

#[tokio::test(start_paused = true)]
async fn waiters_of_a_hold_are_released_spread_over_the_jitter() {
    let jitter = Duration::from_secs(1);
    let a = Admission::new(AdmissionConfig::default().with_release_jitter(jitter));
    let start = Instant::now();
    a.hold("p", Duration::from_secs(2));
    let mut at = Vec::new();
    let tickets: Vec<_> = (0..20).map(|_| a.enqueue("p")).collect();
    let mut set = tokio::task::JoinSet::new();
    for t in tickets {
        set.spawn(async move {
            let _p = t.await;
            Instant::now()
        });
    }
    while let Some(t) = timeout(BOUND, set.join_next()).await.expect("bounded") {
        at.push(t.expect("task") - start);
    }
    let (lo, hi) = (at.iter().min().copied(), at.iter().max().copied());
    assert!(
        at.iter()
            .all(|d| *d >= Duration::from_secs(2) && *d <= Duration::from_secs(3)),
        "all within the hold plus the jitter: {at:?}"
    );
    assert!(hi > lo, "not all in the same instant: {at:?}");
}

#[tokio::test(start_paused = true)]
async fn without_shared_backoff_a_hold_is_ignored() {
    let a = Admission::new(AdmissionConfig::default().with_shared_backoff(false));
    a.hold("p", Duration::from_secs(2));
    assert_eq!(a.held_until("p"), None);
    assert!(a.enqueue("p").try_take().is_some());
}

#[test]
fn a_limit_of_zero_is_taken_as_one() {
    let c = AdmissionConfig::default()
        .with_max_streams(0)
        .with_pool_limit("p", 0);
    assert_eq!(c.max_streams, Some(1));
    assert_eq!(c.pool_limits.get("p"), Some(&1));
}
