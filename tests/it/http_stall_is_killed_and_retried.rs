//! The whole chain on a real transport: the Anthropic SSE source over HTTP
//! against the mock server. The first response stalls after a few frames
//! with the socket held open; the watchdog kills it, the client closes the
//! connection (the server sees it), and the retry succeeds. Real time with
//! a short allowance.

use std::time::Duration;

use crate::common::Within;
use warden_core::{LifecycleEvent, RetryPolicy};
use warden_mock::{MockConfig, MockServer, Scenario};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_stall_is_killed_the_socket_closed_and_the_retry_succeeds() {
    let mock = MockServer::start(
        MockConfig::default()
            .with_sequence([Scenario::Stall, Scenario::Normal])
            .with_fault_after_frames(3),
    )
    .await
    .expect("mock");
    let sup = crate::common::anthropic_supervisor(
        mock.base_url(),
        Duration::from_millis(400),
        RetryPolicy::default().with_backoff(Duration::from_millis(20), Duration::from_millis(50)),
    )
    .await;
    let mut events = sup.subscribe();
    let t0 = std::time::Instant::now();
    let turn = sup.send("ws", "hello").await.expect("send");
    let (text, summary) = turn
        .finish()
        .patiently("the turn to finish")
        .await
        .expect("the retry succeeds");
    assert!(!text.is_empty());
    assert_eq!(summary.attempts, 2);
    // Bounded: the kill came after the allowance, well before a hang.
    assert!(t0.elapsed() >= Duration::from_millis(400));
    let mut timed_out = false;
    while let Ok(ev) = events.try_recv() {
        if let LifecycleEvent::StreamTimedOut { silent_for, .. } = ev {
            assert!(silent_for >= Duration::from_millis(400));
            timed_out = true;
        }
    }
    assert!(timed_out, "the watchdog killed the stalled stream");
    assert!(
        mock.wait_for_client_close(1, Duration::from_secs(5)).await,
        "the server saw the stalled connection closed by the client"
    );
    assert_eq!(mock.requests_to("/v1/messages"), 2);
    sup.shutdown().await;
    mock.shutdown().await;
}
