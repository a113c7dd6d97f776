//! A full Anthropic Messages stream becomes the right events, in order.

use crate::support::*;
use warden_core::{AgentEvent, EventSource, Usage};

fn block(event: &str, json: &str) -> Vec<u8> {
    sse(event, json)
}

#[tokio::test]
async fn a_full_anthropic_turn_is_mapped_to_events_in_order() {
    let parts = vec![
        sse(
            "message_start",
            r#"{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","content":[],"model":"claude-x","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":25,"cache_creation_input_tokens":100,"cache_read_input_tokens":2000,"output_tokens":1}}}"#,
        ),
        ping(),
        // Thinking block, index 0.
        block(
            "content_block_start",
            r#"{"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":""}}"#,
        ),
        block(
            "content_block_delta",
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"Let me think"}}"#,
        ),
        block(
            "content_block_delta",
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":"EqQB"}}"#,
        ),
        block(
            "content_block_stop",
            r#"{"type":"content_block_stop","index":0}"#,
        ),
        // Text block, index 1.
        block(
            "content_block_start",
            r#"{"type":"content_block_start","index":1,"content_block":{"type":"text","text":""}}"#,
        ),
        block(
            "content_block_delta",
            r#"{"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"Hello"}}"#,
        ),
        block(
            "content_block_delta",
            r#"{"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":" world"}}"#,
        ),
        block(
            "content_block_stop",
            r#"{"type":"content_block_stop","index":1}"#,
        ),
        // Tool-use block, index 2.
        block(
            "content_block_start",
            r#"{"type":"content_block_start","index":2,"content_block":{"type":"tool_use","id":"toolu_1","name":"get_weather","input":{}}}"#,
        ),
        block(
            "content_block_delta",
            r#"{"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":""}}"#,
        ),
        block(
            "content_block_delta",
            r#"{"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"{\"city\":"}}"#,
        ),
        block(
            "content_block_delta",
            r#"{"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"\"Paris\"}"}}"#,
        ),
        block(
            "content_block_stop",
            r#"{"type":"content_block_stop","index":2}"#,
        ),
        sse(
            "message_delta",
            r#"{"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":42}}"#,
        ),
        sse("message_stop", r#"{"type":"message_stop"}"#),
    ];
    let raw_frames = parts.len();
    let server = Server::start(vec![Reply::sse(parts)]).await;
    let stream = anthropic(&server)
        .open(turn("hi"))
        .await
        .expect("stream opens");
    let (frames, error) = collect(stream).await;
    assert_eq!(error, None, "a complete turn ends with None");

    let usage = |output_tokens| {
        AgentEvent::Usage(Usage {
            input_tokens: 25,
            cache_creation_input_tokens: 100,
            cache_read_input_tokens: 2000,
            output_tokens,
        })
    };
    assert_eq!(
        events(&frames),
        vec![
            usage(1),
            AgentEvent::ThinkingDelta("Let me think".into()),
            AgentEvent::TextDelta("Hello".into()),
            AgentEvent::TextDelta(" world".into()),
            AgentEvent::ToolUseStarted {
                id: "toolu_1".into(),
                name: "get_weather".into()
            },
            AgentEvent::ToolInputDelta {
                id: "toolu_1".into(),
                partial_json: "{\"city\":".into()
            },
            AgentEvent::ToolInputDelta {
                id: "toolu_1".into(),
                partial_json: "\"Paris\"}".into()
            },
            AgentEvent::ToolUseFinished {
                id: "toolu_1".into()
            },
            // message_delta keeps the input and cache fields of message_start.
            usage(42),
            AgentEvent::Stop {
                reason: "tool_use".into()
            },
            TURN_COMPLETE,
        ]
    );
    // ping, thinking start, signature_delta, thinking stop, text start, text
    // stop, the empty input_json_delta: liveness only.
    assert_eq!(keepalives(&frames), 7);
    // Every raw frame yields at least one frame (message_delta yields two).
    assert_eq!(frames.len(), raw_frames + 1);
    assert_eq!(
        frames.last(),
        Some(&warden_core::Frame::Event(TURN_COMPLETE))
    );
}

