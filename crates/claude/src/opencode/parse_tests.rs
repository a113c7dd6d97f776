//! The OpenCode line parser on the line shapes of `opencode run --format
//! json` 1.18.33 (`../shared/reference/agents.md`, and what the real CLI
//! printed against `warden mock`).

use warden_core::{AgentEvent, Frame, ResumeCause, StreamError, Usage};

use super::{OpenCodeParser, is_session_id};
use crate::cli::{ExitInfo, Step, TurnParser};

const ID: &str = "ses_db0b50d49ffee7lTFDmx16Fh84";

fn start(id: &str) -> String {
    format!(
        r#"{{"type":"step_start","timestamp":1,"sessionID":"{id}","part":{{"type":"step-start"}}}}"#
    )
}

fn text(text: &str) -> String {
    format!(
        r#"{{"type":"text","timestamp":1,"sessionID":"{ID}","part":{{"type":"text","text":"{text}","time":{{"start":1,"end":2}}}}}}"#
    )
}

fn finish(reason: &str) -> String {
    format!(
        r#"{{"type":"step_finish","timestamp":1,"sessionID":"{ID}","part":{{"reason":"{reason}","type":"step-finish","tokens":{{"total":140,"input":100,"output":40,"reasoning":0,"cache":{{"write":3,"read":7}}}},"cost":0}}}}"#
    )
}

fn line(p: &mut OpenCodeParser, text: &str) -> Step {
    p.line(&serde_json::from_str(text).expect("json"))
}

fn parser(resume: Option<&str>) -> OpenCodeParser {
    OpenCodeParser::new(
        "opencode",
        &super::CUT_STREAM,
        resume.map(str::to_owned),
        Some("warden/m".to_owned()),
    )
}

#[test]
fn a_turn_announces_its_session_relays_the_text_and_ends_at_the_stop_step_with_its_usage() {
    let mut p = parser(None);
    assert_eq!(
        line(&mut p, &start(ID)),
        Step::Frames(vec![Frame::Event(AgentEvent::SessionStarted {
            session_id: ID.to_owned(),
            model: Some("warden/m".to_owned()),
        })])
    );
    assert_eq!(
        line(&mut p, &text("Hello")),
        Step::Frames(vec![Frame::Event(AgentEvent::TextDelta(
            "Hello".to_owned()
        ))])
    );
    let usage = Frame::Event(AgentEvent::Usage(Usage {
        input_tokens: 100,
        cache_creation_input_tokens: 3,
        cache_read_input_tokens: 7,
        output_tokens: 40,
    }));
    assert_eq!(
        line(&mut p, &finish("tool-calls")),
        Step::Frames(vec![usage.clone()])
    );
    assert_eq!(line(&mut p, &start(ID)), Step::Frames(Vec::new()));
    assert_eq!(
        line(&mut p, &finish("stop")),
        Step::Complete(vec![
            usage,
            Frame::Event(AgentEvent::TurnComplete {
                context_window: None,
                duration: None,
            })
        ])
    );
    assert_eq!(p.session_id(), Some(ID));
}

#[test]
fn a_stream_ended_without_a_finish_reason_fails_the_turn_instead_of_looping_or_truncating() {
    let mut p = parser(Some(ID));
    line(&mut p, &start(ID));
    line(&mut p, &text("Hello from"));
    match line(&mut p, &finish("unknown")) {
        Step::Fail(e @ StreamError::Truncated { .. }) => assert!(e.is_retryable()),
        other => panic!("expected Truncated, got {other:?}"),
    }
}

#[test]
fn kilo_says_other_for_a_cut_stream_and_opencode_unknown() {
    let mut kilo = OpenCodeParser::new("kilo-code", &super::KILO_CUT_STREAM, None, None);
    line(&mut kilo, &start(ID));
    assert!(matches!(
        line(&mut kilo, &finish("other")),
        Step::Fail(StreamError::Truncated { .. })
    ));
    let mut opencode = parser(None);
    line(&mut opencode, &start(ID));
    assert!(matches!(
        line(&mut opencode, &finish("other")),
        Step::Complete(_)
    ));
}

#[test]
fn a_second_step_start_without_a_finish_is_the_clis_own_retry() {
    let mut p = parser(None);
    line(&mut p, &start(ID));
    assert_eq!(
        line(&mut p, &start(ID)),
        Step::Frames(vec![Frame::Event(AgentEvent::ProviderRetry {
            attempt: 1,
            status: None
        })])
    );
}

#[test]
fn resume_failures_are_unknown_session_silent_or_on_stderr() {
    let mut p = parser(Some("ses_asked"));
    match line(&mut p, &start(ID)) {
        Step::Fail(StreamError::UnknownSession { session_id, .. }) => {
            assert_eq!(session_id, "ses_asked");
        }
        other => panic!("expected UnknownSession, got {other:?}"),
    }
    let mut p = parser(Some("ses_gone"));
    let stderr = ["\u{1b}[91m\u{1b}[1mError: \u{1b}[0mSession not found".to_owned()];
    match p.ended_early(ExitInfo::Code(1), &stderr, false) {
        StreamError::UnknownSession { message, .. } => {
            assert_eq!(message, "Error: Session not found");
        }
        other => panic!("expected UnknownSession, got {other:?}"),
    }
    let mut p = parser(None);
    match p.ended_early(ExitInfo::Code(1), &stderr, false) {
        StreamError::Connection { message } => assert!(
            message.ends_with("stderr: Error: Session not found"),
            "no colour codes: {message:?}"
        ),
        other => panic!("expected Connection, got {other:?}"),
    }
    assert!(matches!(
        p.ended_early(ExitInfo::Signal(15), &[], true),
        StreamError::Truncated { .. }
    ));
}

#[test]
fn error_lines_are_typed_by_name_and_status() {
    let error = |name: &str, status: Option<u16>| {
        let data = match status {
            Some(s) => format!(r#"{{"message":"m","statusCode":{s},"isRetryable":true}}"#),
            None => r#"{"message":"m","isRetryable":true}"#.to_owned(),
        };
        let text = format!(
            r#"{{"type":"error","timestamp":1,"sessionID":"{ID}","error":{{"name":"{name}","data":{data}}}}}"#
        );
        match line(&mut parser(None), &text) {
            Step::Fail(e) => e,
            other => panic!("expected a failure, got {other:?}"),
        }
    };
    assert!(matches!(
        error("ContextOverflowError", Some(400)),
        StreamError::ContextOverflow {
            reason: ResumeCause::PromptTooLong,
            ..
        }
    ));
    assert!(matches!(
        error("APIError", Some(401)),
        StreamError::Unauthorized { .. }
    ));
    assert!(!error("APIError", Some(400)).is_retryable());
    assert!(error("APIError", Some(503)).is_retryable());
    assert!(error("APIError", None).is_retryable());
}

#[test]
fn session_ids_are_ses_and_letters_or_digits() {
    assert!(is_session_id(ID));
    for id in [
        "",
        "ses_",
        "latest",
        "-s",
        "ses_a/b",
        "ses_a b",
        "ses_\0",
        "not-a-session",
    ] {
        assert!(!is_session_id(id), "{id:?}");
    }
}
