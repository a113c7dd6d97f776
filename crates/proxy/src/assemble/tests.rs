//! The assemblers, event by event.

use serde_json::{Value, json};
use warden_llm::sse::SseEvent;

use super::*;

/// A budget no test reaches.
fn plenty() -> Budget {
    Budget::new(usize::MAX)
}

fn ev(event: &str, data: Value) -> SseEvent {
    SseEvent {
        event: event.to_owned(),
        data: data.to_string(),
        id: None,
    }
}

#[test]
fn an_anthropic_stream_becomes_the_message_the_api_would_have_sent() {
    let mut m = Messages::default();
    let mut budget = plenty();
    for (name, data) in [
        (
            "message_start",
            json!({"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant", "content": [], "model": "claude-x", "stop_reason": null, "usage": {"input_tokens": 25, "output_tokens": 1}}}),
        ),
        (
            "content_block_start",
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": ""}}),
        ),
        (
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "hmm"}}),
        ),
        (
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "signature_delta", "signature": "sig"}}),
        ),
        (
            "content_block_stop",
            json!({"type": "content_block_stop", "index": 0}),
        ),
        (
            "content_block_start",
            json!({"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}}),
        ),
        (
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "Hel"}}),
        ),
        ("ping", json!({"type": "ping"})),
        (
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "lo"}}),
        ),
        (
            "content_block_stop",
            json!({"type": "content_block_stop", "index": 1}),
        ),
        (
            "content_block_start",
            json!({"type": "content_block_start", "index": 2, "content_block": {"type": "tool_use", "id": "t1", "name": "ls", "input": {}}}),
        ),
        (
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 2, "delta": {"type": "input_json_delta", "partial_json": "{\"pa"}}),
        ),
        (
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 2, "delta": {"type": "input_json_delta", "partial_json": "th\": \"/\"}"}}),
        ),
        (
            "content_block_stop",
            json!({"type": "content_block_stop", "index": 2}),
        ),
        (
            "message_delta",
            json!({"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": null}, "usage": {"output_tokens": 15}}),
        ),
        ("message_stop", json!({"type": "message_stop"})),
    ] {
        m.event(&ev(name, data), &mut budget)
            .expect("within the budget");
    }
    let Ok(Assembled::Answer(message)) = m.finish() else {
        panic!("a whole message");
    };
    assert_eq!(message["id"], "msg_1");
    assert_eq!(message["stop_reason"], "tool_use");
    assert_eq!(
        message["usage"],
        json!({"input_tokens": 25, "output_tokens": 15})
    );
    assert_eq!(
        message["content"],
        json!([
            {"type": "thinking", "thinking": "hmm", "signature": "sig"},
            {"type": "text", "text": "Hello"},
            {"type": "tool_use", "id": "t1", "name": "ls", "input": {"path": "/"}},
        ])
    );
}

#[test]
fn a_stream_without_its_end_or_with_an_error_is_not_an_answer() {
    let mut b = plenty();
    let mut m = Messages::default();
    let start = ev("message_start", json!({"message": {"id": "m"}}));
    m.event(&start, &mut b).expect("event");
    assert_eq!(m.finish(), Ok(Assembled::Incomplete));
    let mut m = Messages::default();
    m.event(&start, &mut b).expect("event");
    let error = json!({"type": "error", "error": {"type": "overloaded_error", "message": "x"}});
    m.event(&ev("error", error), &mut b).expect("event");
    assert_eq!(
        m.finish(),
        Ok(Assembled::Error(
            json!({"type": "overloaded_error", "message": "x"})
        ))
    );
    let mut c = ChatCompletions::default();
    let chunk = json!({"id": "c", "choices": [{"index": 0, "delta": {"content": "a"}}]});
    c.event(&ev("message", chunk), &mut b).expect("event");
    assert_eq!(c.finish(), Ok(Assembled::Incomplete));
}

#[test]
fn a_chat_stream_becomes_the_completion_the_api_would_have_sent() {
    let mut c = ChatCompletions::default();
    let mut budget = plenty();
    for data in [
        json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 7, "model": "gpt-x", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": null}]}),
        json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 7, "model": "gpt-x", "choices": [{"index": 0, "delta": {"content": "Hel"}, "finish_reason": null}]}),
        json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 7, "model": "gpt-x", "choices": [{"index": 0, "delta": {"content": "lo", "tool_calls": [{"index": 0, "id": "call_1", "type": "function", "function": {"name": "ls", "arguments": "{\"a"}}]}, "finish_reason": null}]}),
        json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 7, "model": "gpt-x", "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "\":1}"}}]}, "finish_reason": "tool_calls"}]}),
        json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 7, "model": "gpt-x", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}}),
    ] {
        c.event(&ev("message", data), &mut budget)
            .expect("within the budget");
    }
    c.event(
        &SseEvent {
            event: "message".into(),
            data: "[DONE]".into(),
            id: None,
        },
        &mut budget,
    )
    .expect("event");
    let Ok(Assembled::Answer(done)) = c.finish() else {
        panic!("a whole completion");
    };
    assert_eq!(done["object"], "chat.completion");
    assert_eq!(done["id"], "chatcmpl-1");
    assert_eq!(done["usage"]["total_tokens"], 8);
    let choice = &done["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls");
    assert_eq!(choice["message"]["role"], "assistant");
    assert_eq!(choice["message"]["content"], "Hello");
    assert_eq!(
        choice["message"]["tool_calls"],
        json!([{"id": "call_1", "type": "function", "function": {"name": "ls", "arguments": "{\"a\":1}"}}])
    );
}

