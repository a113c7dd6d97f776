//! Continuing a broken reply, as the Anthropic Messages API does it
//! (`docs/wire-formats.md`, "Continuing a broken reply").
//!
//! - **Prefill**: a request whose last message is the assistant's partial
//!   text. The model continues that text exactly: the mock streams the rest
//!   of the reply it intended, generating only that (its `output_tokens`
//!   count only the rest). A prefill ending in whitespace is refused (400
//!   `final assistant content cannot end with trailing whitespace`), and
//!   models of Claude 4.6 and later refuse prefill altogether (400 `This
//!   model does not support assistant message prefill. The conversation
//!   must end with a user message.`): model names with `-4-6`, `-4-7`,
//!   `-4-8`, `-5` after `claude-…`, or containing `no-prefill`.
//! - **Continuation turn** (also on `/v1/chat/completions` and in a
//!   Responses request's `input`, which have no prefill): the partial text
//!   as an assistant message, then a user message asking to continue (it
//!   says "continue" and "cut off").
//!   The model repeats the last few words of the partial text, then goes
//!   on — the overlap a client must trim.
//!
//! The intended reply is the one the mock would give to the user message
//! before the partial text, so a continued reply and an unbroken one are
//! the same text.

use serde_json::Value;

/// The 400 message of a prefill that ends in whitespace.
pub const TRAILING_WHITESPACE: &str = "final assistant content cannot end with trailing whitespace";
/// The 400 message of a model that refuses prefill.
pub const NO_PREFILL: &str = "This model does not support assistant message prefill. The conversation must end with a user message.";

/// Words of the partial text a model repeats in a continuation turn.
const REPEATED_WORDS: usize = 3;

/// How a request continues a partial reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Continue {
    /// The last message prefills the assistant's partial text.
    Prefill {
        /// The partial text.
        partial: String,
    },
    /// A continuation turn after the partial text.
    Turn {
        /// The partial text.
        partial: String,
    },
}

impl Continue {
    /// What the request continues, if anything; `Err` with the API's 400
    /// message for a prefill the model refuses.
    pub(crate) fn of(request: &Value) -> Result<Option<Self>, &'static str> {
        // A Responses request's messages are items of its `input`.
        let Some(messages) = request
            .get("messages")
            .or_else(|| request.get("input"))
            .and_then(Value::as_array)
        else {
            return Ok(None);
        };
        let role = |m: &Value| m.get("role").and_then(Value::as_str).map(str::to_owned);
        let n = messages.len();
        match messages.last().and_then(role).as_deref() {
            Some("assistant") => {
                let partial = text_of(&messages[n - 1]);
                let model = request.get("model").and_then(Value::as_str).unwrap_or("");
                if refuses_prefill(model) {
                    return Err(NO_PREFILL);
                }
                if partial.ends_with(char::is_whitespace) {
                    return Err(TRAILING_WHITESPACE);
                }
                Ok(Some(Self::Prefill { partial }))
            }
            Some("user") if n >= 3 && role(&messages[n - 2]).as_deref() == Some("assistant") => {
                let ask = text_of(&messages[n - 1]).to_lowercase();
                if ask.contains("continue") && ask.contains("cut off") {
                    Ok(Some(Self::Turn {
                        partial: text_of(&messages[n - 2]),
                    }))
                } else {
                    Ok(None)
                }
            }
            _ => Ok(None),
        }
    }

    /// A continuation turn in a chat-completions or Responses request
    /// (those APIs have no prefill: a request ending with an assistant
    /// message is answered as any other).
    pub(crate) fn turn_of(request: &Value) -> Option<Self> {
        match Self::of(request) {
            Ok(Some(turn @ Self::Turn { .. })) => Some(turn),
            _ => None,
        }
    }

    /// `"prefill"` or `"turn"`, as the journal records it.
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Self::Prefill { .. } => "prefill",
            Self::Turn { .. } => "turn",
        }
    }

    /// Index from the end of `messages` of the user message the intended
    /// reply answers: before the partial text (and the continuation ask).
    pub(crate) fn answered_from_end(&self) -> usize {
        match self {
            Self::Prefill { .. } => 1,
            Self::Turn { .. } => 2,
        }
    }

    /// What the model streams, given the reply it intended: the rest after
    /// the partial text; in a continuation turn, preceded by the partial
    /// text's last few words.
    pub(crate) fn text(&self, intended: &str) -> String {
        match self {
            Self::Prefill { partial } => rest(intended, partial).to_owned(),
            Self::Turn { partial } => {
                let from = last_words_start(partial, REPEATED_WORDS);
                let end = partial.trim_end().len();
                let rest = rest(intended, partial.trim_end());
                format!("{}{rest}", &partial[from..end])
            }
        }
    }
}

