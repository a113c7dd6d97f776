//! End to end over real HTTP through the mock: an Anthropic stream that
//! stalls mid-text is killed by the watchdog and *continued* — by prefill
//! for a model that takes it, by a continuation turn (overlap trimmed) for
//! one that refuses prefill, learned from the API's 400 once. The consumer
//! gets the intended reply exactly once; the continuation generates only
//! the rest. Real time with a short allowance.

use std::sync::Arc;
use std::time::Duration;

use crate::common::Within;
use warden_core::Supervisor;
use warden_mock::{MockConfig, MockServer, Scenario};

const REPLY: &str = "The quick brown fox jumps over the lazy dog, then naps under the old oak tree \
until the sun goes down behind the hills and the first stars come out over the quiet valley.";

async fn mock(sequence: &[Scenario]) -> MockServer {
    MockServer::start(
        MockConfig::default()
            .with_sequence(sequence.iter().copied())
            .with_reply(REPLY)
            .with_fault_after_frames(6), // message_start, block start, ping, 3 deltas
    )
    .await
    .expect("mock")
}

async fn supervisor(base_url: String, model: &str) -> Supervisor {
    let source = Arc::new(
        warden_llm::AnthropicSource::new(
            warden_llm::AnthropicOptions::default()
                .with_base_url(base_url)
                .with_model(model)
                .with_api_key("dummy"),
        )
        .expect("source"),
    );
    crate::common::supervisor_over(source, Duration::from_millis(300)).await
}

fn tokens(text: &str) -> u64 {
    (text.len() as u64).div_ceil(4).max(1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_that_takes_prefill_continues_the_reply_exactly() {
    let mock = mock(&[Scenario::Stall, Scenario::Normal]).await;
    let sup = supervisor(mock.base_url(), "claude-sonnet-4-5").await;
    let turn = sup.send("ws", "tell me about the fox").await.expect("send");
    let (_, summary) = turn.finish().patiently("the turn").await.expect("answered");
    assert_eq!(summary.text, REPLY, "the intended reply, once");
    assert_eq!((summary.attempts, summary.continuations), (2, 1));
    let requests = mock.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(requests[1].continuation, Some("prefill"));
    let generated = requests[1].output_tokens.expect("counted");
    assert!(
        generated < tokens(REPLY),
        "only the rest was generated: {generated} of {} tokens",
        tokens(REPLY)
    );
    sup.shutdown().await;
    mock.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_that_refuses_prefill_gets_a_continuation_turn_learned_once() {
    // Turn 1: stall, prefill refused (400), continuation turn. Turn 2:
    // stall, continuation turn at once.
    let mock = mock(&[
        Scenario::Stall,
        Scenario::Normal,
        Scenario::Normal,
        Scenario::Stall,
        Scenario::Normal,
    ])
    .await;
    let sup = supervisor(mock.base_url(), "claude-opus-4-8").await;
    for (turn, expected_requests) in [(1, 3), (2, 5)] {
        let t = sup.send("ws", "tell me about the fox").await.expect("send");
        let (_, summary) = t.finish().patiently("the turn").await.expect("answered");
        assert_eq!(summary.text, REPLY, "turn {turn}: the overlap was trimmed");
        assert_eq!(summary.continuations, 1, "turn {turn}");
        assert_eq!(mock.requests().len(), expected_requests, "turn {turn}");
    }
    let requests = mock.requests();
    assert_eq!(requests[1].status, Some(400), "the prefill was refused");
    assert_eq!(requests[2].continuation, Some("turn"));
    assert_eq!(
        requests[4].continuation,
        Some("turn"),
        "no second prefill try"
    );
    assert!(requests[4].output_tokens.expect("counted") < tokens(REPLY));
    sup.shutdown().await;
    mock.shutdown().await;
}
