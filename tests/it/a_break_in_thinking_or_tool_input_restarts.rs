//! End to end over HTTP through the mock: a stream that stalls inside a
//! thinking block (no signature yet) or inside a tool call's partial input
//! cannot be continued; the watchdog kills it and the turn restarts from
//! scratch (no prefill is sent), the consumer told to discard. Real time
//! with a short allowance.

use std::sync::Arc;
use std::time::Duration;

use crate::common::Within;

use warden_mock::{MockConfig, MockServer, Scenario};

const REPLY: &str = "All tests pass after the fix to the connection timeout.";

async fn run(stall: Scenario) -> (Vec<&'static str>, String, MockServer) {
    let mock = MockServer::start(
        MockConfig::default()
            .with_sequence([stall, Scenario::Normal])
            .with_reply(REPLY),
    )
    .await
    .expect("mock");
    let source = Arc::new(
        warden_llm::AnthropicSource::new(
            warden_llm::AnthropicOptions::default()
                .with_base_url(mock.base_url())
                .with_api_key("dummy"),
        )
        .expect("source"),
    );
    let sup = crate::common::supervisor_over(source, Duration::from_millis(300)).await;
    let turn = sup.send("ws", "run the tests").await.expect("send");
    let c = crate::common::consume(turn).patiently("the turn").await;
    let text = c.text().to_owned();
    assert_eq!(c.shown, text, "what the consumer shows is the answer");
    sup.shutdown().await;
    (c.notices, text, mock)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stall_inside_a_thinking_block_restarts_the_turn() {
    let (notices, text, mock) = run(Scenario::StallInThinking).await;
    assert_eq!(notices, ["retrying"]);
    assert_eq!(text, REPLY);
    let requests = mock.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(
        requests[1].continuation, None,
        "no prefill of a thinking block"
    );
    mock.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stall_inside_a_tool_calls_input_restarts_the_turn() {
    let (notices, text, mock) = run(Scenario::StallInToolInput).await;
    assert_eq!(notices, ["retrying"]);
    assert_eq!(text, REPLY, "the partial text and tool call were discarded");
    let requests = mock.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(
        requests[1].continuation, None,
        "a partial tool call is never continued"
    );
    mock.shutdown().await;
}