/// `intended` after the longest prefix it shares with `partial` (all of it
/// when the partial text is a prefix, as it is for a reply the mock began).
fn rest<'a>(intended: &'a str, partial: &str) -> &'a str {
    let common = intended
        .char_indices()
        .zip(partial.chars())
        .take_while(|((_, a), b)| a == b)
        .last()
        .map_or(0, |((i, c), _)| i + c.len_utf8());
    &intended[common..]
}

/// Byte offset where the last `words` words of `s` begin.
fn last_words_start(s: &str, words: usize) -> usize {
    let t = s.trim_end();
    let starts: Vec<usize> = t
        .char_indices()
        .filter(|&(i, c)| !c.is_whitespace() && (i == 0 || t[..i].ends_with(char::is_whitespace)))
        .map(|(i, _)| i)
        .collect();
    starts.len().checked_sub(words).map_or(0, |k| starts[k])
}

/// The text of a message: string content or its text blocks.
fn text_of(message: &Value) -> String {
    match message.get("content") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(blocks)) => blocks
            .iter()
            .filter_map(|b| b.get("text").and_then(Value::as_str))
            .collect(),
        _ => String::new(),
    }
}

/// Claude 4.6 and later (and any model named `…no-prefill…`): the first
/// two numbers of a `claude-…` name are its version (`claude-opus-4-8`,
/// `claude-sonnet-4-5-20250929`, `claude-opus-5`).
fn refuses_prefill(model: &str) -> bool {
    if model.contains("no-prefill") {
        return true;
    }
    let Some(rest) = model.strip_prefix("claude-") else {
        return false;
    };
    let mut numbers = rest.split('-').filter_map(|p| p.parse::<u32>().ok());
    match (numbers.next(), numbers.next()) {
        (Some(major), _) if (5..100).contains(&major) => true,
        (Some(4), Some(minor)) => (6..100).contains(&minor),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const INTENDED: &str = "The quick brown fox jumps over the lazy dog.";

    #[test]
    fn a_prefill_is_continued_exactly() {
        let req = json!({"model": "claude-sonnet-4-5", "messages": [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "The quick brown fox ju"}
        ]});
        let c = Continue::of(&req).expect("accepted").expect("a prefill");
        assert_eq!(c.text(INTENDED), "mps over the lazy dog.");
        assert_eq!(c.answered_from_end(), 1);
    }

    #[test]
    fn refused_prefills_get_the_apis_messages() {
        let trailing = json!({"model": "claude-sonnet-4-5", "messages": [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "The quick "}
        ]});
        assert_eq!(Continue::of(&trailing), Err(TRAILING_WHITESPACE));
        for model in [
            "claude-opus-4-6",
            "claude-sonnet-4-8",
            "claude-opus-5",
            "mock-no-prefill",
        ] {
            let req = json!({"model": model, "messages": [
                {"role": "user", "content": "q"},
                {"role": "assistant", "content": "The quick"}
            ]});
            assert_eq!(Continue::of(&req), Err(NO_PREFILL), "{model}");
        }
    }

    #[test]
    fn older_models_take_prefill() {
        for model in [
            "claude-sonnet-4-5",
            "claude-sonnet-4-5-20250929",
            "claude-3-5-sonnet-20241022",
            "mock",
        ] {
            assert!(!refuses_prefill(model), "{model}");
        }
    }

    #[test]
    fn a_continuation_turn_repeats_the_last_words_then_goes_on() {
        let req = json!({"model": "claude-opus-4-8", "messages": [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "The quick brown fox ju"},
            {"role": "user", "content": "Your reply was cut off. Continue exactly where it stopped."}
        ]});
        let c = Continue::of(&req)
            .expect("accepted")
            .expect("a continuation turn");
        assert_eq!(c.text(INTENDED), "brown fox jumps over the lazy dog.");
        assert_eq!(c.answered_from_end(), 2);
    }

    #[test]
    fn a_responses_input_ending_with_the_ask_is_a_continuation_turn() {
        let req = json!({"model": "gpt-5", "input": [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "q"}]},
            {"type": "message", "role": "assistant",
             "content": [{"type": "output_text", "text": "The quick brown fox ju"}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text",
             "text": "Your reply was cut off. Continue exactly where it stopped."}]}
        ]});
        let c = Continue::turn_of(&req).expect("a continuation turn");
        assert_eq!(c.text(INTENDED), "brown fox jumps over the lazy dog.");
        let plain = json!({"model": "gpt-5", "input": "q"});
        assert_eq!(Continue::turn_of(&plain), None);
    }

    #[test]
    fn an_ordinary_conversation_is_not_a_continuation() {
        let req = json!({"model": "m", "messages": [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "a"},
            {"role": "user", "content": "and then?"}
        ]});
        assert_eq!(Continue::of(&req), Ok(None));
    }
}
