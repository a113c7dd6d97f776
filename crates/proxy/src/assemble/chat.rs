//! A chat completion assembled from its (spliced) stream's chunks.

use serde_json::{Map, Value, json};
use warden_llm::sse::SseEvent;

use super::{Assembled, AssemblyError, Budget, SLOT_BYTES, append, append_field, json_size};

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
    /// Takes one chunk of the (spliced) stream; what it keeps is charged
    /// to `budget`. Tool-call arguments stay the string the model wrote,
    /// as the API gives them (the client parses them): nothing is made up
    /// when they are not JSON.
    pub(crate) fn event(
        &mut self,
        event: &SseEvent,
        budget: &mut Budget,
    ) -> Result<(), AssemblyError> {
        if event.data.trim() == "[DONE]" {
            self.done = true;
            return Ok(());
        }
        let Ok(chunk) = serde_json::from_str::<Value>(&event.data) else {
            return Ok(());
        };
        if let Some(error) = chunk.get("error") {
            budget.spend(event.data.len())?;
            self.error = Some(error.clone());
            return Ok(());
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
                    budget.spend(json_size(v))?;
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
                budget.spend((i + 1 - self.choices.len()).saturating_mul(SLOT_BYTES))?;
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
                        budget.spend(text.len())?;
                        append_field(message, key, text);
                    }
                    ("tool_calls", Value::Array(calls)) => {
                        merge_tool_calls(message, calls, budget)?;
                    }
                    (_, Value::Null) => {}
                    _ => {
                        // Replaced, not accumulated: charged when new.
                        if !message.contains_key(key) {
                            budget.spend(key.len().saturating_add(json_size(value)))?;
                        }
                        message.insert(key.clone(), value.clone());
                    }
                }
            }
        }
        Ok(())
    }

    /// The completion, once the stream has ended.
    pub(crate) fn finish(self) -> Result<Assembled, AssemblyError> {
        if let Some(error) = self.error {
            return Ok(Assembled::Error(error));
        }
        let (true, Some(mut out)) = (self.done, self.head) else {
            return Ok(Assembled::Incomplete);
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
        Ok(Assembled::Answer(Value::Object(out)))
    }
}

/// Merges streamed tool-call fragments (by `index`) into `message`.
fn merge_tool_calls(
    message: &mut Map<String, Value>,
    calls: &[Value],
    budget: &mut Budget,
) -> Result<(), AssemblyError> {
    let list = message.entry("tool_calls").or_insert_with(|| json!([]));
    let Some(list) = list.as_array_mut() else {
        return Ok(());
    };
    for call in calls {
        let i = call
            .get("index")
            .and_then(Value::as_u64)
            .and_then(|i| usize::try_from(i).ok())
            .unwrap_or(list.len());
        if list.len() <= i {
            budget.spend((i + 1 - list.len()).saturating_mul(SLOT_BYTES))?;
            list.resize(
                i + 1,
                json!({"type": "function", "function": {"name": "", "arguments": ""}}),
            );
        }
        let slot = &mut list[i];
        for key in ["id", "type"] {
            if let Some(v) = call.get(key).filter(|v| !v.is_null()) {
                budget.spend(json_size(v))?;
                slot[key] = v.clone();
            }
        }
        if let Some(function) = call.get("function") {
            for key in ["name", "arguments"] {
                if let Some(text) = function.get(key).and_then(Value::as_str) {
                    budget.spend(text.len())?;
                    if let Some(f) = slot.get_mut("function") {
                        append(f, key, text);
                    }
                }
            }
        }
    }
    Ok(())
}
