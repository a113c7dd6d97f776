//! A message on stdin (`chat -`) or a request body (`stream --body`) larger
//! than 32 MiB is a usage error naming the limit, read no further than the
//! limit; 10 MB still goes through. The oversized input is a generated,
//! finite stream (limit + 1 MiB) fed through a pipe, never `/dev/zero`.
//! `warden serve` answers a body over its `--max-body-bytes` with 413
//! naming the limit and that flag.

use crate::common;

use std::process::{Output, Stdio};
use std::time::Duration;

use common::*;
use tokio::io::AsyncWriteExt;
use warden_mock::{MockConfig, MockServer};

const LIMIT: usize = 32 * 1024 * 1024;

/// Runs `cmd` with `input` written to its stdin; the child may stop reading
/// early (a broken pipe is expected then).
async fn with_stdin(mut cmd: tokio::process::Command, input: Vec<u8>) -> Output {
    cmd.stdin(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn");
    let mut stdin = child.stdin.take().expect("stdin");
    let writer = tokio::spawn(async move {
        // An early exit of the child closes the pipe: not an error here.
        let _ = stdin.write_all(&input).await;
    });
    let out = tokio::time::timeout(Duration::from_secs(120), child.wait_with_output())
        .await
        .expect("warden finished in time")
        .expect("warden ran");
    tokio::time::timeout(Duration::from_secs(10), writer)
        .await
        .expect("the writer finished")
        .expect("the writer did not panic");
    check_no_panic(&out);
    out
}

fn chat_args<'a>(
    dir: &'a std::path::Path,
    data: &'a std::path::Path,
    base: &'a str,
) -> Vec<&'a str> {
    vec![
        "chat",
        "--workspace",
        arg(dir),
        "--data-dir",
        arg(data),
        "--agent",
        "anthropic",
        "--base-url",
        base,
        "-",
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_over_the_limit_on_stdin_is_a_usage_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let args = chat_args(dir.path(), &data, "http://127.0.0.1:9");
    let out = with_stdin(command(&args), vec![b'a'; LIMIT + 1024 * 1024]).await;
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert_one_line_error(
        &out,
        "the message on stdin is larger than the limit of 32 MiB",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_over_the_limit_is_a_usage_error() {
    // A JSON string that never ends within the limit.
    let mut body = b"{\"messages\":\"".to_vec();
    body.resize(LIMIT + 1024 * 1024, b'a');
    let out = with_stdin(
        command(&["stream", "http://127.0.0.1:9", "--body", "/dev/stdin"]),
        body,
    )
    .await;
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert_one_line_error(&out, "--body /dev/stdin is larger than the limit of 32 MiB");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_megabytes_of_message_or_body_still_go_through() {
    const SIZE: usize = 10 * 1000 * 1000;
    let server = MockServer::start(MockConfig::default())
        .await
        .expect("mock");
    let base = server.base_url();
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let args = chat_args(dir.path(), &data, &base);
    let out = with_stdin(command(&args), vec![b'a'; SIZE]).await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(
        stdout(&out).contains(&format!("had {SIZE} characters")),
        "{}",
        stdout(&out)
    );

    let body = serde_json::to_vec(&serde_json::json!({
        "model": "m",
        "max_tokens": 8,
        "messages": [{"role": "user", "content": "b".repeat(SIZE)}],
    }))
    .expect("json");
    let out = with_stdin(command(&["stream", &base, "--body", "/dev/stdin"]), body).await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(
        stdout(&out).contains(&format!("had {SIZE} characters")),
        "{}",
        stdout(&out)
    );
    server.shutdown().await;
}

/// `warden serve --max-body-bytes` sets the largest request body it takes:
/// a larger one gets 413 naming the limit and the flag that raises it, a
/// smaller one is accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_refuses_a_body_over_max_body_bytes_naming_the_flag() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let (mut child, base, token) = serve_on(
        &data,
        "http://127.0.0.1:9",
        &["--max-body-bytes", "2048"],
        &[],
    )
    .await;
    let client = reqwest::Client::new();
    let post = |size: usize| {
        let request = client
            .post(format!("{base}/v1/turns"))
            .bearer_auth(&token)
            .header("content-type", "application/json")
            .body(serde_json::json!({"key": "k", "message": "x".repeat(size)}).to_string())
            .send();
        async move {
            tokio::time::timeout(Duration::from_secs(30), request)
                .await
                .expect("answered within 30 s")
                .expect("post")
        }
    };
    let answer = post(4096).await;
    assert_eq!(answer.status().as_u16(), 413);
    let body: serde_json::Value =
        serde_json::from_slice(&answer.bytes().await.expect("the body")).expect("a JSON error");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("2048 bytes") && message.contains("--max-body-bytes"),
        "{body}"
    );
    assert_eq!(post(1024).await.status().as_u16(), 202);
    let _ = child.start_kill();
}
