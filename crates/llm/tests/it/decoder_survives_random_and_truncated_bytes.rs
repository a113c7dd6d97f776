//! The SSE → Frame decoder, driven from memory: any bytes, split anywhere
//! or cut short, never panic, never buffer past the frame limit, and give
//! the same events whatever the chunking.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use futures_util::{StreamExt, stream};
use proptest::prelude::*;
use warden_core::{AgentEvent, Frame, StreamError};
use warden_llm::decode::{Protocol, decode_frames};

use crate::support::memory::{decode, drain, split};

fn events(frames: &[Frame]) -> Vec<AgentEvent> {
    frames
        .iter()
        .filter_map(|f| match f {
            Frame::Event(e) => Some(e.clone()),
            Frame::KeepAlive => None,
        })
        .collect()
}

const ANTHROPIC_TURN: &str = concat!(
    ": keep-alive\n\n",
    "event: message_start\r\n",
    "data: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":25,\"cache_creation_input_tokens\":3,\"cache_read_input_tokens\":7,\"output_tokens\":1}}}\r\n\r\n",
    "event: content_block_start\n",
    "data: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
    "event: ping\n",
    "data: {\"type\": \"ping\"}\n\n",
    "event: content_block_delta\n",
    "data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Héllo ✓ wörld\"}}\n\n",
    "event: content_block_stop\n",
    "data: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
    "event: content_block_start\n",
    "data: {\"type\":\"content_block_start\",\"index\":1,\"content_block\":{\"type\":\"tool_use\",\"id\":\"toolu_1\",\"name\":\"bash\",\"input\":{}}}\n\n",
    "event: content_block_delta\n",
    "data: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\\\"cmd\\\":\\\"ls\\\"}\"}}\n\n",
    "event: content_block_stop\n",
    "data: {\"type\":\"content_block_stop\",\"index\":1}\n\n",
    ":\n\n",
    "event: message_delta\n",
    "data: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"tool_use\"},\"usage\":{\"output_tokens\":15}}\n\n",
    "event: message_stop\n",
    "data: {\"type\":\"message_stop\"}\n\n",
);

const OPENAI_TURN: &str = concat!(
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n",
    ": keep-alive\n\n",
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Héllo ✓\"}}]}\n\n",
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"call_1\",\"function\":{\"name\":\"bash\",\"arguments\":\"{\\\"a\\\"\"}}]}}]}\n\n",
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\":1}\"}}]}}]}\n\n",
    "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"tool_calls\"}]}\n\n",
    "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":4}}\n\n",
    "data: [DONE]\n\n",
);

/// Raw SSE frames of a turn: comment lines and blank-line-terminated events.
fn raw_frames(body: &[u8]) -> usize {
    let text = std::str::from_utf8(body)
        .expect("utf-8")
        .replace("\r\n", "\n");
    let comments = text.lines().filter(|l| l.starts_with(':')).count();
    let events = text
        .split("\n\n")
        .filter(|e| e.lines().any(|l| !l.is_empty() && !l.starts_with(':')))
        .count();
    comments + events
}

fn turn(protocol: Protocol) -> &'static [u8] {
    match protocol {
        Protocol::Anthropic => ANTHROPIC_TURN.as_bytes(),
        _ => OPENAI_TURN.as_bytes(),
    }
}

fn protocol() -> impl Strategy<Value = Protocol> {
    prop_oneof![Just(Protocol::Anthropic), Just(Protocol::OpenAi)]
}

