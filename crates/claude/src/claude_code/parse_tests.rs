//! The Claude Code line parser on the line shapes of the real CLI.

use std::time::Duration;

use warden_core::{AgentEvent, Frame, ResumeCause, StreamError, Usage};

use super::errors::early_exit_error;
use super::parse::ClaudeParser;
use crate::cli::{ExitInfo, Step};
use crate::lines::LineParser;

/// A parser as the source builds it: garbage handling around Claude Code's.
fn claude(resume_id: Option<String>, max_garbage: u32) -> LineParser<ClaudeParser> {
    LineParser::new(ClaudeParser::new(resume_id), "claude", max_garbage)
}

fn parser() -> LineParser<ClaudeParser> {
    claude(None, 3)
}

fn frames(p: &mut LineParser<ClaudeParser>, line: &str) -> Vec<Frame> {
    match p.line(line.as_bytes()) {
        Step::Frames(f) => f,
        other => panic!("expected frames, got {other:?}"),
    }
}

fn ev(e: AgentEvent) -> Frame {
    Frame::Event(e)
}

#[test]
fn init_line_starts_the_session_and_keeps_the_newest_id() {
    let mut p = parser();
    let f = frames(
        &mut p,
        r#"{"type":"system","subtype":"init","cwd":"/w","session_id":"9753c268-aaaa-4aaa-8aaa-aaaaaaaaaaaa","model":"claude-x","tools":["Bash"],"permissionMode":"default"}"#,
    );
    assert_eq!(
        f,
        [ev(AgentEvent::SessionStarted {
            session_id: "9753c268-aaaa-4aaa-8aaa-aaaaaaaaaaaa".into(),
            model: Some("claude-x".into())
        })]
    );
    frames(
        &mut p,
        r#"{"session_id":"9753c268-bbbb-4bbb-8bbb-bbbbbbbbbbbb","subtype":"init","type":"system"}"#,
    );
    assert_eq!(p.session_id(), Some("9753c268-bbbb-4bbb-8bbb-bbbbbbbbbbbb"));
}

