//! The Codex line parser on the line shapes of `codex exec --json` 0.169.0
//! (`../shared/reference/agents.md`).

use warden_core::{AgentEvent, Frame, ResumeCause, StreamError};

use super::CodexParser;
use crate::cli::{ExitInfo, Step, TurnParser};

const ID: &str = "01a24537-0000-4000-8000-000000000001";

fn line(p: &mut CodexParser, text: &str) -> Step {
    p.line(&serde_json::from_str(text).expect("json"))
}

fn frames(p: &mut CodexParser, text: &str) -> Vec<Frame> {
    match line(p, text) {
        Step::Frames(f) => f,
        other => panic!("expected frames, got {other:?}"),
    }
}

fn fail(p: &mut CodexParser, text: &str) -> StreamError {
    match line(p, text) {
        Step::Fail(e) => e,
        other => panic!("expected a failure, got {other:?}"),
    }
}

fn ev(e: AgentEvent) -> Frame {
    Frame::Event(e)
}

#[test]
fn a_turn_maps_to_session_text_tools_and_completion() {
    let mut p = CodexParser::new(None, Some("gpt-5.5".into()), None);
    let started = format!(r#"{{"type":"thread.started","thread_id":"{ID}"}}"#);
    assert_eq!(
        frames(&mut p, &started),
        [ev(AgentEvent::SessionStarted {
            session_id: ID.into(),
            model: Some("gpt-5.5".into())
        })]
    );
    assert_eq!(p.session_id(), Some(ID));
    assert!(frames(&mut p, r#"{"type":"turn.started"}"#).is_empty());
    let tool = [
        r#"{"type":"item.started","item":{"id":"item_1","type":"command_execution","command":"ls","status":"in_progress"}}"#,
        r#"{"type":"item.completed","item":{"id":"item_1","type":"command_execution","command":"ls","exit_code":0}}"#,
    ];
    assert_eq!(
        frames(&mut p, tool[0]),
        [ev(AgentEvent::ToolUseStarted {
            id: "item_1".into(),
            name: "command_execution".into()
        })]
    );
    assert_eq!(
        frames(&mut p, tool[1]),
        [ev(AgentEvent::ToolUseFinished {
            id: "item_1".into()
        })]
    );
    // Text an item repeats is sent once.
    let text = [
        r#"{"type":"item.updated","item":{"id":"item_2","type":"agent_message","text":"Hel"}}"#,
        r#"{"type":"item.completed","item":{"id":"item_2","type":"agent_message","text":"Hello."}}"#,
    ];
    assert_eq!(
        frames(&mut p, text[0]),
        [ev(AgentEvent::TextDelta("Hel".into()))]
    );
    assert_eq!(
        frames(&mut p, text[1]),
        [ev(AgentEvent::TextDelta("lo.".into()))]
    );
    let done = r#"{"type":"turn.completed","usage":{"input_tokens":19121,"cached_input_tokens":0,"output_tokens":30}}"#;
    match line(&mut p, done) {
        // No session file: no usage (the printed one is cumulative).
        Step::Complete(f) => assert_eq!(
            f,
            [ev(AgentEvent::TurnComplete {
                context_window: None,
                duration: None
            })]
        ),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_resume_that_announces_another_thread_is_an_unknown_session() {
    let mut p = CodexParser::new(Some(ID.into()), None, None);
    let e = fail(
        &mut p,
        r#"{"type":"thread.started","thread_id":"01a24537-0000-4000-8000-0000000000ff"}"#,
    );
    assert_eq!(e.resume_failure_cause(), Some(ResumeCause::UnknownSession));
    let mut p = CodexParser::new(Some(ID.into()), None, None);
    let same = format!(r#"{{"type":"thread.started","thread_id":"{ID}"}}"#);
    assert_eq!(frames(&mut p, &same).len(), 1);
}

#[test]
fn context_overflow_and_reconnects_and_failures_are_typed() {
    let mut p = CodexParser::new(Some(ID.into()), None, None);
    assert_eq!(
        frames(
            &mut p,
            r#"{"type":"error","message":"Reconnecting... 2/5 (stream disconnected before completion: idle timeout waiting for SSE)"}"#
        ),
        [ev(AgentEvent::ProviderRetry {
            attempt: 2,
            status: None
        })]
    );
    let e = fail(
        &mut p,
        r#"{"type":"error","message":"Codex ran out of room in the model's context window. Start a new thread or clear earlier history before retrying."}"#,
    );
    assert_eq!(e.resume_failure_cause(), Some(ResumeCause::PromptTooLong));
    let e = fail(
        &mut p,
        r#"{"type":"turn.failed","error":{"message":"stream disconnected before completion"}}"#,
    );
    assert!(e.is_retryable(), "{e:?}");
    assert_eq!(e.resume_failure_cause(), None);
}

#[test]
fn an_early_exit_with_a_missing_rollout_is_an_unknown_session() {
    let mut p = CodexParser::new(Some(ID.into()), None, None);
    let stderr = [
        "WARNING: proceeding, even though we could not create PATH aliases".to_owned(),
        format!(
            "Error: thread/resume: thread/resume failed: no rollout found for thread id {ID} (code -32600)"
        ),
    ];
    let e = p.ended_early(ExitInfo::Code(1), &stderr, false);
    assert!(
        matches!(&e, StreamError::UnknownSession { session_id, .. } if session_id == ID),
        "{e:?}"
    );
    let mut p = CodexParser::new(None, None, None);
    let e = p.ended_early(ExitInfo::Signal(9), &[], true);
    assert!(matches!(e, StreamError::Truncated { .. }), "{e:?}");
    assert!(e.is_retryable());
}
