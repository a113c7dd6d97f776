//! The Gemini line parser on the line shapes of `gemini --output-format
//! stream-json` 0.61.0 (`../shared/reference/agents.md`, and what the
//! real CLI printed against `warden mock`).

use std::time::Duration;

use warden_core::{AgentEvent, Frame, ResumeCause, StreamError};

use super::GeminiParser;
use crate::cli::{ExitInfo, Step, TurnParser};
use crate::lines::LineParser;

const ID: &str = "3444ea42-15e7-456d-aad9-56aa4be86122";

fn init(id: &str) -> String {
    format!(
        r#"{{"type":"init","timestamp":"2026-12-06T02:58:13.371Z","session_id":"{id}","model":"gemini-2.5-pro"}}"#
    )
}
const USER: &str = r#"{"type":"message","timestamp":"t","role":"user","content":"say hi"}"#;
const SUCCESS: &str = r#"{"type":"result","timestamp":"t","status":"success","stats":{"total_tokens":105,"input_tokens":100,"output_tokens":5,"cached":0,"input":100,"duration_ms":313,"tool_calls":0}}"#;

fn delta(text: &str) -> String {
    format!(
        r#"{{"type":"message","timestamp":"t","role":"assistant","content":"{text}","delta":true}}"#
    )
}

fn line(p: &mut GeminiParser, text: &str) -> Step {
    p.line(&serde_json::from_str(text).expect("json"))
}

fn frames(p: &mut GeminiParser, text: &str) -> Vec<Frame> {
    match line(p, text) {
        Step::Frames(f) => f,
        other => panic!("expected frames, got {other:?}"),
    }
}

fn fail(p: &mut GeminiParser, text: &str) -> StreamError {
    match line(p, text) {
        Step::Fail(e) => e,
        other => panic!("expected a failure, got {other:?}"),
    }
}

fn ev(e: AgentEvent) -> Frame {
    Frame::Event(e)
}

fn started(id: &str) -> Frame {
    ev(AgentEvent::SessionStarted {
        session_id: id.into(),
        model: Some("gemini-2.5-pro".into()),
    })
}

#[test]
fn a_fresh_turn_announces_its_id_only_with_a_successful_result() {
    let mut p = GeminiParser::new(None, Some("m".into()), None);
    assert!(frames(&mut p, &init(ID)).is_empty());
    assert_eq!(p.session_id(), None, "nothing to resume before success");
    assert!(frames(&mut p, USER).is_empty());
    assert_eq!(
        frames(&mut p, &delta("Hello ")),
        [ev(AgentEvent::TextDelta("Hello ".into()))]
    );
    match line(&mut p, SUCCESS) {
        Step::Complete(f) => assert_eq!(
            f,
            [
                started(ID),
                ev(AgentEvent::TurnComplete {
                    context_window: None,
                    duration: Some(Duration::from_millis(313)),
                })
            ]
        ),
        other => panic!("expected completion, got {other:?}"),
    }
    assert_eq!(p.session_id(), Some(ID));
}

#[test]
fn a_resumed_turn_announces_the_id_at_init_and_another_id_is_a_resume_failure() {
    let mut p = GeminiParser::new(Some(ID.into()), None, None);
    assert_eq!(frames(&mut p, &init(ID)), [started(ID)]);
    assert_eq!(p.session_id(), Some(ID));
    let mut p = GeminiParser::new(Some(ID.into()), None, None);
    let other = "77f1b399-7767-4622-b42e-459b378b2f7c";
    let e = fail(&mut p, &init(other));
    assert!(
        matches!(e, StreamError::UnknownSession { ref session_id, .. } if session_id == ID),
        "{e:?}"
    );
}

#[test]
fn a_fresh_turn_that_fails_leaves_nothing_to_resume() {
    let mut p = GeminiParser::new(None, None, None);
    frames(&mut p, &init(ID));
    frames(&mut p, &delta("Hel"));
    frames(
        &mut p,
        r#"{"type":"error","timestamp":"t","severity":"error","message":"Model stream ended without a finish reason."}"#,
    );
    let e = fail(
        &mut p,
        r#"{"type":"result","timestamp":"t","status":"error","stats":{"duration_ms":305}}"#,
    );
    match e {
        StreamError::Api {
            retryable, message, ..
        } => {
            assert!(retryable);
            assert!(message.contains("without a finish reason"), "{message}");
        }
        other => panic!("expected a retryable Api error, got {other:?}"),
    }
    assert_eq!(p.session_id(), None);
}

