//! One progress rule for both engines (issue 48): the same recorded
//! streams judged event by event by the proxy (the rule every attempt's
//! events are judged by, [`progress_of`]) and by a session (llm's decoder,
//! `decode_frames`, and [`AgentEvent::is_progress`] on what it yields). The
//! third column pins the rule itself (`docs/runtime-semantics.md`,
//! "Progress"): text, thinking or tool input that is not empty, a tool
//! call's start and end, and the reply's end are progress; a message's
//! start, pings, empty deltas, usage, a signature and a stop reason are
//! not. A Gemini stream has no session decoder of its own (Gemini CLI
//! reads it): its rows hold the proxy to llm's Gemini chunk decoder.

use futures_util::StreamExt as _;
use warden_core::{AgentEvent, Frame, StreamError};
use warden_llm::decode::decode_frames;
use warden_llm::sse::{Parsed, SseParser};

use super::progress_of;
use crate::upstream::Protocol;

/// A recorded stream: each event's bytes and whether it is progress.
type Recorded = &'static [(&'static str, bool)];

const ANTHROPIC: Recorded = &[
    (
        "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"claude-test\",\"content\":[],\"stop_reason\":null,\"usage\":{\"input_tokens\":12,\"output_tokens\":1}}}\n\n",
        false,
    ),
    ("event: ping\ndata: {\"type\":\"ping\"}\n\n", false),
    (
        "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"thinking\",\"thinking\":\"\"}}\n\n",
        false,
    ),
    (
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"thinking_delta\",\"thinking\":\"Let me see\"}}\n\n",
        true,
    ),
    (
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"signature_delta\",\"signature\":\"EqQBCgIYAhIM\"}}\n\n",
        false,
    ),
    (
        "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
        false,
    ),
    (
        "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":1,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
        false,
    ),
    (
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"text_delta\",\"text\":\"\"}}\n\n",
        false,
    ),
    (
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hello\"}}\n\n",
        true,
    ),
    (
        "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":1}\n\n",
        false,
    ),
    (
        "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":2,\"content_block\":{\"type\":\"tool_use\",\"id\":\"toolu_1\",\"name\":\"ls\",\"input\":{}}}\n\n",
        true,
    ),
    (
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":2,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"\"}}\n\n",
        false,
    ),
    (
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":2,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\\\"path\\\":\"}}\n\n",
        true,
    ),
    (
        "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":2}\n\n",
        true,
    ),
    (
        "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"tool_use\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":30}}\n\n",
        false,
    ),
    (
        "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
        true,
    ),
];