/// A whole Anthropic stream with one tool call whose input arrives in
/// `fragments`; `stop` says whether its block stops.
fn tool_call(fragments: &[&str], stop: bool) -> Vec<SseEvent> {
    let mut events = vec![
        ev(
            "message_start",
            json!({"type": "message_start", "message": {"id": "msg_1", "content": []}}),
        ),
        ev(
            "content_block_start",
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "tool_use", "id": "t1", "name": "rm", "input": {}}}),
        ),
    ];
    for f in fragments {
        events.push(ev(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "input_json_delta", "partial_json": f}}),
        ));
    }
    if stop {
        events.push(ev(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": 0}),
        ));
    }
    events.push(ev("message_stop", json!({"type": "message_stop"})));
    events
}

/// Feeds `events` to a fresh assembler: the first error, or what it
/// finishes with.
fn assemble(events: &[SseEvent], budget: &mut Budget) -> Result<Assembled, AssemblyError> {
    let mut m = Messages::default();
    for e in events {
        m.event(e, budget)?;
    }
    m.finish()
}

#[test]
fn tool_input_that_is_not_a_json_object_is_an_error_never_an_empty_input() {
    for (fragments, stop, why) in [
        (
            &["{\"path\": \"/ho", "me"][..],
            true,
            "EOF while parsing a string",
        ),
        (&["{\"a\": 1}", "}"][..], true, "trailing characters"),
        (&["[1, 2]"][..], true, "not an object"),
        (&["{\"a\": 1}"][..], false, "never stopped"),
    ] {
        let error =
            assemble(&tool_call(fragments, stop), &mut plenty()).expect_err("not an answer");
        let AssemblyError::ToolInput { index, reason } = &error else {
            panic!("{error:?}");
        };
        assert_eq!(*index, 0);
        assert!(reason.contains(why), "{fragments:?}: {reason}");
        assert_eq!(error.code(), "EMALFORMED");
        let text = error.to_string();
        assert!(!text.contains("/ho"), "the input is never quoted: {text}");
    }
    // No fragments: the input of the block's start, as the API sends a
    // tool without parameters.
    let Ok(Assembled::Answer(message)) = assemble(&tool_call(&[], true), &mut plenty()) else {
        panic!("an answer");
    };
    assert_eq!(message["content"][0]["input"], json!({}));
    let Ok(Assembled::Answer(message)) =
        assemble(&tool_call(&["{\"a\"", ": [1]}"], true), &mut plenty())
    else {
        panic!("an answer");
    };
    assert_eq!(message["content"][0]["input"], json!({"a": [1]}));
}

#[test]
fn the_budget_counts_what_is_kept_and_stops_past_its_limit() {
    let text = |t: &str| {
        ev(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": t}}),
        )
    };
    let start = ev(
        "message_start",
        json!({"type": "message_start", "message": {"id": "m"}}),
    );
    let block = ev(
        "content_block_start",
        json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
    );
    let overhead = start.data.len() + block.data.len() + SLOT_BYTES;
    // Text is charged by its bytes, not by its events' JSON.
    let mut budget = Budget::new(overhead + 1000);
    let mut m = Messages::default();
    for e in [&start, &block] {
        m.event(e, &mut budget).expect("within");
    }
    for _ in 0..100 {
        m.event(&text("0123456789"), &mut budget).expect("within");
    }
    assert_eq!(
        m.event(&text("x"), &mut budget),
        Err(AssemblyError::TooLarge {
            limit: overhead + 1000
        })
    );
    // A block index far ahead is charged for its slots before any is
    // made.
    let mut budget = Budget::new(1 << 20);
    let far = ev(
        "content_block_start",
        json!({"type": "content_block_start", "index": 1u64 << 40, "content_block": {"type": "text"}}),
    );
    let mut m = Messages::default();
    assert!(matches!(
        m.event(&far, &mut budget),
        Err(AssemblyError::TooLarge { .. })
    ));
    // Chat: choices and tool calls far ahead too; content by its bytes.
    let mut c = ChatCompletions::default();
    let far = json!({"id": "c", "choices": [{"index": 1u64 << 40, "delta": {"content": "a"}}]});
    assert!(matches!(
        c.event(&ev("message", far), &mut budget),
        Err(AssemblyError::TooLarge { .. })
    ));
    let mut c = ChatCompletions::default();
    let far = json!({"id": "c", "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 1u64 << 40, "function": {"arguments": "{}"}}]}}]});
    assert!(matches!(
        c.event(&ev("message", far), &mut budget),
        Err(AssemblyError::TooLarge { .. })
    ));
    let limit = SLOT_BYTES + json_size(&json!("c")) + 100;
    let mut budget = Budget::new(limit);
    let mut c = ChatCompletions::default();
    let content = |t: &str| {
        ev(
            "message",
            json!({"id": "c", "choices": [{"index": 0, "delta": {"content": t}}]}),
        )
    };
    assert!(c.event(&content(""), &mut budget).is_ok());
    for _ in 0..10 {
        c.event(&content("0123456789"), &mut budget)
            .expect("within");
    }
    assert_eq!(
        c.event(&content("x"), &mut budget),
        Err(AssemblyError::TooLarge { limit })
    );
}
