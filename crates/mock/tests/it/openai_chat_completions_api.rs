//! The OpenAI-compatible endpoint streams chunks and ends with `[DONE]`.

use crate::common::{Sse, openai_request, parse_sse};
use serde_json::Value;
use warden_mock::{Endpoint, MockConfig, MockServer, Scenario, TokenUsage};

type TestResult = Result<(), Box<dyn std::error::Error>>;

async fn post(server: &MockServer, body: &Value, headers: &[(&str, &str)]) -> reqwest::Response {
    let mut req = reqwest::Client::new()
        .post(server.url("/v1/chat/completions"))
        .header("authorization", "Bearer dummy")
        .header("content-type", "application/json")
        .body(body.to_string());
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    req.send().await.expect("send")
}

#[tokio::test]
async fn a_stream_with_include_usage_ends_with_a_usage_chunk_then_done() -> TestResult {
    let server =
        MockServer::start(MockConfig::default().with_usage(TokenUsage::new(10, 0, 5))).await?;
    let resp = post(&server, &openai_request("gpt-test", true, true), &[]).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.headers()["content-type"].to_str()?,
        "text/event-stream"
    );
    let frames = parse_sse(&resp.text().await?);

    assert!(frames.iter().all(|f| f.name().is_none()), "no event names");
    assert_eq!(frames.last().and_then(Sse::data), Some("[DONE]"));
    let chunks: Vec<Value> = frames[..frames.len() - 1].iter().map(Sse::json).collect();
    for c in &chunks {
        assert_eq!(c["object"], "chat.completion.chunk");
        assert_eq!(c["model"], "gpt-test");
        assert!(
            c["id"]
                .as_str()
                .is_some_and(|id| id.starts_with("chatcmpl-"))
        );
    }
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert!(text.starts_with("Hello from warden-mock"), "{text}");

    let usage = &chunks[chunks.len() - 1];
    assert_eq!(usage["choices"], serde_json::json!([]));
    assert_eq!(usage["usage"]["prompt_tokens"], 15);
    let completion = usage["usage"]["completion_tokens"].as_u64().unwrap_or(0);
    assert!(completion > 0);
    assert_eq!(usage["usage"]["total_tokens"], 15 + completion);
    let finish = &chunks[chunks.len() - 2];
    assert_eq!(finish["choices"][0]["finish_reason"], "stop");
    // Only the last chunk carries usage.
    assert!(
        chunks[..chunks.len() - 1]
            .iter()
            .all(|c| c["usage"].is_null())
    );

    assert_eq!(
        server.requests()[0].endpoint,
        Endpoint::OpenAiChatCompletions
    );
    server.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn a_stream_without_include_usage_has_no_usage_chunk() -> TestResult {
    let server = MockServer::start(MockConfig::default()).await?;
    let frames = parse_sse(
        &post(&server, &openai_request("m", true, false), &[])
            .await
            .text()
            .await?,
    );
    assert_eq!(frames.last().and_then(Sse::data), Some("[DONE]"));
    for f in &frames[..frames.len() - 1] {
        let c = f.json();
        assert!(c.get("usage").is_none(), "{c}");
        assert_eq!(c["choices"].as_array().map(Vec::len), Some(1));
    }
    server.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn a_non_streaming_request_gets_one_chat_completion() -> TestResult {
    let server = MockServer::start(MockConfig::default()).await?;
    let resp = post(&server, &openai_request("m", false, false), &[]).await;
    assert_eq!(resp.status(), 200);
    let body: Value = serde_json::from_str(&resp.text().await?)?;
    assert_eq!(body["object"], "chat.completion");
    assert_eq!(body["choices"][0]["message"]["role"], "assistant");
    assert_eq!(body["choices"][0]["finish_reason"], "stop");
    assert!(
        body["usage"]["total_tokens"]
            .as_u64()
            .is_some_and(|n| n > 0)
    );
    server.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn thinking_pings_are_keep_alive_comments_on_the_openai_endpoint() -> TestResult {
    let server = MockServer::start(MockConfig::scenario(Scenario::ThinkingPings)).await?;
    let frames = parse_sse(
        &post(&server, &openai_request("m", true, false), &[])
            .await
            .text()
            .await?,
    );
    let comments = frames
        .iter()
        .filter(|f| matches!(f, Sse::Comment(c) if c == "keep-alive"))
        .count();
    // 200 ms pause, a ping every 50 ms.
    assert_eq!(comments, 4);
    assert!(
        matches!(frames[1], Sse::Comment(_)),
        "pings follow the role chunk"
    );
    assert_eq!(frames.last().and_then(Sse::data), Some("[DONE]"));
    server.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn errors_on_the_openai_endpoint_use_the_openai_error_shape() -> TestResult {
    let server = MockServer::start(MockConfig::default()).await?;
    let resp = post(
        &server,
        &openai_request("m", true, true),
        &[("x-mock-scenario", "rate-limited")],
    )
    .await;
    assert_eq!(resp.status(), 429);
    assert_eq!(resp.headers()["retry-after-ms"].to_str()?, "100");
    let body: Value = serde_json::from_str(&resp.text().await?)?;
    assert_eq!(body["error"]["code"], "rate_limit_exceeded");
    assert!(body["error"]["message"].is_string());

    let resp = post(
        &server,
        &openai_request("m", true, true),
        &[("x-mock-scenario", "midstream-error")],
    )
    .await;
    let frames = parse_sse(&resp.text().await?);
    let last = frames.last().map(Sse::json).unwrap_or_default();
    assert_eq!(last["error"]["type"], "overloaded_error");
    assert!(
        frames.iter().all(|f| f.data() != Some("[DONE]")),
        "an errored stream has no [DONE]"
    );
    server.shutdown().await;
    Ok(())
}
