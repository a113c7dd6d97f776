//! A whole answer (what an API gives a request without a stream) as the
//! events of the stream that would have carried it — the inverse of
//! `assemble` — so a client that asked for a stream can be given an
//! answer the proxy had to ask for whole (`WholeFallback`): one
//! `message_start`, each block started, given in one delta and stopped,
//! `message_delta`, `message_stop` (Anthropic); a chunk per part of each
//! choice, its finish, the usage when asked for, `[DONE]` (chat
//! completions); the response itself as its one frame (Gemini, whose
//! stream is a run of whole responses).

use serde_json::{Map, Value, json};

use crate::upstream::Protocol;

/// `answer`, the whole answer to `request`, as the SSE text of its stream;
/// `None` for a protocol whose answers are not replayed (Responses) or an
/// answer that is not the API's JSON object.
pub(crate) fn stream_of(protocol: Protocol, request: &Value, answer: &Value) -> Option<String> {
    let answer = answer.as_object()?;
    let mut out = String::new();
    match protocol {
        Protocol::Messages => messages(answer, &mut out),
        Protocol::ChatCompletions => chat(request, answer, &mut out),
        Protocol::Gemini => frame(&mut out, None, &Value::Object(answer.clone())),
        Protocol::Responses => return None,
    }
    Some(out)
}

/// Whether answers of `protocol` are replayed as a stream.
pub(crate) fn replays(protocol: Protocol) -> bool {
    protocol != Protocol::Responses
}

/// One SSE event: its name (none for OpenAI's and Gemini's data-only
/// frames) and its data.
fn frame(out: &mut String, event: Option<&str>, data: &Value) {
    if let Some(event) = event {
        out.push_str("event: ");
        out.push_str(event);
        out.push('\n');
    }
    out.push_str("data: ");
    out.push_str(&data.to_string());
    out.push_str("\n\n");
}

/// An Anthropic message as its stream's events.
fn messages(answer: &Map<String, Value>, out: &mut String) {
    let mut message = answer.clone();
    let content = message
        .insert("content".to_owned(), json!([]))
        .and_then(|c| match c {
            Value::Array(blocks) => Some(blocks),
            _ => None,
        })
        .unwrap_or_default();
    let stop_reason = message.insert("stop_reason".to_owned(), Value::Null);
    let stop_sequence = message.insert("stop_sequence".to_owned(), Value::Null);
    let usage = answer.get("usage").cloned().unwrap_or_else(|| json!({}));
    if let Some(Value::Object(start_usage)) = message.get_mut("usage") {
        start_usage.insert("output_tokens".to_owned(), json!(0));
    }
    let start = json!({"type": "message_start", "message": message});
    frame(out, Some("message_start"), &start);
    for (index, block) in content.into_iter().enumerate() {
        content_block(out, index, block);
    }
    let delta = json!({
        "type": "message_delta",
        "delta": {
            "stop_reason": stop_reason.unwrap_or(Value::Null),
            "stop_sequence": stop_sequence.unwrap_or(Value::Null),
        },
        "usage": usage,
    });
    frame(out, Some("message_delta"), &delta);
    frame(out, Some("message_stop"), &json!({"type": "message_stop"}));
}

/// One content block: started empty, its whole content in one delta (a
/// thinking block's signature in a second), stopped. A kind without
/// deltas (`redacted_thinking`, a server tool's result) starts whole.
fn content_block(out: &mut String, index: usize, block: Value) {
    let kind = block.get("type").and_then(Value::as_str).unwrap_or("");
    let text = |field: &str| block.get(field).and_then(Value::as_str).unwrap_or("");
    let (start, deltas) = match kind {
        "text" => (
            json!({"type": "text", "text": ""}),
            vec![json!({"type": "text_delta", "text": text("text")})],
        ),
        "thinking" => {
            let mut deltas = vec![json!({"type": "thinking_delta", "thinking": text("thinking")})];
            if let Some(signature) = block.get("signature") {
                deltas.push(json!({"type": "signature_delta", "signature": signature}));
            }
            (json!({"type": "thinking", "thinking": ""}), deltas)
        }
        "tool_use" | "server_tool_use" => {
            let input = block.get("input").cloned().unwrap_or_else(|| json!({}));
            let mut start = block.clone();
            start["input"] = json!({});
            let delta = json!({"type": "input_json_delta", "partial_json": input.to_string()});
            (start, vec![delta])
        }
        _ => (block.clone(), Vec::new()),
    };
    let start = json!({"type": "content_block_start", "index": index, "content_block": start});
    frame(out, Some("content_block_start"), &start);
    for delta in deltas {
        let empty = ["text", "thinking", "partial_json"]
            .iter()
            .any(|f| delta.get(*f).and_then(Value::as_str) == Some(""));
        if !empty {
            let delta = json!({"type": "content_block_delta", "index": index, "delta": delta});
            frame(out, Some("content_block_delta"), &delta);
        }
    }
    let stop = json!({"type": "content_block_stop", "index": index});
    frame(out, Some("content_block_stop"), &stop);
}