const CHAT: Recorded = &[
    (
        "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}]}\n\n",
        false,
    ),
    (
        "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hel\"},\"finish_reason\":null}]}\n\n",
        true,
    ),
    (
        "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"\"},\"finish_reason\":null}]}\n\n",
        false,
    ),
    (": keep-alive\n\n", false),
    (
        "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"reasoning_content\":\"hmm\"},\"finish_reason\":null}]}\n\n",
        true,
    ),
    (
        "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"ls\",\"arguments\":\"\"}}]},\"finish_reason\":null}]}\n\n",
        true,
    ),
    (
        "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"{\\\"p\\\":1}\"}}]},\"finish_reason\":null}]}\n\n",
        true,
    ),
    (
        "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"tool_calls\"}]}\n\n",
        true,
    ),
    (
        "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":7,\"total_tokens\":12}}\n\n",
        false,
    ),
    ("data: [DONE]\n\n", true),
];

const RESPONSES: Recorded = &[
    (
        "event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_1\",\"object\":\"response\",\"status\":\"in_progress\",\"output\":[]}}\n\n",
        false,
    ),
    (
        "event: response.in_progress\ndata: {\"type\":\"response.in_progress\",\"sequence_number\":1,\"response\":{\"id\":\"resp_1\",\"object\":\"response\",\"status\":\"in_progress\",\"output\":[]}}\n\n",
        false,
    ),
    (
        "event: response.output_item.added\ndata: {\"type\":\"response.output_item.added\",\"sequence_number\":2,\"output_index\":0,\"item\":{\"type\":\"message\",\"id\":\"msg_1\",\"status\":\"in_progress\",\"role\":\"assistant\",\"content\":[]}}\n\n",
        false,
    ),
    (
        "event: response.content_part.added\ndata: {\"type\":\"response.content_part.added\",\"sequence_number\":3,\"item_id\":\"msg_1\",\"output_index\":0,\"content_index\":0,\"part\":{\"type\":\"output_text\",\"text\":\"\",\"annotations\":[]}}\n\n",
        false,
    ),
    (
        "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"sequence_number\":4,\"item_id\":\"msg_1\",\"output_index\":0,\"content_index\":0,\"delta\":\"\"}\n\n",
        false,
    ),
    (
        "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"sequence_number\":5,\"item_id\":\"msg_1\",\"output_index\":0,\"content_index\":0,\"delta\":\"Hi\"}\n\n",
        true,
    ),
    (
        "event: response.output_text.done\ndata: {\"type\":\"response.output_text.done\",\"sequence_number\":6,\"item_id\":\"msg_1\",\"output_index\":0,\"content_index\":0,\"text\":\"Hi\"}\n\n",
        false,
    ),
    (
        "event: response.output_item.done\ndata: {\"type\":\"response.output_item.done\",\"sequence_number\":7,\"output_index\":0,\"item\":{\"type\":\"message\",\"id\":\"msg_1\",\"status\":\"completed\",\"role\":\"assistant\",\"content\":[{\"type\":\"output_text\",\"text\":\"Hi\",\"annotations\":[]}]}}\n\n",
        false,
    ),
    (
        "event: response.output_item.added\ndata: {\"type\":\"response.output_item.added\",\"sequence_number\":8,\"output_index\":1,\"item\":{\"type\":\"function_call\",\"id\":\"fc_1\",\"call_id\":\"call_1\",\"name\":\"ls\",\"arguments\":\"\",\"status\":\"in_progress\"}}\n\n",
        true,
    ),
    (
        "event: response.function_call_arguments.delta\ndata: {\"type\":\"response.function_call_arguments.delta\",\"sequence_number\":9,\"item_id\":\"fc_1\",\"output_index\":1,\"delta\":\"{\\\"p\\\":1}\"}\n\n",
        true,
    ),
    (
        "event: response.output_item.done\ndata: {\"type\":\"response.output_item.done\",\"sequence_number\":10,\"output_index\":1,\"item\":{\"type\":\"function_call\",\"id\":\"fc_1\",\"call_id\":\"call_1\",\"name\":\"ls\",\"arguments\":\"{\\\"p\\\":1}\",\"status\":\"completed\"}}\n\n",
        true,
    ),
    (
        "event: response.completed\ndata: {\"type\":\"response.completed\",\"sequence_number\":11,\"response\":{\"id\":\"resp_1\",\"object\":\"response\",\"status\":\"completed\",\"output\":[],\"usage\":{\"input_tokens\":5,\"output_tokens\":9,\"total_tokens\":14}}}\n\n",
        true,
    ),
];

const GEMINI: Recorded = &[
    (
        "data: {\"candidates\":[{\"content\":{\"parts\":[{\"text\":\"Let me see\",\"thought\":true}],\"role\":\"model\"},\"index\":0}],\"usageMetadata\":{\"promptTokenCount\":10}}\n\n",
        true,
    ),
    (
        "data: {\"candidates\":[{\"content\":{\"parts\":[{\"text\":\"\"}],\"role\":\"model\"},\"index\":0}]}\n\n",
        false,
    ),
    (
        "data: {\"candidates\":[{\"content\":{\"parts\":[{\"text\":\"Hello\"}],\"role\":\"model\"},\"index\":0}]}\n\n",
        true,
    ),
    (
        "data: {\"usageMetadata\":{\"promptTokenCount\":10,\"candidatesTokenCount\":3}}\n\n",
        false,
    ),
    (
        "data: {\"candidates\":[{\"content\":{\"parts\":[{\"functionCall\":{\"name\":\"ls\",\"args\":{}}}],\"role\":\"model\"},\"index\":0}]}\n\n",
        true,
    ),
    (
        "data: {\"candidates\":[{\"content\":{\"parts\":[],\"role\":\"model\"},\"finishReason\":\"STOP\",\"index\":0}],\"usageMetadata\":{\"promptTokenCount\":10,\"candidatesTokenCount\":4}}\n\n",
        true,
    ),
];

/// The event of `bytes` (a recorded event), if it is one (not a comment).
fn event_of(bytes: &str) -> Option<warden_llm::sse::SseEvent> {
    let mut parsed = std::collections::VecDeque::new();
    SseParser::new(1 << 20)
        .feed(bytes.as_bytes(), &mut parsed)
        .expect("a recorded event parses");
    match parsed.pop_front() {
        Some(Parsed::Event(event)) => Some(event),
        _ => None,
    }
}

/// What a session's decoder yields for the first `n` events of `stream`
/// (what follows a break in the stream left out).
async fn session_frames(protocol: warden_llm::Protocol, stream: Recorded, n: usize) -> Vec<Frame> {
    let bytes: Vec<Result<Vec<u8>, StreamError>> = stream[..n]
        .iter()
        .map(|(b, _)| Ok(b.as_bytes().to_vec()))
        .collect();
    decode_frames(protocol, futures_util::stream::iter(bytes), 1 << 20)
        .take_while(|f| std::future::ready(f.is_ok()))
        .map(|f| f.expect("kept only while ok"))
        .collect()
        .await
}

/// A session's judgement of each event of `stream`: whether the frames
/// the decoder yields for it hold progress.
async fn session_judges(protocol: warden_llm::Protocol, stream: Recorded) -> Vec<bool> {
    let mut judged = Vec::new();
    let mut before = 0;
    for n in 1..=stream.len() {
        let frames = session_frames(protocol, stream, n).await;
        judged.push(
            frames[before.min(frames.len())..]
                .iter()
                .any(|f| matches!(f, Frame::Event(e) if e.is_progress())),
        );
        before = frames.len();
    }
    judged
}

/// The proxy's judgement of each event of `stream`.
fn proxy_judges(protocol: Protocol, stream: Recorded) -> Vec<bool> {
    let mut progress = progress_of(protocol);
    stream
        .iter()
        .map(|(bytes, _)| event_of(bytes).is_some_and(|e| progress.judge(&e)))
        .collect()
}

fn rule(stream: Recorded) -> Vec<bool> {
    stream.iter().map(|(_, p)| *p).collect()
}

/// Each event side by side, for a failure's message.
fn table(stream: Recorded, proxy: &[bool], session: &[bool]) -> String {
    let mut rows = String::from("proxy session rule  event\n");
    for (((bytes, rule), p), s) in stream.iter().zip(proxy).zip(session) {
        let head: String = bytes
            .lines()
            .last()
            .unwrap_or("")
            .chars()
            .take(110)
            .collect();
        rows.push_str(&format!("{p:5} {s:7} {rule:5} {head}\n"));
    }
    rows
}

#[tokio::test]
async fn the_proxy_and_a_session_judge_every_event_of_the_same_streams_alike() {
    for (protocol, wire, stream) in [
        (
            Protocol::Messages,
            warden_llm::Protocol::Anthropic,
            ANTHROPIC,
        ),
        (
            Protocol::ChatCompletions,
            warden_llm::Protocol::OpenAi,
            CHAT,
        ),
        (
            Protocol::Responses,
            warden_llm::Protocol::OpenAiResponses,
            RESPONSES,
        ),
    ] {
        let proxy = proxy_judges(protocol, stream);
        let session = session_judges(wire, stream).await;
        assert!(
            proxy == session && session == rule(stream),
            "{protocol:?}: the proxy, a session and the rule disagree:\n{}",
            table(stream, &proxy, &session)
        );
    }
}

#[test]
fn a_gemini_stream_is_judged_as_its_chunk_decoder_reads_it() {
    let proxy = proxy_judges(Protocol::Gemini, GEMINI);
    let decoded: Vec<bool> = GEMINI
        .iter()
        .map(|(bytes, _)| {
            let event = event_of(bytes).expect("an event");
            let chunk = warden_llm::gemini::decode_chunk(&event.data).expect("a chunk");
            // The chunk with the finish reason is the reply's end.
            chunk.finished || chunk.events.iter().any(AgentEvent::is_progress)
        })
        .collect();
    assert!(
        proxy == decoded && decoded == rule(GEMINI),
        "Gemini: the proxy, the decoder and the rule disagree:\n{}",
        table(GEMINI, &proxy, &decoded)
    );
}
