//! `warden proxy` as an operator watches it: an upstream that cannot be
//! reached is named at start, every retry and hand-back is one `warden
//! proxy:` line on stderr with its reason, and `HEAD /` (Claude Code's
//! probe) is answered by the proxy instead of going to a public host.

mod common;

use std::time::Duration;

use common::*;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// Sends `request` (raw HTTP/1.1, `Connection: close`) and returns the
/// whole answer.
async fn http(base: &str, request: &str) -> String {
    let addr = base.strip_prefix("http://").expect("an http:// base");
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    stream.write_all(request.as_bytes()).await.expect("write");
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), stream.read_to_end(&mut answer))
        .await
        .expect("an answer in time")
        .expect("read");
    String::from_utf8_lossy(&answer).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_upstream_is_named_at_start_and_each_recovery_is_one_line() {
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let dead = format!("http://{}", closed.local_addr().expect("addr"));
    drop(closed);
    let cmd = command(&[
        "proxy",
        "--listen",
        "127.0.0.1:0",
        "--anthropic-upstream",
        &dead,
        "--openai-upstream",
        &dead,
        "--timeout",
        "1000",
    ]);
    let (mut child, base, _stdout) = spawn_listening(cmd, Duration::from_secs(30)).await;
    let mut stderr = child.stderr.take().expect("stderr");
    let said = tokio::spawn(async move {
        let mut all = String::new();
        let _ = stderr.read_to_string(&mut all).await;
        all
    });

    let probe = http(
        &base,
        "HEAD / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(probe.starts_with("HTTP/1.1 200"), "{probe}");

    let body = r#"{"model":"claude-x","max_tokens":10,"stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    let request = format!(
        "POST /v1/messages HTTP/1.1\r\nHost: x\r\nx-api-key: sk-test\r\nanthropic-version: 2023-06-01\r\ncontent-type: application/json\r\ncontent-length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let answer = http(&base, &request).await;
    assert!(answer.starts_with("HTTP/1.1 502"), "{answer}");
    assert!(answer.contains("cannot be reached"), "{answer}");
    // The circuit is open: the next request is answered at once, naming
    // the cause, without asking the upstream.
    let t0 = std::time::Instant::now();
    let again = http(&base, &request).await;
    assert!(again.starts_with("HTTP/1.1 502"), "{again}");
    assert!(
        again.contains("not asked again until a probe") && again.contains("refused"),
        "{again}"
    );
    assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());

    child.kill().await.expect("stop the proxy");
    let said = tokio::time::timeout(Duration::from_secs(10), said)
        .await
        .expect("stderr in time")
        .expect("stderr");
    assert!(
        said.contains(&format!(
            "warning: the Anthropic upstream {dead} cannot be reached"
        )),
        "{said}"
    );
    let retries = said
        .lines()
        .filter(|l| {
            l.starts_with("warden proxy: anthropic /v1/messages: attempt")
                && l.contains("(ECONNECTION); retrying in")
        })
        .count();
    assert!(retries >= 1, "{said}");
    assert!(
        said.lines().any(|l| l
            .starts_with("warden proxy: anthropic /v1/messages: answered 502 after")
            && l.contains("ECONNECTION")),
        "{said}"
    );
    assert!(
        said.lines().any(|l| l
            .starts_with("warden proxy: anthropic: the upstream cannot be reached")
            && l.contains("answered at once")),
        "one line when the circuit opens: {said}"
    );
    // The start line: where it listens, where requests go, how it judges.
    assert!(
        said.lines()
            .any(|l| l.starts_with("warden proxy: listening on http://")
                && l.contains(&format!("anthropic -> {dead}"))
                && l.contains("timeout 1s")
                && l.contains("progress allowance 180s")),
        "{said}"
    );
    assert!(!said.contains("sk-test"), "no key in the logs: {said}");
}

/// A bare number is milliseconds: `--timeout 45` (45 ms, which kills every
/// real stream) is warned about at start, and a default upstream nobody
/// named is not probed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_under_a_second_is_warned_about_and_default_upstreams_are_not_probed() {
    let cmd = command(&["proxy", "--listen", "127.0.0.1:0", "--timeout", "45"]);
    let (mut child, _base, _stdout) = spawn_listening(cmd, Duration::from_secs(30)).await;
    let mut stderr = child.stderr.take().expect("stderr");
    let said = tokio::spawn(async move {
        let mut all = String::new();
        let _ = stderr.read_to_string(&mut all).await;
        all
    });
    // The start line and any probe are out well within this.
    tokio::time::sleep(Duration::from_secs(4)).await;
    child.kill().await.expect("stop the proxy");
    let said = tokio::time::timeout(Duration::from_secs(10), said)
        .await
        .expect("stderr in time")
        .expect("stderr");
    assert!(
        said.contains("warning: --timeout is 45 ms (a bare number is milliseconds"),
        "{said}"
    );
    assert!(said.contains("timeout 0.045s"), "{said}");
    assert!(
        !said.contains("cannot be reached"),
        "nothing probed: {said}"
    );
}
