//! The proxy's upstream connection pool against hand-written HTTP/1.1
//! upstreams over real loopback TCP: a connection goes back to the pool
//! only after an answer read cleanly to its end (a streamed one
//! included), never after an error answer; a request the upstream may
//! have read is never sent again unseen — a second send is an attempt the
//! access log counts.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::*;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use warden_proxy::{AccessRecord, Proxy, ProxyConfig};

/// Reads one request (its head and `content-length` body) from `socket`:
/// `false` once the client closed it.
async fn read_request(socket: &mut TcpStream) -> bool {
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        if let Some(end) = seen.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&seen[..end]).to_lowercase();
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length: "))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            if seen.len() >= end + 4 + len {
                return true;
            }
        }
        match socket.read(&mut buf).await {
            Ok(0) | Err(_) => return false,
            Ok(n) => seen.extend_from_slice(&buf[..n]),
        }
    }
}

/// A whole Anthropic stream saying `text`, chunked, its end in the same
/// write as its last event (as an upstream sends it).
fn streamed(text: &str) -> String {
    let ev = |e: &str, d: String| format!("event: {e}\ndata: {d}\n\n");
    let events = [
        ev("message_start", r#"{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","model":"claude-test","content":[],"stop_reason":null,"usage":{"input_tokens":3,"output_tokens":1}}}"#.into()),
        ev("content_block_start", r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#.into()),
        ev("content_block_delta", format!(r#"{{"type":"content_block_delta","index":0,"delta":{{"type":"text_delta","text":"{text}"}}}}"#)),
        ev("content_block_stop", r#"{"type":"content_block_stop","index":0}"#.into()),
        ev("message_delta", r#"{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":3}}"#.into()),
        ev("message_stop", r#"{"type":"message_stop"}"#.into()),
    ]
    .concat();
    format!(
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n{:x}\r\n{events}\r\n0\r\n\r\n",
        events.len()
    )
}

const OVERLOADED: &str =
    r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#;

/// What a hand-written upstream saw.
#[derive(Default)]
struct Seen {
    connections: AtomicUsize,
    requests: AtomicUsize,
}

/// An upstream that runs `script` on each connection it accepts (with the
/// connection's number, from 1, and what it saw).
async fn upstream<F, Fut>(script: F) -> (String, Arc<Seen>)
where
    F: Fn(usize, TcpStream, Arc<Seen>) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    let seen = Arc::new(Seen::default());
    let counts = seen.clone();
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            let n = counts.connections.fetch_add(1, Ordering::SeqCst) + 1;
            tokio::spawn(script(n, socket, counts.clone()));
        }
    });
    (base, seen)
}

/// Answers every request on `socket` with a whole stream saying `text`.
async fn answer_all(mut socket: TcpStream, seen: Arc<Seen>, text: &str) {
    while read_request(&mut socket).await {
        seen.requests.fetch_add(1, Ordering::SeqCst);
        if socket.write_all(streamed(text).as_bytes()).await.is_err() {
            return;
        }
    }
}

/// A proxy in front of `base` whose access records are kept.
async fn proxy(
    base: &str,
    tune: impl FnOnce(ProxyConfig) -> ProxyConfig,
) -> (String, Proxy, Arc<Mutex<Vec<AccessRecord>>>) {
    let records: Arc<Mutex<Vec<AccessRecord>>> = Arc::default();
    let sink = records.clone();
    let config = ProxyConfig::default()
        .with_anthropic_upstream(base)
        .with_timeout(TIMEOUT)
        .with_retry(
            warden_core::RetryPolicy::default()
                .with_jitter(0.0)
                .with_backoff(Duration::from_millis(10), Duration::from_millis(10)),
        )
        .with_access_log(move |r| {
            sink.lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(r.clone())
        });
    let proxy = Proxy::start(tune(config)).await.expect("proxy");
    (serve(&proxy).await, proxy, records)
}

/// A streaming request through the proxy at `at`: its status, and its
/// text when it is a stream.
async fn ask(at: &str) -> (u16, String) {
    let response = within(
        "the answer",
        reqwest::Client::new()
            .post(format!("{at}/v1/messages"))
            .header("x-api-key", KEY)
            .header("anthropic-version", "2023-06-01")
            .header("content-type", "application/json")
            .body(messages_body("claude-test", "hi"))
            .send(),
    )
    .await
    .expect("answer");
    let status = response.status().as_u16();
    if status != 200 {
        return (
            status,
            within("the body", response.text()).await.expect("body"),
        );
    }
    (status, well_formed_anthropic(&read_sse(response).await))
}

/// Waits (bounded) until `records` holds `n` access records.
async fn records(records: &Mutex<Vec<AccessRecord>>, n: usize) -> Vec<AccessRecord> {
    within("the access records", async {
        loop {
            let now = records.lock().unwrap_or_else(|p| p.into_inner()).clone();
            if now.len() >= n {
                return now;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
}

#[tokio::test]
async fn a_streamed_answer_gives_its_connection_to_the_next_request() {
    let (base, seen) = upstream(|_, socket, seen| answer_all(socket, seen, "the answer")).await;
    let (at, _proxy, _) = proxy(&base, |c| c).await;
    for _ in 0..3 {
        assert_eq!(ask(&at).await, (200, "the answer".to_owned()));
    }
    assert_eq!(seen.requests.load(Ordering::SeqCst), 3);
    assert_eq!(
        seen.connections.load(Ordering::SeqCst),
        1,
        "one upstream connection for three streamed answers"
    );
}

#[tokio::test]
async fn a_request_the_upstream_read_before_resetting_is_a_counted_attempt() {
    // The first connection answers its first request, then reads the
    // second and resets; every other connection answers.
    let (base, seen) = upstream(|n, mut socket, seen| async move {
        if n > 1 {
            return answer_all(socket, seen, "the answer").await;
        }
        assert!(read_request(&mut socket).await);
        seen.requests.fetch_add(1, Ordering::SeqCst);
        socket
            .write_all(streamed("the answer").as_bytes())
            .await
            .expect("write");
        if read_request(&mut socket).await {
            seen.requests.fetch_add(1, Ordering::SeqCst);
        }
        // A reset, not a close: no linger.
        let _ = socket.set_zero_linger();
        drop(socket);
    })
    .await;
    let (at, _proxy, log) = proxy(&base, |c| c).await;
    assert_eq!(ask(&at).await, (200, "the answer".to_owned()));
    assert_eq!(ask(&at).await, (200, "the answer".to_owned()));
    let records = records(&log, 2).await;
    let attempts: Vec<u32> = records.iter().map(|r| r.attempts).collect();
    let read = seen.requests.load(Ordering::SeqCst);
    assert_eq!(read, 3, "the reset request was read, then sent again");
    assert_eq!(
        attempts.iter().sum::<u32>() as usize,
        read,
        "every request the upstream read is an attempt in the access log: {attempts:?}"
    );
    assert_eq!(attempts, [1, 2]);
}

#[tokio::test]
async fn a_late_response_after_an_error_answer_never_reaches_the_next_request() {
    // The first connection answers 529, then writes an answer nobody asked
    // for; every other connection answers.
    let (base, _seen) = upstream(|n, mut socket, seen| async move {
        if n > 1 {
            return answer_all(socket, seen, "the answer").await;
        }
        assert!(read_request(&mut socket).await);
        let overloaded = format!(
            "HTTP/1.1 529 Overloaded\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{OVERLOADED}",
            OVERLOADED.len()
        );
        socket
            .write_all(overloaded.as_bytes())
            .await
            .expect("write");
        // Late, but within the proxy's silence allowance (TIMEOUT).
        tokio::time::sleep(Duration::from_millis(100)).await;
        let _ = socket.write_all(streamed("stray").as_bytes()).await;
        let mut rest = Vec::new();
        let _ = socket.read_to_end(&mut rest).await;
    })
    .await;
    // The 529 goes back to the client as it came (no retry of its own).
    let (at, _proxy, _) = proxy(&base, |c| {
        c.with_retry(
            warden_core::RetryPolicy::default()
                .with_jitter(0.0)
                .with_max_attempts(1),
        )
    })
    .await;
    let (status, _) = ask(&at).await;
    assert_eq!(status, 529);
    assert_eq!(ask(&at).await, (200, "the answer".to_owned()));
}
