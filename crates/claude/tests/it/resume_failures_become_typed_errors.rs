//! Each way the real CLI reports a failed resume or an early end becomes
//! the right typed error: result lines (check `is_error`, not `subtype`)
//! and exits before any result (the reason is on stderr).

use crate::common::*;
use serde_json::{Value, json};
use warden_claude::{ClaudeOptions, ClaudeSource};
use warden_core::{EventSource, ResumeCause, StreamError};

const ID: &str = "9753c268-1111-4111-8111-111111111111";

/// Runs one resumed turn of `actions` and returns its error.
async fn resumed_turn_error(actions: Value) -> (StreamError, Fixture, ClaudeSource) {
    let fx = Fixture::new();
    let source = ClaudeSource::new(fx.options(json!({ "turns": [actions] })));
    let stream = source
        .open(fx.request(1, "SECRET-PROMPT-TEXT", Some(ID)))
        .await
        .expect("open");
    let (_, error) = run(stream).await;
    let error = error.expect("the turn fails");
    assert!(
        !error.to_string().contains("SECRET-PROMPT-TEXT"),
        "no prompt text in errors: {error}"
    );
    (error, fx, source)
}

/// Like [`resumed_turn_error`], failing at start (before stdin is read).
async fn resumed_start_error(start: Value) -> StreamError {
    let fx = Fixture::new();
    let source = ClaudeSource::new(fx.options(json!({ "start": start })));
    let stream = source
        .open(fx.request(1, "SECRET-PROMPT-TEXT", Some(ID)))
        .await
        .expect("open");
    let (frames, error) = run(stream).await;
    assert!(events(&frames).is_empty(), "{frames:?}");
    let error = error.expect("the turn fails");
    assert!(!error.to_string().contains("SECRET-PROMPT-TEXT"));
    error
}

