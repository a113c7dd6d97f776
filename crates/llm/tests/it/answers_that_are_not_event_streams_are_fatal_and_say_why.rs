//! A 2xx answer that is not an event stream (an HTML page, a JSON document,
//! a compressed body) and a redirect are fatal errors that say what came
//! back, instead of a retried "stream ended before message_stop" or
//! "invalid UTF-8". Redirects are still not followed.

use std::time::Duration;

use crate::support::*;
use warden_core::{EventSource, StreamError};
use warden_llm::NOT_AN_EVENT_STREAM;

fn reply(status: u16, headers: &[(&str, &str)], body: &[u8]) -> Reply {
    Reply {
        status,
        headers: headers
            .iter()
            .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
            .collect(),
        parts: vec![body.to_vec()],
        delay: Duration::ZERO,
        framing: Framing::Length,
        after: After::End,
    }
}

/// The error of the first attempt, whether `open` or the stream reports it.
async fn error_of(server: &Server) -> StreamError {
    match anthropic(server).open(turn("hi")).await {
        Err(e) => e,
        Ok(stream) => collect(stream).await.1.expect("the stream fails"),
    }
}

fn assert_fatal_not_an_event_stream(e: &StreamError, needle: &str) {
    match e {
        StreamError::Api {
            kind,
            message,
            retryable,
            ..
        } => {
            assert_eq!(kind, NOT_AN_EVENT_STREAM, "{e}");
            assert!(!retryable, "{e}");
            assert!(message.contains(needle), "{needle:?} not in {message:?}");
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn an_html_or_json_200_is_a_fatal_wrong_endpoint_error() {
    for (content_type, body) in [
        (
            "text/html; charset=utf-8",
            &b"<html><body>Welcome</body></html>"[..],
        ),
        ("application/json", &br#"{"models":[]}"#[..]),
    ] {
        let server = Server::start(vec![reply(200, &[("content-type", content_type)], body)]).await;
        let e = error_of(&server).await;
        assert_fatal_not_an_event_stream(&e, "wrong endpoint or content type");
        assert_fatal_not_an_event_stream(&e, content_type);
    }
}

#[tokio::test]
async fn a_compressed_body_is_named_as_such_not_as_invalid_utf8() {
    let gzip = [
        0x1f, 0x8b, 0x08, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xff, 0xc3, 0x28,
    ];
    let mut server = Server::start(vec![reply(
        200,
        &[
            ("content-type", "text/event-stream"),
            ("content-encoding", "gzip"),
        ],
        &gzip,
    )])
    .await;
    let e = error_of(&server).await;
    assert_fatal_not_an_event_stream(&e, "content-encoding: gzip");
    assert_eq!(
        server.request().await.header("accept-encoding").as_deref(),
        Some("identity"),
        "warden asks for an uncompressed body"
    );

    // The same bytes without the header: recognised by their magic number.
    let server = Server::start(vec![reply(
        200,
        &[("content-type", "text/event-stream")],
        &gzip,
    )])
    .await;
    let e = error_of(&server).await;
    assert_fatal_not_an_event_stream(&e, "gzip-compressed");
}

#[tokio::test]
async fn a_redirect_names_its_target_and_is_not_followed() {
    let mut server = Server::start(vec![
        reply(
            307,
            &[("location", "https://elsewhere.example/v1/messages")],
            b"",
        ),
        Reply::sse(anthropic_text_turn()),
    ])
    .await;
    let e = error_of(&server).await;
    match &e {
        StreamError::Api {
            status: Some(307),
            kind,
            message,
            retryable: false,
            ..
        } => {
            assert_eq!(kind, "redirect");
            assert!(
                message.contains("https://elsewhere.example/v1/messages"),
                "{message}"
            );
        }
        other => panic!("{other:?}"),
    }
    // Had it been followed, the error would be the unreachable target's
    // connection error (or the second reply's text), not the 307.
    let first = server.request().await;
    assert!(first.request_line().starts_with("POST /v1/messages"));
}
