//! OpenAI's Responses API end to end over HTTP through the mock: a stream
//! that stalls mid-text is killed by the watchdog and re-attached after the
//! last event received (`GET /v1/responses/{id}?stream=true&starting_after=N`)
//! — the consumer gets the reply once, and no token is generated again.
//! Real time with a short allowance.

use std::sync::Arc;
use std::time::Duration;

use crate::common::Within;

use warden_mock::{Endpoint, MockConfig, MockServer, Scenario};

const REPLY: &str = "Background responses keep generating when the connection drops, \
so a client that comes back asks only for the events it has not seen yet.";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_response_is_reattached_and_nothing_is_generated_twice() {
    let mock = MockServer::start(
        MockConfig::default()
            .with_sequence([Scenario::Stall, Scenario::Normal])
            .with_reply(REPLY)
            .with_fault_after_frames(7), // 4 opening events, 3 text deltas
    )
    .await
    .expect("mock");
    let source = Arc::new(
        warden_llm::OpenAiResponsesSource::new(
            warden_llm::OpenAiResponsesOptions::default()
                .with_base_url(mock.base_url())
                .with_api_key("dummy"),
        )
        .expect("source"),
    );
    let sup = crate::common::supervisor_over(source, Duration::from_millis(300)).await;

    let turn = sup.send("ws", "why background mode?").await.expect("send");
    let c = crate::common::consume(turn).patiently("the turn").await;
    let (shown, notices) = (&c.shown, &c.notices);
    let summary = c.result.as_ref().expect("answered");
    assert_eq!(summary.text, REPLY);
    assert_eq!(shown, REPLY, "the consumer's text, nothing twice");
    assert_eq!(*notices, ["continuing"]);
    let requests = mock.requests();
    assert_eq!(requests.len(), 2, "{requests:#?}");
    assert_eq!(requests[0].endpoint, Endpoint::OpenAiResponses);
    assert_eq!(requests[1].endpoint, Endpoint::OpenAiResponse);
    assert_eq!(requests[1].method, "GET");
    assert!(
        requests[1]
            .query
            .as_deref()
            .is_some_and(|q| q.contains("stream=true") && q.contains("starting_after=6")),
        "re-attached after the last event seen: {:?}",
        requests[1].query
    );
    assert_eq!(
        requests[1].output_tokens,
        Some(0),
        "nothing generated again"
    );
    sup.shutdown().await;
    mock.shutdown().await;
}