#[tokio::test]
async fn an_unknown_session_result_line_is_unknown_session() {
    let (error, fx, _) = resumed_turn_error(json!([
        err("No conversation found with session ID: {resume_id}"),
        out(r#"{"type":"result","subtype":"error_during_execution","is_error":true,"errors":["No conversation found with session ID: {resume_id}"]}"#),
        {"exit": 1},
    ]))
    .await;
    assert_eq!(
        error,
        StreamError::UnknownSession {
            session_id: ID.into(),
            message: format!("No conversation found with session ID: {ID}"),
        }
    );
    assert_eq!(
        error.resume_failure_cause(),
        Some(ResumeCause::UnknownSession)
    );
    assert!(fx.args(0).windows(2).any(|w| w == ["--resume", ID]));
}

#[tokio::test]
async fn an_unknown_session_reported_only_on_stderr_at_exit_is_unknown_session() {
    let error = resumed_start_error(json!([
        err("No conversation found with session ID: {resume_id}"),
        {"exit": 1},
    ]))
    .await;
    assert!(
        matches!(&error, StreamError::UnknownSession { session_id, .. } if session_id == ID),
        "{error:?}"
    );
}

#[tokio::test]
async fn an_invalid_resume_id_is_unknown_session() {
    let error = resumed_start_error(json!([
        err("Error: --resume requires a valid session ID when used with --print"),
        {"exit": 1},
    ]))
    .await;
    assert_eq!(
        error.resume_failure_cause(),
        Some(ResumeCause::UnknownSession)
    );
}

#[tokio::test]
async fn a_session_in_use_by_another_process_is_a_retryable_error() {
    let error = resumed_start_error(json!([
        err("Error: Session ID {resume_id} is already in use."),
        {"exit": 1},
    ]))
    .await;
    assert!(error.is_retryable(), "{error:?}");
    assert_eq!(error.resume_failure_cause(), None);
    assert!(matches!(&error, StreamError::Api { kind, .. } if kind == "session_in_use"));
}

#[tokio::test]
async fn prompt_too_long_with_subtype_success_is_context_overflow() {
    let (error, _, _) = resumed_turn_error(json!([
        out(INIT),
        out(r#"{"type":"result","subtype":"success","is_error":true,"terminal_reason":"prompt_too_long","api_error_status":400,"result":"Prompt is too long","session_id":"{session_id}"}"#),
        {"exit": 1},
    ]))
    .await;
    assert_eq!(
        error,
        StreamError::ContextOverflow {
            reason: ResumeCause::PromptTooLong,
            message: "Prompt is too long".into(),
        }
    );
}

#[tokio::test]
async fn a_blocking_limit_result_is_context_overflow() {
    let (error, _, _) = resumed_turn_error(json!([
        out(INIT),
        out(r#"{"is_error":true,"terminal_reason":"blocking_limit","result":"Context limit reached","subtype":"success","type":"result"}"#),
    ]))
    .await;
    assert_eq!(
        error.resume_failure_cause(),
        Some(ResumeCause::BlockingLimit)
    );
}

#[tokio::test]
async fn max_turns_budget_and_execution_errors_are_fatal_api_errors() {
    for subtype in [
        "error_max_turns",
        "error_max_budget_usd",
        "error_during_execution",
    ] {
        let line = format!(
            r#"{{"type":"result","subtype":"{subtype}","is_error":true,"errors":["gave up"]}}"#
        );
        let (error, _, _) = resumed_turn_error(json!([out(INIT), out(&line)])).await;
        assert!(
            matches!(&error, StreamError::Api { kind, retryable: false, .. } if kind == subtype),
            "{error:?}"
        );
        assert_eq!(error.resume_failure_cause(), None);
    }
}

#[tokio::test]
async fn an_exit_before_any_output_is_a_retryable_connection_error_with_status_and_stderr() {
    let error = resumed_start_error(json!([
        err("fatal: config is broken"),
        {"exit": 7},
    ]))
    .await;
    assert!(matches!(error, StreamError::Connection { .. }), "{error:?}");
    assert!(error.is_retryable());
    let text = error.to_string();
    assert!(text.contains("exit status 7"), "{text}");
    assert!(text.contains("fatal: config is broken"), "{text}");
}

#[tokio::test]
async fn a_crash_mid_turn_is_a_retryable_truncation_and_stderr_reaches_diagnostics() {
    let (error, fx, source) = resumed_turn_error(json!([
        out(INIT),
        out(ECHO),
        err("panic: something broke"),
        {"exit": 3},
    ]))
    .await;
    assert!(matches!(error, StreamError::Truncated { .. }), "{error:?}");
    assert!(error.is_retryable());
    assert!(error.to_string().contains("exit status 3"));
    let d = source.diagnostics(ID, Some(&fx.workspace));
    assert_eq!(d.stderr_tail.as_deref(), Some("panic: something broke"));
}

#[tokio::test]
async fn an_error_result_after_a_fresh_start_is_not_a_resume_failure_without_a_matching_text() {
    // A plain API error after Claude Code's own retries: retryable by status.
    let fx = Fixture::new();
    let source = ClaudeSource::new(fx.options(json!({"turns": [[
        out(INIT),
        out(r#"{"type":"result","subtype":"success","is_error":true,"api_error_status":529,"result":"API Error: Overloaded"}"#),
    ]]})));
    let (_, error) = run(source.open(fx.request(1, "x", None)).await.expect("open")).await;
    let error = error.expect("fails");
    assert!(error.is_retryable(), "{error:?}");
    assert_eq!(error.resume_failure_cause(), None);
}

#[tokio::test]
async fn a_binary_that_cannot_be_started_fails_open_with_a_connection_error() {
    let source = ClaudeSource::new(
        ClaudeOptions::default().with_binary("/nonexistent/warden-claude-test/claude"),
    );
    let fx = Fixture::new();
    let error = match source.open(fx.request(1, "x", None)).await {
        Ok(_) => panic!("open must fail"),
        Err(e) => e,
    };
    assert!(matches!(error, StreamError::Connection { .. }), "{error:?}");
    assert!(
        error
            .to_string()
            .contains("/nonexistent/warden-claude-test/claude")
    );
}
