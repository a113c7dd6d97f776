//! The WatchdogActor on its own, on tokio's paused clock.

use std::time::Duration;

use crate::common::Within;
use tokio::sync::mpsc;
use tokio::time::{Instant, sleep};
use warden_core::watchdog::WatchdogHandle;
use warden_core::{WatchdogActor, WatchdogConfig};

const T: Duration = Duration::from_millis(1000);
/// The documented late-kill bound on an idle watchdog: timer granularity.
const BOUND: Duration = Duration::from_millis(2);

async fn watchdog() -> WatchdogHandle {
    let config = WatchdogConfig::default()
        .with_default_timeout(T)
        .expect("valid");
    WatchdogActor::spawn(config).await.expect("spawn").0
}

fn killer() -> (
    impl FnOnce(warden_core::watchdog::Expiry) + Send + 'static,
    mpsc::UnboundedReceiver<(Instant, warden_core::watchdog::Expiry)>,
) {
    let (tx, rx) = mpsc::unbounded_channel();
    (
        move |e| {
            let _ = tx.send((Instant::now(), e));
        },
        rx,
    )
}

#[tokio::test(start_paused = true)]
async fn fires_after_the_timeout_with_no_frames() {
    let wd = watchdog().await;
    let t0 = Instant::now();
    let (on_expire, mut rx) = killer();
    let guard = wd.watch(None, on_expire).expect("watch");
    let (at, expiry) = rx
        .recv()
        .within("the watchdog's kill")
        .await
        .expect("fired");
    let waited = at - t0;
    assert!(waited >= T, "killed early: {waited:?}");
    assert!(waited <= T + BOUND, "killed late: {waited:?}");
    assert_eq!(expiry.id, guard.id());
    assert!(expiry.silent_for >= T);
    assert!(!wd.is_watching(guard.id()).await.expect("alive"));
    assert_eq!(wd.stats().await.expect("alive").kills, 1);
}

#[tokio::test(start_paused = true)]
async fn a_frame_at_0_8_t_moves_the_kill_to_1_8_t() {
    let wd = watchdog().await;
    let t0 = Instant::now();
    let (on_expire, mut rx) = killer();
    let guard = wd.watch(None, on_expire).expect("watch");
    sleep(T.mul_f64(0.8)).await;
    guard.heartbeat().beat();
    let (at, _) = rx
        .recv()
        .within("the watchdog's kill")
        .await
        .expect("fired");
    let waited = at - t0;
    assert!(waited >= T.mul_f64(1.8), "killed early: {waited:?}");
    assert!(waited <= T.mul_f64(1.8) + BOUND, "killed late: {waited:?}");
}

#[tokio::test(start_paused = true)]
async fn never_fires_with_frames_every_half_timeout_for_ten_timeouts() {
    let wd = watchdog().await;
    let (on_expire, mut rx) = killer();
    let guard = wd.watch(None, on_expire).expect("watch");
    let hb = guard.heartbeat();
    for _ in 0..20 {
        sleep(T / 2).await;
        hb.beat();
    }
    assert!(rx.try_recv().is_err(), "fired despite frames");
    assert!(wd.is_watching(guard.id()).await.expect("alive"));
    // ... and still fires once the frames stop.
    let (_, e) = rx
        .recv()
        .within("the watchdog's kill")
        .await
        .expect("fired after frames stopped");
    assert_eq!(e.id, guard.id());
}

#[tokio::test(start_paused = true)]
async fn dropping_the_guard_stops_watching_and_never_fires() {
    let wd = watchdog().await;
    let (on_expire, mut rx) = killer();
    let guard = wd.watch(None, on_expire).expect("watch");
    let id = guard.id();
    sleep(T / 2).await;
    drop(guard);
    sleep(T * 10).await;
    assert!(rx.try_recv().is_err(), "fired after stop");
    assert!(!wd.is_watching(id).await.expect("alive"));
    let stats = wd.stats().await.expect("alive");
    assert_eq!((stats.watched, stats.kills), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn a_hundred_rapid_frames_leave_one_deadline() {
    let wd = watchdog().await;
    let (on_expire, _rx) = killer();
    let guard = wd.watch(None, on_expire).expect("watch");
    let hb = guard.heartbeat();
    for _ in 0..100 {
        hb.beat();
        tokio::time::advance(Duration::from_micros(100)).await;
    }
    let stats = wd.stats().await.expect("alive");
    assert_eq!((stats.watched, stats.queued), (1, 1), "{stats:?}");
}

#[tokio::test(start_paused = true)]
async fn per_stream_override_beats_the_default() {
    let wd = watchdog().await;
    let t0 = Instant::now();
    let (on_expire, mut rx) = killer();
    let _guard = wd
        .watch(Some(Duration::from_millis(200)), on_expire)
        .expect("watch");
    let (at, e) = rx
        .recv()
        .within("the watchdog's kill")
        .await
        .expect("fired");
    assert!(at - t0 >= Duration::from_millis(200) && at - t0 <= Duration::from_millis(202));
    assert_eq!(e.timeout, Duration::from_millis(200));
}

#[tokio::test(start_paused = true)]
async fn shrinking_a_timeout_takes_effect_from_the_last_frame() {
    let wd = watchdog().await;
    let t0 = Instant::now();
    let (on_expire, mut rx) = killer();
    let guard = wd
        .watch(Some(Duration::from_secs(600)), on_expire)
        .expect("watch");
    sleep(Duration::from_secs(5)).await;
    guard
        .heartbeat()
        .set_timeout(Duration::from_secs(1))
        .expect("valid");
    let (at, _) = rx
        .recv()
        .within("the watchdog's kill")
        .await
        .expect("fired");
    // Last frame was at registration (t0): silence already exceeds 1 s.
    assert!(at - t0 <= Duration::from_secs(5) + BOUND, "{:?}", at - t0);
}

#[tokio::test(start_paused = true)]
async fn default_timeout_is_45_seconds_and_invalid_values_are_rejected() {
    assert_eq!(
        WatchdogConfig::default().default_timeout,
        Duration::from_secs(45)
    );
    assert!(
        WatchdogConfig::default()
            .with_default_timeout(Duration::ZERO)
            .is_err()
    );
    let wd = watchdog().await;
    assert!(wd.watch(Some(Duration::ZERO), |_| {}).is_err());
    assert!(wd.watch(Some(Duration::from_secs(90_000)), |_| {}).is_err());
}

#[tokio::test(start_paused = true)]
async fn many_streams_each_killed_at_their_own_deadline() {
    let wd = watchdog().await;
    let t0 = Instant::now();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut guards = Vec::new();
    for i in 1..=50u64 {
        let tx = tx.clone();
        let timeout = Duration::from_millis(10 * i);
        guards.push(
            wd.watch(Some(timeout), move |e| {
                let _ = tx.send((Instant::now(), timeout, e));
            })
            .expect("watch"),
        );
    }
    for _ in 0..50 {
        let (at, timeout, _) = rx
            .recv()
            .within("the watchdog's kill")
            .await
            .expect("fired");
        let waited = at - t0;
        assert!(
            waited >= timeout && waited <= timeout + BOUND,
            "{waited:?} vs {timeout:?}"
        );
    }
}
