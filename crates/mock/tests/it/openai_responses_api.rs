//! The Responses API endpoint: numbered, typed events; a background
//! response survives its connection and is re-attached after the last
//! sequence number seen, with nothing generated twice.

use std::time::Duration;

use crate::common::{Sse, names, parse_sse};
use serde_json::{Value, json};
use warden_mock::{Endpoint, MockConfig, MockServer, Scenario};

type TestResult = Result<(), Box<dyn std::error::Error>>;

fn body(background: bool) -> Value {
    json!({
        "model": "gpt-5",
        "input": [{"role": "user", "content": "say something long"}],
        "stream": true,
        "background": background,
        "store": true
    })
}

async fn post(server: &MockServer, body: &Value) -> reqwest::Response {
    reqwest::Client::new()
        .post(server.url("/v1/responses"))
        .header("authorization", "Bearer dummy")
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .expect("send")
}

#[tokio::test]
async fn a_stream_is_numbered_events_ending_with_response_completed() -> TestResult {
    let server = MockServer::start(MockConfig::default()).await?;
    let resp = post(&server, &body(false)).await;
    assert_eq!(resp.status(), 200);
    let frames = parse_sse(&resp.text().await?);
    let n = names(&frames);
    assert_eq!(n.first().map(String::as_str), Some("response.created"));
    assert_eq!(n.last().map(String::as_str), Some("response.completed"));
    assert!(n.iter().any(|e| e == "response.output_text.delta"));
    for (i, f) in frames.iter().enumerate() {
        assert_eq!(f.json()["sequence_number"], i, "{:?}", f.name());
    }
    let done = frames.last().map(Sse::json).expect("completed");
    assert!(done["response"]["usage"]["output_tokens"].as_u64() > Some(0));
    assert_eq!(server.requests()[0].endpoint, Endpoint::OpenAiResponses);
    // Not a background response: it cannot be re-attached.
    let id = frames[0].json()["response"]["id"]
        .as_str()
        .expect("id")
        .to_owned();
    let get = reqwest::get(server.url(&format!("/v1/responses/{id}?stream=true"))).await?;
    assert_eq!(get.status(), 404);
    server.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn a_stalled_background_response_is_reattached_after_the_last_event_seen() -> TestResult {
    let server = MockServer::start(
        MockConfig::default()
            .with_default_scenario(Scenario::Stall)
            .with_fault_after_frames(6),
    )
    .await?;
    let mut first = post(&server, &body(true)).await;
    let mut seen = String::new();
    while let Ok(Some(chunk)) = tokio::time::timeout(Duration::from_millis(300), first.chunk())
        .await
        .unwrap_or(Ok(None))
    {
        seen.push_str(std::str::from_utf8(&chunk)?);
    }
    drop(first);
    let frames = parse_sse(&seen);
    assert_eq!(frames.len(), 6, "stalled after 6 events");
    let id = frames[0].json()["response"]["id"]
        .as_str()
        .expect("id")
        .to_owned();
    let last = frames
        .last()
        .and_then(|f| f.json()["sequence_number"].as_u64())
        .expect("seq");
    let partial: String = frames
        .iter()
        .filter(|f| f.name() == Some("response.output_text.delta"))
        .map(|f| f.json()["delta"].as_str().unwrap_or("").to_owned())
        .collect();

    let url = server.url(&format!(
        "/v1/responses/{id}?stream=true&starting_after={last}"
    ));
    let rest = parse_sse(&reqwest::get(url).await?.text().await?);
    assert_eq!(
        rest.first().map(|f| f.json()["sequence_number"].as_u64()),
        Some(Some(last + 1)),
        "only later events"
    );
    let more: String = rest
        .iter()
        .filter(|f| f.name() == Some("response.output_text.delta"))
        .map(|f| f.json()["delta"].as_str().unwrap_or("").to_owned())
        .collect();
    let full = rest
        .iter()
        .find(|f| f.name() == Some("response.output_text.done"))
        .map(|f| f.json()["text"].as_str().unwrap_or("").to_owned())
        .expect("done");
    assert_eq!(
        format!("{partial}{more}"),
        full,
        "nothing missing, nothing twice"
    );
    let records = server.requests();
    assert_eq!(records[1].endpoint, Endpoint::OpenAiResponse);
    assert_eq!(records[1].continuation, Some("reattach"));
    assert_eq!(records[1].output_tokens, Some(0), "nothing generated again");
    let status: Value = serde_json::from_str(
        &reqwest::get(server.url(&format!("/v1/responses/{id}")))
            .await?
            .text()
            .await?,
    )?;
    assert_eq!(status["status"], "completed");
    server.shutdown().await;
    Ok(())
}

/// `stall-in-thinking`: a reasoning item whose summary streams, then
/// silence with the socket open, before the item's end or any message.
#[tokio::test]
async fn a_stall_in_thinking_is_a_reasoning_item_left_open() -> TestResult {
    let server =
        MockServer::start(MockConfig::default().with_sequence([Scenario::StallInThinking])).await?;
    let mut resp = post(&server, &body(false)).await;
    let mut raw = Vec::new();
    // The stream never ends: read until it has been silent a while.
    while let Ok(Ok(Some(piece))) =
        tokio::time::timeout(Duration::from_millis(500), resp.chunk()).await
    {
        raw.extend_from_slice(&piece);
    }
    let frames = parse_sse(&String::from_utf8_lossy(&raw));
    let n = names(&frames);
    assert_eq!(n[2], "response.output_item.added", "{n:?}");
    assert_eq!(frames[2].json()["item"]["type"], "reasoning");
    assert_eq!(
        n.last().map(String::as_str),
        Some("response.reasoning_summary_text.delta"),
        "{n:?}"
    );
    assert!(
        !n.iter()
            .any(|e| e.contains("output_text") || e.contains(".done"))
    );
    server.shutdown().await;
    Ok(())
}
