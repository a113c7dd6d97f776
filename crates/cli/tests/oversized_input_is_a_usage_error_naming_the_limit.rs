//! A message on stdin (`chat -`) or a request body (`stream --body`) larger
//! than 32 MiB is a usage error naming the limit, read no further than the
//! limit; 10 MB still goes through. The oversized input is a generated,
//! finite stream (limit + 1 MiB) fed through a pipe, never `/dev/zero`.

mod common;

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
