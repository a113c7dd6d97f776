//! Every fault scenario is visible on the wire and in the server's log.

use std::time::{Duration, Instant};

use crate::common::{
    ReadEnd, WITHIN, anthropic_request, names, parse_sse, raw_request, raw_send, read_for,
};
use serde_json::Value;
use warden_mock::{MockConfig, MockServer, Outcome, Scenario, ServerEvent};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// Long enough to see that nothing more comes, short enough for a fast suite.
const QUIET: Duration = Duration::from_millis(300);

async fn stream_text(server: &MockServer, scenario: Scenario) -> reqwest::Result<String> {
    reqwest::Client::new()
        .post(server.url("/v1/messages"))
        .header("content-type", "application/json")
        .header("x-mock-scenario", scenario.to_string())
        .body(anthropic_request("m", true).to_string())
        .send()
        .await?
        .text()
        .await
}

#[tokio::test]
async fn stall_holds_the_socket_open_and_the_server_notices_the_client_closing_it() -> TestResult {
    let server = MockServer::start(MockConfig::scenario(Scenario::Stall)).await?;
    let mut live = server.subscribe();
    let mut raw = raw_request(
        server.addr(),
        "POST",
        "/v1/messages?beta=true",
        &[],
        &anthropic_request("m", true),
    )
    .await;
    assert_eq!(raw.status, 200);
    raw.read_until("content_block_delta").await;
    assert!(
        server
            .wait_for_event(|e| matches!(e, ServerEvent::Stalled { .. }), WITHIN)
            .await
            .is_some()
    );

    // Silence, but no EOF: the socket is held open.
    assert_eq!(raw.read_for(QUIET).await, ReadEnd::StillOpen);
    let frames = parse_sse(&raw.text());
    assert_eq!(
        names(&frames),
        [
            "message_start",
            "content_block_start",
            "ping",
            "content_block_delta"
        ]
    );
    assert!(!raw.complete(), "no final chunk");
    assert_eq!(server.closed_by_client(), 0);
    assert_eq!(server.request(1).map(|r| r.outcome), Some(Outcome::Stalled));

    // The client gives up: the server sees it.
    drop(raw);
    assert!(server.wait_for_client_close(1, WITHIN).await);
    assert_eq!(server.closed_by_client(), 1);
    let rec = server.request(1).ok_or("request 1")?;
    assert_eq!(rec.outcome, Outcome::ClientClosed);
    assert_eq!(rec.frames, 4);

    // The live channel saw the same story, in order.
    let mut story = Vec::new();
    while let Ok(e) = live.try_recv() {
        story.push(e);
    }
    assert!(
        matches!(
            story.as_slice(),
            [
                ServerEvent::RequestStarted {
                    id: 1,
                    scenario: Some(Scenario::Stall),
                    ..
                },
                ServerEvent::Stalled { id: 1, frames: 4 },
                ServerEvent::ClientClosed { id: 1, frames: 4 },
            ]
        ),
        "{story:?}"
    );
    server.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn a_client_leaving_a_live_stream_is_noticed_too() -> TestResult {
    let server = MockServer::start(
        MockConfig::scenario(Scenario::ThinkingPings).with_thinking_pause(Duration::from_secs(30)),
    )
    .await?;
    let mut raw = raw_request(
        server.addr(),
        "POST",
        "/v1/messages",
        &[],
        &anthropic_request("m", true),
    )
    .await;
    raw.read_until("event: ping").await;
    drop(raw);
    assert!(server.wait_for_client_close(1, WITHIN).await);
    let rec = server.request(1).ok_or("request 1")?;
    assert_eq!(rec.outcome, Outcome::ClientClosed);
    assert!(rec.frames >= 2, "{rec:?}");
    server.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn stall_after_zero_frames_sends_headers_only() -> TestResult {
    let server =
        MockServer::start(MockConfig::scenario(Scenario::Stall).with_fault_after_frames(0)).await?;
    let mut raw = raw_request(
        server.addr(),
        "POST",
        "/v1/messages",
        &[],
        &anthropic_request("m", true),
    )
    .await;
    assert_eq!(raw.status, 200);
    assert_eq!(raw.read_for(QUIET).await, ReadEnd::StillOpen);
    assert_eq!(raw.text(), "");
    assert!(!raw.complete(), "the body must not end");
    assert_eq!(server.request(1).map(|r| r.outcome), Some(Outcome::Stalled));
    server.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn abrupt_close_ends_the_connection_without_message_stop() -> TestResult {
    let server = MockServer::start(MockConfig::scenario(Scenario::AbruptClose)).await?;
    let mut raw = raw_request(
        server.addr(),
        "POST",
        "/v1/messages",
        &[],
        &anthropic_request("m", true),
    )
    .await;
    raw.read_to_eof().await;
    let frames = parse_sse(&raw.text());
    assert_eq!(
        names(&frames),
        [
            "message_start",
            "content_block_start",
            "ping",
            "content_block_delta"
        ]
    );
    assert!(!raw.complete(), "the chunked body must be cut, not ended");
    assert!(
        server
            .wait_for_event(
                |e| matches!(e, ServerEvent::ServerClosed { id: 1, frames: 4 }),
                WITHIN
            )
            .await
            .is_some()
    );
    assert_eq!(server.closed_by_client(), 0);
    server.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn abrupt_close_delivers_back_to_back_frames_before_the_cut() -> TestResult {
    let server = MockServer::start(
        MockConfig::scenario(Scenario::AbruptClose)
            .with_frame_interval(Duration::ZERO)
            .with_fault_after_frames(5),
    )
    .await?;
    let mut raw = raw_request(
        server.addr(),
        "POST",
        "/v1/messages",
        &[],
        &anthropic_request("m", true),
    )
    .await;
    raw.read_to_eof().await;
    assert_eq!(parse_sse(&raw.text()).len(), 5);
    assert!(!raw.complete());
    server.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn an_http_client_sees_an_abrupt_close_as_a_broken_body() -> TestResult {
    let server = MockServer::start(MockConfig::default()).await?;
    let err = stream_text(&server, Scenario::AbruptClose).await;
    assert!(err.is_err(), "{err:?}");
    server.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn rate_limited_answers_429_with_retry_after_headers() -> TestResult {
    let server = MockServer::start(
        MockConfig::scenario(Scenario::RateLimited).with_retry_after(Duration::from_millis(2500)),
    )
    .await?;
    let resp = reqwest::Client::new()
        .post(server.url("/v1/messages"))
        .body(anthropic_request("m", true).to_string())
        .send()
        .await?;
    assert_eq!(resp.status(), 429);
    assert_eq!(resp.headers()["retry-after"].to_str()?, "3");
    assert_eq!(resp.headers()["retry-after-ms"].to_str()?, "2500");
    let body: Value = serde_json::from_str(&resp.text().await?)?;
    assert_eq!(body["type"], "error");
    assert_eq!(body["error"]["type"], "rate_limit_error");
    server.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn http_error_scenarios_answer_with_anthropic_error_bodies() -> TestResult {
    let server = MockServer::start(MockConfig::default()).await?;
    let cases = [
        (Scenario::ServerError, 500, "api_error", None),
        (Scenario::Overloaded, 529, "overloaded_error", None),
        (Scenario::Unavailable, 503, "api_error", None),
        (
            Scenario::PromptTooLong,
            400,
            "invalid_request_error",
            Some("prompt is too long: 210000 tokens > 200000 maximum"),
        ),
    ];
    for (scenario, status, kind, message) in cases {
        for stream in [true, false] {
            let resp = reqwest::Client::new()
                .post(server.url("/v1/messages"))
                .header("x-mock-scenario", scenario.to_string())
                .body(anthropic_request("m", stream).to_string())
                .send()
                .await?;
            assert_eq!(resp.status().as_u16(), status, "{scenario}");
            assert_eq!(scenario.http_status(), status);
            let body: Value = serde_json::from_str(&resp.text().await?)?;
            assert_eq!(body["type"], "error", "{scenario}");
            assert_eq!(body["error"]["type"], kind, "{scenario}");
            assert!(body["error"]["message"].is_string());
            if let Some(m) = message {
                assert_eq!(body["error"]["message"], m);
            }
        }
    }
    server.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn midstream_error_sends_an_overloaded_error_event_instead_of_message_stop() -> TestResult {
    let server = MockServer::start(MockConfig::default()).await?;
    let frames = parse_sse(&stream_text(&server, Scenario::MidstreamError).await?);
    assert_eq!(
        names(&frames),
        [
            "message_start",
            "content_block_start",
            "ping",
            "content_block_delta",
            "error"
        ]
    );
    let err = frames[4].json();
    assert_eq!(err["type"], "error");
    assert_eq!(err["error"]["type"], "overloaded_error");
    assert_eq!(
        server.request(1).map(|r| r.outcome),
        Some(Outcome::Completed)
    );
    server.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn malformed_sends_exactly_one_frame_whose_data_is_not_json() -> TestResult {
    let server = MockServer::start(MockConfig::default()).await?;
    let frames = parse_sse(&stream_text(&server, Scenario::Malformed).await?);
    let bad: Vec<usize> = frames
        .iter()
        .enumerate()
        .filter(|(_, f)| serde_json::from_str::<Value>(f.data().unwrap_or("{}")).is_err())
        .map(|(i, _)| i)
        .collect();
    assert_eq!(bad, [4], "{frames:?}");
    assert_eq!(
        names(&frames).last().map(String::as_str),
        Some("message_stop")
    );
    server.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn oversized_sends_one_valid_frame_of_about_four_mebibytes() -> TestResult {
    let server = MockServer::start(MockConfig::default()).await?;
    let frames = parse_sse(&stream_text(&server, Scenario::Oversized).await?);
    let sizes: Vec<usize> = frames
        .iter()
        .map(|f| f.data().map_or(0, str::len))
        .collect();
    let big: Vec<usize> = sizes.iter().copied().filter(|&n| n > 10_000).collect();
    assert_eq!(big.len(), 1, "{sizes:?}");
    let four_mib = 4 * 1024 * 1024;
    assert!((four_mib - 1024..=four_mib).contains(&big[0]), "{}", big[0]);
    for f in &frames {
        let _ = f.json();
    }
    assert_eq!(
        names(&frames).last().map(String::as_str),
        Some("message_stop")
    );
    server.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn thinking_pings_fill_a_long_pause_before_the_reply() -> TestResult {
    let server = MockServer::start(
        MockConfig::default()
            .with_thinking_pause(Duration::from_millis(300))
            .with_ping_interval(Duration::from_millis(60)),
    )
    .await?;
    let started = Instant::now();
    let frames = parse_sse(&stream_text(&server, Scenario::ThinkingPings).await?);
    assert!(started.elapsed() >= Duration::from_millis(300));
    let names = names(&frames);
    assert_eq!(
        names[..7],
        [
            "message_start",
            "ping",
            "ping",
            "ping",
            "ping",
            "ping",
            "content_block_start"
        ]
    );
    assert_eq!(names.last().map(String::as_str), Some("message_stop"));
    server.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn a_non_streaming_stall_never_answers_and_notices_the_client_leaving() -> TestResult {
    let server = MockServer::start(MockConfig::scenario(Scenario::Stall)).await?;
    let mut socket = raw_send(
        server.addr(),
        "/v1/messages",
        &[],
        &anthropic_request("m", false),
    )
    .await;
    assert!(
        server
            .wait_for_event(
                |e| matches!(e, ServerEvent::Stalled { id: 1, frames: 0 }),
                WITHIN
            )
            .await
            .is_some()
    );
    let (got, end) = read_for(&mut socket, QUIET).await;
    assert_eq!((got.len(), end), (0, ReadEnd::StillOpen));
    drop(socket);
    assert!(server.wait_for_client_close(1, WITHIN).await);
    assert_eq!(server.request(1).and_then(|r| r.status), None);
    server.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn a_non_streaming_abrupt_close_closes_without_an_answer() -> TestResult {
    let server = MockServer::start(MockConfig::scenario(Scenario::AbruptClose)).await?;
    let mut socket = raw_send(
        server.addr(),
        "/v1/messages",
        &[],
        &anthropic_request("m", false),
    )
    .await;
    let (got, end) = read_for(&mut socket, WITHIN).await;
    assert_eq!(end, ReadEnd::Eof);
    assert!(got.is_empty(), "{}", String::from_utf8_lossy(&got));
    assert_eq!(
        server.request(1).map(|r| r.outcome),
        Some(Outcome::ServerClosed)
    );
    server.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn shutdown_closes_stalled_connections_without_calling_it_a_client_close() -> TestResult {
    let server = MockServer::start(MockConfig::scenario(Scenario::Stall)).await?;
    let mut live = server.subscribe();
    let mut raw = raw_request(
        server.addr(),
        "POST",
        "/v1/messages",
        &[],
        &anthropic_request("m", true),
    )
    .await;
    raw.read_until("content_block_delta").await;
    let addr = server.addr();
    server.shutdown().await;
    raw.read_to_eof().await;
    while let Ok(e) = live.try_recv() {
        assert!(!matches!(e, ServerEvent::ClientClosed { .. }), "{e:?}");
    }
    // The port is closed too.
    assert!(tokio::net::TcpStream::connect(addr).await.is_err());
    Ok(())
}

#[tokio::test]
async fn overlapping_streams_of_one_prompt_are_counted_and_sequential_ones_are_not() -> TestResult {
    let server = MockServer::start(
        MockConfig::scenario(Scenario::ThinkingPings).with_thinking_pause(Duration::from_secs(30)),
    )
    .await?;
    let with_text = |text: &str| {
        let mut body = anthropic_request("m", true);
        body["messages"][0]["content"][0]["text"] = Value::from(text);
        body
    };
    // "a" twice, one after the other; "b" twice at once.
    for id in 1..=2 {
        let mut raw =
            raw_request(server.addr(), "POST", "/v1/messages", &[], &with_text("a")).await;
        raw.read_until("event: ping").await;
        drop(raw);
        assert!(server.wait_for_client_close(id, WITHIN).await);
    }
    let mut b1 = raw_request(server.addr(), "POST", "/v1/messages", &[], &with_text("b")).await;
    let mut b2 = raw_request(server.addr(), "POST", "/v1/messages", &[], &with_text("b")).await;
    b1.read_until("event: ping").await;
    b2.read_until("event: ping").await;

    let (a, b) = (
        warden_mock::prompt_digest("a"),
        warden_mock::prompt_digest("b"),
    );
    assert_ne!(a, b);
    let digests: Vec<_> = server.requests().iter().map(|r| r.prompt_digest).collect();
    assert_eq!(digests, [Some(a), Some(a), Some(b), Some(b)]);
    let peak = server.peak_concurrency(|r| r.prompt_digest);
    assert_eq!(peak.get(&a), Some(&1), "{peak:?}");
    assert_eq!(peak.get(&b), Some(&2), "{peak:?}");
    drop((b1, b2));
    server.shutdown().await;
    Ok(())
}
