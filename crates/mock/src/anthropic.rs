//! Anthropic Messages wire format: SSE events and JSON bodies.
//!
//! A normal stream is, in order: `message_start` (usage with the cache
//! fields), `content_block_start`, `ping`, one `content_block_delta`
//! (`text_delta`) per few words, `content_block_stop`, `message_delta`
//! (`stop_reason` and output usage) and `message_stop`.

use hyper::body::Bytes;
use serde_json::{Value, json};

use crate::reply::{Reply, split_deltas};
use crate::script::Frames;

/// One SSE event: `event: NAME\ndata: JSON\n\n`.
fn event(name: &str, data: &Value) -> Bytes {
    Bytes::from(format!("event: {name}\ndata: {data}\n\n"))
}

/// The frames of a complete, successful stream.
pub(crate) fn frames(reply: &Reply) -> Frames {
    let mut frames = vec![
        event(
            "message_start",
            &json!({
                "type": "message_start",
                "message": {
                    "id": reply.id,
                    "type": "message",
                    "role": "assistant",
                    "content": [],
                    "model": reply.model,
                    "stop_reason": null,
                    "stop_sequence": null,
                    "usage": {
                        "input_tokens": reply.input_tokens,
                        "cache_creation_input_tokens": reply.cache_creation_input_tokens,
                        "cache_read_input_tokens": reply.cache_read_input_tokens,
                        "output_tokens": 1
                    }
                }
            }),
        ),
        event(
            "content_block_start",
            &json!({
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": ""}
            }),
        ),
        ping(),
    ];
    let text_at = frames.len();
    frames.extend(split_deltas(&reply.text).iter().map(|t| text_delta(t)));
    frames.push(event(
        "content_block_stop",
        &json!({"type": "content_block_stop", "index": 0}),
    ));
    frames.push(event(
        "message_delta",
        &json!({
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn", "stop_sequence": null},
            "usage": {"output_tokens": reply.output_tokens}
        }),
    ));
    frames.push(event("message_stop", &json!({"type": "message_stop"})));
    Frames {
        frames,
        pause_at: 1,
        text_at,
    }
}

/// The frames before a stall inside a thinking block (`in_tool` false) or
/// inside a tool call's input (`in_tool` true); the stream then goes
/// silent, so no block is ever closed.
pub(crate) fn frames_until_phase_stall(reply: &Reply, in_tool: bool) -> Vec<Bytes> {
    let full = frames(reply);
    // message_start, then the phase's blocks.
    let mut out = vec![full.frames[0].clone()];
    if in_tool {
        out.push(event(
            "content_block_start",
            &json!({"type": "content_block_start", "index": 0,
                    "content_block": {"type": "text", "text": ""}}),
        ));
        out.push(text_delta("Let me run the tests first."));
        out.push(event(
            "content_block_stop",
            &json!({"type": "content_block_stop", "index": 0}),
        ));
        out.push(event(
            "content_block_start",
            &json!({"type": "content_block_start", "index": 1,
                    "content_block": {"type": "tool_use", "id": "toolu_01mock", "name": "Bash", "input": {}}}),
        ));
        out.push(event(
            "content_block_delta",
            &json!({"type": "content_block_delta", "index": 1,
                    "delta": {"type": "input_json_delta", "partial_json": "{\"command\": \"cargo te"}}),
        ));
    } else {
        out.push(event(
            "content_block_start",
            &json!({"type": "content_block_start", "index": 0,
                    "content_block": {"type": "thinking", "thinking": ""}}),
        ));
        for t in ["Let me look at ", "the failing test ", "before answering."] {
            out.push(event(
                "content_block_delta",
                &json!({"type": "content_block_delta", "index": 0,
                        "delta": {"type": "thinking_delta", "thinking": t}}),
            ));
        }
    }
    out
}

fn text_delta(text: &str) -> Bytes {
    event(
        "content_block_delta",
        &json!({
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "text_delta", "text": text}
        }),
    )
}

/// The `ping` event.
pub(crate) fn ping() -> Bytes {
    event("ping", &json!({"type": "ping"}))
}

/// The mid-stream `error` event (`overloaded_error`).
pub(crate) fn midstream_error() -> Bytes {
    event("error", &error_body("overloaded_error", "Overloaded"))
}

/// A `content_block_delta` event whose data is cut short: not JSON.
pub(crate) fn malformed() -> Bytes {
    Bytes::from_static(
        b"event: content_block_delta\n\
          data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"unterminated\n\n",
    )
}

/// One `text_delta` event about `size` bytes long.
pub(crate) fn oversized(size: usize) -> Bytes {
    // The JSON envelope is ~120 bytes; the rest is the text.
    text_delta(&"x".repeat(size.saturating_sub(128).max(1)))
}

/// The non-streaming Messages response.
pub(crate) fn message_json(reply: &Reply) -> Value {
    json!({
        "id": reply.id,
        "type": "message",
        "role": "assistant",
        "model": reply.model,
        "content": [{"type": "text", "text": reply.text}],
        "stop_reason": "end_turn",
        "stop_sequence": null,
        "usage": {
            "input_tokens": reply.input_tokens,
            "cache_creation_input_tokens": reply.cache_creation_input_tokens,
            "cache_read_input_tokens": reply.cache_read_input_tokens,
            "output_tokens": reply.output_tokens
        }
    })
}

/// `{"type":"error","error":{"type":KIND,"message":MESSAGE}}`.
pub(crate) fn error_body(kind: &str, message: &str) -> Value {
    json!({"type": "error", "error": {"type": kind, "message": message}})
}
