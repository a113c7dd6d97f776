//! `warden proxy` as an operator watches it: an upstream that cannot be
//! reached is named at start, every retry and hand-back is one `warden
//! proxy:` line on stderr with its reason, and `HEAD /` (Claude Code's
//! probe) is answered by the proxy instead of going to a public host.

use crate::common;

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
        "--json",
    ]);
    let (mut child, base, mut stdout) = spawn_listening(cmd, Duration::from_secs(30)).await;
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
    // The access log: one JSON line per request, each with when and its id.
    let mut access = Vec::new();
    while access.len() < 3 {
        let line = tokio::time::timeout(Duration::from_secs(10), stdout.next_line())
            .await
            .expect("an access line in time")
            .expect("read")
            .expect("a line");
        access.push(serde_json::from_str::<serde_json::Value>(&line).expect("JSON"));
    }

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
    // Each recovery line: when, then which request (`#id`), then what.
    let recoveries: Vec<&str> = said.lines().filter_map(recovery).collect();
    let retried: Vec<&str> = recoveries
        .iter()
        .filter(|l| {
            l.starts_with("anthropic /v1/messages #")
                && l.contains(": attempt")
                && l.contains("(ECONNECTION); retrying in")
        })
        .copied()
        .collect();
    assert!(!retried.is_empty(), "{said}");
    let answered = recoveries
        .iter()
        .find(|l| l.contains(": answered 502 after") && l.contains("ECONNECTION"))
        .unwrap_or_else(|| panic!("{said}"));
    let id = request_id(retried[0]);
    assert_eq!(request_id(answered), id, "one request's lines: {said}");
    assert!(
        recoveries.iter().any(
            |l| l.starts_with("anthropic: the upstream cannot be reached")
                && l.contains("answered at once")
        ),
        "one line when the circuit opens: {said}"
    );
    let logged = access
        .iter()
        .find(|r| r["id"] == id && r["path"] == "/v1/messages")
        .unwrap_or_else(|| panic!("request #{id} in the access log: {access:?}"));
    assert_eq!(logged["status"], 502, "{logged}");
    let at = logged["at"].as_str().expect("at");
    humantime::parse_rfc3339(at).unwrap_or_else(|e| panic!("{at}: {e}"));
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

/// A `warden proxy:` recovery line's text after its RFC 3339 time (which
/// must be there); `None` for the proxy's other lines.
fn recovery(line: &str) -> Option<&str> {
    let rest = line.strip_prefix("warden proxy: ")?;
    let (at, text) = rest.split_once(' ')?;
    humantime::parse_rfc3339(at).ok()?;
    Some(text)
}

/// The request id a recovery line names (`… #7: …`).
fn request_id(line: &str) -> u64 {
    line.split_once(" #")
        .and_then(|(_, rest)| rest.split_once(':'))
        .and_then(|(id, _)| id.parse().ok())
        .unwrap_or_else(|| panic!("no request id: {line}"))
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
