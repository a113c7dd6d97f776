//! `warden serve` and `warden proxy` as processes against clients that
//! misbehave: a request head sent by halves is cut off after
//! `--header-timeout`; a request body that never comes is answered `408`
//! after it, in each server's error shape; past `--max-connections` a new
//! connection gets a `503` at once (before any token check); and SIGTERM
//! with a half-read head open exits 0 at once instead of waiting on the
//! head.

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use warden_mock::{MockConfig, MockServer};

const PATIENCE: Duration = Duration::from_secs(30);

/// Which server is under test.
#[derive(Clone, Copy, Debug)]
enum Server {
    Serve,
    Proxy,
}

/// Starts `server` in front of `mock` with `extra` flags: the child, its
/// address and the scratch directory it keeps.
async fn start(
    server: Server,
    mock: &MockServer,
    extra: &[&str],
) -> (tokio::process::Child, String, tempfile::TempDir) {
    let data = tempfile::tempdir().expect("tempdir");
    let base_url = mock.base_url();
    let mut args: Vec<&str> = match server {
        Server::Serve => vec![
            "serve",
            "--data-dir",
            data.path().to_str().expect("utf-8"),
            "--base-url",
            &base_url,
        ],
        Server::Proxy => vec![
            "proxy",
            "--anthropic-upstream",
            &base_url,
            "--openai-upstream",
            &base_url,
        ],
    };
    args.extend(["--listen", "127.0.0.1:0"]);
    args.extend(extra);
    let (child, base, _stdout) = spawn_listening(command(&args), PATIENCE).await;
    let addr = base.strip_prefix("http://").expect("http").to_owned();
    (child, addr, data)
}

/// Reads until the server closes the connection (a reset counts): what
/// was read. Fails if it is still open after `limit`.
async fn read_to_close(tcp: &mut TcpStream, limit: Duration, what: &str) -> String {
    let mut all = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = match tokio::time::timeout(limit, tcp.read(&mut buf)).await {
            Ok(Ok(n)) => n,
            Ok(Err(_)) => 0,
            Err(_) => panic!("{what}: still open after {limit:?}"),
        };
        if n == 0 {
            return String::from_utf8_lossy(&all).into_owned();
        }
        all.extend_from_slice(&buf[..n]);
    }
}

async fn half_head(addr: &str) -> TcpStream {
    let mut tcp = TcpStream::connect(addr).await.expect("connect");
    tcp.write_all(b"GET /v1/models HTTP/1.1\r\nHo")
        .await
        .expect("write");
    tcp
}

async fn a_half_sent_head_is_cut_off(server: Server) {
    let mock = MockServer::start(MockConfig::default())
        .await
        .expect("mock");
    let (_child, addr, _data) = start(server, &mock, &["--header-timeout", "500ms"]).await;
    let mut slow = half_head(&addr).await;
    let answer = read_to_close(&mut slow, Duration::from_secs(10), "a half-sent head").await;
    assert!(!answer.contains(" 200 "), "{server:?}: {answer}");
}

