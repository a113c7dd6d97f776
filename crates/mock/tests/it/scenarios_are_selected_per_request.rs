//! A request's scenario comes from its header, its model, its path prefix,
//! the server's sequence script or the server's default, in that order.

use crate::common;
use crate::common::anthropic_request;
use serde_json::Value;
use warden_mock::{MockConfig, MockServer, SCENARIO_HEADER, Scenario, Selection};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// Sends a streaming Messages request, returns the HTTP status (the body
/// is not read: a stall would never end).
async fn status_of(server: &MockServer, path: &str, model: &str, header: Option<&str>) -> u16 {
    let mut req = reqwest::Client::new()
        .post(server.url(path))
        .header("content-type", "application/json")
        .body(anthropic_request(model, true).to_string());
    if let Some(h) = header {
        req = req.header(SCENARIO_HEADER, h);
    }
    req.send().await.expect("send").status().as_u16()
}

fn played(server: &MockServer) -> Vec<(Option<Scenario>, Option<Selection>)> {
    server
        .requests()
        .iter()
        .map(|r| (r.scenario, r.selection))
        .collect()
}

#[tokio::test]
async fn header_beats_model_beats_path_beats_default() -> TestResult {
    let server = MockServer::start(MockConfig::scenario(Scenario::ServerError)).await?;
    let path = "/scenario/overloaded/v1/messages";
    assert_eq!(
        status_of(&server, path, "mock-rate-limited", Some("prompt-too-long")).await,
        400
    );
    assert_eq!(
        status_of(&server, path, "mock-rate-limited", None).await,
        429
    );
    assert_eq!(
        status_of(&server, path, "claude-x:rate-limited", None).await,
        429
    );
    assert_eq!(status_of(&server, path, "claude-x", None).await, 529);
    assert_eq!(
        status_of(&server, "/v1/messages", "claude-x", None).await,
        500
    );
    assert_eq!(
        played(&server),
        [
            (Some(Scenario::PromptTooLong), Some(Selection::Header)),
            (Some(Scenario::RateLimited), Some(Selection::Model)),
            (Some(Scenario::RateLimited), Some(Selection::Model)),
            (Some(Scenario::Overloaded), Some(Selection::Path)),
            (Some(Scenario::ServerError), Some(Selection::Default)),
        ]
    );
    server.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn the_sequence_plays_in_order_then_repeats_its_last_entry() -> TestResult {
    let server = MockServer::start(MockConfig::default().with_sequence([
        Scenario::Overloaded,
        Scenario::RateLimited,
        Scenario::Normal,
    ]))
    .await?;
    let mut statuses = Vec::new();
    for _ in 0..5 {
        statuses.push(status_of(&server, "/v1/messages", "m", None).await);
    }
    assert_eq!(statuses, [529, 429, 200, 200, 200]);
    let selections: Vec<_> = played(&server).into_iter().map(|p| p.1).collect();
    assert_eq!(
        selections,
        [0, 1, 2, 2, 2].map(|n| Some(Selection::Sequence(n)))
    );
    server.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn explicitly_selected_requests_do_not_use_up_the_sequence() -> TestResult {
    let server = MockServer::start(
        MockConfig::default().with_sequence([Scenario::ServerError, Scenario::Normal]),
    )
    .await?;
    assert_eq!(
        status_of(&server, "/v1/messages", "m", Some("normal")).await,
        200
    );
    assert_eq!(
        status_of(&server, "/v1/messages", "mock-overloaded", None).await,
        529
    );
    assert_eq!(status_of(&server, "/v1/messages", "m", None).await, 500);
    assert_eq!(status_of(&server, "/v1/messages", "m", None).await, 200);
    server.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn first_attempt_stalls_and_the_retry_succeeds() -> TestResult {
    let server =
        MockServer::start(MockConfig::default().with_sequence([Scenario::Stall, Scenario::Normal]))
            .await?;
    let client = reqwest::Client::new();
    let send = || {
        client
            .post(server.url("/v1/messages?beta=true"))
            .header("content-type", "application/json")
            .body(anthropic_request("m", true).to_string())
            .send()
    };
    // Attempt 1: the body never completes; a client watchdog gives up.
    let mut first = send().await?;
    let first_chunk = first.chunk().await?;
    assert!(first_chunk.is_some());
    let waited = tokio::time::timeout(std::time::Duration::from_millis(300), async {
        while first.chunk().await.ok().flatten().is_some() {}
    })
    .await;
    assert!(waited.is_err(), "the stalled body must not end");
    drop(first);
    assert!(server.wait_for_client_close(1, common::WITHIN).await);

    // Attempt 2 completes.
    let text = send().await?.text().await?;
    assert!(text.contains("event: message_stop"), "{text}");
    assert_eq!(server.requests_to("/v1/messages"), 2);
    assert_eq!(server.closed_by_client(), 1);
    server.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn unknown_scenario_names_are_rejected_with_the_list_of_names() -> TestResult {
    let server = MockServer::start(MockConfig::default()).await?;
    let resp = reqwest::Client::new()
        .post(server.url("/v1/messages"))
        .header(SCENARIO_HEADER, "nope")
        .body(anthropic_request("m", true).to_string())
        .send()
        .await?;
    assert_eq!(resp.status(), 400);
    let body: Value = serde_json::from_str(&resp.text().await?)?;
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("abrupt-close"), "{message}");

    assert_eq!(
        status_of(&server, "/scenario/nope/v1/messages", "m", None).await,
        404
    );
    // An unknown `mock-…` model is just a model name.
    assert_eq!(
        status_of(&server, "/v1/messages", "mock-nope", None).await,
        200
    );
    server.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn scenario_base_url_selects_by_path() -> TestResult {
    let server = MockServer::start(MockConfig::default()).await?;
    let url = format!(
        "{}/v1/messages",
        server.scenario_base_url(Scenario::Overloaded)
    );
    let resp = reqwest::Client::new()
        .post(url)
        .body(anthropic_request("m", true).to_string())
        .send()
        .await?;
    assert_eq!(resp.status().as_u16(), 529);
    assert_eq!(server.requests_to("/scenario/overloaded/v1/messages"), 1);
    server.shutdown().await;
    Ok(())
}

/// Each session plays its own script, whichever request comes first:
/// worker-1's first request is rate-limited (the scripted fault), the
/// planner's requests and worker-2's are not, and the global sequence is
/// not used up by them.
#[tokio::test]
async fn each_session_plays_its_own_script() -> TestResult {
    let server = MockServer::start(
        MockConfig::default()
            .with_sequence([Scenario::ServerError, Scenario::Normal])
            .with_script("worker-1", [Scenario::RateLimited, Scenario::Normal])
            .with_script("planner", [Scenario::Normal]),
    )
    .await?;
    let session = |key: &str| format!("/session/{key}/v1/messages");
    assert_eq!(
        status_of(&server, &session("planner"), "claude-x", None).await,
        200
    );
    assert_eq!(
        status_of(&server, &session("worker-1"), "claude-x", None).await,
        429
    );
    assert_eq!(
        status_of(&server, &session("planner"), "claude-x", None).await,
        200
    );
    assert_eq!(
        status_of(&server, &session("worker-1"), "claude-x", None).await,
        200
    );
    assert_eq!(
        status_of(&server, &session("worker-1"), "claude-x", None).await,
        200
    );
    // A session without a script plays the global sequence, from its start.
    assert_eq!(
        status_of(&server, &session("worker-2"), "claude-x", None).await,
        500
    );
    assert_eq!(
        played(&server),
        [
            (Some(Scenario::Normal), Some(Selection::Session(0))),
            (Some(Scenario::RateLimited), Some(Selection::Session(0))),
            (Some(Scenario::Normal), Some(Selection::Session(0))),
            (Some(Scenario::Normal), Some(Selection::Session(1))),
            (Some(Scenario::Normal), Some(Selection::Session(1))),
            (Some(Scenario::ServerError), Some(Selection::Sequence(0))),
        ]
    );
    Ok(())
}
