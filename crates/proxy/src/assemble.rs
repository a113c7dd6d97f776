//! A non-streaming answer assembled from a watched stream.
//!
//! A client that asked for a whole message (`"stream": false` or no
//! `stream`) is answered the way the API would have: the proxy sends the
//! request upstream as a stream — watched, retried and continued like any
//! other — and builds the JSON the client asked for from the spliced
//! events: for Anthropic Messages the `message_start`'s message with its
//! content blocks (text, thinking with its signature, tool use with its
//! input parsed) and the `message_delta`'s stop reason and usage; for chat
//! completions a `chat.completion` with each choice's message (content,
//! tool calls) and finish reason, and the usage chunk.

use serde_json::{Map, Value, json};
use warden_llm::sse::SseEvent;

/// What the assembled stream came to.
#[derive(Debug, PartialEq)]
pub(crate) enum Assembled {
    /// The whole answer.
    Answer(Value),
    /// The stream ended with an error event (the upstream's, or the
    /// proxy's after it gave up): its error object.
    Error(Value),
    /// The stream ended before its last event.
    Incomplete,
}

/// Builds an Anthropic message from its stream's events.
#[derive(Debug, Default)]
pub(crate) struct Messages {
    message: Option<Map<String, Value>>,
    content: Vec<Value>,
    /// Tool inputs as their JSON fragments arrive, by block index.
    partial_json: Vec<String>,
    error: Option<Value>,
    done: bool,
}

impl Messages {
    /// Takes one event of the (spliced) stream.
    pub(crate) fn event(&mut self, event: &SseEvent) {
        let Ok(data) = serde_json::from_str::<Value>(&event.data) else {
            return;
        };
        let index = data
            .get("index")
            .and_then(Value::as_u64)
            .and_then(|i| usize::try_from(i).ok());
        match event.event.as_str() {
            "message_start" => {
                self.message = data.get("message").and_then(Value::as_object).cloned();
            }
            "content_block_start" => {
                if let (Some(i), Some(block)) = (index, data.get("content_block")) {
                    if self.content.len() <= i {
                        self.content.resize(i + 1, Value::Null);
                        self.partial_json.resize(i + 1, String::new());
                    }
                    self.content[i] = block.clone();
                }
            }
            "content_block_delta" => {
                let (Some(i), Some(delta)) = (index, data.get("delta")) else {
                    return;
                };
                let Some(block) = self.content.get_mut(i) else {
                    return;
                };
                let text = |key: &str| delta.get(key).and_then(Value::as_str).unwrap_or("");
                match delta.get("type").and_then(Value::as_str) {
                    Some("text_delta") => append(block, "text", text("text")),
                    Some("thinking_delta") => append(block, "thinking", text("thinking")),
                    Some("signature_delta") => append(block, "signature", text("signature")),
                    Some("input_json_delta") => {
                        if let Some(p) = self.partial_json.get_mut(i) {
                            p.push_str(text("partial_json"));
                        }
                    }
                    Some("citations_delta") => {
                        if let (Some(citation), Some(b)) =
                            (delta.get("citation"), block.as_object_mut())
                        {
                            let list = b.entry("citations").or_insert_with(|| json!([]));
                            if let Some(list) = list.as_array_mut() {
                                list.push(citation.clone());
                            }
                        }
                    }
                    _ => {}
                }
            }
            "content_block_stop" => {
                let Some(i) = index else { return };
                let input = self.partial_json.get(i).filter(|p| !p.is_empty());
                if let (Some(partial), Some(block)) = (input, self.content.get_mut(i)) {
                    if let Ok(input) = serde_json::from_str::<Value>(partial) {
                        block["input"] = input;
                    }
                }
            }
            "message_delta" => {
                let Some(message) = self.message.as_mut() else {
                    return;
                };
                if let Some(delta) = data.get("delta").and_then(Value::as_object) {
                    for (k, v) in delta {
                        message.insert(k.clone(), v.clone());
                    }
                }
                if let Some(usage) = data.get("usage").and_then(Value::as_object) {
                    let merged = message.entry("usage").or_insert_with(|| json!({}));
                    if let Some(merged) = merged.as_object_mut() {
                        for (k, v) in usage {
                            merged.insert(k.clone(), v.clone());
                        }
                    }
                }
            }
            "message_stop" => self.done = true,
            "error" => self.error = Some(data.get("error").cloned().unwrap_or(data)),
            _ => {}
        }
    }

