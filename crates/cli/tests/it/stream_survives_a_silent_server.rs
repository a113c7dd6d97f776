//! `warden stream` against the mock server: a stall is killed by the
//! watchdog and retried, each ending has its documented exit code, and
//! Ctrl-C cancels at once.

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::io::AsyncReadExt;
use warden_mock::{MockConfig, MockServer, Scenario};

const STALL_MESSAGE: &str = "Connection lost during streaming. Retrying...";

async fn mock(sequence: &[Scenario]) -> MockServer {
    MockServer::start(MockConfig::default().with_sequence(sequence.iter().copied()))
        .await
        .expect("mock starts")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_stream_is_killed_retried_and_completed() {
    let server = mock(&[Scenario::Stall, Scenario::Normal]).await;
    let url = server.url("/v1/messages");
    let out = run(&["stream", &url, "--timeout", "300", "--message", "ping me"]).await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let err = stderr(&out);
    assert_eq!(
        err.lines().filter(|l| *l == STALL_MESSAGE).count(),
        1,
        "stderr: {err}"
    );
    // The reply broke mid-text and was continued: stdout has it once,
    // stderr says so.
    assert_eq!(
        stdout(&out),
        "Hello from warden-mock. Your last message had 7 characters.\n"
    );
    assert!(err.contains("continuing the reply"), "stderr: {err}");
    // The watchdog's kill closed the stalled connection.
    assert!(
        server
            .wait_for_client_close(1, Duration::from_secs(5))
            .await
    );
    assert_eq!(server.requests_to("/v1/messages"), 2);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_responses_stream_is_reattached_and_printed_once() {
    let server = MockServer::start(
        MockConfig::default()
            .with_sequence([Scenario::Stall, Scenario::Normal])
            .with_fault_after_frames(5),
    )
    .await
    .expect("mock starts");
    let url = server.url("/v1/responses");
    let out = run(&["stream", &url, "--timeout", "300", "--message", "ping me"]).await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(
        stdout(&out),
        "Hello from warden-mock. Your last message had 7 characters.\n"
    );
    let err = stderr(&out);
    assert_eq!(
        err.lines().filter(|l| *l == STALL_MESSAGE).count(),
        1,
        "stderr: {err}"
    );
    assert!(err.contains("continuing the reply"), "stderr: {err}");
    let requests = server.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(requests[1].method, "GET", "re-attached, not re-sent");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silence_on_every_attempt_exits_4() {
    let server = mock(&[Scenario::Stall]).await;
    let url = server.url("/v1/messages");
    let out = run(&["stream", &url, "--timeout", "200", "--retries", "1"]).await;
    assert_eq!(code(&out), 4, "{}", stderr(&out));
    assert_eq!(stderr(&out).matches(STALL_MESSAGE).count(), 1);
    assert_one_line_error(
        &out,
        "turn failed after 2 attempts: Connection lost during streaming",
    );
    assert_eq!(server.requests_to("/v1/messages"), 2);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_codes_tell_fatal_api_errors_from_unavailable_servers_and_usage() {
    let server = mock(&[Scenario::PromptTooLong]).await;
    // OpenAI protocol, chosen from the URL's path.
    let out = run(&["stream", &server.url("/v1/chat/completions")]).await;
    assert_eq!(code(&out), 3, "{}", stderr(&out));
    assert_one_line_error(&out, "prompt is too long");
    assert_eq!(
        server.requests_to("/v1/chat/completions"),
        1,
        "a fatal error is not retried"
    );
    server.shutdown().await;

    // Nothing listens on that port any more.
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind")
        .local_addr()
        .expect("addr");
    let url = format!("http://{closed}/v1/messages");
    let out = run(&["stream", &url, "--retries", "0"]).await;
    assert_eq!(code(&out), 5, "{}", stderr(&out));
    assert_one_line_error(&out, "connection error");

    for (args, needle) in [
        (vec!["stream", "not a url"], "invalid URL"),
        (vec!["stream", "ftp://example.com/"], "invalid URL"),
        (
            vec!["stream", "http://127.0.0.1:9/", "--timeout", "0"],
            "--timeout",
        ),
        (
            vec![
                "stream",
                "http://127.0.0.1:9/",
                "--body",
                "/nonexistent.json",
            ],
            "cannot read --body",
        ),
    ] {
        let out = run(&args).await;
        assert_eq!(code(&out), 2, "{args:?}: {}", stderr(&out));
        assert_one_line_error(&out, needle);
    }
    // clap's own usage errors use 2 as well.
    let out = run(&["stream", "http://127.0.0.1:9/", "--bogus"]).await;
    assert_eq!(code(&out), 2);
    let out = run(&["stream", "http://127.0.0.1:9/", "--provider", "gemini"]).await;
    assert_eq!(code(&out), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_file_is_sent_as_the_request() {
    let server = mock(&[Scenario::Normal]).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let body = dir.path().join("request.json");
    std::fs::write(
        &body,
        r#"{"model":"claude-from-file","max_tokens":32,"messages":[{"role":"user","content":"from the file"}]}"#,
    )
    .expect("write");
    let out = run(&["stream", &server.base_url(), "--body", arg(&body)]).await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(
        stdout(&out).contains("had 13 characters"),
        "{}",
        stdout(&out)
    );
    let request = &server.requests()[0];
    assert_eq!(request.model.as_deref(), Some("claude-from-file"));
    assert!(request.stream, "stream: true is set for the user");

    std::fs::write(&body, "[1, 2]").expect("write");
    let out = run(&["stream", &server.base_url(), "--body", arg(&body)]).await;
    assert_eq!(code(&out), 2);
    assert_one_line_error(&out, "must be a JSON object");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctrl_c_cancels_at_once_with_exit_130() {
    let server = mock(&[Scenario::Stall]).await;
    let url = server.url("/v1/messages");
    let mut child = command(&["stream", &url, "--timeout", "60000"])
        .spawn()
        .expect("spawn");
    assert!(
        server.wait_for_request(1, Duration::from_secs(10)).await,
        "the request reached the server"
    );
    // Readiness marker: the stall's first text on stdout. `warden` prints it
    // from the relay loop, which by then has polled (and so registered) its
    // Ctrl-C handler; a SIGINT sent earlier could find the default handler
    // and kill it by signal instead of exit 130. Keep reading the pipe open.
    let mut stdout = child.stdout.take().expect("stdout");
    let mut first = [0u8; 64];
    let n = tokio::time::timeout(Duration::from_secs(10), stdout.read(&mut first))
        .await
        .expect("the stall's first text in time")
        .expect("read stdout");
    assert!(n > 0, "stdout closed before any text");
    let pid = Pid::from_raw(child.id().expect("pid") as i32);
    let sent = Instant::now();
    kill(pid, Signal::SIGINT).expect("SIGINT");
    let out = tokio::time::timeout(Duration::from_secs(10), child.wait_with_output())
        .await
        .expect("exited")
        .expect("output");
    let took = sent.elapsed();
    check_no_panic(&out);
    assert_eq!(code(&out), 130, "{}", stderr(&out));
    assert_one_line_error(&out, "cancelled");
    assert!(took < Duration::from_secs(3), "cancel took {took:?}");
    assert!(
        server
            .wait_for_client_close(1, Duration::from_secs(5))
            .await
    );
    assert!(
        !stderr(&out).contains(STALL_MESSAGE),
        "a cancel is not retried"
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_above_100_are_a_usage_error_instead_of_retrying_for_ever() {
    for n in ["101", "4294967295"] {
        let out = run(&["stream", "http://127.0.0.1:9/", "--retries", n]).await;
        assert_eq!(code(&out), 2, "--retries {n}: {}", stderr(&out));
        assert!(stderr(&out).contains("--retries"), "{}", stderr(&out));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_cancels_like_ctrl_c_and_exits_143() {
    let server = mock(&[Scenario::Stall]).await;
    let url = server.url("/v1/messages");
    let child = command(&["stream", &url, "--timeout", "60000"])
        .spawn()
        .expect("spawn");
    assert!(
        server.wait_for_request(1, Duration::from_secs(10)).await,
        "the request reached the server"
    );
    let pid = Pid::from_raw(child.id().expect("pid") as i32);
    let sent = Instant::now();
    kill(pid, Signal::SIGTERM).expect("SIGTERM");
    let out = tokio::time::timeout(Duration::from_secs(10), child.wait_with_output())
        .await
        .expect("exited within 10 s of SIGTERM")
        .expect("output");
    let took = sent.elapsed();
    check_no_panic(&out);
    assert!(took < Duration::from_secs(3), "the cancel took {took:?}");
    // An exit code, not death by the signal: the handler ran.
    assert_eq!(code(&out), 143, "{}", stderr(&out));
    assert_one_line_error(&out, "cancelled");
    // Cleaned up: the stream's connection was closed, not just abandoned.
    assert!(
        server
            .wait_for_client_close(1, Duration::from_secs(5))
            .await
    );
    assert!(!stderr(&out).contains(STALL_MESSAGE), "not retried");
    server.shutdown().await;
}