#[test]
fn tools_map_to_tool_use_started_and_finished() {
    let mut p = GeminiParser::new(None, None, None);
    assert_eq!(
        frames(
            &mut p,
            r#"{"type":"tool_use","timestamp":"t","tool_name":"run_shell_command","tool_id":"call-1","parameters":{"command":"ls"}}"#
        ),
        [ev(AgentEvent::ToolUseStarted {
            id: "call-1".into(),
            name: "run_shell_command".into()
        })]
    );
    assert_eq!(
        frames(
            &mut p,
            r#"{"type":"tool_result","timestamp":"t","tool_id":"call-1","status":"success","output":"a\nb"}"#
        ),
        [ev(AgentEvent::ToolUseFinished {
            id: "call-1".into()
        })]
    );
    // An empty delta and unknown lines are liveness only.
    assert!(frames(&mut p, &delta("")).is_empty());
    assert!(frames(&mut p, r#"{"type":"something_new"}"#).is_empty());
}

#[test]
fn result_errors_are_typed_overflow_auth_fatal_or_retryable() {
    let result = |code: u16, status: &str, message: &str| {
        format!(
            r#"{{"type":"result","status":"error","error":{{"type":"unknown","message":"[API Error: {{\"error\":{{\"code\":{code},\"message\":\"{message}\",\"status\":\"{status}\"}}}}]"}},"stats":{{}}}}"#
        )
    };
    let mut p = GeminiParser::new(None, None, None);
    let e = fail(
        &mut p,
        &result(
            400,
            "INVALID_ARGUMENT",
            "The input token count (2000000) exceeds the maximum number of tokens allowed (1048576).",
        ),
    );
    assert!(
        matches!(
            e,
            StreamError::ContextOverflow {
                reason: ResumeCause::PromptTooLong,
                ..
            }
        ),
        "{e:?}"
    );
    let e = fail(&mut p, &result(401, "UNAUTHENTICATED", "bad key"));
    assert!(matches!(e, StreamError::Unauthorized { .. }), "{e:?}");
    let e = fail(&mut p, &result(404, "NOT_FOUND", "no such model"));
    assert!(
        matches!(
            e,
            StreamError::Api {
                status: Some(404),
                retryable: false,
                ..
            }
        ),
        "{e:?}"
    );
    for (code, status) in [(500, "INTERNAL"), (429, "RESOURCE_EXHAUSTED")] {
        let e = fail(&mut p, &result(code, status, "try later"));
        assert!(
            matches!(e, StreamError::Api { status: Some(s), retryable: true, .. } if s == code),
            "{e:?}"
        );
    }
}

#[test]
fn an_exit_before_the_result_is_a_resume_failure_auth_or_a_retryable_break() {
    let stderr = |l: &str| vec![l.to_owned()];
    let mut p = GeminiParser::new(Some(ID.into()), None, None);
    let e = p.ended_early(
        ExitInfo::Code(42),
        &stderr(&format!(
            "Error resuming session: Invalid session identifier \"{ID}\"."
        )),
        false,
    );
    assert!(matches!(e, StreamError::UnknownSession { .. }), "{e:?}");
    let e = p.ended_early(
        ExitInfo::Code(42),
        &stderr("No previous sessions found for this project."),
        false,
    );
    assert!(matches!(e, StreamError::UnknownSession { .. }), "{e:?}");
    let mut fresh = GeminiParser::new(None, None, None);
    let e = fresh.ended_early(ExitInfo::Code(41), &stderr("Invalid auth method"), false);
    assert!(matches!(e, StreamError::Unauthorized { .. }), "{e:?}");
    // SIGTERM: exit 0 after partial deltas, no result line: not a success.
    let e = fresh.ended_early(ExitInfo::Code(0), &[], true);
    assert!(matches!(e, StreamError::Truncated { .. }), "{e:?}");
    let e = fresh.ended_early(ExitInfo::Signal(9), &[], false);
    assert!(matches!(e, StreamError::Connection { .. }), "{e:?}");
}

#[test]
fn garbage_and_a_truncated_json_line_are_liveness_then_a_typed_error() {
    let mut lines = LineParser::new(GeminiParser::new(None, None, None), "gemini", 2);
    assert_eq!(
        lines.line(b"Warning: 256-color support not detected."),
        Step::Frames(vec![Frame::KeepAlive])
    );
    // A line cut mid-object is not JSON: liveness, never text.
    assert_eq!(
        lines.line(br#"{"type":"message","role":"assistant","content":"Hel"#),
        Step::Frames(vec![Frame::KeepAlive])
    );
    match lines.line(b"[STARTUP] noise") {
        Step::Fail(StreamError::Malformed { .. }) => {}
        other => panic!("expected Malformed, got {other:?}"),
    }
    // A good line resets the run.
    let mut lines = LineParser::new(GeminiParser::new(None, None, None), "gemini", 2);
    lines.line(b"noise");
    lines.line(b"noise");
    assert_eq!(
        lines.line(delta("ok").as_bytes()),
        Step::Frames(vec![ev(AgentEvent::TextDelta("ok".into()))])
    );
    lines.line(b"noise");
    lines.line(b"noise");
    assert!(matches!(
        lines.line(b"noise"),
        Step::Fail(StreamError::Malformed { .. })
    ));
}
