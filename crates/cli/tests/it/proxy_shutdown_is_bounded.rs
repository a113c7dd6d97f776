//! `warden proxy` stops in bounded time: SIGTERM stops accepting, an open
//! response gets `--grace`, then ends with the provider's error event (not
//! a plain close, for which Claude Code sends the whole request again) and
//! the proxy exits 0; a second signal exits at once.

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use warden_mock::{MockConfig, MockServer, Scenario};

/// A proxy in front of an upstream whose every stream stalls mid-text
/// (socket open), with a watchdog too patient to notice during the test.
async fn stalled_proxy(grace: &str) -> (MockServer, tokio::process::Child, String) {
    let mock = MockServer::start(
        MockConfig::default()
            .with_sequence([Scenario::Stall])
            .with_frame_interval(Duration::from_millis(5))
            .with_fault_after_frames(9),
    )
    .await
    .expect("mock");
    let cmd = command(&[
        "proxy",
        "--listen",
        "127.0.0.1:0",
        "--anthropic-upstream",
        &mock.base_url(),
        "--openai-upstream",
        &mock.base_url(),
        "--timeout",
        "60000",
        "--grace",
        grace,
    ]);
    let (child, base, _stdout) = spawn_listening(cmd, Duration::from_secs(30)).await;
    (mock, child, base)
}

/// Opens a streaming Messages request and reads until the reply is under
/// way: the stream and the rest of it.
async fn open_stream(base: &str) -> (tokio::net::TcpStream, String) {
    let addr = base.strip_prefix("http://").expect("http");
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let body = r#"{"model":"claude-x","max_tokens":100,"stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    let request = format!(
        "POST /v1/messages HTTP/1.1\r\nHost: x\r\nx-api-key: sk-test\r\nanthropic-version: 2023-06-01\r\ncontent-type: application/json\r\ncontent-length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.expect("write");
    let mut seen = String::new();
    let mut buf = [0u8; 4096];
    while !seen.contains("text_delta") {
        let n = tokio::time::timeout(Duration::from_secs(20), stream.read(&mut buf))
            .await
            .expect("the reply starts in time")
            .expect("read");
        assert!(n > 0, "closed early: {seen}");
        seen.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    (stream, seen)
}

fn signal(child: &tokio::process::Child, signal: Signal) {
    let pid = Pid::from_raw(i32::try_from(child.id().expect("pid")).expect("pid fits"));
    kill(pid, signal).expect("signal");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_the_grace_period_an_open_stream_ends_with_an_error_event() {
    let (_mock, mut child, base) = stalled_proxy("1s").await;
    let (mut stream, mut seen) = open_stream(&base).await;
    let t0 = Instant::now();
    signal(&child, Signal::SIGTERM);
    let mut rest = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut rest))
        .await
        .expect("the stream ends in time")
        .expect("read");
    seen.push_str(&String::from_utf8_lossy(&rest));
    let took = t0.elapsed();
    assert!(
        seen.contains("event: error") && seen.contains("overloaded_error"),
        "ended with the provider's error event: {seen}"
    );
    assert!(
        took >= Duration::from_millis(900),
        "the grace period was given: {took:?}"
    );
    let status = tokio::time::timeout(Duration::from_secs(10), child.wait())
        .await
        .expect("the proxy exits in time")
        .expect("status");
    assert_eq!(status.code(), Some(0));
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_signal_exits_at_once() {
    let (_mock, mut child, base) = stalled_proxy("60s").await;
    let (_stream, _) = open_stream(&base).await;
    signal(&child, Signal::SIGTERM);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let t0 = Instant::now();
    signal(&child, Signal::SIGINT);
    let status = tokio::time::timeout(Duration::from_secs(10), child.wait())
        .await
        .expect("the proxy exits in time")
        .expect("status");
    assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
    assert_eq!(status.code(), Some(143), "the first signal's exit code");
}
