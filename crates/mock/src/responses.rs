//! OpenAI Responses API wire format (`POST /v1/responses`), as
//! `docs/wire-formats.md` ("OpenAI Responses streams") records it.
//!
//! A normal stream is typed, numbered events (`sequence_number` from 0):
//! `response.created` (with the response `id`), `response.in_progress`,
//! `response.output_item.added`, `response.content_part.added`, one
//! `response.output_text.delta` per few words, `response.output_text.done`,
//! `response.content_part.done`, `response.output_item.done`,
//! `response.completed` (with `usage`). Keep-alives are SSE comments.
//!
//! With `"background": true` the response is kept: `GET
//! /v1/responses/{id}?stream=true&starting_after=N` streams its events
//! after sequence number `N` again (a re-attach: nothing is generated
//! twice), and `GET /v1/responses/{id}` gives it as JSON. Without it,
//! `GET` is a 404, as on the real API once the connection is gone.

use hyper::body::Bytes;
use serde_json::{Value, json};

use crate::reply::{Reply, split_deltas};
use crate::script::Frames;

/// One SSE event: `event: TYPE\ndata: JSON\n\n`, numbered.
fn event(seq: usize, mut data: Value) -> Bytes {
    let kind = data
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned();
    data["sequence_number"] = json!(seq);
    Bytes::from(format!("event: {kind}\ndata: {data}\n\n"))
}

/// The response object in `status`.
fn response(reply: &Reply, status: &str, with_output: bool) -> Value {
    let mut r = json!({
        "id": reply.id,
        "object": "response",
        "created_at": reply.created,
        "status": status,
        "model": reply.model,
        "output": [],
        "usage": null
    });
    if with_output {
        r["output"] = json!([message_item(reply, "completed", &reply.text)]);
        r["usage"] = json!({
            "input_tokens": reply.prompt_tokens(),
            "input_tokens_details": {"cached_tokens": reply.cache_read_input_tokens},
            "output_tokens": reply.output_tokens,
            "total_tokens": reply.prompt_tokens() + reply.output_tokens
        });
    }
    r
}

fn item_id(reply: &Reply) -> String {
    format!("msg_{}", reply.id.trim_start_matches("resp_"))
}

fn message_item(reply: &Reply, status: &str, text: &str) -> Value {
    let content = if status == "in_progress" {
        json!([])
    } else {
        json!([{"type": "output_text", "text": text, "annotations": []}])
    };
    json!({
        "id": item_id(reply),
        "type": "message",
        "status": status,
        "role": "assistant",
        "content": content
    })
}

/// The frames of a complete, successful stream.
pub(crate) fn frames(reply: &Reply) -> Frames {
    let item = item_id(reply);
    let mut data = vec![
        json!({"type": "response.created", "response": response(reply, "in_progress", false)}),
        json!({"type": "response.in_progress", "response": response(reply, "in_progress", false)}),
        json!({"type": "response.output_item.added", "output_index": 0,
               "item": message_item(reply, "in_progress", "")}),
        json!({"type": "response.content_part.added", "item_id": item, "output_index": 0,
               "content_index": 0, "part": {"type": "output_text", "text": "", "annotations": []}}),
    ];
    let text_at = data.len();
    data.extend(split_deltas(&reply.text).into_iter().map(|d| {
        json!({"type": "response.output_text.delta", "item_id": item, "output_index": 0,
               "content_index": 0, "delta": d})
    }));
    data.extend([
        json!({"type": "response.output_text.done", "item_id": item, "output_index": 0,
               "content_index": 0, "text": reply.text}),
        json!({"type": "response.content_part.done", "item_id": item, "output_index": 0,
               "content_index": 0, "part": {"type": "output_text", "text": reply.text, "annotations": []}}),
        json!({"type": "response.output_item.done", "output_index": 0,
               "item": message_item(reply, "completed", &reply.text)}),
        json!({"type": "response.completed", "response": response(reply, "completed", true)}),
    ]);
    Frames {
        frames: data
            .into_iter()
            .enumerate()
            .map(|(i, d)| event(i, d))
            .collect(),
        pause_at: 1,
        text_at,
    }
}

