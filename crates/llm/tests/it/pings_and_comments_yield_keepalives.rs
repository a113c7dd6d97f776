//! Pings, `:` comments and data-less events each yield a `KeepAlive`, so the
//! watchdog is fed from raw frames.

use crate::support::*;
use warden_core::{AgentEvent, EventSource, Frame};

#[tokio::test]
async fn anthropic_pings_comments_and_dataless_events_yield_keepalives() {
    let mut parts = vec![
        b": keep-alive\n\n".to_vec(),
        message_start(),
        ping(),
        b":\n\n".to_vec(),
        // A named event without data: the SSE parser drops it.
        b"event: ping\n\n".to_vec(),
    ];
    parts.extend(text_block(0, "Hi"));
    parts.push(b": keep-alive\r\n\r\n".to_vec());
    parts.push(ping());
    parts.extend(message_end("end_turn"));
    let raw_frames = parts.len();

    let server = Server::start(vec![Reply::sse(parts)]).await;
    let stream = anthropic(&server).open(turn("hi")).await.expect("opens");
    let (frames, error) = collect(stream).await;
    assert_eq!(error, None);
    // 3 comments, 2 pings, 1 data-less event, text block start and stop.
    assert_eq!(keepalives(&frames), 8);
    assert_eq!(frames.len(), raw_frames + 1); // message_delta yields two
    assert_eq!(
        events(&frames)
            .into_iter()
            .filter(|e| matches!(e, AgentEvent::TextDelta(_)))
            .collect::<Vec<_>>(),
        vec![AgentEvent::TextDelta("Hi".into())]
    );
}

#[tokio::test]
async fn a_stream_of_only_pings_yields_one_keepalive_each_as_they_arrive() {
    let mut parts = vec![message_start()];
    parts.extend(std::iter::repeat_with(ping).take(5));
    parts.extend(std::iter::repeat_n(b": keep-alive\n\n".to_vec(), 5));
    let mut reply = Reply::sse(parts).after(After::Hold);
    reply.delay = std::time::Duration::from_millis(20);
    let server = Server::start(vec![reply]).await;
    let mut stream = anthropic(&server).open(turn("hi")).await.expect("opens");

    use futures_util::StreamExt;
    // Read frame by frame while the server is still sending: liveness is
    // reported as it arrives, not at the end.
    let first = stream.next().await.expect("a frame").expect("ok");
    assert!(matches!(first, Frame::Event(AgentEvent::Usage(_))));
    for i in 0..10 {
        let frame = tokio::time::timeout(std::time::Duration::from_secs(2), stream.next())
            .await
            .unwrap_or_else(|_| panic!("keep-alive {i} arrived"))
            .expect("a frame")
            .expect("ok");
        assert_eq!(frame, Frame::KeepAlive, "frame {i}");
    }
}

#[tokio::test]
async fn openai_comments_and_empty_chunks_yield_keepalives() {
    let parts = vec![
        b": keep-alive\n\n".to_vec(),
        data(
            r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}"#,
        ),
        b": OPENROUTER PROCESSING\n\n".to_vec(),
        data(
            r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"Hel"},"finish_reason":null}]}"#,
        ),
        data(
            r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#,
        ),
        data("[DONE]"),
    ];
    let raw_frames = parts.len();
    let server = Server::start(vec![Reply::sse(parts)]).await;
    let (frames, error) = collect(openai(&server).open(turn("hi")).await.expect("opens")).await;
    assert_eq!(error, None);
    assert_eq!(keepalives(&frames), 3);
    assert_eq!(frames.len(), raw_frames);
    assert_eq!(
        events(&frames),
        vec![
            AgentEvent::TextDelta("Hel".into()),
            AgentEvent::Stop {
                reason: "stop".into()
            },
            TURN_COMPLETE
        ]
    );
}