#[test]
fn an_announced_id_that_is_not_a_uuid_is_neither_started_nor_kept() {
    let mut p = parser();
    for id in [r"9753c268\u0000-x", "../../etc/passwd", "", "b2"] {
        let line = format!(r#"{{"type":"system","subtype":"init","session_id":"{id}"}}"#);
        assert_eq!(frames(&mut p, &line), [Frame::KeepAlive], "{id}");
        assert_eq!(p.session_id(), None, "{id}");
    }
}

#[test]
fn assistant_blocks_map_to_text_thinking_tool_start_and_usage() {
    let mut p = parser();
    let f = frames(
        &mut p,
        r#"{"type":"assistant","message":{"id":"msg_1","content":[{"type":"thinking","thinking":"hm"},{"type":"text","text":"One file."},{"type":"tool_use","id":"tu_1","name":"Bash","input":{}}],"usage":{"input_tokens":3,"cache_read_input_tokens":14000,"cache_creation_input_tokens":200,"output_tokens":1}},"session_id":"9753"}"#,
    );
    assert_eq!(
        f,
        [
            ev(AgentEvent::ThinkingDelta("hm".into())),
            ev(AgentEvent::TextDelta("One file.".into())),
            ev(AgentEvent::ToolUseStarted {
                id: "tu_1".into(),
                name: "Bash".into()
            }),
            ev(AgentEvent::Usage(Usage {
                input_tokens: 3,
                cache_creation_input_tokens: 200,
                cache_read_input_tokens: 14000,
                output_tokens: 1
            })),
        ]
    );
}

#[test]
fn tool_results_in_user_lines_finish_tool_calls() {
    let mut p = parser();
    let f = frames(
        &mut p,
        r#"{"type":"user","message":{"role":"user","content":[{"type":"tool_result","tool_use_id":"tu_1","content":"ok"}]}}"#,
    );
    assert_eq!(f, [ev(AgentEvent::ToolUseFinished { id: "tu_1".into() })]);
    // A plain user echo is liveness only.
    let f = frames(
        &mut p,
        r#"{"type":"user","message":{"role":"user","content":"hi"}}"#,
    );
    assert_eq!(f, [Frame::KeepAlive]);
}

#[test]
fn api_retry_maps_to_provider_retry() {
    let mut p = parser();
    let f = frames(
        &mut p,
        r#"{"type":"system","subtype":"api_retry","attempt":2,"error_status":500}"#,
    );
    assert_eq!(
        f,
        [ev(AgentEvent::ProviderRetry {
            attempt: 2,
            status: Some(500)
        })]
    );
}

#[test]
fn unknown_lines_are_liveness() {
    let mut p = parser();
    for line in [
        r#"{"type":"system","subtype":"hook_response"}"#,
        r#"{"type":"rate_limit_event"}"#,
        r#"{"no_type":1}"#,
        "   ",
    ] {
        assert_eq!(frames(&mut p, line), [Frame::KeepAlive], "{line}");
    }
}

#[test]
fn success_result_completes_the_turn_with_the_reported_window() {
    let mut p = parser();
    frames(
        &mut p,
        r#"{"type":"system","subtype":"init","session_id":"s","model":"claude-x[1m]"}"#,
    );
    let step = p.line(
        br#"{"subtype":"success","is_error":false,"duration_ms":612,"num_turns":2,"result":"One file.","session_id":"s","total_cost_usd":0.0123,"usage":{"input_tokens":6},"modelUsage":{"claude-haiku":{"contextWindow":200000},"claude-x[1m]":{"contextWindow":1000000}},"type":"result"}"#,
    );
    assert_eq!(
        step,
        Step::Complete(vec![ev(AgentEvent::TurnComplete {
            context_window: Some(1_000_000),
            duration: Some(Duration::from_millis(612))
        })])
    );
    let step = p.line(br#"{"type":"result","subtype":"success","is_error":false}"#);
    assert_eq!(
        step,
        Step::Complete(vec![ev(AgentEvent::TurnComplete {
            context_window: None,
            duration: None
        })])
    );
}

#[test]
fn a_compaction_result_is_not_the_end_of_the_turn() {
    let mut p = parser();
    for subtype in ["compact", "compaction"] {
        let line = format!(r#"{{"type":"result","subtype":"{subtype}","is_error":false}}"#);
        assert_eq!(frames(&mut p, &line), [Frame::KeepAlive]);
    }
}

fn fail(p: &mut LineParser<ClaudeParser>, line: &str) -> StreamError {
    match p.line(line.as_bytes()) {
        Step::Fail(e) => e,
        other => panic!("expected a failure, got {other:?}"),
    }
}

#[test]
fn unknown_session_result_is_unknown_session() {
    let mut p = claude(Some("abc-1".into()), 3);
    let e = fail(
        &mut p,
        r#"{"type":"result","subtype":"error_during_execution","is_error":true,"errors":["No conversation found with session ID: abc-1"]}"#,
    );
    assert_eq!(
        e,
        StreamError::UnknownSession {
            session_id: "abc-1".into(),
            message: "No conversation found with session ID: abc-1".into()
        }
    );
    // Without a resume id the id comes from the message.
    let e = fail(
        &mut parser(),
        r#"{"type":"result","subtype":"error_during_execution","is_error":true,"errors":["No conversation found with session ID: zz-9"]}"#,
    );
    assert_eq!(e.resume_failure_cause(), Some(ResumeCause::UnknownSession));
    assert!(matches!(e, StreamError::UnknownSession { session_id, .. } if session_id == "zz-9"));
}

#[test]
fn prompt_too_long_with_subtype_success_is_context_overflow() {
    let e = fail(
        &mut parser(),
        r#"{"type":"result","subtype":"success","is_error":true,"terminal_reason":"prompt_too_long","api_error_status":400,"result":"Prompt is too long"}"#,
    );
    assert_eq!(
        e,
        StreamError::ContextOverflow {
            reason: ResumeCause::PromptTooLong,
            message: "Prompt is too long".into()
        }
    );
    let e = fail(
        &mut parser(),
        r#"{"type":"result","subtype":"success","is_error":true,"terminal_reason":"blocking_limit","result":"Context limit reached"}"#,
    );
    assert_eq!(e.resume_failure_cause(), Some(ResumeCause::BlockingLimit));
    let e = fail(
        &mut parser(),
        r#"{"type":"result","subtype":"success","is_error":true,"result":"Prompt is too long"}"#,
    );
    assert_eq!(e.resume_failure_cause(), Some(ResumeCause::PromptTooLong));
}

#[test]
fn other_error_subtypes_are_fatal_api_errors() {
    for subtype in [
        "error_max_turns",
        "error_max_budget_usd",
        "error_during_execution",
    ] {
        let line = format!(
            r#"{{"type":"result","subtype":"{subtype}","is_error":true,"errors":["stopped"]}}"#
        );
        let e = fail(&mut parser(), &line);
        assert!(
            matches!(&e, StreamError::Api { kind, retryable: false, .. } if kind == subtype),
            "{e:?}"
        );
        assert_eq!(e.resume_failure_cause(), None);
    }
    // An error subtype without is_error is still an error.
    let e = fail(
        &mut parser(),
        r#"{"type":"result","subtype":"error_max_turns"}"#,
    );
    assert!(!e.is_retryable());
}

#[test]
fn an_api_error_result_is_retryable_only_for_transient_statuses() {
    let e = fail(
        &mut parser(),
        r#"{"type":"result","subtype":"success","is_error":true,"api_error_status":529,"result":"API Error: Overloaded"}"#,
    );
    assert!(e.is_retryable(), "{e:?}");
    let e = fail(
        &mut parser(),
        r#"{"type":"result","subtype":"success","is_error":true,"api_error_status":400,"result":"API Error: bad"}"#,
    );
    assert!(!e.is_retryable(), "{e:?}");
    let e = fail(
        &mut parser(),
        r#"{"type":"result","subtype":"success","is_error":true,"api_error_status":401,"result":"Invalid API key"}"#,
    );
    assert!(matches!(e, StreamError::Unauthorized { .. }), "{e:?}");
}

#[test]
fn garbage_lines_are_liveness_until_too_many_in_a_row() {
    let mut p = parser(); // at most 3 in a row
    for _ in 0..3 {
        assert_eq!(frames(&mut p, "npm WARN something"), [Frame::KeepAlive]);
    }
    // A JSON line resets the run.
    frames(&mut p, r#"{"type":"system","subtype":"x"}"#);
    for _ in 0..3 {
        assert_eq!(frames(&mut p, "[1, 2]"), [Frame::KeepAlive]);
    }
    let e = fail(&mut p, "not json");
    assert!(matches!(e, StreamError::Malformed { .. }), "{e:?}");
    assert!(
        !e.to_string().contains("not json"),
        "no line text in errors"
    );
}

#[test]
fn stream_events_map_to_anthropic_deltas_and_the_repeat_is_skipped() {
    let mut p = parser();
    let lines = [
        r#"{"type":"stream_event","event":{"type":"message_start","message":{"id":"msg_1","usage":{"input_tokens":25,"cache_creation_input_tokens":0,"cache_read_input_tokens":100,"output_tokens":1}}}}"#,
        r#"{"type":"stream_event","event":{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}}"#,
        r#"{"type":"stream_event","event":{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hel"}}}"#,
        r#"{"type":"stream_event","event":{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"t"}}}"#,
        r#"{"type":"stream_event","event":{"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"tu_9","name":"Read","input":{}}}}"#,
        r#"{"type":"stream_event","event":{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"a\""}}}"#,
        r#"{"type":"stream_event","event":{"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":15}}}"#,
        r#"{"type":"stream_event","event":{"type":"ping"}}"#,
        r#"{"type":"assistant","message":{"id":"msg_1","content":[{"type":"text","text":"Hel"}],"usage":{"input_tokens":25}}}"#,
    ];
    let all: Vec<Frame> = lines.iter().flat_map(|l| frames(&mut p, l)).collect();
    let start = Usage {
        input_tokens: 25,
        cache_creation_input_tokens: 0,
        cache_read_input_tokens: 100,
        output_tokens: 1,
    };
    assert_eq!(
        all,
        [
            ev(AgentEvent::Usage(start)),
            Frame::KeepAlive,
            ev(AgentEvent::TextDelta("Hel".into())),
            ev(AgentEvent::ThinkingDelta("t".into())),
            ev(AgentEvent::ToolUseStarted {
                id: "tu_9".into(),
                name: "Read".into()
            }),
            ev(AgentEvent::ToolInputDelta {
                id: "tu_9".into(),
                partial_json: "{\"a\"".into()
            }),
            ev(AgentEvent::Stop {
                reason: "tool_use".into()
            }),
            ev(AgentEvent::Usage(Usage {
                output_tokens: 15,
                ..start
            })),
            Frame::KeepAlive,
            Frame::KeepAlive,
        ]
    );
}

#[test]
fn early_exits_are_classified_from_stderr() {
    let e = early_exit_error(
        ExitInfo::Code(1),
        &["No conversation found with session ID: abc".into()],
        Some("abc"),
        false,
    );
    assert!(matches!(e, StreamError::UnknownSession { ref session_id, .. } if session_id == "abc"));
    let e = early_exit_error(
        ExitInfo::Code(1),
        &["Error: --resume requires a valid session ID when used with --print".into()],
        Some("not-a-uuid"),
        false,
    );
    assert_eq!(e.resume_failure_cause(), Some(ResumeCause::UnknownSession));
    let e = early_exit_error(
        ExitInfo::Code(1),
        &["Error: Session ID abc is already in use.".into()],
        Some("abc"),
        false,
    );
    assert!(e.is_retryable());
    assert!(matches!(e, StreamError::Api { ref kind, .. } if kind == "session_in_use"));
    let e = early_exit_error(ExitInfo::Code(3), &["boom".into()], None, false);
    assert!(matches!(e, StreamError::Connection { .. }), "{e:?}");
    assert!(e.to_string().contains("exit status 3"));
    assert!(e.to_string().contains("boom"));
    let e = early_exit_error(ExitInfo::Signal(9), &[], None, true);
    assert!(matches!(e, StreamError::Truncated { .. }), "{e:?}");
    assert!(e.to_string().contains("signal 9"));
}

mod fuzz {
    use super::*;
    use proptest::prelude::*;

    /// Real line shapes (`docs/wire-formats.md`), cut anywhere by the property below.
    const SAMPLES: &[&str] = &[
        r#"{"type":"system","subtype":"init","cwd":"/w","session_id":"9753c268-aaaa","model":"claude-x","tools":["Bash"],"permissionMode":"default"}"#,
        r#"{"type":"assistant","message":{"id":"msg_1","content":[{"type":"text","text":"One file."},{"type":"tool_use","id":"tu_1","name":"Bash","input":{"command":"ls"}}],"usage":{"input_tokens":3,"cache_read_input_tokens":14000,"cache_creation_input_tokens":200,"output_tokens":1}},"session_id":"9753"}"#,
        r#"{"type":"user","message":{"role":"user","content":[{"type":"tool_result","tool_use_id":"tu_1","content":"a.txt"}]}}"#,
        r#"{"type":"result","subtype":"success","is_error":false,"num_turns":2,"result":"One file.","session_id":"9753","total_cost_usd":0.0123,"usage":{"input_tokens":6,"cache_creation_input_tokens":200,"cache_read_input_tokens":28000,"output_tokens":40},"modelUsage":{"claude-x":{"contextWindow":200000}}}"#,
        r#"{"type":"result","subtype":"success","is_error":true,"terminal_reason":"prompt_too_long","api_error_status":400,"result":"Prompt is too long"}"#,
        r#"{"type":"result","subtype":"error_during_execution","is_error":true,"errors":["No conversation found with session ID: abc"]}"#,
        r#"{"type":"stream_event","event":{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hel"}}}"#,
        r#"{"type":"system","subtype":"api_retry","attempt":1,"error_status":500}"#,
    ];

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn random_lines_never_panic(
            lines in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..300), 0..40),
        ) {
            let mut p = claude(Some("abc".into()), 20);
            for l in &lines {
                let _ = p.line(l);
            }
        }

        #[test]
        fn truncated_real_lines_never_panic(which in 0..SAMPLES.len(), cut in 0usize..600) {
            let line = SAMPLES[which].as_bytes();
            let mut p = claude(Some("abc".into()), 2);
            p.begin_turn();
            let _ = p.line(&line[..cut.min(line.len())]);
            let _ = p.line(line);
        }
    }

    /// The `fuzz_*` profile (`just fuzz`): `PROPTEST_CASES` sets the
    /// cases; failures are kept in `parse.proptest-regressions`.
    fn fuzz_config() -> ProptestConfig {
        ProptestConfig {
            failure_persistence: Some(Box::new(
                proptest::test_runner::FileFailurePersistence::WithSource("proptest-regressions"),
            )),
            ..ProptestConfig::default()
        }
    }

    /// Bytes that are mostly JSON lines of the real shapes, cut and
    /// spliced, so the fuzzer gets past `serde_json`'s first error.
    fn line_ish() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..400),
            (
                0..SAMPLES.len(),
                0usize..600,
                proptest::collection::vec(any::<u8>(), 0..16)
            )
                .prop_map(|(which, cut, noise)| {
                    let s = SAMPLES[which].as_bytes();
                    let cut = cut.min(s.len());
                    [&s[..cut], &noise[..], &s[cut..]].concat()
                }),
        ]
    }

    proptest! {
        #![proptest_config(fuzz_config())]

        #[test]
        fn fuzz_any_lines_give_frames_a_completion_or_a_typed_failure(
            lines in proptest::collection::vec(line_ish(), 0..32),
            resume in proptest::option::of("[a-z0-9-]{1,12}"),
            max_garbage in 0u32..6,
        ) {
            let mut p = claude(resume, max_garbage);
            p.begin_turn();
            for l in &lines {
                match p.line(l) {
                    Step::Frames(f) => prop_assert!(!f.is_empty(), "Frames is never empty"),
                    Step::Complete(f) => prop_assert!(
                        matches!(f.last(), Some(Frame::Event(AgentEvent::TurnComplete { .. }))),
                        "a completion ends with TurnComplete: {:?}", f
                    ),
                    Step::Fail(e) => prop_assert!(e.code() != "EINTERNAL", "{:?}", e),
                }
            }
        }

        #[test]
        fn fuzz_assistant_text_blocks_round_trip(
            texts in proptest::collection::vec("\\PC{1,40}|[\\n\\r\"\\\\\u{0}-\u{1f}]{1,6}", 1..6),
        ) {
            let content: Vec<serde_json::Value> = texts
                .iter()
                .map(|t| serde_json::json!({"type": "text", "text": t}))
                .collect();
            let line = serde_json::json!({
                "type": "assistant",
                "message": {"id": "msg_f", "content": content},
                "session_id": "s",
            })
            .to_string();
            let mut p = claude(None, 3);
            p.begin_turn();
            match p.line(line.as_bytes()) {
                Step::Frames(f) => {
                    let got: Vec<String> = f
                        .into_iter()
                        .filter_map(|fr| match fr {
                            Frame::Event(AgentEvent::TextDelta(t)) => Some(t),
                            _ => None,
                        })
                        .collect();
                    prop_assert_eq!(got, texts);
                }
                other => prop_assert!(false, "expected frames, got {:?}", other),
            }
        }
    }
}
