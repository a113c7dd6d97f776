//! What the client was shown of a Responses stream — the one account the
//! splice keeps of it — and the request that continues after it: the
//! original `input`, the items the client has whole, the open message's
//! text as an assistant message, then [`CONTINUE_ASK`].

use serde_json::{Value, json};
use warden_llm::CONTINUE_ASK;

/// An output item the client has open.
#[derive(Debug)]
pub(super) struct Open {
    pub(super) index: u64,
    pub(super) id: String,
    /// A `message` (the only kind a continuation can go on with).
    pub(super) message: bool,
    /// Its content parts the client has whole.
    pub(super) parts: Vec<Value>,
    /// Its content part the client has open: content index and text.
    pub(super) part: Option<(u64, String)>,
}

impl Open {
    /// Every text of the item the client was shown, part by part.
    pub(super) fn texts(&self) -> Vec<&str> {
        let done = self
            .parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str));
        done.chain(self.part.as_ref().map(|(_, t)| t.as_str()))
            .filter(|t| !t.is_empty())
            .collect()
    }
}

/// `original` continued after what the client was shown: its whole
/// `items` and the `open` message's text; `None` when an item the client
/// has cannot go back as input (a tool call is answered by its output).
pub(super) fn continuation(original: &Value, items: &[Value], open: &Open) -> Option<Value> {
    let mut input = match original.get("input") {
        Some(Value::String(s)) => vec![json!({"role": "user", "content": s})],
        Some(Value::Array(items)) => items.clone(),
        _ => return None,
    };
    for item in items {
        match item.get("type").and_then(Value::as_str) {
            Some("message") => {
                let mut message = item.clone();
                if let Some(m) = message.as_object_mut() {
                    m.remove("id");
                    m.remove("status");
                }
                input.push(message);
            }
            // Reasoning goes back only with its content (a request that
            // does not store responses names none by id).
            Some("reasoning") if item.get("encrypted_content").is_some_and(Value::is_string) => {
                input.push(item.clone());
            }
            Some("reasoning") => {}
            // A tool call is answered by its output, not continued.
            _ => return None,
        }
    }
    let shown: Vec<Value> = open
        .texts()
        .into_iter()
        .map(|t| json!({"type": "output_text", "text": t}))
        .collect();
    input.push(json!({"type": "message", "role": "assistant", "content": shown}));
    input.push(json!({"type": "message", "role": "user",
                      "content": [{"type": "input_text", "text": CONTINUE_ASK}]}));
    let mut request = original.clone();
    request["input"] = Value::Array(input);
    Some(request)
}