    /// The message, once the stream has ended.
    pub(crate) fn finish(self) -> Assembled {
        if let Some(error) = self.error {
            return Assembled::Error(error);
        }
        match (self.done, self.message) {
            (true, Some(mut message)) => {
                let content: Vec<Value> =
                    self.content.into_iter().filter(|b| !b.is_null()).collect();
                message.insert("content".into(), Value::Array(content));
                Assembled::Answer(Value::Object(message))
            }
            _ => Assembled::Incomplete,
        }
    }
}

/// Appends `text` to the string field `key` of `block` (an object).
fn append(block: &mut Value, key: &str, text: &str) {
    if let Some(block) = block.as_object_mut() {
        append_field(block, key, text);
    }
}

/// Appends `text` to the string field `key` of `map`.
fn append_field(map: &mut Map<String, Value>, key: &str, text: &str) {
    let field = map.entry(key).or_insert_with(|| json!(""));
    if let Value::String(s) = field {
        s.push_str(text);
    } else {
        *field = json!(text);
    }
}

/// Builds a chat completion from its stream's chunks.
#[derive(Debug, Default)]
pub(crate) struct ChatCompletions {
    head: Option<Map<String, Value>>,
    /// Each choice's message and finish reason, by index.
    choices: Vec<(Map<String, Value>, Value)>,
    usage: Option<Value>,
    error: Option<Value>,
    done: bool,
}

impl ChatCompletions {
    /// Takes one chunk of the (spliced) stream.
    pub(crate) fn event(&mut self, event: &SseEvent) {
        if event.data.trim() == "[DONE]" {
            self.done = true;
            return;
        }
        let Ok(chunk) = serde_json::from_str::<Value>(&event.data) else {
            return;
        };
        if let Some(error) = chunk.get("error") {
            self.error = Some(error.clone());
            return;
        }
        if self.head.is_none() {
            let mut head = Map::new();
            for key in [
                "id",
                "created",
                "model",
                "system_fingerprint",
                "service_tier",
            ] {
                if let Some(v) = chunk.get(key) {
                    head.insert(key.into(), v.clone());
                }
            }
            self.head = Some(head);
        }
        if let Some(usage) = chunk.get("usage").filter(|u| !u.is_null()) {
            self.usage = Some(usage.clone());
        }
        for choice in chunk
            .get("choices")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let Some(i) = choice
                .get("index")
                .and_then(Value::as_u64)
                .and_then(|i| usize::try_from(i).ok())
            else {
                continue;
            };
            if self.choices.len() <= i {
                self.choices.resize(i + 1, (Map::new(), Value::Null));
            }
            let (message, finish) = &mut self.choices[i];
            if let Some(reason) = choice.get("finish_reason").filter(|r| !r.is_null()) {
                *finish = reason.clone();
            }
            let Some(delta) = choice.get("delta").and_then(Value::as_object) else {
                continue;
            };
            for (key, value) in delta {
                match (key.as_str(), value) {
                    ("content" | "refusal", Value::String(text)) => {
                        append_field(message, key, text);
                    }
                    ("tool_calls", Value::Array(calls)) => merge_tool_calls(message, calls),
                    (_, Value::Null) => {}
                    _ => {
                        message.insert(key.clone(), value.clone());
                    }
                }
            }
        }
    }

    /// The completion, once the stream has ended.
    pub(crate) fn finish(self) -> Assembled {
        if let Some(error) = self.error {
            return Assembled::Error(error);
        }
        let (true, Some(mut out)) = (self.done, self.head) else {
            return Assembled::Incomplete;
        };
        let choices: Vec<Value> = self
            .choices
            .into_iter()
            .enumerate()
            .map(|(i, (mut message, finish))| {
                message.entry("role").or_insert_with(|| json!("assistant"));
                message.entry("content").or_insert(Value::Null);
                json!({"index": i, "message": message, "finish_reason": finish, "logprobs": null})
            })
            .collect();
        out.insert("object".into(), json!("chat.completion"));
        out.insert("choices".into(), Value::Array(choices));
        if let Some(usage) = self.usage {
            out.insert("usage".into(), usage);
        }
        Assembled::Answer(Value::Object(out))
    }
}

