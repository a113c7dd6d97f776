//! OpenAI-compatible chat completions wire format.
//!
//! A normal stream is `data: {chunk}` frames: the role, a few content
//! deltas, the `finish_reason`, with `stream_options.include_usage` one last
//! chunk with `choices: []` and the usage, then the literal `data: [DONE]`.
//! Keep-alives are SSE comments (`: keep-alive`).

use hyper::body::Bytes;
use serde_json::{Value, json};

use crate::reply::{Reply, split_deltas};
use crate::script::Frames;

/// One SSE frame: `data: JSON\n\n`.
fn data(value: &Value) -> Bytes {
    Bytes::from(format!("data: {value}\n\n"))
}

/// Builds chunks of one completion.
struct Chunker<'a> {
    reply: &'a Reply,
    include_usage: bool,
}

impl Chunker<'_> {
    fn chunk(&self, delta: Value, finish_reason: Value) -> Bytes {
        let mut chunk = json!({
            "id": self.reply.id,
            "object": "chat.completion.chunk",
            "created": self.reply.created,
            "model": self.reply.model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}]
        });
        if self.include_usage {
            // OpenAI sends `usage: null` on every chunk but the last.
            chunk["usage"] = Value::Null;
        }
        data(&chunk)
    }
}

/// The frames of a complete, successful stream.
pub(crate) fn frames(reply: &Reply, include_usage: bool) -> Frames {
    let c = Chunker {
        reply,
        include_usage,
    };
    let mut frames = vec![c.chunk(json!({"role": "assistant", "content": ""}), Value::Null)];
    let text_at = frames.len();
    frames.extend(
        split_deltas(&reply.text)
            .into_iter()
            .map(|t| c.chunk(json!({"content": t}), Value::Null)),
    );
    frames.push(c.chunk(json!({}), json!("stop")));
    if include_usage {
        frames.push(data(&json!({
            "id": reply.id,
            "object": "chat.completion.chunk",
            "created": reply.created,
            "model": reply.model,
            "choices": [],
            "usage": usage(reply)
        })));
    }
    frames.push(Bytes::from_static(b"data: [DONE]\n\n"));
    Frames {
        frames,
        pause_at: 1,
        text_at,
    }
}

fn usage(reply: &Reply) -> Value {
    json!({
        "prompt_tokens": reply.prompt_tokens(),
        "completion_tokens": reply.output_tokens,
        "total_tokens": reply.prompt_tokens() + reply.output_tokens,
        "prompt_tokens_details": {"cached_tokens": reply.cache_read_input_tokens}
    })
}

/// The keep-alive comment.
pub(crate) fn ping() -> Bytes {
    Bytes::from_static(b": keep-alive\n\n")
}

/// A mid-stream error frame, as OpenAI-compatible servers send it.
pub(crate) fn midstream_error() -> Bytes {
    data(&error_body(
        "overloaded_error",
        "Overloaded",
        Some("overloaded"),
    ))
}

/// A chunk frame whose data is cut short: not JSON.
pub(crate) fn malformed() -> Bytes {
    Bytes::from_static(b"data: {\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"unterminated\n\n")
}

/// One content chunk about `size` bytes long.
pub(crate) fn oversized(reply: &Reply, size: usize, include_usage: bool) -> Bytes {
    let c = Chunker {
        reply,
        include_usage,
    };
    // The JSON envelope is ~200 bytes; the rest is the text.
    let text = "x".repeat(size.saturating_sub(256).max(1));
    c.chunk(json!({ "content": text }), Value::Null)
}

/// The non-streaming `chat.completion` response.
pub(crate) fn completion_json(reply: &Reply) -> Value {
    json!({
        "id": reply.id,
        "object": "chat.completion",
        "created": reply.created,
        "model": reply.model,
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": reply.text},
            "finish_reason": "stop"
        }],
        "usage": usage(reply)
    })
}

/// `{"error":{"message":…,"type":…,"param":null,"code":…}}`.
pub(crate) fn error_body(kind: &str, message: &str, code: Option<&str>) -> Value {
    json!({"error": {"message": message, "type": kind, "param": null, "code": code}})
}
