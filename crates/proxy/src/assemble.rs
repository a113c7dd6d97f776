//! A non-streaming answer assembled from a watched stream.
//!
//! A client that asked for a whole message (`"stream": false` or no
//! `stream`) is answered the way the API would have: the proxy sends the
//! request upstream as a stream — watched, retried and continued like any
//! other — and builds the JSON the client asked for from the spliced
//! events as they arrive: for Anthropic Messages the `message_start`'s
//! message with its content blocks (text, thinking with its signature,
//! tool use with its input parsed) and the `message_delta`'s stop reason
//! and usage; for chat completions a `chat.completion` with each choice's
//! message (content, tool calls) and finish reason, and the usage chunk;
//! for Gemini one `GenerateContentResponse` with the first candidate's
//! parts (consecutive text of one kind joined), its finish reason and the
//! last usage.
//!
//! Nothing the upstream did not say is made up: tool input that is not a
//! JSON object is an [`AssemblyError`], and what is assembled is charged
//! to a [`Budget`]
//! ([`ProxyConfig::max_reply_bytes`](crate::ProxyConfig::max_reply_bytes)),
//! past which assembly stops. The driver (`run`) feeds the events and
//! answers the client.

mod chat;
mod gemini;
mod messages;
#[cfg(test)]
mod tests;

use serde_json::{Map, Value, json};
use warden_llm::sse::SseEvent;

pub(crate) use chat::ChatCompletions;
pub(crate) use gemini::Gemini;
pub(crate) use messages::Messages;

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

/// Why a stream cannot become the answer.
#[derive(Debug, PartialEq, thiserror::Error)]
pub(crate) enum AssemblyError {
    /// What was assembled passed the cap.
    #[error(
        "the reply passed --max-reply-bytes ({limit} bytes of text, thinking and tool input); \
         the rest was not read (EREPLY_TOO_LARGE)"
    )]
    TooLarge {
        /// The cap.
        limit: usize,
    },
    /// A tool call's input is not a JSON object.
    #[error(
        "the tool input of content block {index} is not a JSON object ({reason}); no input \
         was made up in its place (EMALFORMED)"
    )]
    ToolInput {
        /// The content block.
        index: usize,
        /// Why (the parser's words and position, never the text).
        reason: String,
    },
}

impl AssemblyError {
    /// Its warden error code.
    pub(crate) fn code(&self) -> &'static str {
        match self {
            Self::TooLarge { .. } => "EREPLY_TOO_LARGE",
            Self::ToolInput { .. } => "EMALFORMED",
        }
    }

    /// Its `code` in an OpenAI error body.
    pub(crate) fn openai_code(&self) -> &'static str {
        match self {
            Self::TooLarge { .. } => "reply_too_large",
            Self::ToolInput { .. } => "invalid_tool_input",
        }
    }
}

/// What an assembled answer may still hold, in bytes: text, thinking,
/// signatures and tool input as they are appended, every other value kept
/// at the size of its event.
#[derive(Debug)]
pub(crate) struct Budget {
    /// Charged so far.
    pub(crate) used: usize,
    limit: usize,
}

impl Budget {
    pub(crate) fn new(limit: usize) -> Self {
        Self { used: 0, limit }
    }

    /// Charges `bytes`; past the limit, the error.
    pub(crate) fn spend(&mut self, bytes: usize) -> Result<(), AssemblyError> {
        self.used = self.used.saturating_add(bytes);
        if self.used > self.limit {
            return Err(AssemblyError::TooLarge { limit: self.limit });
        }
        Ok(())
    }
}

/// What one more slot of a list (a content block, a choice, a tool call)
/// is charged, whatever it comes to hold: an index far ahead is not a
/// free allocation.
pub(crate) const SLOT_BYTES: usize = 128;

/// The size of `value` written as JSON.
pub(crate) fn json_size(value: &Value) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    let _ = serde_json::to_writer(&mut count, value);
    count.0
}

/// Appends `text` to the string field `key` of `block` (an object).
pub(crate) fn append(block: &mut Value, key: &str, text: &str) {
    if let Some(block) = block.as_object_mut() {
        append_field(block, key, text);
    }
}

/// Appends `text` to the string field `key` of `map`.
pub(crate) fn append_field(map: &mut Map<String, Value>, key: &str, text: &str) {
    let field = map.entry(key).or_insert_with(|| json!(""));
    if let Value::String(s) = field {
        s.push_str(text);
    } else {
        *field = json!(text);
    }
}

/// The assembler of one protocol.
pub(crate) enum Whole {
    /// An Anthropic message.
    Messages(Messages),
    /// A chat completion.
    Chat(ChatCompletions),
    /// A Gemini `GenerateContentResponse`.
    Gemini(Gemini),
}

impl Whole {
    /// Takes one event of the (spliced) stream.
    pub(crate) fn event(
        &mut self,
        event: &SseEvent,
        budget: &mut Budget,
    ) -> Result<(), AssemblyError> {
        match self {
            Self::Messages(m) => m.event(event, budget),
            Self::Chat(c) => c.event(event, budget),
            Self::Gemini(g) => g.event(event, budget),
        }
    }

    /// What the stream came to, once it has ended.
    pub(crate) fn finish(self) -> Result<Assembled, AssemblyError> {
        match self {
            Self::Messages(m) => m.finish(),
            Self::Chat(c) => c.finish(),
            Self::Gemini(g) => g.finish(),
        }
    }
}
