//! `--hold-thinking` against a hand-written Anthropic upstream over real
//! loopback HTTP: a stall inside a thinking block is retried from scratch
//! without the client seeing anything of it (without the hold, its stream
//! ends with an error event, which a streaming SDK raises), and the text
//! after a thinking block is not delayed by holding it. A client that
//! asked for no stream has its answer retried unseen without the hold.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::common::*;
use axum::Router;
use axum::body::Body;
use axum::http::{HeaderValue, header};
use axum::response::Response;
use axum::routing::post;
use futures_util::StreamExt as _;
use warden_proxy::{Proxy, ProxyConfig};

const THOUGHTS: usize = 20;
const GAP: Duration = Duration::from_millis(20);

/// The events of a reply: message start, a thinking block of
/// [`THOUGHTS`] deltas (with its signature unless `stall`, which stops
/// there with the socket open), then a text block and the end.
fn reply(
    stall: bool,
) -> impl futures_util::Stream<Item = Result<String, std::convert::Infallible>> {
    let ev = |e: &str, d: String| format!("event: {e}\ndata: {d}\n\n");
    let mut events = vec![
        ev("message_start", r#"{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","model":"claude-test","content":[],"stop_reason":null,"usage":{"input_tokens":3,"output_tokens":1}}}"#.into()),
        ev("content_block_start", r#"{"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":""}}"#.into()),
    ];
    for i in 0..THOUGHTS {
        events.push(ev(
            "content_block_delta",
            format!(r#"{{"type":"content_block_delta","index":0,"delta":{{"type":"thinking_delta","thinking":"step {i}. "}}}}"#),
        ));
    }
    let done = [
        ev("content_block_delta", r#"{"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":"c2ln"}}"#.into()),
        ev("content_block_stop", r#"{"type":"content_block_stop","index":0}"#.into()),
        ev("content_block_start", r#"{"type":"content_block_start","index":1,"content_block":{"type":"text","text":""}}"#.into()),
        ev("content_block_delta", r#"{"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"the answer"}}"#.into()),
        ev("content_block_stop", r#"{"type":"content_block_stop","index":1}"#.into()),
        ev("message_delta", r#"{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":30}}"#.into()),
        ev("message_stop", r#"{"type":"message_stop"}"#.into()),
    ];
    if !stall {
        events.extend(done);
    }
    futures_util::stream::iter(events)
        .then(|e| async move {
            tokio::time::sleep(GAP).await;
            Ok(e)
        })
        .chain(futures_util::stream::once(async move {
            if stall {
                // Silence with the socket open, past every bound here.
                tokio::time::sleep(Duration::from_secs(600)).await;
            }
            Ok(String::new())
        }))
}

/// An upstream whose first request stalls inside its thinking (when
/// `stall_first`), the rest answering whole.
async fn upstream(stall_first: bool) -> String {
    let calls = Arc::new(AtomicUsize::new(0));
    let app = Router::new().route(
        "/v1/messages",
        post(move || {
            let calls = calls.clone();
            async move {
                let first = calls.fetch_add(1, Ordering::SeqCst) == 0;
                let mut r = Response::new(Body::from_stream(reply(stall_first && first)));
                r.headers_mut().insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("text/event-stream"),
                );
                r
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    tokio::spawn(async move { axum::serve(listener, app).await });
    base
}

async fn proxy(base: &str, hold: bool) -> (String, Proxy) {
    let config = ProxyConfig::default()
        .with_anthropic_upstream(base)
        .with_timeout(TIMEOUT)
        .with_hold_thinking(hold)
        .with_retry(
            warden_core::RetryPolicy::default()
                .with_jitter(0.0)
                .with_backoff(Duration::from_millis(10), Duration::from_millis(10)),
        );
    let proxy = Proxy::start(config).await.expect("proxy");
    (serve(&proxy).await, proxy)
}

/// The client's events, and when the first text delta arrived after the
/// request was sent.
async fn stream(proxy_base: &str) -> (Vec<Sse>, Option<Duration>) {
    let t0 = Instant::now();
    let response = within(
        "the answer",
        reqwest::Client::new()
            .post(format!("{proxy_base}/v1/messages"))
            .header("x-api-key", KEY)
            .header("anthropic-version", "2023-06-01")
            .header("content-type", "application/json")
            .body(messages_body("claude-test", "think, then answer"))
            .send(),
    )
    .await
    .expect("answer");
    let mut first_text = None;
    let mut body = response.bytes_stream();
    let mut raw = Vec::new();
    within("the stream", async {
        while let Some(chunk) = body.next().await {
            let chunk = chunk.expect("chunk");
            if first_text.is_none() && String::from_utf8_lossy(&chunk).contains("text_delta") {
                first_text = Some(t0.elapsed());
            }
            raw.extend_from_slice(&chunk);
        }
    })
    .await;
    (parse_sse(&String::from_utf8_lossy(&raw)), first_text)
}

#[tokio::test]
async fn a_stall_inside_held_thinking_is_retried_unseen() {
    let base = upstream(true).await;
    let (held, _p) = proxy(&base, true).await;
    let (events, _) = stream(&held).await;
    let last = events.last().expect("events");
    assert_eq!(last.event, "message_stop", "{events:?}");
    assert!(events.iter().all(|e| e.event != "error"), "{events:?}");
    let starts = events.iter().filter(|e| e.event == "message_start").count();
    assert_eq!(starts, 1, "{events:?}");
    // One thinking block (the retry's, whole), then the text.
    let thinking: Vec<&Sse> = events
        .iter()
        .filter(|e| e.event == "content_block_delta" && e.data.contains("thinking_delta"))
        .collect();
    assert_eq!(
        thinking.len(),
        THOUGHTS,
        "the stalled block was never shown"
    );
    assert_eq!(well_formed_anthropic(&events), "the answer");

    // Without the hold the same stall ends the stream with an error event.
    let base = upstream(true).await;
    let (plain, _p) = proxy(&base, false).await;
    let (events, _) = stream(&plain).await;
    assert_eq!(events.last().expect("events").event, "error", "{events:?}");
}

#[tokio::test]
async fn holding_thinking_does_not_delay_the_text_after_it() {
    let mut took = Vec::new();
    for hold in [false, true] {
        let base = upstream(false).await;
        let (at, _p) = proxy(&base, hold).await;
        let (events, first_text) = stream(&at).await;
        assert_eq!(well_formed_anthropic(&events), "the answer");
        took.push(first_text.expect("a text delta"));
    }
    let (plain, held) = (took[0], took[1]);
    eprintln!("first text delta: {plain:?} streamed, {held:?} held");
    // The thinking streams for THOUGHTS × GAP (400 ms); holding it moves
    // none of that in front of the text.
    assert!(
        held <= plain + Duration::from_millis(100),
        "held {held:?}, streamed {plain:?}"
    );
}

/// A client that asked for no stream sees nothing until the answer is
/// whole: a stall inside its thinking is retried unseen, held or not
/// (the SDKs with no retries of their own lose nothing).
#[tokio::test]
async fn a_whole_answer_whose_thinking_stalls_is_retried_unseen_without_the_hold() {
    let base = upstream(true).await;
    let (plain, _p) = proxy(&base, false).await;
    let mut body: serde_json::Value =
        serde_json::from_str(&messages_body("claude-test", "think, then answer")).expect("json");
    body["stream"] = serde_json::Value::Bool(false);
    let response = within(
        "the answer",
        reqwest::Client::new()
            .post(format!("{plain}/v1/messages"))
            .header("x-api-key", KEY)
            .header("anthropic-version", "2023-06-01")
            .header("content-type", "application/json")
            .body(body.to_string())
            .send(),
    )
    .await
    .expect("answer");
    let status = response.status();
    let text = within("the body", response.text()).await.expect("a body");
    let message: serde_json::Value = serde_json::from_str(&text).expect("a JSON body");
    assert_eq!(status, 200, "{message}");
    let content = message["content"].as_array().expect("content");
    let kinds: Vec<&str> = content.iter().filter_map(|b| b["type"].as_str()).collect();
    assert_eq!(kinds, ["thinking", "text"], "{message}");
    let thinking = content[0]["thinking"].as_str().expect("thinking");
    assert_eq!(
        thinking.matches("step ").count(),
        THOUGHTS,
        "only the retry's thinking: {thinking}"
    );
    assert_eq!(content[0]["signature"], "c2ln");
    assert_eq!(content[1]["text"], "the answer");
}

/// A streamed stall inside the first thinking block, without the hold,
/// ends with the error event — which Claude Code answers by sending the
/// request again (no block had closed), so it may yet complete: the line
/// says the client retries it, not "gave up".
#[tokio::test]
async fn a_stall_inside_streamed_thinking_is_handed_back_not_given_up() {
    let base = upstream(true).await;
    let heard: Arc<std::sync::Mutex<Vec<warden_proxy::RecoveryEvent>>> = Arc::default();
    let sink = heard.clone();
    let config = ProxyConfig::default()
        .with_anthropic_upstream(&base)
        .with_timeout(TIMEOUT)
        .with_retry(
            warden_core::RetryPolicy::default()
                .with_jitter(0.0)
                .with_backoff(Duration::from_millis(10), Duration::from_millis(10)),
        )
        .with_recovery_log(move |r| {
            sink.lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(r.clone())
        });
    let proxy = Proxy::start(config).await.expect("proxy");
    let at = serve(&proxy).await;
    let (events, _) = stream(&at).await;
    assert_eq!(events.last().expect("events").event, "error", "{events:?}");
    let heard = heard.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let ended: Vec<String> = heard
        .iter()
        .filter(|r| {
            matches!(
                r,
                warden_proxy::RecoveryEvent::GaveUp { .. }
                    | warden_proxy::RecoveryEvent::HandedBackMidStream { .. }
            )
        })
        .map(ToString::to_string)
        .collect();
    assert_eq!(ended.len(), 1, "{heard:?}");
    assert!(
        ended[0].contains("before any block closed; handed back to the client"),
        "{ended:?}"
    );
}
