//! The typed errors of a failed Claude Code turn: a `result` line with
//! `is_error`, or an exit before any result (from stderr).

use serde_json::Value;
use warden_core::{ResumeCause, StreamError, retryable_status};

use crate::cli::ExitInfo;
use crate::lines::{clip, stderr_summary};

/// The text of an error result: its `errors`, else its `result`.
fn error_text(v: &Value) -> String {
    let errors: Vec<String> = v
        .get("errors")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .map(|e| match e {
                    Value::String(s) => s.clone(),
                    other => other
                        .get("message")
                        .and_then(Value::as_str)
                        .map_or_else(|| other.to_string(), str::to_owned),
                })
                .collect()
        })
        .unwrap_or_default();
    let text = if errors.is_empty() {
        v.get("result")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    } else {
        errors.join("; ")
    };
    clip(&text)
}

/// Cuts agent text to [`MAX_MESSAGE_CHARS`] characters.
const NO_CONVERSATION: &str = "No conversation found with session ID";

/// What Claude Code says (2.1.332, `../shared/reference/formats.md`) when
/// its model stream broke after its own retries, with no HTTP status: a
/// connection cut mid-reply, a stream silent past its idle timeout, an API
/// it could not reach. A new attempt may well succeed, so each is a
/// retryable [`StreamError::Connection`], never a fatal `EAPI`.
const TRANSIENT: &[&str] = &[
    "Connection lost mid-response",
    "The operation timed out",
    "Request timed out",
    "Unable to connect to API",
    "Connection error",
    "socket hang up",
    "ECONNRESET",
];

/// The connection error `text` names, if it names one of [`TRANSIENT`].
fn transient(text: &str) -> Option<StreamError> {
    TRANSIENT
        .iter()
        .any(|needle| text.contains(needle))
        .then(|| StreamError::Connection {
            message: clip(text),
        })
}

/// The id after "session ID:" in Claude Code's message, if any.
fn id_in(text: &str) -> Option<String> {
    let at = text.find(NO_CONVERSATION)? + NO_CONVERSATION.len();
    let rest = text[at..].trim_start_matches(':').trim();
    let id: String = rest
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
        .collect();
    (!id.is_empty()).then_some(id)
}

fn unknown_session(text: &str, resume_id: Option<&str>) -> StreamError {
    StreamError::UnknownSession {
        session_id: resume_id
            .map(str::to_owned)
            .or_else(|| id_in(text))
            .unwrap_or_default(),
        message: clip(text),
    }
}

/// The typed error of a `result` line with `is_error: true` (or an
/// `error_*` subtype).
pub(super) fn result_error(v: &Value, subtype: &str, resume_id: Option<&str>) -> StreamError {
    let text = error_text(v);
    let terminal = v.get("terminal_reason").and_then(Value::as_str);
    let status = v
        .get("api_error_status")
        .and_then(Value::as_u64)
        .and_then(|n| u16::try_from(n).ok());
    if text.contains(NO_CONVERSATION) {
        return unknown_session(&text, resume_id);
    }
    if let Some(reason) = terminal
        .and_then(ResumeCause::from_name)
        .filter(|c| *c != ResumeCause::UnknownSession)
    {
        return StreamError::ContextOverflow {
            reason,
            message: text,
        };
    }
    if text.to_ascii_lowercase().contains("prompt is too long") {
        return StreamError::ContextOverflow {
            reason: ResumeCause::PromptTooLong,
            message: text,
        };
    }
    if matches!(status, Some(401 | 403)) {
        return StreamError::Unauthorized { message: text };
    }
    if subtype.starts_with("error") {
        // error_max_turns, error_max_budget_usd, error_during_execution, ...:
        // the agent gave up; running the turn again would do the same.
        return StreamError::Api {
            status,
            kind: subtype.to_owned(),
            message: text,
            retryable: false,
            retry_after: None,
        };
    }
    // `success` with is_error: an API error after Claude Code's own retries.
    if status.is_none()
        && let Some(broken) = transient(&text)
    {
        return broken;
    }
    let retryable = status.is_some_and(retryable_status);
    StreamError::Api {
        status,
        kind: terminal.unwrap_or("api_error").to_owned(),
        message: text,
        retryable,
        retry_after: None,
    }
}

/// The typed error of a process that ended before the turn's `result`
/// line, from its stderr.
pub(super) fn early_exit_error(
    exit: ExitInfo,
    stderr: &[String],
    resume_id: Option<&str>,
    saw_output: bool,
) -> StreamError {
    let find = |needle: &str| stderr.iter().rev().find(|l| l.contains(needle));
    if let Some(line) = find(NO_CONVERSATION) {
        return unknown_session(line, resume_id);
    }
    if let Some(line) = find("--resume requires a valid session ID") {
        return StreamError::UnknownSession {
            session_id: resume_id.unwrap_or_default().to_owned(),
            message: clip(line),
        };
    }
    if let Some(line) = stderr
        .iter()
        .rev()
        .find(|l| l.contains("Session ID") && l.contains("is already in use"))
    {
        // Another process holds the conversation: may clear up (it may be
        // the previous attempt's process still going down).
        return StreamError::Api {
            status: None,
            kind: "session_in_use".to_owned(),
            message: clip(line),
            retryable: true,
            retry_after: None,
        };
    }
    if let Some(broken) = stderr.iter().rev().find_map(|l| transient(l)) {
        return broken;
    }
    let tail = stderr_summary(stderr);
    let message = if tail.is_empty() {
        format!("claude ended before the turn's result line ({exit}); stderr was empty")
    } else {
        format!("claude ended before the turn's result line ({exit}); stderr: {tail}")
    };
    if saw_output {
        StreamError::Truncated { message }
    } else {
        StreamError::Connection { message }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(line: &str) -> StreamError {
        let v: Value = serde_json::from_str(line).expect("JSON");
        result_error(&v, "success", None)
    }

    #[test]
    fn a_stream_claude_code_lost_mid_reply_is_a_retryable_connection_error() {
        for said in [
            "API Error: Connection lost mid-response",
            "API Error: The operation timed out.",
            "API Error: Unable to connect to API (ConnectionRefused)",
        ] {
            let line = format!(
                r#"{{"type":"result","subtype":"success","is_error":true,"result":"{said}"}}"#
            );
            let e = result(&line);
            assert!(
                matches!(&e, StreamError::Connection { message } if message.contains(said)),
                "{said}: {e:?}"
            );
            assert!(e.is_retryable(), "{said}");
        }
    }

    #[test]
    fn an_api_error_with_a_status_keeps_its_status_rule() {
        let e = result(
            r#"{"type":"result","subtype":"success","is_error":true,"api_error_status":400,"result":"API Error: Connection error in the request"}"#,
        );
        assert!(
            matches!(
                e,
                StreamError::Api {
                    status: Some(400),
                    retryable: false,
                    ..
                }
            ),
            "{e:?}"
        );
        let e = result(
            r#"{"type":"result","subtype":"success","is_error":true,"result":"API Error: something else"}"#,
        );
        assert!(
            matches!(
                e,
                StreamError::Api {
                    retryable: false,
                    ..
                }
            ),
            "{e:?}"
        );
    }

    #[test]
    fn an_exit_after_a_lost_connection_is_retryable() {
        let stderr = vec!["API Error: Connection lost mid-response".to_owned()];
        let e = early_exit_error(ExitInfo::Code(1), &stderr, None, true);
        assert!(matches!(e, StreamError::Connection { .. }), "{e:?}");
    }
}
