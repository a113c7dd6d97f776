//! A turn's stream-json lines come out as warden events, in order, and the
//! CLI is run the way the crate docs say.

use std::time::Duration;

use crate::common::*;
use serde_json::json;
use warden_claude::{ClaudeSource, PermissionMode};
use warden_core::{AgentEvent, EventSource, Frame, Usage};

#[tokio::test]
async fn a_turn_maps_init_blocks_tools_retries_and_result_to_events_in_order() {
    let fx = Fixture::new();
    let script = json!({"turns": [[
        out(INIT),
        out(r#"{"type":"assistant","message":{"id":"msg_1","content":[{"type":"thinking","thinking":"Let me look."},{"type":"text","text":"Checking."},{"type":"tool_use","id":"toolu_1","name":"Bash","input":{"command":"ls"}}],"usage":{"input_tokens":3,"cache_read_input_tokens":14000,"cache_creation_input_tokens":200,"output_tokens":1}},"session_id":"{session_id}"}"#),
        out(r#"{"type":"system","subtype":"api_retry","attempt":1,"error_status":500}"#),
        out(r#"{"type":"user","message":{"role":"user","content":[{"tool_use_id":"toolu_1","type":"tool_result","content":"a.txt"}]},"session_id":"{session_id}"}"#),
        out(r#"{"type":"system","subtype":"hook_response","session_id":"{session_id}"}"#),
        out(r#"{"type":"result","subtype":"compact","is_error":false,"session_id":"{session_id}"}"#),
        out(r#"{"type":"assistant","message":{"id":"msg_2","content":[{"type":"text","text":"One file."}],"usage":{"input_tokens":5,"cache_read_input_tokens":14200,"cache_creation_input_tokens":30,"output_tokens":4}},"session_id":"{session_id}"}"#),
        out(RESULT),
    ]]});
    let source = ClaudeSource::new(fx.options(script));
    let stream = source
        .open(fx.request(1, "how many files?", None))
        .await
        .expect("open");
    let (frames, error) = run(stream).await;
    assert_eq!(error, None);
    assert_eq!(
        frames,
        [
            Frame::Event(AgentEvent::SessionStarted {
                session_id: SESS_1.into(),
                model: Some("claude-x".into()),
            }),
            Frame::Event(AgentEvent::ThinkingDelta("Let me look.".into())),
            Frame::Event(AgentEvent::TextDelta("Checking.".into())),
            Frame::Event(AgentEvent::ToolUseStarted {
                id: "toolu_1".into(),
                name: "Bash".into(),
            }),
            Frame::Event(AgentEvent::Usage(Usage {
                input_tokens: 3,
                cache_creation_input_tokens: 200,
                cache_read_input_tokens: 14000,
                output_tokens: 1,
            })),
            Frame::Event(AgentEvent::ProviderRetry {
                attempt: 1,
                status: Some(500),
            }),
            Frame::Event(AgentEvent::ToolUseFinished {
                id: "toolu_1".into()
            }),
            Frame::KeepAlive, // hook_response
            Frame::KeepAlive, // compaction is not the end of the turn
            Frame::Event(AgentEvent::TextDelta("One file.".into())),
            Frame::Event(AgentEvent::Usage(Usage {
                input_tokens: 5,
                cache_creation_input_tokens: 30,
                cache_read_input_tokens: 14200,
                output_tokens: 4,
            })),
            Frame::Event(AgentEvent::TurnComplete {
                context_window: Some(200_000),
                duration: Some(Duration::from_millis(600)),
            }),
        ]
    );
}

#[tokio::test]
async fn partial_messages_yield_anthropic_deltas_without_repeating_the_assistant_line() {
    let fx = Fixture::new();
    let script = json!({"turns": [[
        out(INIT),
        out(r#"{"type":"stream_event","event":{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","content":[],"model":"claude-x","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":25,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":1}}},"session_id":"{session_id}"}"#),
        out(r#"{"type":"stream_event","event":{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}},"session_id":"{session_id}"}"#),
        out(r#"{"type":"stream_event","event":{"type":"ping"},"session_id":"{session_id}"}"#),
        out(r#"{"type":"stream_event","event":{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hello"}},"session_id":"{session_id}"}"#),
        out(r#"{"type":"stream_event","event":{"type":"content_block_stop","index":0},"session_id":"{session_id}"}"#),
        out(r#"{"type":"assistant","message":{"id":"msg_1","content":[{"type":"text","text":"Hello"}],"usage":{"input_tokens":25,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":1}},"session_id":"{session_id}"}"#),
        out(r#"{"type":"stream_event","event":{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":15}},"session_id":"{session_id}"}"#),
        out(r#"{"type":"stream_event","event":{"type":"message_stop"},"session_id":"{session_id}"}"#),
        out(RESULT),
    ]]});
    let source = ClaudeSource::new(fx.options(script).with_partial_messages(true));
    let stream = source.open(fx.request(1, "hi", None)).await.expect("open");
    let (frames, error) = run(stream).await;
    assert_eq!(error, None);
    assert!(
        fx.args(0)
            .contains(&"--include-partial-messages".to_owned())
    );
    assert_eq!(text(&frames), "Hello", "the assistant line is not repeated");
    let start = Usage {
        input_tokens: 25,
        output_tokens: 1,
        ..Usage::default()
    };
    assert_eq!(
        events(&frames),
        [
            AgentEvent::SessionStarted {
                session_id: SESS_1.into(),
                model: Some("claude-x".into()),
            },
            AgentEvent::Usage(start),
            AgentEvent::TextDelta("Hello".into()),
            AgentEvent::Stop {
                reason: "end_turn".into()
            },
            AgentEvent::Usage(Usage {
                output_tokens: 15,
                ..start
            }),
            AgentEvent::TurnComplete {
                context_window: Some(200_000),
                duration: Some(Duration::from_millis(600)),
            },
        ]
    );
    // One frame per line: every line fed the watchdog.
    assert_eq!(frames.len(), 11);
}

#[tokio::test]
async fn the_cli_runs_in_the_workspace_with_stream_json_flags_env_and_the_user_line() {
    let fx = Fixture::new();
    let source = ClaudeSource::new(
        fx.options(echo_script())
            .with_model("claude-x")
            .with_append_system_prompt("from options")
            .with_arg("--max-turns")
            .with_arg("5")
            .with_env("FAKE_EXTRA", "yes"),
    );
    let mut request = fx.request(1, "say \"hi\"\nplease", None);
    request.append_system_prompt = Some("from request".into());
    let stream = source.open(request).await.expect("open");
    let (frames, error) = run(stream).await;
    assert_eq!(error, None);
    assert_eq!(text(&frames), "echo say \"hi\"\nplease");

    let start = &fx.recorded("start")[0];
    assert_eq!(start["cwd"], real(&fx.workspace).display().to_string());
    assert_eq!(
        start["pgid"], start["pid"],
        "the agent leads its own process group"
    );
    assert_eq!(
        fx.args(0),
        [
            "--output-format",
            "stream-json",
            "--input-format",
            "stream-json",
            "--verbose",
            "--model",
            "claude-x",
            "--permission-mode",
            "default",
            "--append-system-prompt",
            "from options\n\nfrom request",
            "--max-turns",
            "5",
        ]
    );
    let scratch = fx.dir.path().join("scratch").display().to_string();
    assert_eq!(start["env"]["FAKE_EXTRA"], "yes");
    assert_eq!(start["env"]["CLAUDE_CODE_TMPDIR"], scratch.as_str());
    assert_eq!(start["env"]["XDG_RUNTIME_DIR"], scratch.as_str());
    // Not set by the source (only inherited, if the test runner has it).
    assert_eq!(
        start["env"].get("IS_SANDBOX").and_then(|v| v.as_str()),
        std::env::var("IS_SANDBOX").ok().as_deref()
    );
    assert_eq!(
        fx.recorded("stdin")[0]["line"],
        json!({"type": "user", "message": {"role": "user", "content": "say \"hi\"\nplease"}})
    );
}

#[tokio::test]
async fn bypass_permissions_runs_with_is_sandbox_and_never_skips_permissions() {
    let fx = Fixture::new();
    let source = ClaudeSource::new(
        fx.options(echo_script())
            .with_permission_mode(PermissionMode::BypassPermissions),
    );
    let (_, error) = run(source.open(fx.request(1, "x", None)).await.expect("open")).await;
    assert_eq!(error, None);
    let args = fx.args(0);
    assert!(
        args.windows(2)
            .any(|w| w == ["--permission-mode", "bypassPermissions"])
    );
    assert!(!args.iter().any(|a| a == "--dangerously-skip-permissions"));
    assert_eq!(fx.recorded("start")[0]["env"]["IS_SANDBOX"], "1");
}
