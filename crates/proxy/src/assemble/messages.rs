//! An Anthropic message assembled from its (spliced) stream's events.

use serde_json::{Map, Value, json};
use warden_llm::sse::SseEvent;

use super::{Assembled, AssemblyError, Budget, SLOT_BYTES, append};

/// Builds an Anthropic message from its stream's events.
#[derive(Debug, Default)]
pub(crate) struct Messages {
    message: Option<Map<String, Value>>,
    content: Vec<Value>,
    /// Tool inputs as their JSON fragments arrive, by block index; taken
    /// (and parsed) when the block stops.
    partial_json: Vec<String>,
    error: Option<Value>,
    done: bool,
}

impl Messages {
    /// Takes one event of the (spliced) stream; what it keeps is charged
    /// to `budget`. Tool input that is not a JSON object when its block
    /// stops is an error: the message would carry input the model never
    /// gave.
    pub(crate) fn event(
        &mut self,
        event: &SseEvent,
        budget: &mut Budget,
    ) -> Result<(), AssemblyError> {
        let Ok(data) = serde_json::from_str::<Value>(&event.data) else {
            return Ok(());
        };
        let index = data
            .get("index")
            .and_then(Value::as_u64)
            .and_then(|i| usize::try_from(i).ok());
        match event.event.as_str() {
            "message_start" => {
                budget.spend(event.data.len())?;
                self.message = data.get("message").and_then(Value::as_object).cloned();
            }
            "content_block_start" => {
                if let (Some(i), Some(block)) = (index, data.get("content_block")) {
                    if self.content.len() <= i {
                        budget.spend((i + 1 - self.content.len()).saturating_mul(SLOT_BYTES))?;
                        self.content.resize(i + 1, Value::Null);
                        self.partial_json.resize(i + 1, String::new());
                    }
                    budget.spend(event.data.len())?;
                    self.content[i] = block.clone();
                }
            }
            "content_block_delta" => {
                let (Some(i), Some(delta)) = (index, data.get("delta")) else {
                    return Ok(());
                };
                let Some(block) = self.content.get_mut(i) else {
                    return Ok(());
                };
                let text = |key: &str| delta.get(key).and_then(Value::as_str).unwrap_or("");
                let field = match delta.get("type").and_then(Value::as_str) {
                    Some("text_delta") => "text",
                    Some("thinking_delta") => "thinking",
                    Some("signature_delta") => "signature",
                    Some("input_json_delta") => {
                        let part = text("partial_json");
                        budget.spend(part.len())?;
                        if let Some(p) = self.partial_json.get_mut(i) {
                            p.push_str(part);
                        }
                        return Ok(());
                    }
                    Some("citations_delta") => {
                        budget.spend(event.data.len())?;
                        if let (Some(citation), Some(b)) =
                            (delta.get("citation"), block.as_object_mut())
                        {
                            let list = b.entry("citations").or_insert_with(|| json!([]));
                            if let Some(list) = list.as_array_mut() {
                                list.push(citation.clone());
                            }
                        }
                        return Ok(());
                    }
                    _ => return Ok(()),
                };
                let part = text(field);
                budget.spend(part.len())?;
                append(block, field, part);
            }
            "content_block_stop" => {
                let Some(i) = index else { return Ok(()) };
                let partial = self.partial_json.get_mut(i).map(std::mem::take);
                if let (Some(partial), Some(block)) = (partial, self.content.get_mut(i))
                    && !partial.is_empty()
                {
                    block["input"] = tool_input(i, &partial)?;
                }
            }
            "message_delta" => {
                budget.spend(event.data.len())?;
                let Some(message) = self.message.as_mut() else {
                    return Ok(());
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
            "error" => {
                budget.spend(event.data.len())?;
                self.error = Some(data.get("error").cloned().unwrap_or(data));
            }
            _ => {}
        }
        Ok(())
    }

    /// The message, once the stream has ended. A tool call whose input
    /// fragments arrived but whose block never stopped is an error, as one
    /// whose input is not JSON.
    pub(crate) fn finish(self) -> Result<Assembled, AssemblyError> {
        if let Some(error) = self.error {
            return Ok(Assembled::Error(error));
        }
        let (true, Some(mut message)) = (self.done, self.message) else {
            return Ok(Assembled::Incomplete);
        };
        if let Some(index) = self.partial_json.iter().position(|p| !p.is_empty()) {
            return Err(AssemblyError::ToolInput {
                index,
                reason: "its block never stopped".to_owned(),
            });
        }
        let content: Vec<Value> = self.content.into_iter().filter(|b| !b.is_null()).collect();
        message.insert("content".into(), Value::Array(content));
        Ok(Assembled::Answer(Value::Object(message)))
    }
}

/// The input of the tool call in block `index`, from its fragments: a JSON
/// object, as the API gives it, else an error naming why (the parser's
/// position, never the text).
fn tool_input(index: usize, partial: &str) -> Result<Value, AssemblyError> {
    match serde_json::from_str::<Value>(partial) {
        Ok(input) if input.is_object() => Ok(input),
        Ok(_) => Err(AssemblyError::ToolInput {
            index,
            reason: "it is JSON but not an object".to_owned(),
        }),
        Err(e) => Err(AssemblyError::ToolInput {
            index,
            reason: e.to_string(),
        }),
    }
}
