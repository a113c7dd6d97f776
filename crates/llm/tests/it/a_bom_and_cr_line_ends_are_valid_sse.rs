//! A leading byte-order mark (whole or split across reads) and CR-only line
//! ends are valid SSE: both providers take them over real HTTP, without a
//! panic and without holding back the last event.

use crate::support::*;
use warden_core::{AgentEvent, EventSource, Frame};

const BOM: &[u8] = b"\xEF\xBB\xBF";

fn with_cr_line_ends(parts: Vec<Vec<u8>>) -> Vec<Vec<u8>> {
    parts
        .into_iter()
        .map(|p| {
            p.into_iter()
                .map(|b| if b == b'\n' { b'\r' } else { b })
                .collect()
        })
        .collect()
}

/// A BOM split after each of its bytes, as a separate write before the body.
fn with_split_bom(mut parts: Vec<Vec<u8>>, at: usize) -> Vec<Vec<u8>> {
    let mut first = BOM[at..].to_vec();
    first.extend_from_slice(&parts[0]);
    parts[0] = first;
    if at > 0 {
        parts.insert(0, BOM[..at].to_vec());
    }
    parts
}

fn texts(frames: &[Frame]) -> Vec<String> {
    frames
        .iter()
        .filter_map(|f| match f {
            Frame::Event(AgentEvent::TextDelta(t)) => Some(t.clone()),
            _ => None,
        })
        .collect()
}

fn openai_turn() -> Vec<Vec<u8>> {
    vec![
        data(r#"{"choices":[{"index":0,"delta":{"content":"Hello"}}]}"#),
        data(r#"{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#),
        data("[DONE]"),
    ]
}

#[tokio::test]
async fn anthropic_takes_a_leading_bom_whole_or_split() {
    for at in 0..BOM.len() {
        let server =
            Server::start(vec![Reply::sse(with_split_bom(anthropic_text_turn(), at))]).await;
        let stream = anthropic(&server).open(turn("hi")).await.expect("opens");
        let (frames, error) = collect(stream).await;
        assert_eq!(error, None, "BOM split at {at}");
        assert_eq!(texts(&frames), vec!["Hello"], "BOM split at {at}");
    }
}

#[tokio::test]
async fn openai_takes_a_leading_bom_whole_or_split() {
    for at in 0..BOM.len() {
        let server = Server::start(vec![Reply::sse(with_split_bom(openai_turn(), at))]).await;
        let stream = openai(&server).open(turn("hi")).await.expect("opens");
        let (frames, error) = collect(stream).await;
        assert_eq!(error, None, "BOM split at {at}");
        assert_eq!(texts(&frames), vec!["Hello"], "BOM split at {at}");
    }
}

/// The server keeps the connection open after the last event: the turn must
/// end on the terminal event's own CR, not on a byte that never comes.
#[tokio::test]
async fn cr_only_line_ends_deliver_the_last_event_at_once() {
    let server = Server::start(vec![
        Reply::sse(with_cr_line_ends(anthropic_text_turn())).after(After::Hold),
    ])
    .await;
    let (frames, error) = collect(anthropic(&server).open(turn("hi")).await.expect("opens")).await;
    assert_eq!(error, None);
    assert_eq!(texts(&frames), vec!["Hello"]);
    assert!(matches!(
        frames.last(),
        Some(Frame::Event(AgentEvent::TurnComplete { .. }))
    ));

    let server = Server::start(vec![
        Reply::sse(with_cr_line_ends(openai_turn())).after(After::Hold),
    ])
    .await;
    let (frames, error) = collect(openai(&server).open(turn("hi")).await.expect("opens")).await;
    assert_eq!(error, None);
    assert_eq!(texts(&frames), vec!["Hello"]);
}
