//! The server loop's limits against clients that misbehave, over real TCP:
//! a half-sent head is cut off, an idle keep-alive connection is closed, a
//! connection past the cap gets a `503` at once, a body that never comes
//! is answered `408` and frees its slot, a response whose client stops
//! reading stops being produced within a MiB, and a shutdown ends every
//! connection.

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::{get, post};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use warden_http::{Limits, serve};

/// Every wait in these tests is bounded by this.
const BOUND: Duration = Duration::from_secs(10);

fn app() -> Router {
    Router::new()
        .route("/", get(|| async { "ok" }))
        .route("/healthz", get(|| async { "ok" }))
        // Reads the whole body, as a JSON handler does.
        .route(
            "/echo",
            post(|body: axum::body::Bytes| async move { format!("{} bytes", body.len()) }),
        )
        .route(
            "/endless",
            get(|| async {
                let ticks = futures_util::stream::unfold(0u64, |n| async move {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    Some((Ok::<_, std::io::Error>(format!("tick {n}\n")), n + 1))
                });
                Body::from_stream(ticks)
            }),
        )
}

struct Server {
    addr: std::net::SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

async fn start(limits: Limits) -> Server {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(serve(listener, app(), limits, async move {
        let _ = stopped.await;
    }));
    Server {
        addr,
        stop: Some(stop),
        task,
    }
}

/// Reads until the peer closes: everything read. Fails the test if the
/// peer does not close within [`BOUND`].
async fn read_to_close(tcp: &mut TcpStream, why: &str) -> String {
    let mut all = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = match tokio::time::timeout(BOUND, tcp.read(&mut buf)).await {
            Ok(Ok(n)) => n,
            Ok(Err(_)) => 0, // a reset is a close too
            Err(_) => panic!("{why}: still open after {BOUND:?}"),
        };
        if n == 0 {
            return String::from_utf8_lossy(&all).into_owned();
        }
        all.extend_from_slice(&buf[..n]);
    }
}

async fn get_ok(addr: std::net::SocketAddr) -> String {
    let mut tcp = TcpStream::connect(addr).await.expect("connect");
    tcp.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .expect("write");
    read_to_close(&mut tcp, "a complete request's answer").await
}

#[tokio::test]
async fn a_half_sent_head_is_cut_off_after_the_header_timeout() {
    let server = start(Limits::default().with_header_timeout(Duration::from_millis(300))).await;
    let mut slow = TcpStream::connect(server.addr).await.expect("connect");
    slow.write_all(b"GET / HTTP/1.1\r\nHo")
        .await
        .expect("write");
    let answer = read_to_close(&mut slow, "a half-sent head").await;
    assert!(
        !answer.contains("200 OK"),
        "no answer to half a head: {answer}"
    );
    // A client that sends its head in time is served.
    let ok = get_ok(server.addr).await;
    assert!(ok.starts_with("HTTP/1.1 200 OK"), "{ok}");
}

#[tokio::test]
async fn an_idle_kept_alive_connection_is_closed_after_the_header_timeout() {
    let server = start(Limits::default().with_header_timeout(Duration::from_millis(300))).await;
    let mut tcp = TcpStream::connect(server.addr).await.expect("connect");
    tcp.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("write");
    let answer = read_to_close(&mut tcp, "an idle kept-alive connection").await;
    assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer}");
}