/// The frames before a stall inside a reasoning item (a reasoning model's
/// thinking: its summary streaming, no `output_item.done`); the stream then
/// goes silent, before any message.
pub(crate) fn frames_until_reasoning_stall(reply: &Reply) -> Vec<Bytes> {
    let item = format!("rs_{}", reply.id.trim_start_matches("resp_"));
    let mut data = vec![
        json!({"type": "response.created", "response": response(reply, "in_progress", false)}),
        json!({"type": "response.in_progress", "response": response(reply, "in_progress", false)}),
        json!({"type": "response.output_item.added", "output_index": 0,
               "item": {"id": item, "type": "reasoning", "summary": []}}),
        json!({"type": "response.reasoning_summary_part.added", "item_id": item, "output_index": 0,
               "summary_index": 0, "part": {"type": "summary_text", "text": ""}}),
    ];
    data.extend(
        ["**Looking** at ", "the failing test ", "before answering."].map(|d| {
            json!({"type": "response.reasoning_summary_text.delta", "item_id": item,
                   "output_index": 0, "summary_index": 0, "delta": d})
        }),
    );
    data.into_iter()
        .enumerate()
        .map(|(i, d)| event(i, d))
        .collect()
}

/// The complete response as JSON (non-streaming, and `GET` of a kept one).
pub(crate) fn response_json(reply: &Reply) -> Value {
    response(reply, "completed", true)
}

/// The mid-stream `error` event.
pub(crate) fn midstream_error() -> Bytes {
    Bytes::from_static(
        b"event: error\ndata: {\"type\":\"error\",\"code\":\"server_is_overloaded\",\"message\":\"The server is overloaded.\",\"param\":null,\"sequence_number\":99}\n\n",
    )
}

/// A `response.output_text.delta` whose data is cut short: not JSON.
pub(crate) fn malformed() -> Bytes {
    Bytes::from_static(
        b"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"unterminated\n\n",
    )
}

/// One `response.output_text.delta` event about `size` bytes long.
pub(crate) fn oversized(size: usize) -> Bytes {
    event(
        0,
        json!({"type": "response.output_text.delta", "item_id": "msg_x", "output_index": 0,
               "content_index": 0, "delta": "x".repeat(size.saturating_sub(160).max(1))}),
    )
}

/// The response id of a Responses reply.
pub(crate) fn response_id(id: crate::journal::RequestId) -> String {
    format!("resp_mock{id:014}")
}

/// Frames after sequence number `after` (all of them for `None`).
pub(crate) fn after(frames: &[Bytes], after: Option<usize>) -> Vec<Bytes> {
    match after {
        Some(n) => frames.iter().skip(n + 1).cloned().collect(),
        None => frames.to_vec(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::MockConfig;

    #[test]
    fn events_are_numbered_in_order_and_end_with_completed() {
        let req = json!({"model": "gpt-5", "input": [{"role": "user", "content": "hi"}]});
        let mut reply = Reply::new(&MockConfig::default(), "resp_1".into(), &req, 10, 0);
        reply.text = "one two three four five six seven".into();
        let f = frames(&reply);
        let texts: Vec<String> = f
            .frames
            .iter()
            .map(|b| String::from_utf8(b.to_vec()).expect("utf-8"))
            .collect();
        for (i, t) in texts.iter().enumerate() {
            assert!(t.contains(&format!("\"sequence_number\":{i}")), "{t}");
        }
        assert!(texts[0].starts_with("event: response.created\n"));
        assert!(texts[f.text_at].starts_with("event: response.output_text.delta\n"));
        assert!(
            texts
                .last()
                .expect("frames")
                .starts_with("event: response.completed\n")
        );
        assert_eq!(
            after(&f.frames, Some(f.text_at)).len(),
            f.frames.len() - f.text_at - 1
        );
    }
}
