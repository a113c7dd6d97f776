//! Failures after the 200: error events, truncation, broken connections,
//! malformed JSON and oversized frames each end the stream with the right
//! error, after the events that came before.

use std::time::Duration;

use crate::support::*;
use warden_core::{AgentEvent, EventSource, StreamError};

fn started_text() -> Vec<Vec<u8>> {
    let mut parts = vec![message_start()];
    let block = text_block(0, "Hel");
    parts.extend(block.into_iter().take(2)); // start + delta, no stop
    parts
}

async fn run(reply: Reply) -> (Vec<warden_core::Frame>, StreamError) {
    let server = Server::start(vec![reply]).await;
    let stream = anthropic_with(&server, |o| o.with_max_frame_bytes(4096))
        .open(turn("hi"))
        .await
        .expect("the stream opens");
    let (frames, error) = collect(stream).await;
    (frames, error.expect("the stream fails"))
}

#[tokio::test]
async fn a_mid_stream_overloaded_error_is_a_retryable_api_error() {
    let mut parts = started_text();
    parts.push(sse(
        "error",
        r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
    ));
    let (frames, error) = run(Reply::sse(parts)).await;
    assert!(events(&frames).contains(&AgentEvent::TextDelta("Hel".into())));
    assert_eq!(
        error,
        StreamError::Api {
            status: None,
            kind: "overloaded_error".into(),
            message: "Overloaded".into(),
            retryable: true,
            retry_after: None,
        }
    );
}

#[tokio::test]
async fn mid_stream_error_kinds_decide_retryability() {
    for (kind, retryable) in [
        ("api_error", true),
        ("overloaded_error", true),
        ("invalid_request_error", false),
        ("billing_error", false),
    ] {
        let mut parts = started_text();
        parts.push(sse(
            "error",
            &format!(r#"{{"type":"error","error":{{"type":"{kind}","message":"m"}}}}"#),
        ));
        let (_, error) = run(Reply::sse(parts)).await;
        assert!(
            matches!(&error, StreamError::Api { kind: k, retryable: r, status: None, .. } if k == kind && *r == retryable),
            "{kind}: {error:?}"
        );
    }
}

#[tokio::test]
async fn a_clean_end_before_message_stop_is_truncated() {
    let (frames, error) = run(Reply::sse(started_text())).await;
    assert!(
        matches!(&error, StreamError::Truncated { message } if message.contains("message_stop")),
        "{error:?}"
    );
    assert!(error.is_retryable());
    assert!(events(&frames).contains(&AgentEvent::TextDelta("Hel".into())));
}

#[tokio::test]
async fn eof_of_a_connection_close_body_before_message_stop_is_truncated() {
    let (_, error) = run(Reply::sse(started_text()).framing(Framing::Close)).await;
    assert!(matches!(error, StreamError::Truncated { .. }), "{error:?}");
}

#[tokio::test]
async fn a_connection_broken_inside_a_chunk_is_a_connection_error() {
    let (frames, error) = run(Reply::sse(started_text()).after(After::Abort)).await;
    assert!(matches!(error, StreamError::Connection { .. }), "{error:?}");
    assert!(error.is_retryable());
    assert!(events(&frames).contains(&AgentEvent::TextDelta("Hel".into())));
}

#[tokio::test]
async fn malformed_json_is_malformed_without_the_frame_text() {
    let mut parts = started_text();
    parts.push(sse(
        "content_block_delta",
        r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"SECRET-COMPLETION"#,
    ));
    let (_, error) = run(Reply::sse(parts)).await;
    let StreamError::Malformed { message } = &error else {
        panic!("{error:?}");
    };
    assert!(message.contains("EOF while parsing"), "{message}");
    assert!(!message.contains("SECRET"), "{message}");
    assert!(!error.is_retryable());

    // A type error: serde would quote the value; it is redacted.
    let mut parts = started_text();
    parts.push(sse(
        "content_block_delta",
        r#"{"type":"content_block_delta","index":"SECRET-INDEX","delta":{"type":"text_delta","text":"x"}}"#,
    ));
    let (_, error) = run(Reply::sse(parts)).await;
    let StreamError::Malformed { message } = &error else {
        panic!("{error:?}");
    };
    assert!(message.contains("invalid type"), "{message}");
    assert!(!message.contains("SECRET"), "{message}");
}

#[tokio::test]
async fn invalid_utf8_is_malformed() {
    let mut parts = started_text();
    parts.push(b"event: content_block_delta\ndata: {\"a\xff\xfe\": 1}\n\n".to_vec());
    let (_, error) = run(Reply::sse(parts)).await;
    assert!(
        matches!(&error, StreamError::Malformed { message } if message.contains("UTF-8")),
        "{error:?}"
    );
}

#[tokio::test]
async fn an_oversized_frame_fails_before_it_is_read_whole() {
    // A 4 MiB data line with no end, in 16 KiB parts; the limit is 4 KiB.
    let mut parts = vec![
        message_start(),
        b"event: content_block_delta\ndata: ".to_vec(),
    ];
    parts.extend(std::iter::repeat_n(vec![b'x'; 16 * 1024], 256));
    let mut reply = Reply::sse(parts).after(After::Hold);
    reply.delay = Duration::from_millis(1);
    let mut server = Server::start(vec![reply]).await;
    let stream = anthropic_with(&server, |o| o.with_max_frame_bytes(4096))
        .open(turn("hi"))
        .await
        .expect("opens");
    let (_, error) = collect(stream).await;
    let Some(StreamError::FrameTooLarge { size, limit }) = error else {
        panic!("{error:?}");
    };
    assert_eq!(limit, 4096);
    assert!(size > 4096, "{size}");
    assert!(size < 1024 * 1024, "gave up early, not after {size} bytes");
    assert!(!warden_core::StreamError::FrameTooLarge { size, limit }.is_retryable());
    // Failing dropped the body: the server sees the connection close
    // instead of writing the rest.
    assert_eq!(server.client_closed().await, ClientClosed::Yes);
}

#[tokio::test]
async fn many_short_data_lines_in_one_event_count_toward_the_limit() {
    let mut parts = vec![message_start(), b"event: content_block_delta\n".to_vec()];
    // 40 parts of 10 lines: 6.8 KiB in one event.
    parts.extend(std::iter::repeat_n(b"data: 0123456789\n".repeat(10), 40));
    let (_, error) = run(Reply::sse(parts)).await;
    assert!(
        matches!(error, StreamError::FrameTooLarge { limit: 4096, .. }),
        "{error:?}"
    );
}
