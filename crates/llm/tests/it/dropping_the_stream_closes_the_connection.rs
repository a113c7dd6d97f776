//! The returned stream owns the response body: dropping it, or reaching
//! the end of the turn, closes the connection.

use crate::support::*;
use futures_util::StreamExt;
use warden_core::{AgentEvent, EventSource, Frame};

#[tokio::test]
async fn dropping_an_anthropic_stream_mid_turn_closes_the_socket() {
    let mut parts = vec![message_start(), ping()];
    parts.extend(text_block(0, "Hel").into_iter().take(2));
    let mut server = Server::start(vec![Reply::sse(parts).after(After::Hold)]).await;
    let mut stream = anthropic(&server).open(turn("hi")).await.expect("opens");
    let first = stream.next().await.expect("a frame").expect("ok");
    assert!(matches!(first, Frame::Event(AgentEvent::Usage(_))));
    drop(stream);
    assert_eq!(server.client_closed().await, ClientClosed::Yes);
}

#[tokio::test]
async fn dropping_an_openai_stream_mid_turn_closes_the_socket() {
    let parts = vec![data(
        r#"{"choices":[{"index":0,"delta":{"content":"Hel"},"finish_reason":null}]}"#,
    )];
    let mut server = Server::start(vec![Reply::sse(parts).after(After::Hold)]).await;
    let mut stream = openai(&server).open(turn("hi")).await.expect("opens");
    let first = stream.next().await.expect("a frame").expect("ok");
    assert_eq!(first, Frame::Event(AgentEvent::TextDelta("Hel".into())));
    drop(stream);
    assert_eq!(server.client_closed().await, ClientClosed::Yes);
}

#[tokio::test]
async fn the_stream_ends_at_message_stop_without_waiting_for_eof() {
    // The server never ends the body; the turn is complete at message_stop.
    let mut server =
        Server::start(vec![Reply::sse(anthropic_text_turn()).after(After::Hold)]).await;
    let stream = anthropic(&server).open(turn("hi")).await.expect("opens");
    let (frames, error) = collect(stream).await;
    assert_eq!(error, None);
    assert_eq!(frames.last(), Some(&Frame::Event(TURN_COMPLETE)));
    assert_eq!(server.client_closed().await, ClientClosed::Yes);
}