#[tokio::test]
async fn past_the_cap_a_connection_gets_a_503_at_once() {
    let busy = r#"{"error":{"type":"busy","message":"full"}}"#;
    let server = start(
        Limits::default()
            .with_max_connections(2)
            .with_busy_body(busy),
    )
    .await;
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut tcp = TcpStream::connect(server.addr).await.expect("connect");
        // Half a head: the connection is accepted and stays open.
        tcp.write_all(b"GET / HT").await.expect("write");
        held.push(tcp);
    }
    // Past the cap: the third is answered and closed, with its request
    // unread (the answer still arrives: no reset).
    let mut third = TcpStream::connect(server.addr).await.expect("connect");
    third
        .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("write");
    let answer = read_to_close(&mut third, "a connection past the cap").await;
    assert!(
        answer.starts_with("HTTP/1.1 503 Service Unavailable"),
        "{answer}"
    );
    assert!(answer.contains("retry-after: 1"), "{answer}");
    assert!(answer.ends_with(busy), "{answer}");
    // A slot comes free when a connection ends; then clients are served.
    drop(held.pop());
    let served = tokio::time::timeout(BOUND, async {
        loop {
            let answer = get_ok(server.addr).await;
            if answer.starts_with("HTTP/1.1 200 OK") {
                return answer;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(served.is_ok(), "a freed slot serves again");
}

#[tokio::test]
async fn shutdown_closes_half_read_heads_and_idle_connections_at_once() {
    let mut server = start(Limits::default()).await;
    let mut half = TcpStream::connect(server.addr).await.expect("connect");
    half.write_all(b"GET /v1/models HTTP/1.1\r\nHo")
        .await
        .expect("write");
    let mut idle = TcpStream::connect(server.addr).await.expect("connect");
    idle.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("write");
    let mut buf = [0u8; 1024];
    let n = tokio::time::timeout(BOUND, idle.read(&mut buf))
        .await
        .expect("an answer in time")
        .expect("read");
    assert!(buf[..n].starts_with(b"HTTP/1.1 200 OK"));
    let _ = server.stop.take().expect("stop").send(());
    let ended = tokio::time::timeout(BOUND, &mut server.task).await;
    assert!(
        matches!(ended, Ok(Ok(Ok(())))),
        "the server returns once its connections have ended: {ended:?}"
    );
    read_to_close(&mut half, "a half-read head at shutdown").await;
    read_to_close(&mut idle, "an idle connection at shutdown").await;
}

#[tokio::test]
async fn a_response_under_way_holds_shutdown_until_the_server_is_dropped() {
    let mut server = start(Limits::default()).await;
    let mut stream = TcpStream::connect(server.addr).await.expect("connect");
    stream
        .write_all(b"GET /endless HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("write");
    let mut buf = [0u8; 1024];
    let n = tokio::time::timeout(BOUND, stream.read(&mut buf))
        .await
        .expect("the stream starts")
        .expect("read");
    assert!(buf[..n].starts_with(b"HTTP/1.1 200 OK"));
    let _ = server.stop.take().expect("stop").send(());
    // New connections are refused at once: the listener is closed.
    let refused = tokio::time::timeout(BOUND, async {
        loop {
            if TcpStream::connect(server.addr).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(refused.is_ok(), "the listener closes at shutdown");
    // The response under way may finish: the server waits for it…
    let early = tokio::time::timeout(Duration::from_millis(300), &mut server.task).await;
    assert!(early.is_err(), "the server waits for a response under way");
    // …until the caller's grace is over and it drops the server: then the
    // connection closes.
    server.task.abort();
    read_to_close(
        &mut stream,
        "a streaming response after the server is dropped",
    )
    .await;
}

/// A whole head declaring a body that never comes: the handler waits for
/// it, and without a timer the connection's slot is held for ever (every
/// slot, with a few such clients). Each is answered `408` with the JSON
/// body within the header timeout, its connection closes, and the slots
/// serve new clients (and `/healthz`) again.
#[tokio::test]
async fn a_body_that_never_comes_is_answered_408_and_frees_its_slot() {
    const SLOTS: usize = 4;
    let timeout = Duration::from_millis(400);
    let stalled_body = r#"{"error":{"type":"request_timeout","message":"stalled"}}"#;
    let server = start(
        Limits::default()
            .with_header_timeout(timeout)
            .with_max_connections(SLOTS)
            .with_stalled_body(stalled_body),
    )
    .await;
    let started = std::time::Instant::now();
    let mut stalled = Vec::new();
    for _ in 0..SLOTS {
        let mut tcp = TcpStream::connect(server.addr).await.expect("connect");
        tcp.write_all(
            b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
              Content-Length: 100\r\n\r\n{\"a\":",
        )
        .await
        .expect("write");
        stalled.push(tcp);
    }
    // Every slot is held: a new client is refused for now.
    let refused = get_ok(server.addr).await;
    assert!(refused.starts_with("HTTP/1.1 503"), "{refused}");
    for tcp in &mut stalled {
        let answer = read_to_close(tcp, "a stalled body").await;
        assert!(
            answer.starts_with("HTTP/1.1 408 Request Timeout"),
            "{answer}"
        );
        assert!(
            answer.contains("content-type: application/json"),
            "{answer}"
        );
        assert!(answer.ends_with(stalled_body), "{answer}");
    }
    let took = started.elapsed();
    assert!(
        took < timeout * 4,
        "the stalled bodies were answered within the timeout: {took:?}"
    );
    // The slots are free again: a new client and /healthz are served.
    let served = tokio::time::timeout(BOUND, async {
        loop {
            let answer = get_ok(server.addr).await;
            if answer.starts_with("HTTP/1.1 200 OK") {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(served.is_ok(), "a new client is served once the stalls end");
    let mut health = TcpStream::connect(server.addr).await.expect("connect");
    health
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .expect("write");
    let answer = read_to_close(&mut health, "/healthz").await;
    assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer}");
}

/// A slow upload that keeps sending is not a stall: each chunk restarts
/// the timer, so a body taking longer than the timeout in all arrives.
#[tokio::test]
async fn a_slow_body_that_keeps_sending_is_served() {
    let timeout = Duration::from_millis(300);
    let server = start(Limits::default().with_header_timeout(timeout)).await;
    let mut tcp = TcpStream::connect(server.addr).await.expect("connect");
    tcp.write_all(
        b"POST /echo HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 6\r\n\r\n",
    )
    .await
    .expect("write");
    for _ in 0..6 {
        tokio::time::sleep(timeout / 3).await;
        tcp.write_all(b"x").await.expect("write");
    }
    let answer = read_to_close(&mut tcp, "a slow body").await;
    assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer}");
    assert!(answer.ends_with("6 bytes"), "{answer}");
}

/// A client that stops reading a response holds back little in the
/// server's kernel: the socket takes at most 128 KiB unsent
/// (`TCP_NOTSENT_LOWAT`), then the body stops being polled — backpressure
/// reaches the application after well under a MiB (the socket's unsent
/// bytes, hyper's write buffer, the client's small receive buffer). Before,
/// the send buffer grew on its own to megabytes: a `warden serve` turn whose
/// client stopped reading read ~4 MiB of its reply before it paused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_pauses_the_response_within_a_mebibyte() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    let produced = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&produced);
    let app = Router::new().route(
        "/firehose",
        get(move || {
            let counted = Arc::clone(&counted);
            async move {
                let chunk = "x".repeat(8 * 1024);
                let chunks = futures_util::stream::repeat_with(move || {
                    counted.fetch_add(chunk.len(), Ordering::SeqCst);
                    Ok::<_, std::io::Error>(chunk.clone())
                });
                Body::from_stream(chunks)
            }
        }),
    );
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (_stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let _server = tokio::spawn(serve(listener, app, Limits::default(), async move {
        let _ = stopped.await;
    }));

    // A small receive buffer, and nothing read after the request.
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket.set_recv_buffer_size(4096).expect("rcvbuf");
    let mut client = socket.connect(addr).await.expect("connect");
    client
        .write_all(b"GET /firehose HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("write");

    // Settled: nothing more produced for 500 ms (at most 20 s).
    let mut last = usize::MAX;
    let mut settled = None;
    for _ in 0..40 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = produced.load(Ordering::SeqCst);
        if now == last {
            settled = Some(now);
            break;
        }
        last = now;
    }
    let settled =
        settled.expect("the response stops being produced while its client does not read");
    eprintln!("{settled} bytes produced before the response paused");
    assert!(
        settled < 1024 * 1024,
        "{settled} bytes produced for a client that reads nothing"
    );
    drop(client);
}

/// What hyper answers itself while it reads a head, before any route runs
/// (docs/serve.md says these cannot be shaped and have no body): a head
/// with too many fields is `431`, a malformed one `400`, each with an empty
/// body, the connection closed and its slot free for the next client
/// (`max_connections` is 1 here).
#[tokio::test]
async fn hypers_own_answers_to_a_bad_head_are_empty_and_free_their_slot() {
    let server = start(
        Limits::default()
            .with_max_connections(1)
            .with_header_timeout(BOUND),
    )
    .await;
    let many_fields: String = (0..200).map(|i| format!("x-field-{i}: {i}\r\n")).collect();
    let heads = [
        (
            format!("GET / HTTP/1.1\r\nHost: x\r\n{many_fields}\r\n"),
            "431",
        ),
        ("GET / HTTP/1.1\r\nHost x\r\n\r\n".to_owned(), "400"),
    ];
    for (head, status) in heads {
        let mut tcp = TcpStream::connect(server.addr).await.expect("connect");
        tcp.write_all(head.as_bytes()).await.expect("write");
        let answer = read_to_close(&mut tcp, "a bad head's answer").await;
        let first = answer.lines().next().unwrap_or_default();
        assert!(
            first.starts_with(&format!("HTTP/1.1 {status} ")),
            "hyper answers {status}: {answer:?}"
        );
        let (_, body) = answer.split_once("\r\n\r\n").expect("a whole head");
        assert_eq!(body, "", "hyper's own answer has no body: {answer:?}");
        // The one slot is free again.
        assert!(get_ok(server.addr).await.ends_with("ok"), "served after it");
    }
}
