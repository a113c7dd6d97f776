//! Backpressure from a turn's SSE clients to its source: a client that
//! stops reading stops the turn reading its source (the events do not pile
//! up at the source's pace), and a client that stays behind past
//! `slow_client_grace` is cut loose — its event stream ends, it can
//! re-attach — so it cannot hold the turn for ever.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures_util::future::BoxFuture;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use warden_core::{
    AgentEvent, EventSource, EventStream, Frame, SessionKey, StreamError, Supervisor, TurnRequest,
};
use warden_serve::ServeConfig;

const TOKEN: &str = "test-token-0123456789";
/// Deltas the source has in all; far more than the socket buffers hold.
const LIMIT: usize = 30_000;
const DELTA: usize = 2_048;

/// An upstream that streams text deltas of `delta` bytes as fast as it is
/// read, up to [`LIMIT`], then goes quiet.
struct Firehose {
    pulled: Arc<AtomicUsize>,
    delta: usize,
}

impl EventSource for Firehose {
    fn open(&self, _: TurnRequest) -> BoxFuture<'static, Result<EventStream, StreamError>> {
        let pulled = self.pulled.clone();
        let size = self.delta;
        Box::pin(async move {
            let delta = "x".repeat(size);
            let frames = futures_util::stream::unfold(0usize, move |n| {
                let pulled = pulled.clone();
                let delta = delta.clone();
                async move {
                    if n >= LIMIT {
                        std::future::pending::<()>().await;
                    }
                    tokio::task::yield_now().await;
                    pulled.fetch_add(1, Ordering::SeqCst);
                    Some((Ok(Frame::Event(AgentEvent::TextDelta(delta))), n + 1))
                }
            });
            Ok(Box::pin(frames) as EventStream)
        })
    }
}

/// Waits (at most 20 s) until `pulled` has not moved for 500 ms: its
/// value then, or `None` if it kept moving.
async fn settled(pulled: &AtomicUsize) -> Option<usize> {
    let mut last = pulled.load(Ordering::SeqCst);
    for _ in 0..40 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = pulled.load(Ordering::SeqCst);
        if now == last {
            return Some(now);
        }
        last = now;
    }
    None
}

/// Serves a [`Firehose`] of `delta`-byte deltas with `grace`, and starts
/// a turn whose client reads until the text flows, then stops reading:
/// the source's count of deltas pulled, and the client.
async fn a_client_that_stops_reading(
    delta: usize,
    grace: Duration,
) -> (Arc<AtomicUsize>, tokio::net::TcpStream) {
    let pulled = Arc::new(AtomicUsize::new(0));
    let source: Arc<dyn EventSource> = Arc::new(Firehose {
        pulled: pulled.clone(),
        delta,
    });
    let sup = Supervisor::start(
        Default::default(),
        Arc::new(move |_: &SessionKey| source.clone()),
    )
    .await
    .expect("supervisor");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let app = warden_serve::router(sup, ServeConfig::new(TOKEN).with_slow_client_grace(grace));
    let _server = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });

    // A small receive buffer: the kernel holds little of what is sent.
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket.set_recv_buffer_size(16 * 1024).expect("rcvbuf");
    let mut client = socket.connect(addr).await.expect("connect");
    let body = r#"{"key": "firehose", "message": "go"}"#;
    let request = format!(
        "POST /v1/turns HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n\
         Accept: text/event-stream\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    client.write_all(request.as_bytes()).await.expect("write");
    // Read until the text flows, then stop reading.
    let mut seen = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    while !String::from_utf8_lossy(&seen).contains("event: text") {
        let n = tokio::time::timeout(Duration::from_secs(20), client.read(&mut buf))
            .await
            .expect("the turn starts in time")
            .expect("read");
        assert!(n > 0, "closed early");
        seen.extend_from_slice(&buf[..n]);
    }
    (pulled, client)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_pauses_the_turn_until_it_is_cut_loose() {
    let grace = Duration::from_secs(2);
    let (pulled, mut client) = a_client_that_stops_reading(DELTA, grace).await;
    let mut buf = vec![0u8; 64 * 1024];

    // The turn stops reading its source once the client's socket buffers
    // and the lag window are full: well short of everything it has.
    let paused = settled(&pulled)
        .await
        .expect("the source is paused while its client does not read");
    assert!(
        paused < LIMIT / 2,
        "paused after {paused} of {LIMIT} deltas ({} MiB)",
        paused * DELTA / (1024 * 1024)
    );

    // Past the grace (the client still not reading) it is cut loose: the
    // turn reads its source on to the end…
    let all = tokio::time::timeout(grace + Duration::from_secs(20), async {
        while pulled.load(Ordering::SeqCst) < LIMIT {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert!(
        all.is_ok(),
        "the turn reads on once the laggard is cut loose: {} of {LIMIT}",
        pulled.load(Ordering::SeqCst)
    );
    // …and the client's stream ends (with the chunked body's last chunk;
    // the connection stays open for another request) once it reads what
    // was under way: it re-attaches with `Last-Event-ID`.
    let ended = tokio::time::timeout(Duration::from_secs(20), async {
        let mut tail = Vec::new();
        loop {
            match client.read(&mut buf).await {
                Ok(0) | Err(_) => return false,
                Ok(n) => {
                    tail.extend_from_slice(&buf[..n]);
                    let keep = tail.len().saturating_sub(16);
                    tail.drain(..keep);
                    if tail.ends_with(b"\r\n0\r\n\r\n") {
                        return true;
                    }
                }
            }
        }
    })
    .await;
    assert_eq!(
        ended,
        Ok(true),
        "a lagging client's stream ends after the grace"
    );
}

/// What a client that stops reading holds back is bounded in bytes, not
/// only in events: with 8 KiB deltas the turn pauses after a few MiB, as
/// with 2 KiB ones (before, the window was 1,024 events whatever their
/// size: 8 MiB of text here, ~5 times that in the server's memory).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_large_deltas_pauses_the_turn_within_mebibytes() {
    const BIG: usize = 8 * 1024;
    let (pulled, _client) = a_client_that_stops_reading(BIG, Duration::from_secs(60)).await;
    let paused = settled(&pulled)
        .await
        .expect("the source is paused while its client does not read");
    let mib = paused * BIG / (1024 * 1024);
    eprintln!("paused after {paused} deltas of {BIG} bytes ({mib} MiB)");
    assert!(
        mib < 6,
        "paused after {paused} deltas of {BIG} bytes ({mib} MiB)"
    );
}
