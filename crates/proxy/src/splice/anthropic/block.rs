//! The parts of an Anthropic stream the splice reads and writes: the
//! downstream block being streamed, a continuation's join, the borrowed
//! forms of the events on the hot path, and the frame writer.

use std::borrow::Cow;

use serde_json::{Value, json};
use warden_core::StreamError;
use warden_core::continuation::Stitcher;

/// The downstream block being streamed.
#[derive(Debug)]
pub(super) struct Open {
    pub(super) index: u64,
    /// The block's `content_block_start` form.
    pub(super) block: Value,
    /// Its text, thinking, or tool input JSON so far (by its type).
    pub(super) text: String,
    /// A thinking block's signature, once sent.
    pub(super) signature: Option<Value>,
}

impl Open {
    pub(super) fn new(index: u64, block: Value) -> Self {
        Self {
            index,
            block,
            text: String::new(),
            signature: None,
        }
    }

    pub(super) fn kind(&self) -> &str {
        self.block.get("type").and_then(Value::as_str).unwrap_or("")
    }

    /// The block whole, as a later request carries it.
    pub(super) fn whole(mut self) -> Value {
        match self.kind() {
            "text" => self.block["text"] = json!(self.text),
            "thinking" => {
                self.block["thinking"] = json!(self.text);
                if let Some(sig) = self.signature {
                    self.block["signature"] = sig;
                }
            }
            "tool_use" | "server_tool_use" if !self.text.is_empty() => {
                if let Ok(input) = serde_json::from_str::<Value>(&self.text) {
                    self.block["input"] = input;
                }
            }
            _ => {}
        }
        self.block
    }
}

/// The fields of a `content_block_delta` the proxy reads, borrowed from
/// the event's data (no allocation for text without escapes).
#[derive(serde::Deserialize)]
pub(super) struct DeltaEvent<'a> {
    pub(super) index: u64,
    #[serde(borrow)]
    pub(super) delta: Delta<'a>,
}

#[derive(serde::Deserialize)]
pub(super) struct Delta<'a> {
    #[serde(rename = "type", borrow)]
    pub(super) kind: Cow<'a, str>,
    #[serde(borrow, default)]
    pub(super) text: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub(super) thinking: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub(super) partial_json: Option<Cow<'a, str>>,
    #[serde(default)]
    pub(super) signature: Option<Value>,
}

/// Just the event's type.
#[derive(serde::Deserialize)]
pub(super) struct Typed<'a> {
    #[serde(rename = "type", borrow)]
    pub(super) kind: Cow<'a, str>,
}

/// A continuation's text joining the open downstream text block.
#[derive(Debug)]
pub(super) struct Join {
    pub(super) index: u64,
    pub(super) stitcher: Stitcher,
    /// The continuation's text block mapped onto it already.
    pub(super) mapped: bool,
}

pub(super) fn frame(out: &mut String, event: &str, data: &str) {
    out.push_str("event: ");
    out.push_str(event);
    out.push_str("\ndata: ");
    out.push_str(data);
    out.push_str("\n\n");
}

pub(super) fn malformed(message: impl Into<String>) -> StreamError {
    StreamError::Malformed {
        message: message.into(),
    }
}
