//! Each way a watched stream ends, on tokio's paused clock.

use std::time::Duration;

use futures_util::StreamExt as _;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::*;
use crate::watchdog::{WatchdogActor, WatchdogConfig};

/// A frame of these tests: content, or a ping (never progress).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Item {
    Content,
    Ping,
}

fn is_content(item: &Item) -> bool {
    *item == Item::Content
}

type Feed = mpsc::UnboundedSender<Result<Item, StreamError>>;

/// A stream fed by hand.
fn fed() -> (
    Feed,
    impl Stream<Item = Result<Item, StreamError>> + Unpin + Send,
) {
    let (tx, mut rx) = mpsc::unbounded_channel();
    (
        tx,
        futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx)),
    )
}

/// Feeds `item` every `period` until the stream is dropped.
fn feed_every(feed: Feed, period: Duration, item: Item) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(period).await;
            if feed.send(Ok(item)).is_err() {
                return;
            }
        }
    })
}

/// The first item that is not `skip` (or the end).
async fn past<S>(s: &mut S, skip: Item) -> Option<S::Item>
where
    S: Stream<Item = Result<Item, WatchError>> + Unpin,
{
    loop {
        match next(s).await {
            Some(Ok(item)) if item == skip => {}
            other => return other,
        }
    }
}

async fn watchdog() -> WatchdogHandle {
    WatchdogActor::spawn(WatchdogConfig::default())
        .await
        .expect("watchdog")
        .0
}

/// The next item, failing rather than waiting past a minute of (paused)
/// time.
async fn next<S: Stream + Unpin>(s: &mut S) -> Option<S::Item> {
    tokio::time::timeout(Duration::from_secs(60), s.next())
        .await
        .expect("the watched stream said nothing for a minute")
}

#[tokio::test(start_paused = true)]
async fn silence_past_the_allowance_is_an_expiry_and_the_end() {
    let dog = watchdog().await;
    let (feed, stream) = fed();
    let mut watched = dog
        .watch_stream(stream, Duration::from_secs(5))
        .expect("watch");
    feed.send(Ok(Item::Ping)).expect("feed");
    assert_eq!(next(&mut watched).await, Some(Ok(Item::Ping)));
    let started = Instant::now();
    match next(&mut watched).await {
        Some(Err(WatchError::Stopped(Stopped::Expired(e)))) => {
            assert!(e.silent_for >= Duration::from_secs(5), "{e:?}");
            assert_eq!(e.timeout, Duration::from_secs(5));
        }
        other => panic!("expected an expiry, got {other:?}"),
    }
    assert!(started.elapsed() >= Duration::from_secs(5));
    // Nothing after the stop, even what was ready.
    feed.send(Ok(Item::Content)).expect("feed");
    assert_eq!(next(&mut watched).await, None);
}

#[tokio::test(start_paused = true)]
async fn frames_keep_it_alive_but_only_content_is_progress() {
    let dog = watchdog().await;
    let (feed, stream) = fed();
    let watch = Watch::arm(
        &dog,
        WatchOptions::default()
            .timeout(Duration::from_secs(5))
            .progress(Some(Duration::from_secs(20))),
    )
    .expect("watch");
    let mut watched = watch.stream(stream, Some(is_content));
    feed.send(Ok(Item::Content)).expect("feed");
    assert_eq!(next(&mut watched).await, Some(Ok(Item::Content)));
    // A ping every 2 s: never silent, never progress.
    let pinger = feed_every(feed, Duration::from_secs(2), Item::Ping);
    let started = Instant::now();
    let ended = past(&mut watched, Item::Ping).await;
    pinger.abort();
    match ended {
        Some(Err(WatchError::Stopped(Stopped::NoProgress(e)))) => {
            assert_eq!(e.timeout, Duration::from_secs(20));
        }
        other => panic!("expected no progress, got {other:?}"),
    }
    let took = started.elapsed();
    assert!(
        took >= Duration::from_secs(20) && took < Duration::from_secs(23),
        "{took:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn progress_said_by_the_reader_counts() {
    let dog = watchdog().await;
    let (feed, stream) = fed();
    let watch = Watch::arm(
        &dog,
        WatchOptions::default()
            .timeout(Duration::from_secs(5))
            .progress(Some(Duration::from_secs(10))),
    )
    .expect("watch");
    // No rule: the reader decodes and says so.
    let mut watched = watch.stream(stream, None);
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_secs(3)).await;
        feed.send(Ok(Item::Ping)).expect("feed");
        assert_eq!(next(&mut watched).await, Some(Ok(Item::Ping)));
        watched.progressed();
    }
    // 30 s of reader-said progress and no stop; then silence of progress.
    tokio::time::sleep(Duration::from_secs(3)).await;
    feed.send(Ok(Item::Ping)).expect("feed");
    assert_eq!(next(&mut watched).await, Some(Ok(Item::Ping)));
    let pinger = feed_every(feed, Duration::from_secs(2), Item::Ping);
    let ended = past(&mut watched, Item::Ping).await;
    pinger.abort();
    assert!(
        matches!(
            ended,
            Some(Err(WatchError::Stopped(Stopped::NoProgress(_))))
        ),
        "{ended:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_deadline_ends_a_stream_that_is_alive() {
    let dog = watchdog().await;
    let (feed, stream) = fed();
    let at = Instant::now() + Duration::from_secs(30);
    let watch = Watch::arm(
        &dog,
        WatchOptions::default()
            .timeout(Duration::from_secs(5))
            .deadline(Some(at)),
    )
    .expect("watch");
    let mut watched = watch.stream(stream, Some(is_content));
    let pinger = feed_every(feed, Duration::from_secs(1), Item::Content);
    let ended = past(&mut watched, Item::Content).await;
    pinger.abort();
    assert_eq!(ended, Some(Err(WatchError::Stopped(Stopped::Deadline))));
    assert!(Instant::now() >= at);
    assert_eq!(
        Stopped::Deadline.error().map(|e| e.code()),
        Some("ESTREAM_INTERRUPTED")
    );
}

