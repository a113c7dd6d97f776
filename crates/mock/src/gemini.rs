//! Google's Gemini API wire format (`generateContent` and
//! `streamGenerateContent?alt=sse`), as the Gemini CLI 0.61.0 uses it
//! (`../shared/reference/agents.md`).
//!
//! The request is `POST {base}/v1beta/models/<model>:streamGenerateContent?alt=sse`
//! (the model is in the path, the key in `x-goog-api-key`, which the mock
//! does not check) with `{"contents":[{"role":"user","parts":[{"text":…}]},
//! …]}`. A normal stream is `data: {…}` frames (no event names, no
//! terminal `[DONE]`): one `GenerateContentResponse` per few words,
//! `{"candidates":[{"content":{"parts":[{"text":…}],"role":"model"},
//! "index":0}],"usageMetadata":{…},"modelVersion":…,"responseId":…}`, the
//! last one with `finishReason: "STOP"` and the final usage. A stream that
//! ends without a `finishReason` is a broken one to the CLI. Errors are
//! `{"error":{"code":N,"message":…,"status":"INVALID_ARGUMENT"|…}}`.

use hyper::body::Bytes;
use serde_json::{Value, json};

use crate::reply::{Reply, split_deltas};
use crate::script::Frames;

/// The window the Gemini CLI assumes for its models (`tokenLimit()`).
const WINDOW: u64 = 1_048_576;

/// The model and whether it streams, from a Gemini path:
/// `…/models/<model>:streamGenerateContent` or `…:generateContent`.
pub(crate) fn model_and_stream(path: &str) -> Option<(String, bool)> {
    let (_, rest) = path.rsplit_once("/models/")?;
    let (model, action) = rest.rsplit_once(':')?;
    let stream = match action {
        "streamGenerateContent" => true,
        "generateContent" => false,
        _ => return None,
    };
    (!model.is_empty() && !model.contains('/')).then(|| (model.to_owned(), stream))
}

/// The request as the shared reply code reads it: the model from the path,
/// `contents` (roles `user`/`model`, `parts[].text`) as `messages`.
pub(crate) fn normalized(request: &Value, model: &str) -> Value {
    let messages: Vec<Value> = request
        .get("contents")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|c| {
            let role = match c.get("role").and_then(Value::as_str) {
                Some("model") => "assistant",
                _ => "user",
            };
            let text: String = c
                .get("parts")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|p| p.get("text").and_then(Value::as_str))
                .collect();
            json!({"role": role, "content": text})
        })
        .collect();
    json!({"model": model, "messages": messages})
}

fn data(value: &Value) -> Bytes {
    Bytes::from(format!("data: {value}\r\n\r\n"))
}

fn usage(reply: &Reply, output: u64) -> Value {
    json!({
        "promptTokenCount": reply.prompt_tokens(),
        "candidatesTokenCount": output,
        "totalTokenCount": reply.prompt_tokens() + output,
        "cachedContentTokenCount": reply.cache_read_input_tokens
    })
}

fn chunk(reply: &Reply, text: &str, last: bool) -> Value {
    let mut candidate = json!({
        "content": {"parts": [{"text": text}], "role": "model"},
        "index": 0
    });
    if last {
        candidate["finishReason"] = json!("STOP");
    }
    json!({
        "candidates": [candidate],
        "usageMetadata": usage(reply, if last { reply.output_tokens } else { 0 }),
        "modelVersion": reply.model,
        "responseId": reply.id
    })
}

/// The frames of a complete, successful stream.
pub(crate) fn frames(reply: &Reply) -> Frames {
    let mut deltas = split_deltas(&reply.text);
    if deltas.is_empty() {
        deltas.push(String::new());
    }
    let last = deltas.len() - 1;
    Frames {
        frames: deltas
            .iter()
            .enumerate()
            .map(|(i, d)| data(&chunk(reply, d, i == last)))
            .collect(),
        pause_at: 1,
        text_at: 0,
    }
}

/// The frames before a stall among a reply's thought parts (`thought:
/// true`, as a thinking model streams them before its text); the stream
/// then goes silent, before any text.
pub(crate) fn frames_until_thinking_stall(reply: &Reply) -> Vec<Bytes> {
    ["Let me look at ", "the failing test ", "before answering."]
        .into_iter()
        .map(|t| {
            let mut c = chunk(reply, "", false);
            c["candidates"][0]["content"]["parts"] = json!([{"text": t, "thought": true}]);
            data(&c)
        })
        .collect()
}

