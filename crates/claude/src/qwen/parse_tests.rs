//! The Qwen Code line parser on the line shapes of `qwen --output-format
//! stream-json` 0.24.4 (`../shared/reference/agents.md`, and what the real
//! CLI printed against `warden mock`).

use warden_core::{AgentEvent, Frame, ResumeCause, StreamError, Usage};

use super::QwenParser;
use crate::cli::{ExitInfo, Step, TurnParser};

const ID: &str = "dd1e9575-40a2-41a9-ae5d-df63321a5814";

fn init(id: &str) -> String {
    format!(
        r#"{{"type":"system","subtype":"init","uuid":"{id}","session_id":"{id}","cwd":"/w","tools":[],"model":"mock-model","permission_mode":"auto"}}"#
    )
}

const GOAL: &str = r#"{"type":"stream_event","uuid":"e6","session_id":"dd1e9575-40a2-41a9-ae5d-df63321a5814","parent_tool_use_id":null,"event":{"type":"goal_state","goal_state":{"v":2,"goal":null,"activity":"idle"}}}"#;

const ASSISTANT: &str = r#"{"type":"assistant","uuid":"a8","session_id":"dd1e9575-40a2-41a9-ae5d-df63321a5814","parent_tool_use_id":null,"message":{"id":"a8","type":"message","role":"assistant","model":"mock-model","content":[{"type":"text","text":"Hello from warden-mock."}],"stop_reason":null,"usage":{"input_tokens":13834,"output_tokens":16,"cache_read_input_tokens":0,"total_tokens":13850}}}"#;

const SUCCESS: &str = r#"{"type":"result","subtype":"success","uuid":"44","session_id":"dd1e9575-40a2-41a9-ae5d-df63321a5814","is_error":false,"duration_ms":1314,"num_turns":1,"result":"Hello from warden-mock.","usage":{"input_tokens":13834,"output_tokens":16},"permission_denials":[]}"#;

const RETRY: &str = r#"{"type":"system","subtype":"retry","uuid":"16","session_id":"dd1e9575-40a2-41a9-ae5d-df63321a5814","parent_tool_use_id":null,"data":{"reason":"retry","discardedToolCalls":0,"preserveText":true}}"#;

fn failed(message: &str) -> String {
    format!(
        r#"{{"type":"result","subtype":"error_during_execution","session_id":"{ID}","is_error":true,"duration_ms":7084,"num_turns":1,"usage":{{"input_tokens":0,"output_tokens":0}},"permission_denials":[],"error":{{"message":"{message}"}}}}"#
    )
}

fn line(p: &mut QwenParser, text: &str) -> Step {
    p.line(&serde_json::from_str(text).expect("json"))
}

fn error(p: &mut QwenParser, text: &str) -> StreamError {
    match line(p, text) {
        Step::Fail(e) => e,
        other => panic!("expected a failure, got {other:?}"),
    }
}

#[test]
fn a_turn_announces_its_session_then_text_usage_and_completion() {
    let mut p = QwenParser::new(None, Some("mock-model".to_owned()));
    assert_eq!(
        line(&mut p, &init(ID)),
        Step::Frames(vec![Frame::Event(AgentEvent::SessionStarted {
            session_id: ID.to_owned(),
            model: Some("mock-model".to_owned()),
        })])
    );
    assert_eq!(p.session_id(), Some(ID));
    assert_eq!(line(&mut p, GOAL), Step::Frames(Vec::new()));
    assert_eq!(
        line(&mut p, ASSISTANT),
        Step::Frames(vec![
            Frame::Event(AgentEvent::TextDelta("Hello from warden-mock.".to_owned())),
            Frame::Event(AgentEvent::Usage(Usage {
                input_tokens: 13834,
                output_tokens: 16,
                ..Usage::default()
            })),
        ])
    );
    assert_eq!(
        line(&mut p, SUCCESS),
        Step::Complete(vec![Frame::Event(AgentEvent::TurnComplete {
            context_window: None,
            duration: Some(std::time::Duration::from_millis(1314)),
        })])
    );
}

#[test]
fn its_own_retry_fails_the_turn_so_the_partial_text_is_not_repeated() {
    let mut p = QwenParser::new(None, None);
    line(&mut p, &init(ID));
    assert!(matches!(
        error(&mut p, RETRY),
        StreamError::Truncated { .. }
    ));
}

#[test]
fn a_resume_answered_in_another_session_or_not_found_is_unknown_session() {
    let asked = "0e4b1d5a-0000-4000-8000-000000000000";
    let mut p = QwenParser::new(Some(asked.to_owned()), None);
    assert!(matches!(
        error(&mut p, &init(ID)),
        StreamError::UnknownSession { session_id, .. } if session_id == asked
    ));
    let mut p = QwenParser::new(Some(asked.to_owned()), None);
    let stderr = [format!(
        "No saved session found with ID {asked}. Run `qwen --resume` without an ID to choose from existing sessions."
    )];
    assert!(matches!(
        p.ended_early(ExitInfo::Code(1), &stderr, false),
        StreamError::UnknownSession { .. }
    ));
    let mut p = QwenParser::new(None, None);
    assert!(matches!(
        p.ended_early(ExitInfo::Code(1), &stderr, false),
        StreamError::Connection { .. }
    ));
    assert!(matches!(
        p.ended_early(ExitInfo::Signal(15), &[], true),
        StreamError::Truncated { .. }
    ));
}

#[test]
fn result_errors_map_by_their_api_status() {
    let mut p = QwenParser::new(None, None);
    assert!(matches!(
        error(
            &mut p,
            &failed("[API Error: 400 This model's maximum context length is 128000 tokens.]")
        ),
        StreamError::ContextOverflow {
            reason: ResumeCause::PromptTooLong,
            ..
        }
    ));
    assert!(matches!(
        error(
            &mut p,
            &failed(
                "Missing API key for OpenAI-compatible auth. Set settings.security.auth.apiKey, or set the 'OPENAI_API_KEY' environment variable."
            )
        ),
        StreamError::Unauthorized { .. }
    ));
    assert!(matches!(
        error(&mut p, &failed("[API Error: 401 bad key]")),
        StreamError::Unauthorized { .. }
    ));
    assert!(matches!(
        error(&mut p, &failed("[API Error: 400 bad request]")),
        StreamError::Api {
            status: Some(400),
            retryable: false,
            ..
        }
    ));
    assert!(matches!(
        error(
            &mut p,
            &failed("[API Error: 529 mock error 529: overloaded]")
        ),
        StreamError::Api {
            status: Some(529),
            retryable: true,
            ..
        }
    ));
    assert!(matches!(
        error(
            &mut p,
            &failed("[API Error: terminated (cause: UND_ERR_SOCKET: other side closed)]")
        ),
        StreamError::Api {
            status: None,
            retryable: true,
            ..
        }
    ));
}
