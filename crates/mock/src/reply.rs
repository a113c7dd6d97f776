//! The deterministic reply: text, ids and usage derived from the request.
//!
//! The default text only states how long the last user message was; the
//! prompt itself is never echoed, logged or stored.

use serde_json::Value;

use crate::MockConfig;
use crate::journal::RequestId;

/// Text, token counts and ids of one reply.
#[derive(Clone)]
pub(crate) struct Reply {
    /// Message id (`msg_…` or `chatcmpl-…`).
    pub(crate) id: String,
    /// The request's model, echoed.
    pub(crate) model: String,
    /// The reply text.
    pub(crate) text: String,
    /// Uncached input tokens.
    pub(crate) input_tokens: u64,
    /// Cache-write input tokens.
    pub(crate) cache_creation_input_tokens: u64,
    /// Cache-read input tokens.
    pub(crate) cache_read_input_tokens: u64,
    /// Tokens of the reply (one per word of the scripted text).
    pub(crate) output_tokens: u64,
    /// Unix seconds, for OpenAI's `created`.
    pub(crate) created: u64,
}

/// Model name used when the request names none.
pub(crate) const FALLBACK_MODEL: &str = "mock";

impl Reply {
    /// The reply to `request`; `answered_from_end` skips that many final
    /// messages (a partial reply and the ask to continue it) when looking
    /// for the user message it answers.
    pub(crate) fn new(
        config: &MockConfig,
        id: String,
        request: &Value,
        request_bytes: usize,
        answered_from_end: usize,
    ) -> Self {
        let model = request
            .get("model")
            .and_then(Value::as_str)
            .unwrap_or(FALLBACK_MODEL)
            .to_owned();
        let text = match &config.reply {
            Some(text) => text.clone(),
            None => format!(
                "Hello from warden-mock. Your last message had {} characters.",
                last_user_chars(request, answered_from_end)
            ),
        };
        let usage = config.usage;
        Self {
            id,
            model,
            output_tokens: estimate_tokens(text.len()),
            text,
            input_tokens: usage
                .input_tokens
                .unwrap_or_else(|| estimate_tokens(request_bytes)),
            cache_creation_input_tokens: usage.cache_creation_input_tokens,
            cache_read_input_tokens: usage.cache_read_input_tokens,
            created: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
        }
    }

    /// Uncached + cache-write + cache-read input tokens.
    pub(crate) fn prompt_tokens(&self) -> u64 {
        self.input_tokens + self.cache_creation_input_tokens + self.cache_read_input_tokens
    }
}

/// Anthropic message id for a request.
pub(crate) fn anthropic_message_id(id: RequestId) -> String {
    format!("msg_01mock{id:014}")
}

/// OpenAI completion id for a request.
pub(crate) fn openai_completion_id(id: RequestId) -> String {
    format!("chatcmpl-mock{id:014}")
}

/// Roughly four bytes per token, at least one.
pub(crate) fn estimate_tokens(bytes: usize) -> u64 {
    (bytes as u64).div_ceil(4).max(1)
}

/// Characters of text in the last `user` message (string content or text
/// blocks) before the final `skip` messages, 0 when there is none.
fn last_user_chars(request: &Value, skip: usize) -> usize {
    last_user_text(request, skip).map_or(0, |t| t.chars().count())
}

/// The text of the last `user` message (string content or text blocks)
/// before the final `skip` messages; `None` when there is none.
pub(crate) fn last_user_text(request: &Value, skip: usize) -> Option<String> {
    // The Responses API takes `input`: a string, or messages.
    if let Some(Value::String(s)) = request.get("input") {
        return Some(s.clone());
    }
    let messages = request
        .get("messages")
        .or_else(|| request.get("input"))
        .and_then(Value::as_array)?;
    let last = messages
        .iter()
        .rev()
        .skip(skip)
        .find(|m| m.get("role").and_then(Value::as_str) == Some("user"))?;
    match last.get("content") {
        Some(Value::String(s)) => Some(s.clone()),
        Some(Value::Array(blocks)) => Some(
            blocks
                .iter()
                .filter_map(|b| b.get("text").and_then(Value::as_str))
                .collect(),
        ),
        _ => Some(String::new()),
    }
}

/// A stable 64-bit digest of a prompt's text (FNV-1a), so a test can tell
/// which message a request answered without the server keeping the text.
pub fn prompt_digest(text: &str) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    text.bytes()
        .fold(OFFSET, |h, b| (h ^ u64::from(b)).wrapping_mul(PRIME))
}

/// Splits `text` into deltas of a few words (at least 16 bytes each, except
/// the last); no deltas for an empty text.
pub(crate) fn split_deltas(text: &str) -> Vec<String> {
    const MIN_DELTA: usize = 16;
    let mut out = Vec::new();
    let mut cur = String::new();
    for word in text.split_inclusive(' ') {
        cur.push_str(word);
        if cur.len() >= MIN_DELTA {
            out.push(std::mem::take(&mut cur));
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn deltas_rebuild_the_text() {
        let text = "Hello from warden-mock. Your last message had 12 characters.";
        let parts = split_deltas(text);
        assert!(parts.len() > 2, "{parts:?}");
        assert_eq!(parts.concat(), text);
        assert!(split_deltas("").is_empty());
    }

    #[test]
    fn default_text_counts_the_last_user_message_without_echoing_it() {
        let req = json!({
            "model": "m",
            "messages": [
                {"role": "user", "content": "first question"},
                {"role": "assistant", "content": "answer"},
                {"role": "user", "content": [{"type": "text", "text": "sécret"}, {"type": "text", "text": "!!"}]}
            ]
        });
        let reply = Reply::new(&MockConfig::default(), "x".into(), &req, 400, 0);
        assert!(reply.text.contains("had 8 characters"), "{}", reply.text);
        assert!(!reply.text.contains("sécret"));
        assert_eq!(reply.model, "m");
        assert_eq!(reply.input_tokens, 100);
    }
}