#[tokio::test(start_paused = true)]
async fn a_token_cancels_before_or_after_arming() {
    let dog = watchdog().await;
    let token = CancellationToken::new();
    let (_feed, stream) = fed();
    let mut watched = Watch::arm(&dog, WatchOptions::default().cancel_on(token.clone()))
        .expect("watch")
        .stream(stream, Some(is_content));
    let cancel = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(2)).await;
        token.cancel();
    });
    assert_eq!(
        next(&mut watched).await,
        Some(Err(WatchError::Stopped(Stopped::Cancelled)))
    );
    cancel.await.expect("cancel task");

    let gone = CancellationToken::new();
    gone.cancel();
    let (_feed, stream) = fed();
    let mut watched = Watch::arm(&dog, WatchOptions::default().cancel_on(gone))
        .expect("watch")
        .stream(stream, Some(is_content));
    assert_eq!(
        next(&mut watched).await,
        Some(Err(WatchError::Stopped(Stopped::Cancelled)))
    );
    assert_eq!(Stopped::Cancelled.error(), None);
}

#[tokio::test(start_paused = true)]
async fn the_first_stop_wins_and_beats_a_ready_item() {
    let dog = watchdog().await;
    let (feed, stream) = fed();
    let watch = Watch::arm(&dog, WatchOptions::default()).expect("watch");
    let stopper = watch.stopper();
    let mut watched = watch.stream(stream, Some(is_content));
    feed.send(Ok(Item::Content)).expect("feed");
    stopper.interrupt();
    stopper.cancel();
    assert_eq!(
        next(&mut watched).await,
        Some(Err(WatchError::Stopped(Stopped::Interrupted)))
    );
    assert_eq!(stopper.stopped(), Some(Stopped::Interrupted));
    assert_eq!(next(&mut watched).await, None);
}

#[tokio::test(start_paused = true)]
async fn the_streams_own_errors_pass_through_and_it_goes_on() {
    let dog = watchdog().await;
    let (feed, stream) = fed();
    let mut watched = dog
        .watch_stream(stream, Duration::from_secs(5))
        .expect("watch");
    let broke = StreamError::Malformed {
        message: "not JSON".into(),
    };
    feed.send(Err(broke.clone())).expect("feed");
    feed.send(Ok(Item::Content)).expect("feed");
    drop(feed);
    assert_eq!(
        next(&mut watched).await,
        Some(Err(WatchError::Source(broke)))
    );
    assert_eq!(next(&mut watched).await, Some(Ok(Item::Content)));
    assert_eq!(next(&mut watched).await, None);
}

#[tokio::test(start_paused = true)]
async fn a_stream_with_an_error_type_of_its_own_is_watched_and_killed_the_same() {
    let dog = watchdog().await;
    let (tx, mut rx) = mpsc::unbounded_channel::<Result<&str, std::io::Error>>();
    let stream = futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx));
    let mut watched = dog
        .watch_stream(stream, Duration::from_secs(5))
        .expect("watch");
    tx.send(Ok("line")).expect("feed");
    tx.send(Err(std::io::ErrorKind::InvalidData.into()))
        .expect("feed");
    assert!(matches!(next(&mut watched).await, Some(Ok("line"))));
    match next(&mut watched).await {
        Some(Err(WatchError::Source(e))) => assert_eq!(e.kind(), std::io::ErrorKind::InvalidData),
        other => panic!("unexpected {other:?}"),
    }
    // Then silence with the sender open: killed after the allowance.
    assert!(matches!(
        next(&mut watched).await,
        Some(Err(WatchError::Stopped(Stopped::Expired(_))))
    ));
    drop(tx);
}

#[tokio::test(start_paused = true)]
async fn until_races_the_wait_before_the_stream_against_the_watch() {
    let dog = watchdog().await;
    let mut watch = Watch::arm(
        &dog,
        WatchOptions::default().timeout(Duration::from_secs(5)),
    )
    .expect("watch");
    // Opening takes longer than the allowance: time to first byte counts.
    let opened = watch
        .until(tokio::time::sleep(Duration::from_secs(60)))
        .await;
    assert!(matches!(opened, Err(Stopped::Expired(_))), "{opened:?}");
    let mut watch = Watch::arm(&dog, WatchOptions::default()).expect("watch");
    assert_eq!(watch.until(async { 7 }).await, Ok(7));
}