/// Fragments that look like SSE, to reach past the first parse error.
fn sse_ish() -> impl Strategy<Value = Vec<Vec<u8>>> {
    let token = prop_oneof![
        Just(b"event: ".to_vec()),
        Just(b"data: ".to_vec()),
        Just(b"\n".to_vec()),
        Just(b"\r\n".to_vec()),
        Just(b"\r".to_vec()),
        Just(b"\n\n".to_vec()),
        Just(b": keep-alive".to_vec()),
        Just(b"ping".to_vec()),
        Just(b"{\"type\":\"ping\"}".to_vec()),
        Just(b"{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"x\"}}".to_vec()),
        Just(b"{\"type\":\"content_block_start\",\"index\":1,\"content_block\":{\"type\":\"tool_use\",\"id\":\"t\",\"name\":\"n\"}}".to_vec()),
        Just(b"{\"type\":\"content_block_stop\",\"index\":1}".to_vec()),
        Just(b"{\"type\":\"message_stop\"}".to_vec()),
        Just(b"{\"choices\":[{\"delta\":{\"content\":\"y\",\"tool_calls\":[{\"index\":3}]}}]}".to_vec()),
        Just(b"[DONE]".to_vec()),
        Just("é✓".as_bytes().to_vec()),
        Just(vec![0xff]),
        prop::collection::vec(any::<u8>(), 0..8),
    ];
    prop::collection::vec(token, 0..40)
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 128,
        // Replays (and records) the failures kept next to this file, in
        // decoder_survives_random_and_truncated_bytes.proptest-regressions.
        failure_persistence: Some(Box::new(
            proptest::test_runner::FileFailurePersistence::WithSource("proptest-regressions"),
        )),
        ..ProptestConfig::default()
    })]

    #[test]
    fn random_bytes_never_panic_and_respect_the_limit(
        protocol in protocol(),
        chunks in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..96), 0..24),
        limit in 8usize..512,
    ) {
        let (frames, error) = decode(protocol, chunks, limit);
        if let Some(StreamError::FrameTooLarge { size, limit: l }) = error {
            prop_assert_eq!(l, limit);
            prop_assert!(size > limit);
        }
        for e in events(&frames) {
            if let AgentEvent::TextDelta(t) | AgentEvent::ThinkingDelta(t) = e {
                prop_assert!(t.len() <= limit);
            }
        }
    }

    #[test]
    fn sse_like_bytes_never_panic_and_end(
        protocol in protocol(),
        tokens in sse_ish(),
        points in prop::collection::vec(0usize..2048, 0..16),
        limit in 16usize..1024,
    ) {
        let bytes = tokens.concat();
        let (_, error) = decode(protocol, split(&bytes, points), limit);
        if let Some(StreamError::Malformed { message }) = error {
            prop_assert!(!message.contains("keep-alive") && !message.contains("DONE") && !message.contains("é✓"), "{}", message);
        }
    }

    #[test]
    fn any_chunking_of_a_turn_gives_the_same_events_and_liveness(
        protocol in protocol(),
        points in prop::collection::vec(0usize..4096, 0..40),
    ) {
        let whole = decode(protocol, vec![turn(protocol).to_vec()], 1 << 20);
        prop_assert_eq!(&whole.1, &None);
        let chunks = split(turn(protocol), points);
        let (frames, error) = decode(protocol, chunks, 1 << 20);
        prop_assert_eq!(error, None);
        // Liveness is frames, not reads: the same frames whatever the
        // chunking, at least one per raw SSE frame.
        prop_assert_eq!(&frames, &whole.0);
        prop_assert!(frames.len() >= raw_frames(turn(protocol)));
    }

    #[test]
    fn a_turn_cut_short_is_truncated_after_a_prefix_of_its_events(
        protocol in protocol(),
        cut in 0usize..4096,
        points in prop::collection::vec(0usize..4096, 0..20),
    ) {
        let full = turn(protocol);
        let cut = cut % full.len(); // strictly shorter than the whole turn
        let all = events(&decode(protocol, vec![full.to_vec()], 1 << 20).0);
        let (frames, error) = decode(protocol, split(&full[..cut], points), 1 << 20);
        let got = events(&frames);
        prop_assert!(matches!(error, Some(StreamError::Truncated { .. })), "{:?}", error);
        prop_assert!(got.len() < all.len());
        prop_assert_eq!(&all[..got.len()], &got[..]);
    }

    #[test]
    fn an_endless_frame_is_refused_after_at_most_the_limit(
        protocol in protocol(),
        prefix in sse_ish(),
        tail in prop::collection::vec(b'a'..=b'z', 1..64),
        newline_in_tail in any::<bool>(),
        limit in 16usize..2048,
    ) {
        let prefix = prefix.concat();
        let mut tail = tail;
        if newline_in_tail {
            tail.push(b'\n'); // endless short lines, never a blank one
        }
        let pulled = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&pulled);
        let tail_len = tail.len();
        let bytes = stream::iter([Ok::<_, StreamError>(prefix.clone())])
            .chain(stream::repeat(tail).map(move |t| {
                counter.fetch_add(t.len(), Ordering::Relaxed);
                Ok(t)
            }));
        let max_items = 4 * (prefix.len() + limit + tail_len) + 64;
        let (_, error) = drain(decode_frames(protocol, bytes, limit), max_items);
        // The prefix may end the stream on its own (an error, a terminal
        // event); otherwise the endless frame must be refused in time.
        if let Some(StreamError::FrameTooLarge { limit: l, .. }) = error {
            prop_assert_eq!(l, limit);
            // At most: the end of a comment line begun in the prefix (one
            // tail chunk), the limit, and the chunk that crossed it.
            prop_assert!(pulled.load(Ordering::Relaxed) <= limit + 2 * tail_len);
        } else {
            prop_assert!(error.is_some() || pulled.load(Ordering::Relaxed) == 0, "{:?}", error);
        }
    }
}

#[test]
fn only_complete_frames_are_signs_of_life() {
    let frame = b"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi\"}}\n\n";
    let chunks = vec![
        frame[..10].to_vec(),
        frame[10..40].to_vec(),
        frame[40..].to_vec(),
        b"\n\n\r\n".to_vec(), // bare blank lines: nothing
        b": keep-alive\n\n: again\n\nevent: ping\n\n".to_vec(),
        b"data: a partial li".to_vec(), // a partial line: nothing
    ];
    let (frames, error) = decode(Protocol::Anthropic, chunks, 4096);
    assert!(
        matches!(error, Some(StreamError::Truncated { .. })),
        "{error:?}"
    );
    assert_eq!(
        frames,
        vec![
            Frame::Event(AgentEvent::TextDelta("Hi".into())),
            Frame::KeepAlive, // two comments and a data-less event
            Frame::KeepAlive,
            Frame::KeepAlive,
        ]
    );
}

#[test]
fn a_multibyte_character_split_across_chunks_survives() {
    let frame =
        "data: {\"choices\":[{\"delta\":{\"content\":\"✓\"}}]}\n\ndata: [DONE]\n\n".as_bytes();
    let at = frame
        .iter()
        .position(|&b| b == 0xe2)
        .expect("the check mark")
        + 1;
    let (frames, error) = decode(
        Protocol::OpenAi,
        vec![frame[..at].to_vec(), frame[at..].to_vec()],
        4096,
    );
    assert_eq!(error, None);
    assert_eq!(events(&frames)[0], AgentEvent::TextDelta("✓".into()));
}

#[test]
fn a_transport_error_is_passed_through() {
    let bytes = stream::iter([
        Ok(b"data: {\"choices\":[]}\n\n".to_vec()),
        Err(StreamError::Connection {
            message: "reset".into(),
        }),
    ]);
    let (frames, error) = drain(decode_frames(Protocol::OpenAi, bytes, 4096), 100);
    assert_eq!(frames, vec![Frame::KeepAlive]);
    assert_eq!(
        error,
        Some(StreamError::Connection {
            message: "reset".into()
        })
    );
}
