//! Fuzz targets for the public SSE decoder (`decode_frames`), as proptest
//! properties named `fuzz_*`. A normal run tries a few hundred cases; `just
//! fuzz` runs them with `PROPTEST_CASES` in the hundreds of thousands.
//! Properties: no input panics or hangs the decoder, every failure is a
//! typed `StreamError` that ends the stream, and valid turns round-trip
//! whatever their chunking.

use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use warden_core::{AgentEvent, Frame, StreamError};
use warden_llm::decode::Protocol;

use crate::support::memory::{decode, split};

fn protocol() -> impl Strategy<Value = Protocol> {
    prop_oneof![Just(Protocol::Anthropic), Just(Protocol::OpenAi)]
}

/// A complete turn streaming `texts` as text deltas, in `protocol`'s SSE.
fn turn_with(protocol: Protocol, texts: &[String]) -> Vec<u8> {
    let mut out = String::new();
    let json = |t: &String| serde_json::to_string(t).expect("a string encodes");
    match protocol {
        Protocol::Anthropic => {
            out.push_str("event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":1,\"output_tokens\":1}}}\n\n");
            out.push_str("event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n");
            for t in texts {
                out.push_str(&format!("event: content_block_delta\ndata: {{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{{\"type\":\"text_delta\",\"text\":{}}}}}\n\n", json(t)));
            }
            out.push_str("event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n");
            out.push_str("event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":2}}\n\n");
            out.push_str("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n");
        }
        _ => {
            for t in texts {
                out.push_str(&format!(
                    "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":{}}}}}]}}\n\n",
                    json(t)
                ));
            }
            out.push_str(
                "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
            );
            out.push_str("data: [DONE]\n\n");
        }
    }
    out.into_bytes()
}

fn config() -> ProptestConfig {
    ProptestConfig {
        // PROPTEST_CASES (read by the default) sets the number of cases.
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource(
            "proptest-regressions",
        ))),
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn fuzz_any_bytes_end_in_frames_or_one_typed_error(
        protocol in protocol(),
        chunks in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..256), 0..32),
        limit in 1usize..4096,
    ) {
        let (_, error) = decode(protocol, chunks, limit);
        if let Some(e) = error {
            prop_assert!(
                matches!(
                    e,
                    StreamError::Malformed { .. }
                        | StreamError::FrameTooLarge { .. }
                        | StreamError::Truncated { .. }
                        | StreamError::Api { .. }
                        | StreamError::ContextOverflow { .. }
                ),
                "untyped or unexpected failure: {:?}", e
            );
        }
    }

    #[test]
    fn fuzz_valid_turns_round_trip_whatever_the_chunking(
        protocol in protocol(),
        texts in prop::collection::vec("\\PC{1,24}|[\\n\\r\"\\\\\u{0}-\u{1f}é✓]{1,8}", 1..12),
        points in prop::collection::vec(0usize..8192, 0..48),
    ) {
        let bytes = turn_with(protocol, &texts);
        let (frames, error) = decode(protocol, split(&bytes, points), 1 << 20);
        prop_assert_eq!(error, None);
        let got: Vec<String> = frames
            .iter()
            .filter_map(|f| match f {
                Frame::Event(AgentEvent::TextDelta(t)) => Some(t.clone()),
                _ => None,
            })
            .collect();
        prop_assert_eq!(got, texts);
    }
}