#[tokio::test]
async fn only_tool_blocks_finish_a_tool_use() {
    let mut parts = vec![message_start()];
    // A text block stops at index 0, then a tool block at index 1.
    parts.extend(text_block(0, "Checking."));
    parts.push(sse(
        "content_block_start",
        r#"{"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"toolu_9","name":"bash","input":{}}}"#,
    ));
    parts.push(sse(
        "content_block_stop",
        r#"{"type":"content_block_stop","index":1}"#,
    ));
    // A second stop for the same index is not a second finish.
    parts.push(sse(
        "content_block_stop",
        r#"{"type":"content_block_stop","index":1}"#,
    ));
    parts.extend(message_end("tool_use"));
    let server = Server::start(vec![Reply::sse(parts)]).await;
    let (frames, error) = collect(anthropic(&server).open(turn("hi")).await.expect("opens")).await;
    assert_eq!(error, None);
    let finished: Vec<_> = events(&frames)
        .into_iter()
        .filter(|e| matches!(e, AgentEvent::ToolUseFinished { .. }))
        .collect();
    assert_eq!(
        finished,
        vec![AgentEvent::ToolUseFinished {
            id: "toolu_9".into()
        }]
    );
}

#[tokio::test]
async fn the_request_carries_the_model_headers_system_and_message() {
    let mut server = Server::start(vec![Reply::sse(anthropic_text_turn())]).await;
    let source = anthropic_with(&server, |o| {
        o.with_max_tokens(1234).with_header("anthropic-beta", "x-1")
    });
    assert_eq!(source.provider(), "anthropic");
    let mut request = turn("hi there");
    request.append_system_prompt = Some("Report your context use.".into());
    let (_, error) = collect(source.open(request).await.expect("opens")).await;
    assert_eq!(error, None);

    let seen = server.request().await;
    assert_eq!(seen.request_line(), "POST /v1/messages HTTP/1.1");
    assert_eq!(seen.header("x-api-key").as_deref(), Some(KEY));
    assert_eq!(
        seen.header("anthropic-version").as_deref(),
        Some("2023-06-01")
    );
    assert_eq!(
        seen.header("content-type").as_deref(),
        Some("application/json")
    );
    assert_eq!(seen.header("anthropic-beta").as_deref(), Some("x-1"));
    assert_eq!(
        seen.json(),
        serde_json::json!({
            "model": "claude-test",
            "max_tokens": 1234,
            "stream": true,
            "system": "Report your context use.",
            "messages": [{"role": "user", "content": "hi there"}],
        })
    );
}

#[tokio::test]
async fn no_system_field_without_a_system_prompt_and_a_base_path_is_kept() {
    let mut server = Server::start(vec![Reply::sse(anthropic_text_turn())]).await;
    let base = format!("{}/proxy/", server.base_url());
    let source = anthropic_with(&server, |o| o.with_base_url(base));
    let (_, error) = collect(source.open(turn("hi")).await.expect("opens")).await;
    assert_eq!(error, None);
    let seen = server.request().await;
    assert_eq!(seen.request_line(), "POST /proxy/v1/messages HTTP/1.1");
    assert!(seen.json().get("system").is_none());
    assert_eq!(seen.json()["max_tokens"], 8192);
}

#[tokio::test]
async fn debug_output_never_shows_the_api_key() {
    let server = Server::start(vec![Reply::sse(anthropic_text_turn())]).await;
    let options = warden_llm::AnthropicOptions::default()
        .with_api_key(KEY)
        .with_header("x-secret-header", "header-secret-value");
    let shown = format!("{options:?}");
    assert!(!shown.contains(KEY), "{shown}");
    assert!(!shown.contains("header-secret-value"), "{shown}");
    assert!(shown.contains("x-secret-header"), "{shown}");
    let source = anthropic(&server);
    let shown = format!("{source:?}");
    assert!(!shown.contains(KEY), "{shown}");
    assert!(shown.contains("x-api-key"), "{shown}");
}

#[test]
fn a_bad_base_url_or_header_is_refused_without_echoing_the_value() {
    let e = warden_llm::AnthropicSource::new(
        warden_llm::AnthropicOptions::default().with_base_url("ftp://example.invalid"),
    )
    .expect_err("ftp is not http");
    assert!(matches!(e, warden_llm::BuildError::InvalidBaseUrl { .. }));
    let e = warden_llm::AnthropicSource::new(
        warden_llm::AnthropicOptions::default().with_api_key("bad\nkey-secret"),
    )
    .expect_err("a newline cannot be sent");
    assert!(matches!(e, warden_llm::BuildError::InvalidHeader { .. }));
    assert!(!e.to_string().contains("key-secret"), "{e}");
}
