//! Lines that are not JSON count as liveness until too many come in a row;
//! a line over the size limit fails the turn.

use crate::common::*;
use serde_json::json;
use warden_claude::ClaudeSource;
use warden_core::{EventSource, Frame, StreamError};

#[tokio::test]
async fn a_few_garbage_lines_are_liveness_and_the_turn_completes() {
    let fx = Fixture::new();
    let script =
        json!({"turns": [[out(INIT), {"garbage": 5}, out(ECHO), {"garbage": 5}, out(RESULT)]]});
    let source = ClaudeSource::new(fx.options(script).with_max_garbage_lines(5));
    let (frames, error) = run(source.open(fx.request(1, "hi", None)).await.expect("open")).await;
    assert_eq!(error, None);
    assert_eq!(text(&frames), "echo hi");
    let keepalives = frames.iter().filter(|f| **f == Frame::KeepAlive).count();
    assert_eq!(keepalives, 10, "one liveness frame per garbage line");
}

#[tokio::test]
async fn too_many_garbage_lines_in_a_row_fail_the_turn_as_malformed() {
    let fx = Fixture::new();
    let script = json!({"turns": [[out(INIT), {"garbage": 6}, out(RESULT)]]});
    let source = ClaudeSource::new(fx.options(script).with_max_garbage_lines(5));
    let (frames, error) = run(source.open(fx.request(1, "hi", None)).await.expect("open")).await;
    let error = error.expect("fails");
    assert!(matches!(error, StreamError::Malformed { .. }), "{error:?}");
    assert!(!error.is_retryable());
    assert!(!error.to_string().contains("npm WARN"), "no line text");
    assert_eq!(frames.len(), 1 + 5, "init, then five tolerated lines");
    let pid = fx.agent_pids()[0];
    assert!(
        eventually(PATIENCE, || reaped(pid)).await,
        "the process is ended"
    );
}

#[tokio::test]
async fn a_line_over_the_size_limit_fails_the_turn_as_frame_too_large() {
    let fx = Fixture::new();
    let script = json!({"turns": [[out(INIT), {"big_line": 5000}, out(RESULT)]]});
    let source = ClaudeSource::new(fx.options(script).with_max_line_bytes(1024));
    let (_, error) = run(source.open(fx.request(1, "hi", None)).await.expect("open")).await;
    match error {
        Some(StreamError::FrameTooLarge { size, limit }) => {
            assert_eq!(limit, 1024);
            assert!(size > 1024, "{size}");
        }
        other => panic!("expected FrameTooLarge, got {other:?}"),
    }
    // A line at the limit is fine.
    let fx = Fixture::new();
    let script = json!({"turns": [[out(INIT), {"big_line": 1024}, out(RESULT)]]});
    let source = ClaudeSource::new(fx.options(script).with_max_line_bytes(1024));
    let (_, error) = run(source.open(fx.request(1, "hi", None)).await.expect("open")).await;
    assert_eq!(error, None);
}