async fn past_the_cap_a_connection_gets_a_503(server: Server, error_type: &str) {
    let mock = MockServer::start(MockConfig::default())
        .await
        .expect("mock");
    let (_child, addr, _data) = start(server, &mock, &["--max-connections", "2"]).await;
    let _held = [half_head(&addr).await, half_head(&addr).await];
    let mut third = TcpStream::connect(&addr).await.expect("connect");
    third
        .write_all(b"GET /v1/sessions HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("write");
    let answer = read_to_close(&mut third, Duration::from_secs(10), "past the cap").await;
    assert!(
        answer.starts_with("HTTP/1.1 503 Service Unavailable"),
        "{server:?}: {answer}"
    );
    assert!(answer.contains("retry-after: 1"), "{server:?}: {answer}");
    let body = answer.split("\r\n\r\n").nth(1).expect("a body");
    let json: serde_json::Value = serde_json::from_str(body).expect("a JSON body");
    assert_eq!(json["error"]["type"], error_type, "{server:?}: {json}");
}

/// A whole head declaring a body that never comes: a `408` in the
/// server's error shape within the header timeout, and the connection
/// closed (it held its slot for ever).
async fn a_stalled_body_is_answered_408(server: Server, error_type: &str) {
    let mock = MockServer::start(MockConfig::default())
        .await
        .expect("mock");
    let (_child, addr, data) = start(server, &mock, &["--header-timeout", "500ms"]).await;
    let (path, auth) = match server {
        Server::Serve => {
            let token = std::fs::read_to_string(data.path().join("token")).expect("the token");
            (
                "/v1/turns",
                format!("Authorization: Bearer {}\r\n", token.trim()),
            )
        }
        Server::Proxy => ("/v1/messages", String::new()),
    };
    let mut tcp = TcpStream::connect(&addr).await.expect("connect");
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\n{auth}Content-Type: application/json\r\n\
         Content-Length: 100\r\n\r\n{{\"message\":"
    );
    tcp.write_all(head.as_bytes()).await.expect("write");
    let t0 = Instant::now();
    let answer = read_to_close(&mut tcp, Duration::from_secs(10), "a stalled body").await;
    assert!(
        answer.starts_with("HTTP/1.1 408 Request Timeout"),
        "{server:?}: {answer}"
    );
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "{server:?}: answered after {:?}",
        t0.elapsed()
    );
    let body = answer.split("\r\n\r\n").nth(1).expect("a body");
    let json: serde_json::Value = serde_json::from_str(body).expect("a JSON body");
    assert_eq!(json["error"]["type"], error_type, "{server:?}: {json}");
}

async fn sigterm_with_a_half_read_head_exits_at_once(server: Server) {
    let mock = MockServer::start(MockConfig::default())
        .await
        .expect("mock");
    let (mut child, addr, _data) = start(server, &mock, &["--grace", "30s"]).await;
    let mut half = half_head(&addr).await;
    // The head is being read (the server has accepted the connection).
    tokio::time::sleep(Duration::from_millis(200)).await;
    let t0 = Instant::now();
    let pid = Pid::from_raw(i32::try_from(child.id().expect("pid")).expect("pid fits"));
    kill(pid, Signal::SIGTERM).expect("signal");
    let status = tokio::time::timeout(Duration::from_secs(20), child.wait())
        .await
        .unwrap_or_else(|_| panic!("{server:?} exits with a half-read head open"))
        .expect("status");
    let took = t0.elapsed();
    assert_eq!(status.code(), Some(0), "{server:?}");
    assert!(
        took < Duration::from_secs(5),
        "{server:?} did not wait out its 30 s grace on a half-read head: {took:?}"
    );
    read_to_close(&mut half, Duration::from_secs(5), "after exit").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_cuts_off_a_half_sent_head() {
    a_half_sent_head_is_cut_off(Server::Serve).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_cuts_off_a_half_sent_head() {
    a_half_sent_head_is_cut_off(Server::Proxy).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_answers_503_past_its_connection_cap() {
    past_the_cap_a_connection_gets_a_503(Server::Serve, "too_many_connections").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_answers_503_past_its_connection_cap() {
    past_the_cap_a_connection_gets_a_503(Server::Proxy, "overloaded_error").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_exits_on_sigterm_with_a_half_read_head_open() {
    sigterm_with_a_half_read_head_exits_at_once(Server::Serve).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_exits_on_sigterm_with_a_half_read_head_open() {
    sigterm_with_a_half_read_head_exits_at_once(Server::Proxy).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_answers_408_to_a_body_that_never_comes() {
    a_stalled_body_is_answered_408(Server::Serve, "request_timeout").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_answers_408_to_a_body_that_never_comes() {
    a_stalled_body_is_answered_408(Server::Proxy, "timeout_error").await;
}

/// The mappings of process `pid` advised into transparent huge pages
/// (`madvise(MADV_HUGEPAGE)`: `hg` among their `VmFlags`), by address.
fn huge_page_advised(pid: u32) -> Vec<String> {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).expect("smaps");
    let mut mapping = "";
    let mut advised = Vec::new();
    for line in smaps.lines() {
        if let Some(flags) = line.strip_prefix("VmFlags:") {
            if flags.split_whitespace().any(|f| f == "hg") {
                advised.push(mapping.to_owned());
            }
        } else if line.split_whitespace().next().is_some_and(|range| {
            range.contains('-') && range.chars().all(|c| c == '-' || c.is_ascii_hexdigit())
        }) {
            // A mapping's header: `start-end perms offset dev inode path`.
            mapping = line;
        }
    }
    advised
}

/// The allocator is built without transparent huge pages: mimalloc
/// advised its whole heap `MADV_HUGEPAGE` by default, so every 2 MiB region
/// a thread touched stayed resident whole, and a client that never read a
/// 50 MB reply took `warden serve` to 113-120 MB of RSS instead of 73-78
/// (docs/serve.md). No mapping of either running server, having answered a
/// request, is advised for huge pages.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_memory_of_a_running_server_is_advised_into_huge_pages() {
    let mock = MockServer::start(MockConfig::default())
        .await
        .expect("mock");
    for server in [Server::Serve, Server::Proxy] {
        let (child, addr, _data) = start(server, &mock, &[]).await;
        let mut tcp = TcpStream::connect(&addr).await.expect("connect");
        tcp.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .expect("write");
        read_to_close(&mut tcp, PATIENCE, "a health check").await;
        let pid = child.id().expect("running");
        let advised = huge_page_advised(pid);
        assert!(
            advised.is_empty(),
            "{server:?}: mappings advised into huge pages: {advised:?}"
        );
    }
}
