//! An OpenAI-compatible stream: text, tool calls, the usage chunk and
//! `[DONE]`.

use crate::support::*;
use warden_core::{AgentEvent, EventSource, Usage};

fn chunk(choices: &str) -> Vec<u8> {
    data(&format!(
        r#"{{"id":"chatcmpl-1","object":"chat.completion.chunk","choices":{choices}}}"#
    ))
}

fn openai_turn() -> Vec<Vec<u8>> {
    vec![
        chunk(r#"[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]"#),
        chunk(r#"[{"index":0,"delta":{"content":"Hel"},"finish_reason":null}]"#),
        chunk(r#"[{"index":0,"delta":{"content":"lo"},"finish_reason":null}]"#),
        chunk(
            r#"[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"get_weather","arguments":""}}]},"finish_reason":null}]"#,
        ),
        chunk(
            r#"[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"city\":"}}]},"finish_reason":null}]"#,
        ),
        chunk(
            r#"[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"\"Paris\"}"}}]},"finish_reason":null}]"#,
        ),
        chunk(r#"[{"index":0,"delta":{},"finish_reason":"tool_calls"}]"#),
        data(
            r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":12,"completion_tokens":7,"total_tokens":19}}"#,
        ),
        data("[DONE]"),
    ]
}

#[tokio::test]
async fn an_openai_stream_maps_text_tools_usage_and_done() {
    let server = Server::start(vec![Reply::sse(openai_turn())]).await;
    let (frames, error) = collect(openai(&server).open(turn("hi")).await.expect("opens")).await;
    assert_eq!(error, None, "[DONE] ends the stream cleanly");
    assert_eq!(
        events(&frames),
        vec![
            AgentEvent::TextDelta("Hel".into()),
            AgentEvent::TextDelta("lo".into()),
            AgentEvent::ToolUseStarted {
                id: "call_1".into(),
                name: "get_weather".into()
            },
            AgentEvent::ToolInputDelta {
                id: "call_1".into(),
                partial_json: "{\"city\":".into()
            },
            AgentEvent::ToolInputDelta {
                id: "call_1".into(),
                partial_json: "\"Paris\"}".into()
            },
            // The finish_reason closes the open tool calls, restoring the
            // normal silence allowance.
            AgentEvent::ToolUseFinished {
                id: "call_1".into()
            },
            AgentEvent::Stop {
                reason: "tool_calls".into()
            },
            AgentEvent::Usage(Usage {
                input_tokens: 12,
                output_tokens: 7,
                ..Usage::default()
            }),
            TURN_COMPLETE,
        ]
    );
    assert_eq!(keepalives(&frames), 1, "the role-only chunk");
}

#[tokio::test]
async fn the_request_asks_for_a_stream_with_usage() {
    let mut server = Server::start(vec![Reply::sse(openai_turn())]).await;
    let source = openai_with(&server, |o| o.with_max_tokens(77));
    assert_eq!(source.provider(), "openai");
    let mut request = turn("hello there");
    request.append_system_prompt = Some("Be brief.".into());
    let (_, error) = collect(source.open(request).await.expect("opens")).await;
    assert_eq!(error, None);

    let seen = server.request().await;
    assert_eq!(seen.request_line(), "POST /v1/chat/completions HTTP/1.1");
    assert_eq!(seen.header("authorization"), Some(format!("Bearer {KEY}")));
    assert_eq!(
        seen.header("content-type").as_deref(),
        Some("application/json")
    );
    assert_eq!(
        seen.json(),
        serde_json::json!({
            "model": "gpt-test",
            "stream": true,
            "stream_options": {"include_usage": true},
            "max_tokens": 77,
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "hello there"},
            ],
        })
    );
}

#[tokio::test]
async fn without_a_key_no_authorization_header_is_sent() {
    let mut server = Server::start(vec![Reply::sse(openai_turn())]).await;
    let source = openai_with(&server, |o| o.with_api_key(""));
    let (_, error) = collect(source.open(turn("hi")).await.expect("opens")).await;
    assert_eq!(error, None);
    let seen = server.request().await;
    assert_eq!(seen.header("authorization"), None);
    assert!(seen.json().get("max_tokens").is_none());
}

#[tokio::test]
async fn an_openai_stream_without_done_is_truncated() {
    let mut parts = openai_turn();
    parts.pop();
    let server = Server::start(vec![Reply::sse(parts)]).await;
    let (frames, error) = collect(openai(&server).open(turn("hi")).await.expect("opens")).await;
    let error = error.expect("an error");
    assert!(
        matches!(&error, warden_core::StreamError::Truncated { message } if message.contains("[DONE]")),
        "{error:?}"
    );
    assert!(error.is_retryable());
    assert!(events(&frames).contains(&AgentEvent::TextDelta("lo".into())));
}

#[tokio::test]
async fn a_mid_stream_openai_error_chunk_is_an_api_error() {
    let parts = vec![
        chunk(r#"[{"index":0,"delta":{"content":"Hel"},"finish_reason":null}]"#),
        data(
            r#"{"error":{"message":"The server had an error","type":"server_error","code":null}}"#,
        ),
    ];
    let server = Server::start(vec![Reply::sse(parts)]).await;
    let (_, error) = collect(openai(&server).open(turn("hi")).await.expect("opens")).await;
    assert_eq!(
        error,
        Some(warden_core::StreamError::Api {
            status: None,
            kind: "server_error".into(),
            message: "The server had an error".into(),
            retryable: true,
            retry_after: None,
        })
    );
}
