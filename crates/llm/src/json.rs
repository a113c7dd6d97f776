//! JSON decoding whose errors are safe to log: serde's message with any
//! literal it quotes from the input redacted, never the input itself.

use serde::de::DeserializeOwned;
use warden_core::StreamError;

/// Parses `data` as JSON. The error is [`StreamError::Malformed`] with
/// serde's message, any quoted literal it echoes from the input redacted:
/// never the frame text.
pub(crate) fn parse_json<T: DeserializeOwned>(data: &str) -> Result<T, StreamError> {
    serde_json::from_str(data).map_err(|e| StreamError::Malformed {
        message: json_error_message(&e),
    })
}

/// serde_json's message, safe to log. Syntax and EOF messages never quote
/// the input; data errors may (`invalid type: string "..."`), so their
/// quoted parts are replaced by `…`.
pub(crate) fn json_error_message(e: &serde_json::Error) -> String {
    let message = e.to_string();
    match e.classify() {
        serde_json::error::Category::Data => redact_literals(&message),
        _ => message,
    }
}

fn redact_literals(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let mut chars = message.chars();
    while let Some(c) = chars.next() {
        out.push(c);
        if c == '"' || c == '`' {
            let mut escaped = false;
            for d in chars.by_ref() {
                if escaped {
                    escaped = false;
                } else if d == '\\' && c == '"' {
                    escaped = true;
                } else if d == c {
                    break;
                }
            }
            out.push('…');
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_errors_are_redacted() {
        #[derive(serde::Deserialize, Debug)]
        #[allow(dead_code)]
        struct T {
            n: u64,
        }
        let err = parse_json::<T>(r#"{"n":"secret \"quoted\" text"}"#).expect_err("bad type");
        let message = err.to_string();
        assert!(!message.contains("secret"), "{message}");
        assert!(message.contains("invalid type"), "{message}");
        let err = parse_json::<T>(r#"{"n": 1, secret"#).expect_err("bad syntax");
        assert!(!err.to_string().contains("secret"));
    }
}