/// Merges streamed tool-call fragments (by `index`) into `message`.
fn merge_tool_calls(message: &mut Map<String, Value>, calls: &[Value]) {
    let list = message.entry("tool_calls").or_insert_with(|| json!([]));
    let Some(list) = list.as_array_mut() else {
        return;
    };
    for call in calls {
        let i = call
            .get("index")
            .and_then(Value::as_u64)
            .and_then(|i| usize::try_from(i).ok())
            .unwrap_or(list.len());
        if list.len() <= i {
            list.resize(
                i + 1,
                json!({"type": "function", "function": {"name": "", "arguments": ""}}),
            );
        }
        let slot = &mut list[i];
        for key in ["id", "type"] {
            if let Some(v) = call.get(key).filter(|v| !v.is_null()) {
                slot[key] = v.clone();
            }
        }
        if let Some(function) = call.get("function") {
            for key in ["name", "arguments"] {
                if let Some(text) = function.get(key).and_then(Value::as_str) {
                    if let Some(f) = slot.get_mut("function") {
                        append(f, key, text);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
            m.event(&ev(name, data));
        }
        let Assembled::Answer(message) = m.finish() else {
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
        let mut m = Messages::default();
        m.event(&ev("message_start", json!({"message": {"id": "m"}})));
        assert_eq!(m.finish(), Assembled::Incomplete);
        let mut m = Messages::default();
        m.event(&ev("message_start", json!({"message": {"id": "m"}})));
        m.event(&ev(
            "error",
            json!({"type": "error", "error": {"type": "overloaded_error", "message": "x"}}),
        ));
        assert_eq!(
            m.finish(),
            Assembled::Error(json!({"type": "overloaded_error", "message": "x"}))
        );
        let mut c = ChatCompletions::default();
        c.event(&ev(
            "message",
            json!({"id": "c", "choices": [{"index": 0, "delta": {"content": "a"}}]}),
        ));
        assert_eq!(c.finish(), Assembled::Incomplete);
    }

    #[test]
    fn a_chat_stream_becomes_the_completion_the_api_would_have_sent() {
        let mut c = ChatCompletions::default();
        for data in [
            json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 7, "model": "gpt-x", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": null}]}),
            json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 7, "model": "gpt-x", "choices": [{"index": 0, "delta": {"content": "Hel"}, "finish_reason": null}]}),
            json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 7, "model": "gpt-x", "choices": [{"index": 0, "delta": {"content": "lo", "tool_calls": [{"index": 0, "id": "call_1", "type": "function", "function": {"name": "ls", "arguments": "{\"a"}}]}, "finish_reason": null}]}),
            json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 7, "model": "gpt-x", "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "\":1}"}}]}, "finish_reason": "tool_calls"}]}),
            json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 7, "model": "gpt-x", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}}),
        ] {
            c.event(&ev("message", data));
        }
        c.event(&SseEvent {
            event: "message".into(),
            data: "[DONE]".into(),
            id: None,
        });
        let Assembled::Answer(done) = c.finish() else {
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
}