/// The complete response as JSON (`generateContent`).
pub(crate) fn response_json(reply: &Reply) -> Value {
    chunk(reply, &reply.text, true)
}

/// An error body: `{"error":{"code","message","status"}}`. An
/// `invalid_request_error` about a too-long prompt gets Gemini's wording.
pub(crate) fn error_body(status: u16, kind: &str, message: &str) -> Value {
    let message = if kind == "invalid_request_error" && message.contains("too long") {
        format!(
            "The input token count ({}) exceeds the maximum number of tokens allowed ({WINDOW}).",
            WINDOW + 1
        )
    } else {
        message.to_owned()
    };
    let grpc = match status {
        400 => "INVALID_ARGUMENT",
        401 => "UNAUTHENTICATED",
        403 => "PERMISSION_DENIED",
        404 => "NOT_FOUND",
        429 => "RESOURCE_EXHAUSTED",
        503 | 529 => "UNAVAILABLE",
        _ => "INTERNAL",
    };
    json!({"error": {"code": status, "message": message, "status": grpc}})
}

/// The mid-stream error: an `error` object in a data frame.
pub(crate) fn midstream_error() -> Bytes {
    data(&error_body(
        503,
        "overloaded_error",
        "The model is overloaded.",
    ))
}

/// A data frame cut short: not JSON.
pub(crate) fn malformed() -> Bytes {
    Bytes::from_static(
        b"data: {\"candidates\":[{\"content\":{\"parts\":[{\"text\":\"unterminated\r\n\r\n",
    )
}

/// One text frame about `size` bytes long.
pub(crate) fn oversized(reply: &Reply, size: usize) -> Bytes {
    data(&chunk(
        reply,
        &"x".repeat(size.saturating_sub(300).max(1)),
        false,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MockConfig;

    #[test]
    fn paths_name_the_model_and_whether_it_streams() {
        assert_eq!(
            model_and_stream("/v1beta/models/gemini-2.5-pro:streamGenerateContent"),
            Some(("gemini-2.5-pro".into(), true))
        );
        assert_eq!(
            model_and_stream("/p/v1beta/models/mock-stall:generateContent"),
            Some(("mock-stall".into(), false))
        );
        assert_eq!(model_and_stream("/v1beta/models/x:countTokens"), None);
        assert_eq!(model_and_stream("/v1/messages"), None);
    }

    #[test]
    fn a_stream_is_data_chunks_the_last_with_stop_and_usage() {
        let req = normalized(
            &json!({"contents": [{"role": "user", "parts": [{"text": "hi"}, {"text": "!"}]}]}),
            "gemini-2.5-pro",
        );
        assert_eq!(req["messages"][0]["content"], "hi!");
        let mut reply = Reply::new(&MockConfig::default(), "r1".into(), &req, 40, 0);
        reply.text = "one two three four five six seven eight".into();
        let f = frames(&reply);
        let chunks: Vec<Value> = f
            .frames
            .iter()
            .map(|b| {
                let t = std::str::from_utf8(b).expect("utf-8");
                serde_json::from_str(t.trim().trim_start_matches("data: ")).expect("json")
            })
            .collect();
        let text: String = chunks
            .iter()
            .map(|c| {
                c["candidates"][0]["content"]["parts"][0]["text"]
                    .as_str()
                    .expect("text")
                    .to_owned()
            })
            .collect();
        assert_eq!(text, reply.text);
        let last = chunks.last().expect("frames");
        assert_eq!(last["candidates"][0]["finishReason"], "STOP");
        assert_eq!(last["usageMetadata"]["promptTokenCount"], 10);
        assert!(chunks[0]["candidates"][0].get("finishReason").is_none());
        let e = error_body(400, "invalid_request_error", "prompt is too long: …");
        assert_eq!(e["error"]["status"], "INVALID_ARGUMENT");
        assert!(
            e["error"]["message"]
                .as_str()
                .expect("message")
                .starts_with("The input token count (1048577) exceeds")
        );
    }
}
