//! The Anthropic Messages endpoint speaks the documented wire format.

use crate::common::{anthropic_request, names, parse_sse};
use serde_json::Value;
use warden_mock::{Endpoint, MockConfig, MockServer, Outcome, ServerEvent, TokenUsage};

type TestResult = Result<(), Box<dyn std::error::Error>>;

async fn post_stream(server: &MockServer, path: &str, model: &str) -> reqwest::Response {
    reqwest::Client::new()
        .post(server.url(path))
        .header("x-api-key", "dummy")
        .header("anthropic-version", "2023-06-01")
        .json_body(&anthropic_request(model, true))
        .send()
        .await
        .expect("send")
}

/// `reqwest` without its `json` feature: set the body and content type.
trait JsonBody {
    fn json_body(self, value: &Value) -> Self;
}

impl JsonBody for reqwest::RequestBuilder {
    fn json_body(self, value: &Value) -> Self {
        self.header("content-type", "application/json")
            .body(value.to_string())
    }
}

#[tokio::test]
async fn a_streamed_reply_follows_the_documented_event_order() -> TestResult {
    let server = MockServer::start(MockConfig::default()).await?;
    let resp = post_stream(&server, "/v1/messages?beta=true", "claude-test-1").await;
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.headers()["content-type"].to_str()?,
        "text/event-stream"
    );
    assert_eq!(resp.headers()["cache-control"].to_str()?, "no-cache");
    let frames = parse_sse(&resp.text().await?);

    let names = names(&frames);
    let deltas = names.iter().filter(|n| *n == "content_block_delta").count();
    assert!(deltas >= 2, "{names:?}");
    let mut expected = vec!["message_start", "content_block_start", "ping"];
    expected.extend(std::iter::repeat_n("content_block_delta", deltas));
    expected.extend(["content_block_stop", "message_delta", "message_stop"]);
    assert_eq!(names, expected);

    // Every data line is JSON whose `type` is the event name.
    for f in &frames {
        assert_eq!(f.json()["type"].as_str(), f.name(), "{f:?}");
    }
    let start = frames[0].json();
    let message = &start["message"];
    assert!(
        message["id"]
            .as_str()
            .is_some_and(|id| id.starts_with("msg_"))
    );
    assert_eq!(message["model"], "claude-test-1");
    assert_eq!(message["role"], "assistant");
    assert_eq!(message["content"], serde_json::json!([]));
    let usage = &message["usage"];
    for field in [
        "input_tokens",
        "cache_creation_input_tokens",
        "cache_read_input_tokens",
        "output_tokens",
    ] {
        assert!(usage[field].is_u64(), "usage.{field} in {usage}");
    }
    let text: String = frames
        .iter()
        .filter(|f| f.name() == Some("content_block_delta"))
        .map(|f| {
            let d = f.json();
            assert_eq!(d["delta"]["type"], "text_delta");
            d["delta"]["text"].as_str().unwrap_or_default().to_owned()
        })
        .collect();
    assert!(text.starts_with("Hello from warden-mock"), "{text}");
    assert!(
        !text.contains("hello there"),
        "the prompt must not be echoed"
    );
    let delta = frames[frames.len() - 2].json();
    assert_eq!(delta["delta"]["stop_reason"], "end_turn");
    assert!(
        delta["usage"]["output_tokens"]
            .as_u64()
            .is_some_and(|n| n > 0)
    );

    let rec = &server.requests()[0];
    assert_eq!(rec.endpoint, Endpoint::AnthropicMessages);
    assert_eq!(rec.query.as_deref(), Some("beta=true"));
    assert_eq!(rec.model.as_deref(), Some("claude-test-1"));
    assert!(rec.stream);
    assert_eq!(rec.status, Some(200));
    assert_eq!(rec.outcome, Outcome::Completed);
    assert_eq!(rec.frames, frames.len());
    server.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn a_path_prefix_and_the_beta_query_reach_the_messages_endpoint() -> TestResult {
    let server = MockServer::start(MockConfig::default()).await?;
    let resp = post_stream(&server, "/some/prefix/v1/messages?beta=true", "m").await;
    assert_eq!(resp.status(), 200);
    let frames = parse_sse(&resp.text().await?);
    assert_eq!(
        names(&frames).last().map(String::as_str),
        Some("message_stop")
    );
    assert_eq!(server.requests_to("/some/prefix/v1/messages"), 1);
    assert_eq!(server.requests_to("/v1/messages"), 0);
    server.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn configured_usage_and_reply_are_reported() -> TestResult {
    let server = MockServer::start(
        MockConfig::default()
            .with_reply("Exactly this.")
            .with_usage(TokenUsage::new(3, 200, 14_000)),
    )
    .await?;
    let frames = parse_sse(
        &post_stream(&server, "/v1/messages", "m")
            .await
            .text()
            .await?,
    );
    let usage = frames[0].json()["message"]["usage"].clone();
    assert_eq!(usage["input_tokens"], 3);
    assert_eq!(usage["cache_creation_input_tokens"], 200);
    assert_eq!(usage["cache_read_input_tokens"], 14_000);
    let text: String = frames
        .iter()
        .filter(|f| f.name() == Some("content_block_delta"))
        .map(|f| {
            f.json()["delta"]["text"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        })
        .collect();
    assert_eq!(text, "Exactly this.");
    server.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn a_non_streaming_request_gets_one_json_message() -> TestResult {
    let server = MockServer::start(MockConfig::default()).await?;
    let resp = reqwest::Client::new()
        .post(server.url("/v1/messages"))
        .json_body(&anthropic_request("claude-test-2", false))
        .send()
        .await?;
    assert_eq!(resp.status(), 200);
    assert!(
        resp.headers()["content-type"]
            .to_str()?
            .starts_with("application/json")
    );
    let msg: Value = serde_json::from_str(&resp.text().await?)?;
    assert_eq!(msg["type"], "message");
    assert_eq!(msg["model"], "claude-test-2");
    assert!(msg["id"].as_str().is_some_and(|id| id.starts_with("msg_")));
    assert_eq!(msg["content"][0]["type"], "text");
    assert!(
        msg["content"][0]["text"]
            .as_str()
            .is_some_and(|t| !t.is_empty())
    );
    assert_eq!(msg["stop_reason"], "end_turn");
    assert!(msg["usage"]["cache_read_input_tokens"].is_u64());
    assert!(!server.requests()[0].stream);
    server.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn probes_get_harmless_answers_and_unknown_paths_a_json_404() -> TestResult {
    let server = MockServer::start(MockConfig::default()).await?;
    let client = reqwest::Client::new();

    assert_eq!(client.head(server.url("/")).send().await?.status(), 200);
    let models: Value = serde_json::from_str(
        &client
            .get(server.url("/v1/models"))
            .send()
            .await?
            .text()
            .await?,
    )?;
    let ids: Vec<&str> = models["data"]
        .as_array()
        .map(|d| d.iter().filter_map(|m| m["id"].as_str()).collect())
        .unwrap_or_default();
    assert!(
        ids.contains(&"mock-normal") && ids.contains(&"mock-stall"),
        "{ids:?}"
    );

    let count: Value = serde_json::from_str(
        &client
            .post(server.url("/v1/messages/count_tokens"))
            .json_body(&anthropic_request("m", false))
            .send()
            .await?
            .text()
            .await?,
    )?;
    assert!(count["input_tokens"].as_u64().is_some_and(|n| n > 0));

    let resp = client.get(server.url("/nowhere")).send().await?;
    assert_eq!(resp.status(), 404);
    let err: Value = serde_json::from_str(&resp.text().await?)?;
    assert_eq!(err["type"], "error");
    assert_eq!(err["error"]["type"], "not_found_error");

    let resp = client
        .post(server.url("/v1/messages"))
        .body("{not json")
        .send()
        .await?;
    assert_eq!(resp.status(), 400);
    let err: Value = serde_json::from_str(&resp.text().await?)?;
    assert_eq!(err["error"]["type"], "invalid_request_error");

    let counts = server.request_counts();
    assert_eq!(counts.get("/"), Some(&1));
    assert_eq!(counts.get("/v1/models"), Some(&1));
    assert_eq!(counts.get("/nowhere"), Some(&1));
    assert_eq!(server.request_count(), 5);
    // HEAD: headers only, no body frame.
    assert_eq!(server.request(1).map(|r| r.frames), Some(0));
    // Every request ended, none was abandoned.
    let completed = server
        .events()
        .iter()
        .filter(|e| matches!(e, ServerEvent::Completed { .. }))
        .count();
    assert_eq!(completed, 5);
    assert_eq!(server.closed_by_client(), 0);
    server.shutdown().await;
    Ok(())
}
