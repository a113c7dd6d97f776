//! The Gemini API endpoint (`…/v1beta/models/<model>:streamGenerateContent?alt=sse`):
//! `data:` chunks with the last one carrying `finishReason: "STOP"` and
//! the usage, the model taken from the path, and the fault scenarios in
//! Gemini's shapes.

use std::time::Duration;

use crate::common::{Sse, parse_sse};
use serde_json::{Value, json};
use warden_mock::{Endpoint, MockConfig, MockServer, Scenario};

type TestResult = Result<(), Box<dyn std::error::Error>>;

const REPLY: &str = "one two three four five six seven eight nine ten";

fn body() -> Value {
    json!({
        "contents": [{"role": "user", "parts": [{"text": "hello"}]}],
        "generationConfig": {"temperature": 0}
    })
}

async fn post(server: &MockServer, model: &str, action: &str) -> reqwest::Response {
    let path = format!("/v1beta/models/{model}:{action}");
    let query = if action.starts_with("stream") {
        "?alt=sse"
    } else {
        ""
    };
    reqwest::Client::new()
        .post(server.url(&format!("{path}{query}")))
        .header("x-goog-api-key", "dummy")
        .header("content-type", "application/json")
        .body(body().to_string())
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .expect("send")
}

fn chunks(text: &str) -> Vec<Value> {
    parse_sse(&text.replace("\r\n", "\n"))
        .iter()
        .map(Sse::json)
        .collect()
}

fn text_of(chunks: &[Value]) -> String {
    chunks
        .iter()
        .filter_map(|c| c.pointer("/candidates/0/content/parts/0/text")?.as_str())
        .collect()
}

#[tokio::test]
async fn a_stream_is_data_chunks_ending_with_stop_and_usage() -> TestResult {
    let server = MockServer::start(MockConfig::default().with_reply(REPLY)).await?;
    let resp = post(&server, "gemini-2.5-pro", "streamGenerateContent").await;
    assert_eq!(resp.status(), 200);
    let chunks = chunks(&resp.text().await?);
    assert!(chunks.len() > 1, "{chunks:?}");
    assert_eq!(text_of(&chunks), REPLY);
    let last = chunks.last().expect("chunks");
    assert_eq!(last["candidates"][0]["finishReason"], "STOP");
    assert!(last["usageMetadata"]["promptTokenCount"].as_u64() > Some(0));
    assert!(
        chunks[..chunks.len() - 1]
            .iter()
            .all(|c| c["candidates"][0].get("finishReason").is_none())
    );
    let record = &server.requests()[0];
    assert_eq!(record.endpoint, Endpoint::GeminiGenerateContent);
    assert_eq!(record.model.as_deref(), Some("gemini-2.5-pro"));
    assert!(record.stream);
    assert_eq!(
        server.requests_to("/v1beta/models/gemini-2.5-pro:streamGenerateContent"),
        1
    );
    // Not streamed: one JSON response.
    let resp = post(&server, "gemini-2.5-pro", "generateContent").await;
    let value: Value = serde_json::from_str(&resp.text().await?)?;
    assert_eq!(value["candidates"][0]["content"]["parts"][0]["text"], REPLY);
    server.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn an_abrupt_close_leaves_partial_text_without_a_finish_reason() -> TestResult {
    let server = MockServer::start(
        MockConfig::default()
            .with_reply(REPLY)
            .with_sequence([Scenario::AbruptClose, Scenario::Normal]),
    )
    .await?;
    let resp = post(&server, "gemini-2.5-pro", "streamGenerateContent").await;
    let mut raw = Vec::new();
    let mut resp = resp;
    while let Ok(Some(piece)) = resp.chunk().await {
        raw.extend_from_slice(&piece);
    }
    let chunks = chunks(&String::from_utf8_lossy(&raw));
    assert!(!chunks.is_empty());
    let partial = text_of(&chunks);
    assert!(REPLY.starts_with(&partial) && partial.len() < REPLY.len());
    assert!(
        chunks
            .iter()
            .all(|c| c["candidates"][0].get("finishReason").is_none())
    );
    // `early-end`: the same partial text, but the body ends cleanly.
    let resp = post(&server, "mock-early-end", "streamGenerateContent").await;
    let chunks = chunks_of(resp).await?;
    assert_eq!(text_of(&chunks), partial);
    assert!(
        chunks
            .iter()
            .all(|c| c["candidates"][0].get("finishReason").is_none())
    );
    // The retry plays the next scenario: the whole reply.
    let resp = post(&server, "gemini-2.5-pro", "streamGenerateContent").await;
    assert_eq!(text_of(&chunks_of(resp).await?), REPLY);
    server.shutdown().await;
    Ok(())
}

/// `stall-in-thinking`: thought parts (`thought: true`) and no text, then
/// silence with the socket open.
#[tokio::test]
async fn a_stall_in_thinking_is_thought_parts_then_silence() -> TestResult {
    let server = MockServer::start(
        MockConfig::default()
            .with_reply(REPLY)
            .with_sequence([Scenario::StallInThinking]),
    )
    .await?;
    let mut resp = post(&server, "gemini-2.5-pro", "streamGenerateContent").await;
    let mut raw = Vec::new();
    // The stream never ends: read until it has been silent a while.
    while let Ok(Ok(Some(piece))) =
        tokio::time::timeout(Duration::from_millis(500), resp.chunk()).await
    {
        raw.extend_from_slice(&piece);
    }
    let chunks = chunks(&String::from_utf8_lossy(&raw));
    assert_eq!(chunks.len(), 3, "{chunks:?}");
    for c in &chunks {
        let part = &c["candidates"][0]["content"]["parts"][0];
        assert_eq!(part["thought"], true, "{c}");
        assert!(c["candidates"][0].get("finishReason").is_none());
    }
    server.shutdown().await;
    Ok(())
}

async fn chunks_of(resp: reqwest::Response) -> Result<Vec<Value>, reqwest::Error> {
    Ok(chunks(&resp.text().await?))
}

#[tokio::test]
async fn errors_have_googles_shape_and_a_too_long_prompt_its_wording() -> TestResult {
    let server = MockServer::start(MockConfig::default()).await?;
    for (model, status, grpc) in [
        ("mock-prompt-too-long", 400, "INVALID_ARGUMENT"),
        ("mock-server-error", 500, "INTERNAL"),
        ("mock-rate-limited", 429, "RESOURCE_EXHAUSTED"),
    ] {
        let resp = post(&server, model, "streamGenerateContent").await;
        assert_eq!(resp.status(), status, "{model}");
        let value: Value = serde_json::from_str(&resp.text().await?)?;
        assert_eq!(value["error"]["code"], status, "{model}");
        assert_eq!(value["error"]["status"], grpc, "{model}");
    }
    let resp = post(&server, "mock-prompt-too-long", "streamGenerateContent").await;
    let value: Value = serde_json::from_str(&resp.text().await?)?;
    let message = value["error"]["message"].as_str().unwrap_or("");
    assert!(
        message.starts_with("The input token count (") && message.contains("exceeds"),
        "{message}"
    );
    // A mid-stream error is an `error` object in a data frame.
    let resp = post(&server, "mock-midstream-error", "streamGenerateContent").await;
    let chunks = chunks_of(resp).await?;
    assert_eq!(chunks.last().expect("chunks")["error"]["code"], 503);
    server.shutdown().await;
    Ok(())
}
