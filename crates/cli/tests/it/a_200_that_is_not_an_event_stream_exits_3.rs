//! `warden stream` pointed at something that answers 200 with a web page
//! (the wrong endpoint) fails at once with exit 3 and says so, instead of
//! retrying "stream ended before message_stop" and exiting 5.

use crate::common;

use std::time::Duration;

use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// Answers every connection with `response`; counts the requests.
async fn serve(response: &'static str) -> (String, tokio::sync::mpsc::UnboundedReceiver<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!(
        "http://{}/v1/messages",
        listener.local_addr().expect("addr")
    );
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let tx = tx.clone();
            tokio::spawn(async move {
                // Read the request head and its body before answering.
                let mut seen = Vec::new();
                let mut buf = [0u8; 4096];
                loop {
                    let Ok(n) = socket.read(&mut buf).await else {
                        return;
                    };
                    if n == 0 {
                        return;
                    }
                    seen.extend_from_slice(&buf[..n]);
                    if let Some(end) = seen.windows(4).position(|w| w == b"\r\n\r\n") {
                        let head = String::from_utf8_lossy(&seen[..end]).to_ascii_lowercase();
                        let length = head
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length:"))
                            .and_then(|v| v.trim().parse::<usize>().ok())
                            .unwrap_or(0);
                        if seen.len() >= end + 4 + length {
                            break;
                        }
                    }
                }
                let _ = tx.send(());
                let _ = socket.write_all(response.as_bytes()).await;
                let _ = socket.shutdown().await;
            });
        }
    });
    (url, rx)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_html_page_with_status_200_is_a_fatal_error_with_exit_3() {
    let (url, mut requests) = serve(
        "HTTP/1.1 200 OK\r\ncontent-type: text/html\r\ncontent-length: 22\r\nconnection: close\r\n\r\n<html>Welcome!</html>\n",
    )
    .await;
    let out = output(
        command(&["stream", &url, "--retries", "3"]),
        Duration::from_secs(60),
    )
    .await;
    assert_eq!(code(&out), 3, "{}", stderr(&out));
    assert_one_line_error(&out, "wrong endpoint or content type");
    assert!(!stderr(&out).contains("retrying"), "{}", stderr(&out));
    // Exactly one request: the error was not retried.
    assert!(requests.try_recv().is_ok());
    assert!(requests.try_recv().is_err(), "retried");
}