/// A chat completion as its stream's chunks: per choice its role, its
/// content, refusal and tool calls, its finish; the usage in a last chunk
/// when `request` asked for it (`stream_options.include_usage`);
/// `[DONE]`.
fn chat(request: &Value, answer: &Map<String, Value>, out: &mut String) {
    let mut head = Map::new();
    for field in [
        "id",
        "created",
        "model",
        "system_fingerprint",
        "service_tier",
    ] {
        if let Some(v) = answer.get(field) {
            head.insert(field.to_owned(), v.clone());
        }
    }
    head.insert("object".to_owned(), json!("chat.completion.chunk"));
    let chunk = |out: &mut String, choices: Value| {
        let mut c = head.clone();
        c.insert("choices".to_owned(), choices);
        frame(out, None, &Value::Object(c));
    };
    let choices = answer
        .get("choices")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    for choice in &choices {
        let index = choice.get("index").cloned().unwrap_or_else(|| json!(0));
        let message = choice.get("message").cloned().unwrap_or_else(|| json!({}));
        let delta = |delta: Value| json!([{"index": index, "delta": delta, "finish_reason": null}]);
        chunk(out, delta(json!({"role": "assistant", "content": ""})));
        for field in ["content", "refusal"] {
            if let Some(text) = message
                .get(field)
                .and_then(Value::as_str)
                .filter(|t| !t.is_empty())
            {
                chunk(out, delta(json!({ field: text })));
            }
        }
        let calls = message.get("tool_calls").and_then(Value::as_array);
        for (i, call) in calls.into_iter().flatten().enumerate() {
            let mut call = call.clone();
            call["index"] = json!(i);
            chunk(out, delta(json!({"tool_calls": [call]})));
        }
        let finish = choice.get("finish_reason").cloned().unwrap_or(Value::Null);
        chunk(
            out,
            json!([{"index": index, "delta": {}, "finish_reason": finish}]),
        );
    }
    let usage_asked = request
        .pointer("/stream_options/include_usage")
        .and_then(Value::as_bool)
        == Some(true);
    if usage_asked && let Some(usage) = answer.get("usage") {
        let mut c = head.clone();
        c.insert("choices".to_owned(), json!([]));
        c.insert("usage".to_owned(), usage.clone());
        frame(out, None, &Value::Object(c));
    }
    out.push_str("data: [DONE]\n\n");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::assemble::{Assembled, Budget, ChatCompletions, Messages, Whole};
    use warden_llm::sse::{Parsed, SseParser};

    /// `sse` assembled back into the whole answer, as a client that asked
    /// for no stream gets it.
    fn assembled(mut whole: Whole, sse: &str) -> Value {
        let mut frames = std::collections::VecDeque::new();
        SseParser::new(1 << 20)
            .feed(sse.as_bytes(), &mut frames)
            .expect("well-formed SSE");
        let mut budget = Budget::new(1 << 20);
        for f in frames {
            if let Parsed::Event(e) = f {
                whole.event(&e, &mut budget).expect("an event of the API");
            }
        }
        match whole.finish().expect("whole") {
            Assembled::Answer(a) => a,
            _ => panic!("not an answer"),
        }
    }

    #[test]
    fn a_message_replayed_as_a_stream_assembles_back_into_the_same_message() {
        let message = json!({
            "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-x",
            "content": [
                {"type": "thinking", "thinking": "hmm", "signature": "sig"},
                {"type": "text", "text": "hello there"},
                {"type": "tool_use", "id": "tu_1", "name": "Read", "input": {"path": "/a"}},
            ],
            "stop_reason": "tool_use", "stop_sequence": null,
            "usage": {"input_tokens": 10, "output_tokens": 7},
        });
        let sse = stream_of(Protocol::Messages, &json!({}), &message).expect("replayed");
        assert!(sse.starts_with("event: message_start\n"), "{sse}");
        assert!(sse.ends_with("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"));
        let back = assembled(Whole::Messages(Messages::default()), &sse);
        assert_eq!(back["content"], message["content"]);
        assert_eq!(back["stop_reason"], "tool_use");
        assert_eq!(back["usage"]["output_tokens"], 7);
    }

    #[test]
    fn a_chat_completion_replayed_as_a_stream_assembles_back_into_the_same_completion() {
        let completion = json!({
            "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "gpt-x",
            "choices": [{"index": 0, "finish_reason": "stop",
                "message": {"role": "assistant", "content": "hello there"}}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
        });
        let request = json!({"stream": true, "stream_options": {"include_usage": true}});
        let sse = stream_of(Protocol::ChatCompletions, &request, &completion).expect("replayed");
        assert!(sse.ends_with("data: [DONE]\n\n"), "{sse}");
        let back = assembled(Whole::Chat(ChatCompletions::default()), &sse);
        assert_eq!(back["choices"][0]["message"]["content"], "hello there");
        assert_eq!(back["choices"][0]["finish_reason"], "stop");
        assert_eq!(back["usage"]["total_tokens"], 5);
    }
}
