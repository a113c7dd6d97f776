//! The proxy in front of `warden-mock` (real loopback HTTP both sides):
//! healthy streams pass through, broken ones are retried, continued and
//! spliced, or ended with the provider's own error event — never a hang,
//! never a torn event.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::*;
use serde_json::Value;
use warden_mock::{MockConfig, Outcome, Scenario};
use warden_proxy::{RecoveryEvent, WholeFallback};

/// What a proxy's recovery log reported, in order.
#[derive(Clone, Default)]
struct Heard(Arc<Mutex<Vec<RecoveryEvent>>>);

impl Heard {
    /// A recovery log that records here.
    fn log(&self) -> impl Fn(&RecoveryEvent) + Send + Sync + 'static {
        let all = self.0.clone();
        move |r| {
            all.lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(r.clone())
        }
    }

    /// Everything recorded so far.
    fn all(&self) -> Vec<RecoveryEvent> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

const REPLY: &str = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa quebec romeo sierra tango";

fn mock(sequence: &[Scenario]) -> MockConfig {
    MockConfig::default()
        .with_sequence(sequence.iter().copied())
        .with_reply(REPLY)
        .with_frame_interval(Duration::from_millis(2))
}

#[tokio::test]
async fn a_healthy_stream_passes_through_event_for_event() {
    let s = setup(mock(&[]), |c| c).await;
    let direct = s
        .client
        .post(s.mock.url("/v1/messages"))
        .header("x-api-key", KEY)
        .header("anthropic-version", "2023-06-01")
        .body(messages_body("claude-test", "hi"))
        .send()
        .await
        .expect("direct");
    let direct = read_sse(direct).await;
    let proxied = within(
        "the proxied answer",
        s.messages(messages_body("claude-test", "hi")).send(),
    )
    .await
    .expect("proxied");
    assert_eq!(proxied.status(), 200);
    assert_eq!(
        proxied.headers()["content-type"].to_str().ok(),
        Some("text/event-stream")
    );
    let proxied = read_sse(proxied).await;
    let names = |v: &[Sse]| v.iter().map(|e| e.event.clone()).collect::<Vec<_>>();
    assert_eq!(names(&proxied), names(&direct));
    // Byte for byte but the message id (the mock numbers its requests).
    for (p, d) in proxied.iter().zip(&direct).skip(1) {
        assert_eq!(p.data, d.data);
    }
    assert_eq!(well_formed_anthropic(&proxied), REPLY);
    assert_eq!(s.mock.request_count(), 2, "one request each, no retry");
}

#[tokio::test]
async fn a_stall_before_the_first_byte_is_retried_and_the_client_sees_one_stream() {
    // The first attempt sends its headers and then nothing at all.
    let s = setup(
        mock(&[Scenario::Stall, Scenario::Normal]).with_fault_after_frames(0),
        |c| c,
    )
    .await;
    let t0 = Instant::now();
    let response = within(
        "the answer",
        s.messages(messages_body("claude-test", "hi")).send(),
    )
    .await
    .expect("answer");
    assert_eq!(response.status(), 200);
    assert!(t0.elapsed() >= TIMEOUT, "the head waited for the retry");
    let events = read_sse(response).await;
    assert_eq!(well_formed_anthropic(&events), REPLY);
    let requests = s.mock.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(requests[0].frames, 0);
    assert_eq!(requests[1].continuation, None, "the same request again");
}

#[tokio::test]
async fn a_stall_mid_text_is_continued_and_spliced_into_one_well_formed_stream() {
    // message_start, content_block_start, ping, then 6 deltas: mid-text.
    let heard = Heard::default();
    let log = heard.log();
    let s = setup(
        mock(&[Scenario::Stall, Scenario::Normal]).with_fault_after_frames(9),
        move |c| c.with_recovery_log(log),
    )
    .await;
    let t0 = Instant::now();
    let response = within(
        "the answer",
        s.messages(messages_body("claude-opus-4-8", "hi")).send(),
    )
    .await
    .expect("answer");
    let events = read_sse(response).await;
    let took = t0.elapsed();
    assert_eq!(
        well_formed_anthropic(&events),
        REPLY,
        "the whole reply, once"
    );
    assert!(took < TIMEOUT + Duration::from_secs(1), "took {took:?}");
    let requests = s.mock.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(requests[0].scenario, Some(Scenario::Stall));
    assert_eq!(
        requests[0].outcome,
        Outcome::ClientClosed,
        "the proxy closed the silent stream"
    );
    assert_eq!(
        requests[1].continuation,
        Some("turn"),
        "a continuation turn, not a replay"
    );
    // One text block: Claude Code keeps only the last one.
    let starts = events
        .iter()
        .filter(|e| e.event == "content_block_start")
        .count();
    assert_eq!(starts, 1);
    // Usage counts both attempts.
    let delta = events
        .iter()
        .find(|e| e.event == "message_delta")
        .expect("message_delta");
    let merged = delta.json()["usage"]["output_tokens"].as_u64().unwrap_or(0);
    let second = requests[1].output_tokens.unwrap_or(0);
    assert!(
        merged > second,
        "merged {merged} > the continuation's {second}"
    );
    // The operator hears of the kill and the continuation, in that order.
    let heard = heard.all();
    assert!(
        matches!(
            heard.as_slice(),
            [
                RecoveryEvent::Killed { attempt: 1, .. },
                RecoveryEvent::Continuing {
                    attempt: 1,
                    code: "ESTREAM_TIMEOUT",
                    ..
                }
            ]
        ),
        "{heard:?}"
    );
    assert!(
        heard[1].to_string().contains("/v1/messages"),
        "{}",
        heard[1]
    );
}

#[tokio::test]
async fn a_stall_inside_a_tool_call_ends_with_an_overloaded_error_event_not_a_hang() {
    let s = setup(mock(&[Scenario::StallInToolInput]), |c| c).await;
    let response = within(
        "the answer",
        s.messages(messages_body("claude-test", "hi")).send(),
    )
    .await
    .expect("answer");
    assert_eq!(response.status(), 200);
    let events = read_sse(response).await;
    let last = events.last().expect("events");
    assert_eq!(last.event, "error");
    assert_eq!(last.json()["error"]["type"], "overloaded_error");
    assert_eq!(s.mock.request_count(), 1, "nothing could continue it");
    assert_eq!(
        events.iter().filter(|e| e.event == "message_start").count(),
        1
    );
}

/// An overloaded answer before any of the reply — 429, 503, 529 — is the
/// client's to retry: the proxy hands it back at once, as the upstream
/// sent it (its `retry-after` included), after one upstream request. The
/// clients retry it themselves and know when to stop; the proxy's
/// attempts on top of theirs would multiply what an overloaded upstream is
/// asked (docs/proxy.md), streaming or not.
#[tokio::test]
async fn an_overloaded_answer_before_any_byte_is_handed_back_at_once() {
    for (scenario, status) in [(Scenario::RateLimited, 429), (Scenario::Overloaded, 529)] {
        for stream in [true, false] {
            let what = format!("{scenario} (stream: {stream})");
            let s = setup(
                mock(&[scenario]).with_retry_after(Duration::from_secs(2)),
                |c| c,
            )
            .await;
            let body = serde_json::json!({"model": "claude-test", "max_tokens": 1024,
                "stream": stream, "messages": [{"role": "user", "content": "hi"}]});
            let t0 = Instant::now();
            let response = within(&what, s.messages(body.to_string()).send())
                .await
                .expect("answer");
            assert_eq!(response.status(), status, "{what}");
            assert!(
                t0.elapsed() < Duration::from_secs(2),
                "{what}: at once, not after the proxy's own retries: {:?}",
                t0.elapsed()
            );
            if status == 429 {
                assert_eq!(
                    response.headers()["retry-after-ms"].to_str().ok(),
                    Some("2000"),
                    "{what}: the client honours the upstream's wait itself"
                );
            }
            let error: Value = response.json_value().await;
            assert_eq!(error["type"], "error", "{what}: {error}");
            assert_eq!(s.mock.request_count(), 1, "{what}: one upstream request");
            s.proxy.stop();
        }
    }
}

/// An overloaded answer to a continuation — the client already has part of
/// the reply, and no retry of its own can take that up — is still retried
/// by the proxy: the client gets the whole reply.
#[tokio::test]
async fn an_overloaded_answer_to_a_continuation_is_retried_by_the_proxy() {
    let s = setup(
        mock(&[Scenario::Stall, Scenario::Overloaded, Scenario::Normal]).with_fault_after_frames(6),
        |c| c,
    )
    .await;
    let response = within(
        "the answer",
        s.messages(messages_body("claude-test", "hi")).send(),
    )
    .await
    .expect("answer");
    assert_eq!(response.status(), 200);
    assert_eq!(well_formed_anthropic(&read_sse(response).await), REPLY);
    assert_eq!(s.mock.request_count(), 3, "stall, 529, continuation");
}

/// Every bad upstream, once then healthy and always: the client gets a
/// well-formed stream (the whole reply when a retry or continuation could
/// save it) or a well-formed error — within the bound.
#[tokio::test]
async fn bad_upstreams_give_a_well_formed_stream_or_a_well_formed_error() {
    let bad = [
        Scenario::Malformed,
        Scenario::Oversized,
        Scenario::AbruptClose,
        Scenario::MidstreamError,
        Scenario::ServerError,
        Scenario::Overloaded,
        Scenario::RateLimited,
        Scenario::Stall,
        Scenario::StallInThinking,
        Scenario::PromptTooLong,
    ];
    for scenario in bad {
        for always in [false, true] {
            let sequence = if always {
                vec![scenario]
            } else {
                vec![scenario, Scenario::Normal]
            };
            let s = setup(
                mock(&sequence)
                    .with_oversized_bytes(2 * 1024 * 1024)
                    .with_retry_after(Duration::from_millis(20)),
                |c| c.with_max_frame_bytes(1024 * 1024),
            )
            .await;
            let what = format!("{scenario} (always: {always})");
            let response = within(&what, s.messages(messages_body("claude-test", "hi")).send())
                .await
                .expect("an answer");
            let status = response.status();
            if status.is_success() {
                let events = read_sse(response).await;
                let last = events.last().unwrap_or_else(|| panic!("{what}: no events"));
                if last.event == "error" {
                    let t = last.json()["error"]["type"].as_str().map(str::to_owned);
                    assert!(t.is_some(), "{what}: an error event with a type");
                } else {
                    let text = well_formed_anthropic(&events);
                    assert_eq!(text, REPLY, "{what}: the whole reply");
                }
            } else {
                let body: Value = response.json_value().await;
                assert_eq!(body["type"], "error", "{what}: {body}");
                assert!(body["error"]["type"].is_string(), "{what}: {body}");
                // An overloaded answer before any byte is the client's
                // to retry: handed back at once.
                let handed_back = matches!(
                    scenario,
                    Scenario::PromptTooLong | Scenario::Overloaded | Scenario::RateLimited
                );
                assert!(always || handed_back, "{what}: a retry would have answered");
            }
            s.proxy.stop();
        }
    }
}

#[tokio::test]
async fn a_chat_completion_stalled_mid_text_is_continued_with_one_id() {
    let s = setup(
        mock(&[Scenario::Stall, Scenario::Normal]).with_fault_after_frames(6),
        |c| c,
    )
    .await;
    let response = within("the answer", s.chat("hi").send())
        .await
        .expect("answer");
    assert_eq!(response.status(), 200);
    let events = read_sse(response).await;
    assert_eq!(events.last().map(|e| e.data.as_str()), Some("[DONE]"));
    let chunks: Vec<Value> = events[..events.len() - 1].iter().map(Sse::json).collect();
    let ids: std::collections::BTreeSet<&str> =
        chunks.iter().filter_map(|c| c["id"].as_str()).collect();
    assert_eq!(ids.len(), 1, "{ids:?}");
    let text: String = chunks
        .iter()
        .filter_map(|c| {
            c.pointer("/choices/0/delta/content")
                .and_then(Value::as_str)
        })
        .collect();
    assert_eq!(text, REPLY);
    let requests = s.mock.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(requests[1].continuation, Some("turn"));
}

/// A Responses stream stalled or cut mid-text (the response, its item, its
/// part and two text deltas sent) is continued with a continuation turn
/// and spliced into the same response: one start, one item, sequence
/// numbers without a gap, the end carrying the whole text and the first id.
#[tokio::test]
async fn a_responses_stream_broken_mid_text_is_continued_into_one_response() {
    for fault in [Scenario::Stall, Scenario::AbruptClose] {
        let s = setup(
            mock(&[fault, Scenario::Normal]).with_fault_after_frames(6),
            |c| c,
        )
        .await;
        let body = serde_json::json!({
            "model": "gpt-test",
            "stream": true,
            "store": false,
            "input": [{"type": "message", "role": "user",
                       "content": [{"type": "input_text", "text": "hi"}]}],
        });
        let t0 = Instant::now();
        let response = within(
            "the answer",
            s.client
                .post(format!("{}/v1/responses", s.base))
                .header("authorization", format!("Bearer {KEY}"))
                .header("content-type", "application/json")
                .body(body.to_string())
                .send(),
        )
        .await
        .expect("answer");
        assert_eq!(response.status(), 200);
        let events: Vec<(String, Value)> = read_sse(response)
            .await
            .iter()
            .map(|e| (e.event.clone(), e.json()))
            .collect();
        let took = t0.elapsed();
        for (i, (name, data)) in events.iter().enumerate() {
            assert_eq!(
                data["sequence_number"], i,
                "{fault}: numbered on: {events:?}"
            );
            assert_eq!(data["type"].as_str(), Some(name.as_str()));
        }
        let count = |kind: &str| events.iter().filter(|(n, _)| n == kind).count();
        assert_eq!(count("response.created"), 1, "{fault}");
        assert_eq!(count("response.output_item.added"), 1, "{fault}");
        let items: std::collections::BTreeSet<&str> = events
            .iter()
            .filter_map(|(_, d)| d["item_id"].as_str())
            .collect();
        assert_eq!(items.len(), 1, "{fault}: one item: {items:?}");
        let text: String = events
            .iter()
            .filter(|(n, _)| n == "response.output_text.delta")
            .filter_map(|(_, d)| d["delta"].as_str())
            .collect();
        assert_eq!(text, REPLY, "{fault}: the whole reply, once");
        let (last, completed) = events.last().expect("events");
        assert_eq!(last, "response.completed", "{fault}");
        let first_id = &events[0].1["response"]["id"];
        assert_eq!(&completed["response"]["id"], first_id, "{fault}");
        assert_eq!(
            completed.pointer("/response/output/0/content/0/text"),
            Some(&Value::from(REPLY)),
            "{fault}"
        );
        assert!(
            took < TIMEOUT + Duration::from_secs(2),
            "{fault}: took {took:?}"
        );
        let requests = s.mock.requests();
        assert_eq!(requests.len(), 2, "{fault}");
        assert_eq!(
            requests[1].continuation,
            Some("turn"),
            "{fault}: a continuation turn, not a replay"
        );
        s.proxy.stop();
    }
}

#[tokio::test]
async fn other_requests_pass_through_untouched() {
    let s = setup(mock(&[]), |c| c).await;
    let response = within(
        "a non-streaming answer",
        s.messages(
            serde_json::json!({"model": "claude-test", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]})
                .to_string(),
        )
        .send(),
    )
    .await
    .expect("answer");
    assert_eq!(response.status(), 200);
    let body: Value = response.json_value().await;
    assert_eq!(body["content"][0]["text"], REPLY);
    let unknown = within(
        "a 404",
        s.client
            .get(format!("{}/v1/nothing-here", s.base))
            .header("anthropic-version", "2023-06-01")
            .send(),
    )
    .await
    .expect("answer");
    assert_eq!(unknown.status(), 404, "the upstream's own answer");
    // Another method on a watched route is the upstream's business too,
    // not the proxy router's.
    let get = within(
        "a GET on a watched route",
        s.client
            .get(format!("{}/v1/messages", s.base))
            .header("anthropic-version", "2023-06-01")
            .send(),
    )
    .await
    .expect("answer");
    assert_eq!(get.status(), 405);
    let body: Value = get.json_value().await;
    let message = body["error"]["message"].as_str().unwrap_or("");
    assert!(message.starts_with("warden-mock:"), "{body}");
}

trait JsonValue {
    async fn json_value(self) -> Value;
}

impl JsonValue for reqwest::Response {
    async fn json_value(self) -> Value {
        let bytes = within("a body", self.bytes()).await.expect("body");
        serde_json::from_slice(&bytes).expect("a JSON body")
    }
}

/// Paths outside the APIs reach no upstream unless one is named for them:
/// `HEAD /` (Claude Code's probe) is answered here, anything else is a 404
/// in the provider's shape.
#[tokio::test]
async fn paths_outside_the_apis_are_answered_here_unless_an_upstream_is_named() {
    let s = setup(mock(&[]), |c| c).await;
    let head = within("HEAD /", s.client.head(format!("{}/", s.base)).send())
        .await
        .expect("answer");
    assert_eq!(head.status(), 200);
    let other = within(
        "GET /favicon.ico",
        s.client
            .get(format!("{}/favicon.ico", s.base))
            .header("anthropic-version", "2023-06-01")
            .send(),
    )
    .await
    .expect("answer");
    assert_eq!(other.status(), 404);
    let body: Value = other.json_value().await;
    assert_eq!(body["error"]["type"], "not_found_error", "{body}");
    assert!(s.mock.requests().is_empty(), "nothing reached the upstream");

    // Named: such requests go there (the mock answers an unknown path 404
    // with its own message).
    let named = setup(mock(&[]), |c| c).await;
    let upstream = named.mock.base_url();
    let s = setup(mock(&[]), move |c| c.with_other_upstream(upstream)).await;
    let other = within(
        "GET /favicon.ico",
        s.client.get(format!("{}/favicon.ico", s.base)).send(),
    )
    .await
    .expect("answer");
    assert_eq!(other.status(), 404);
    let body: Value = other.json_value().await;
    let message = body["error"]["message"].as_str().unwrap_or("");
    assert!(message.starts_with("warden-mock:"), "{body}");
    assert_eq!(
        named.mock.requests().len(),
        1,
        "it went to the named upstream"
    );
}

/// An upstream that cannot be reached: the client gets the provider's
/// error after the attempts, and the operator hears why.
#[tokio::test]
async fn an_unreachable_upstream_is_reported_with_its_reason() {
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let dead = format!("http://{}", closed.local_addr().expect("addr"));
    drop(closed);
    let heard = Heard::default();
    let log = heard.log();
    let s = setup(mock(&[]), move |c| {
        c.with_anthropic_upstream(dead)
            .with_retry(
                warden_core::RetryPolicy::default()
                    .with_jitter(0.0)
                    .with_max_attempts(2)
                    .with_backoff(Duration::from_millis(10), Duration::from_millis(10)),
            )
            .with_recovery_log(log)
    })
    .await;
    let response = within(
        "the answer",
        s.messages(messages_body("claude-opus-4-8", "hi")).send(),
    )
    .await
    .expect("answer");
    // Unreachable is not an overload: a 502 naming the cause.
    assert_eq!(response.status(), 502);
    let error: Value = response.json_value().await;
    let message = error["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("cannot be reached") && message.contains("refused"),
        "{error}"
    );
    let heard = heard.all();
    assert!(
        matches!(
            heard.as_slice(),
            [
                RecoveryEvent::Retrying {
                    code: "ECONNECTION",
                    ..
                },
                RecoveryEvent::CircuitOpened { .. },
                RecoveryEvent::HandedBack {
                    attempts: 2,
                    status: 502,
                    code: "ECONNECTION",
                    ..
                }
            ]
        ),
        "{heard:?}"
    );
    let line = heard[2].to_string();
    assert!(
        line.contains("answered 502 after 2 attempt(s)") && line.contains("refused"),
        "{line}"
    );
    assert!(
        heard[1].to_string().contains("answered at once"),
        "{}",
        heard[1]
    );
}

/// A client that asks for a whole message is answered with one, and the
/// request is watched on the way: sent upstream as a stream, continued
/// through a mid-text stall, assembled into the JSON the API would send.
#[tokio::test]
async fn a_non_streaming_request_is_watched_and_gets_the_whole_answer() {
    // Anthropic Messages, stalled mid-text.
    let s = setup(
        mock(&[Scenario::Stall, Scenario::Normal]).with_fault_after_frames(9),
        |c| c,
    )
    .await;
    let body = serde_json::json!({"model": "claude-opus-4-8", "max_tokens": 1024, "messages": [{"role": "user", "content": "hi"}]});
    let response = within("the message", s.messages(body.to_string()).send())
        .await
        .expect("answer");
    assert_eq!(response.status(), 200);
    assert!(
        response
            .headers()
            .get("content-type")
            .is_some_and(|v| v.as_bytes().starts_with(b"application/json"))
    );
    let message: Value = response.json_value().await;
    assert_eq!(message["type"], "message", "{message}");
    assert_eq!(message["content"][0]["type"], "text");
    assert_eq!(
        message["content"][0]["text"], REPLY,
        "the whole reply, once"
    );
    assert_eq!(message["stop_reason"], "end_turn");
    assert!(
        message["usage"]["output_tokens"].as_u64() > Some(0),
        "{message}"
    );
    let requests = s.mock.requests();
    assert_eq!(requests.len(), 2, "{requests:?}");
    assert_eq!(
        requests[0].outcome,
        Outcome::ClientClosed,
        "the silent stream was killed"
    );
    assert_eq!(requests[1].continuation, Some("turn"));

    // Chat completions, stalled mid-text.
    let s = setup(
        mock(&[Scenario::Stall, Scenario::Normal]).with_fault_after_frames(6),
        |c| c,
    )
    .await;
    let body =
        serde_json::json!({"model": "gpt-test", "messages": [{"role": "user", "content": "hi"}]});
    let response = within(
        "the completion",
        s.client
            .post(format!("{}/v1/chat/completions", s.base))
            .header("authorization", format!("Bearer {KEY}"))
            .header("content-type", "application/json")
            .body(body.to_string())
            .send(),
    )
    .await
    .expect("answer");
    assert_eq!(response.status(), 200);
    let completion: Value = response.json_value().await;
    assert_eq!(completion["object"], "chat.completion", "{completion}");
    assert_eq!(completion["choices"][0]["message"]["content"], REPLY);
    assert_eq!(completion["choices"][0]["finish_reason"], "stop");
    assert!(
        completion["usage"]["completion_tokens"].as_u64() > Some(0),
        "{completion}"
    );
    assert_eq!(s.mock.requests().len(), 2);
}

/// An upstream that keeps stalling: the whole-answer client gets the
/// provider's error after the attempts, never a hang.
#[tokio::test]
async fn a_non_streaming_request_through_a_stalling_upstream_ends_with_an_error() {
    let s = setup(mock(&[Scenario::Stall]).with_fault_after_frames(9), |c| {
        c.with_retry(
            warden_core::RetryPolicy::default()
                .with_jitter(0.0)
                .with_max_attempts(2)
                .with_backoff(Duration::from_millis(10), Duration::from_millis(10)),
        )
    })
    .await;
    let body = serde_json::json!({"model": "claude-opus-4-8", "max_tokens": 1024, "messages": [{"role": "user", "content": "hi"}]});
    let response = within("the error", s.messages(body.to_string()).send())
        .await
        .expect("answer");
    assert_eq!(response.status(), 529);
    let error: Value = response.json_value().await;
    assert_eq!(error["type"], "error", "{error}");
    assert_eq!(error["error"]["type"], "overloaded_error", "{error}");
}

/// A stream that only pings never ends on its own: with a progress
/// allowance the proxy kills it (`ESTREAM_NO_PROGRESS`) and, after its
/// attempts, ends the response with the provider's error event — inside
/// the first thinking block, which Claude Code re-sends: handed back.
#[tokio::test]
async fn a_stream_that_only_pings_is_ended_by_the_progress_allowance() {
    let heard = Heard::default();
    let log = heard.log();
    let s = setup(
        mock(&[Scenario::ThinkingPings])
            .with_thinking_pause(Duration::from_secs(30))
            .with_ping_interval(Duration::from_millis(50)),
        move |c| {
            c.with_progress_timeout(Duration::from_millis(600))
                .with_retry(
                    warden_core::RetryPolicy::default()
                        .with_jitter(0.0)
                        .with_max_attempts(2)
                        .with_backoff(Duration::from_millis(10), Duration::from_millis(10)),
                )
                .with_recovery_log(log)
        },
    )
    .await;
    let t0 = Instant::now();
    let response = within(
        "the answer",
        s.messages(messages_body("claude-opus-4-8", "hi")).send(),
    )
    .await
    .expect("answer");
    let events = read_sse(response).await;
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    let last = events.last().expect("events");
    assert_eq!(last.event, "error", "{events:?}");
    let heard = heard.all();
    assert!(
        heard.iter().any(|r| matches!(
            r,
            RecoveryEvent::HandedBackMidStream {
                code: "ESTREAM_NO_PROGRESS",
                ..
            }
        )),
        "{heard:?}"
    );
}

/// A request's deadline bounds it, attempts and waits included: a stall the
/// silence allowance would wait out for a minute ends at the deadline.
#[tokio::test]
async fn a_request_ends_at_its_deadline() {
    let s = setup(mock(&[Scenario::Stall]).with_fault_after_frames(9), |c| {
        c.with_timeout(Duration::from_secs(60))
            .with_deadline(Duration::from_millis(800))
    })
    .await;
    let t0 = Instant::now();
    let response = within(
        "the answer",
        s.messages(messages_body("claude-opus-4-8", "hi")).send(),
    )
    .await
    .expect("answer");
    let events = read_sse(response).await;
    let took = t0.elapsed();
    assert!(
        took >= Duration::from_millis(700) && took < Duration::from_secs(5),
        "{took:?}"
    );
    let last = events.last().expect("events");
    assert_eq!(last.event, "error", "{events:?}");
    assert_eq!(last.json()["error"]["type"], "overloaded_error");
}

/// The access log counts what the upstream was sent: a client that leaves
/// while a continuation waits out its backoff logs the one request the
/// upstream saw and no continuation.
#[tokio::test]
async fn the_access_log_counts_the_requests_the_upstream_saw() {
    let heard = Heard::default();
    let log = heard.log();
    let records: Arc<Mutex<Vec<warden_proxy::AccessRecord>>> = Arc::default();
    let sink = records.clone();
    let s = setup(
        mock(&[Scenario::Stall, Scenario::Normal]).with_fault_after_frames(9),
        move |c| {
            c.with_retry(
                warden_core::RetryPolicy::default()
                    .with_jitter(0.0)
                    // Long enough for the client to leave during it.
                    .with_backoff(Duration::from_secs(5), Duration::from_secs(5)),
            )
            .with_recovery_log(log)
            .with_access_log(move |r| {
                sink.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(r.clone())
            })
        },
    )
    .await;
    let response = within(
        "the stream",
        s.messages(messages_body("claude-opus-4-8", "hi")).send(),
    )
    .await
    .expect("answer");
    assert_eq!(response.status(), 200);
    let mut body = response.bytes_stream();
    use futures_util::StreamExt as _;
    // Read until the stall is killed and its continuation is scheduled…
    within("the continuation to be scheduled", async {
        loop {
            if heard
                .all()
                .iter()
                .any(|r| matches!(r, RecoveryEvent::Continuing { .. }))
            {
                return;
            }
            tokio::select! {
                _ = body.next() => {}
                () = tokio::time::sleep(Duration::from_millis(20)) => {}
            }
        }
    })
    .await;
    // …then leave during its backoff.
    drop(body);
    let record = within("the access record", async {
        loop {
            if let Some(r) = records
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .first()
                .cloned()
            {
                return r;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    let seen = s.mock.requests_to("/v1/messages");
    assert_eq!(record.attempts as usize, seen, "{record:?}");
    assert_eq!(seen, 1, "the client left before the continuation went out");
    assert_eq!(record.continuations, 0, "{record:?}");
    assert_eq!(record.kills, 1, "{record:?}");
    assert_eq!(record.outcome, warden_proxy::Outcome::ClientGone);
}

/// Invalid UTF-8 inside a text delta, mid-text: as docs/proxy.md says, the
/// frame is not continued or retried (a garbling upstream would garble
/// again) — the stream ends with the provider's error event naming
/// `EMALFORMED`, and the upstream is asked once.
#[tokio::test]
async fn invalid_utf8_mid_text_ends_the_stream_with_an_error_event_not_a_retry() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    let requests = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = requests.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut tcp, _)) = listener.accept().await else {
                return;
            };
            let counted = counted.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 4096];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match tcp.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let mut body = Vec::new();
                body.extend_from_slice(b"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"claude-x\",\"content\":[],\"stop_reason\":null,\"usage\":{\"input_tokens\":1,\"output_tokens\":1}}}\n\n");
                body.extend_from_slice(b"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n");
                body.extend_from_slice(b"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hello \"}}\n\n");
                body.extend_from_slice(b"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"wor\xff\xfeld\"}}\n\n");
                let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n";
                let _ = tcp.write_all(head.as_bytes()).await;
                let _ = tcp.write_all(&body).await;
                // Then silence, socket open: only the bad frame can end it.
                tokio::time::sleep(Duration::from_secs(60)).await;
            });
        }
    });
    let proxy = warden_proxy::Proxy::start(
        warden_proxy::ProxyConfig::default()
            .with_anthropic_upstream(base.clone())
            .with_openai_upstream(base)
            .with_timeout(Duration::from_secs(30)),
    )
    .await
    .expect("proxy");
    let proxy_base = serve(&proxy).await;
    let response = within(
        "the stream",
        reqwest::Client::new()
            .post(format!("{proxy_base}/v1/messages"))
            .header("x-api-key", KEY)
            .header("anthropic-version", "2023-06-01")
            .header("content-type", "application/json")
            .body(messages_body("claude-x", "hi"))
            .send(),
    )
    .await
    .expect("answer");
    assert_eq!(response.status(), 200);
    let events = read_sse(response).await;
    let last = events.last().expect("events");
    assert_eq!(last.event, "error", "{events:?}");
    assert!(last.data.contains("EMALFORMED"), "{}", last.data);
    assert!(
        events.iter().any(|e| e.data.contains("Hello ")),
        "the text before the bad frame reached the client"
    );
    assert_eq!(
        requests.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "not retried or continued"
    );
}

/// An upstream that keeps a text block open and sends only empty
/// `text_delta`s is as stuck as one that only pings: the progress
/// allowance ends it (it never did: each empty delta counted as content).
#[tokio::test]
async fn a_stream_of_empty_deltas_is_ended_by_the_progress_allowance() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let upstream = format!("http://{}", listener.local_addr().expect("addr"));
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 65536];
                let mut head = Vec::new();
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match socket.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let start = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n\
                    event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":\"x\",\"usage\":{\"input_tokens\":1,\"output_tokens\":1}}}\n\n\
                    event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n";
                if socket.write_all(start.as_bytes()).await.is_err() {
                    return;
                }
                // Empty deltas every 50 ms, for at most 30 s.
                for _ in 0..600 {
                    let empty = "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"\"}}\n\n";
                    if socket.write_all(empty.as_bytes()).await.is_err() {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            });
        }
    });
    let heard = Heard::default();
    let log = heard.log();
    let mock = warden_mock::MockServer::start(MockConfig::default())
        .await
        .expect("mock");
    let proxy = warden_proxy::Proxy::start(
        config_for(&mock)
            .with_anthropic_upstream(upstream)
            .with_progress_timeout(Duration::from_millis(600))
            .with_retry(
                warden_core::RetryPolicy::default()
                    .with_jitter(0.0)
                    .with_max_attempts(2)
                    .with_backoff(Duration::from_millis(10), Duration::from_millis(10)),
            )
            .with_recovery_log(log),
    )
    .await
    .expect("proxy");
    let base = serve(&proxy).await;
    let t0 = Instant::now();
    let response = within(
        "the answer",
        reqwest::Client::new()
            .post(format!("{base}/v1/messages"))
            .header("x-api-key", "k")
            .header("anthropic-version", "2023-06-01")
            .header("content-type", "application/json")
            .body(messages_body("claude-opus-4-8", "hi"))
            .send(),
    )
    .await
    .expect("answer");
    let events = within("the events", read_sse(response)).await;
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    assert_eq!(
        events.last().map(|e| e.event.as_str()),
        Some("error"),
        "{events:?}"
    );
    assert!(
        heard
            .all()
            .iter()
            .any(|r| format!("{r}").contains("ESTREAM_NO_PROGRESS")),
        "{:?}",
        heard.all()
    );
}

/// A Gemini request of `path` with a user turn, its key in `x-goog-api-key`.
fn gemini(s: &Setup, path: &str) -> reqwest::RequestBuilder {
    let body = serde_json::json!({"contents": [{"role": "user", "parts": [{"text": "hi"}]}]});
    s.client
        .post(format!("{}{path}", s.base))
        .header("x-goog-api-key", KEY)
        .header("content-type", "application/json")
        .body(body.to_string())
}

/// A Gemini stream stalled or cut mid-text is continued with a
/// continuation turn (the request's `contents`, the text so far as a
/// `model` turn, the ask to go on) and spliced into the same stream: the
/// whole reply once, one `responseId`, the last frame with `STOP`, within
/// the timeout and 2 s.
#[tokio::test]
async fn a_gemini_stream_broken_mid_text_is_continued_into_one_reply() {
    const STREAM: &str = "/v1beta/models/gemini-2.5-pro:streamGenerateContent?alt=sse";
    for fault in [Scenario::Stall, Scenario::AbruptClose] {
        let s = setup(
            mock(&[fault, Scenario::Normal]).with_fault_after_frames(6),
            |c| c,
        )
        .await;
        let t0 = Instant::now();
        let response = within("the answer", gemini(&s, STREAM).send())
            .await
            .expect("answer");
        assert_eq!(response.status(), 200, "{fault}");
        let frames: Vec<Value> = read_sse(response).await.iter().map(Sse::json).collect();
        let took = t0.elapsed();
        let ids: std::collections::BTreeSet<&str> = frames
            .iter()
            .filter_map(|f| f["responseId"].as_str())
            .collect();
        assert_eq!(ids.len(), 1, "{fault}: {ids:?}");
        let text: String = frames
            .iter()
            .flat_map(|f| {
                f.pointer("/candidates/0/content/parts")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
            })
            .filter_map(|p| p["text"].as_str())
            .collect();
        assert_eq!(text, REPLY, "{fault}: the whole reply, once");
        let last = frames.last().expect("frames");
        assert_eq!(last["candidates"][0]["finishReason"], "STOP", "{fault}");
        assert!(
            took < TIMEOUT + Duration::from_secs(2),
            "{fault}: took {took:?}"
        );
        let requests = s.mock.requests();
        assert_eq!(requests.len(), 2, "{fault}");
        assert_eq!(
            requests[1].continuation,
            Some("turn"),
            "{fault}: a continuation turn, not a replay"
        );
        s.proxy.stop();
    }
}

/// `:generateContent` is asked upstream as a watched stream and answered
/// whole: stalled mid-text, continued, the one `GenerateContentResponse`
/// holds the whole reply once. An overloaded answer before any byte goes
/// back to the client at once in Gemini's error shape.
#[tokio::test]
async fn a_gemini_whole_answer_is_watched_and_an_overload_handed_back() {
    let s = setup(
        mock(&[Scenario::Stall, Scenario::Normal]).with_fault_after_frames(6),
        |c| c,
    )
    .await;
    let response = within(
        "the answer",
        gemini(&s, "/v1beta/models/gemini-2.5-pro:generateContent").send(),
    )
    .await
    .expect("answer");
    assert_eq!(response.status(), 200);
    let answer: Value = response.json_value().await;
    assert_eq!(
        answer.pointer("/candidates/0/content/parts/0/text"),
        Some(&Value::from(REPLY)),
        "{answer}"
    );
    assert_eq!(answer["candidates"][0]["finishReason"], "STOP");
    let requests = s.mock.requests();
    assert_eq!(requests.len(), 2, "{requests:?}");
    assert!(requests.iter().all(|r| r.stream), "asked as a stream");
    assert_eq!(requests[1].continuation, Some("turn"));

    let s = setup(mock(&[Scenario::Overloaded, Scenario::Normal]), |c| c).await;
    let response = within(
        "the answer",
        gemini(
            &s,
            "/v1beta/models/gemini-2.5-pro:streamGenerateContent?alt=sse",
        )
        .send(),
    )
    .await
    .expect("answer");
    assert_eq!(response.status(), 529);
    let error: Value = response.json_value().await;
    assert_eq!(error["error"]["status"], "UNAVAILABLE", "{error}");
    assert_eq!(s.mock.requests().len(), 1, "the client's to retry");
}

/// The journal of a request whose streamed attempts all stalled: `silent`
/// streamed requests, then one without a stream, which answered.
fn stalled_streams_then_one_whole(s: &Setup, silent: usize) {
    let requests = s.mock.requests();
    let kinds: Vec<bool> = requests.iter().map(|r| r.stream).collect();
    let mut expected = vec![true; silent];
    expected.push(false);
    assert_eq!(kinds, expected, "streamed attempts, then one whole request");
    assert!(
        requests[..silent]
            .iter()
            .all(|r| r.outcome == Outcome::ClientClosed),
        "the proxy closed each silent stream: {requests:?}"
    );
    assert_eq!(requests[silent].status, Some(200));
}

/// What the proxy told its recovery log of a request whose streams all
/// stalled: a kill per streamed attempt, then the whole answer asked for
/// once, and no give-up.
fn heard_asking_whole(heard: &Heard, silent: u32) {
    let all = heard.all();
    let kills = all
        .iter()
        .filter(|r| matches!(r, RecoveryEvent::Killed { .. }))
        .count();
    assert_eq!(kills, silent as usize, "{all:?}");
    let asked: Vec<_> = all
        .iter()
        .filter(|r| matches!(r, RecoveryEvent::AskingWhole { .. }))
        .collect();
    assert!(
        matches!(asked.as_slice(), [RecoveryEvent::AskingWhole { silent: n, .. }] if *n == silent),
        "{all:?}"
    );
    let line = asked[0].to_string();
    assert!(
        line.contains("went silent before any content; asking once for the whole answer"),
        "{line}"
    );
    assert!(
        !all.iter().any(|r| matches!(
            r,
            RecoveryEvent::GaveUp { .. } | RecoveryEvent::HandedBack { .. }
        )),
        "{all:?}"
    );
}

#[tokio::test]
async fn when_only_streams_stall_a_streaming_client_gets_the_whole_reply_asked_for_without_a_stream()
 {
    let heard = Heard::default();
    let log = heard.log();
    let s = setup(mock(&[Scenario::StallStreamed]), move |c| {
        c.with_recovery_log(log)
    })
    .await;
    let response = within(
        "the answer",
        s.messages(messages_body("claude-test", "hi")).send(),
    )
    .await
    .expect("answer");
    assert_eq!(response.status(), 200);
    assert_eq!(
        response.headers()["content-type"].to_str().ok(),
        Some("text/event-stream")
    );
    let events = within("the stream", read_sse(response)).await;
    assert_eq!(
        well_formed_anthropic(&events),
        REPLY,
        "the whole reply, once, as one stream"
    );
    // The default rule: once the retry policy's 4 streamed attempts are
    // spent.
    stalled_streams_then_one_whole(&s, 4);
    heard_asking_whole(&heard, 4);
}

#[tokio::test]
async fn when_only_streams_stall_a_client_that_asked_for_no_stream_gets_the_whole_answer() {
    let heard = Heard::default();
    let log = heard.log();
    let s = setup(mock(&[Scenario::StallStreamed]), move |c| {
        c.with_recovery_log(log)
            .with_whole_fallback(Some(WholeFallback::default().after(1)))
    })
    .await;
    let body = serde_json::json!({
        "model": "claude-test",
        "max_tokens": 1024,
        "stream": false,
        "messages": [{"role": "user", "content": "hi"}],
    });
    let response = within("the answer", s.messages(body.to_string()).send())
        .await
        .expect("answer");
    assert_eq!(response.status(), 200);
    let answer = within("the body", response.bytes()).await.expect("body");
    let answer: Value = serde_json::from_slice(&answer).expect("JSON");
    assert_eq!(answer["type"], "message");
    assert_eq!(answer["content"][0]["text"], REPLY, "{answer}");
    assert_eq!(answer["stop_reason"], "end_turn");
    // `after(1)`: the whole answer asked for after the first silence.
    stalled_streams_then_one_whole(&s, 1);
    heard_asking_whole(&heard, 1);
}

#[tokio::test]
async fn when_only_streams_stall_a_chat_completions_stream_gets_the_whole_reply() {
    let heard = Heard::default();
    let log = heard.log();
    let s = setup(mock(&[Scenario::StallStreamed]), move |c| {
        c.with_recovery_log(log)
            .with_whole_fallback(Some(WholeFallback::default().after(2)))
    })
    .await;
    let response = within("the answer", s.chat("hi").send())
        .await
        .expect("answer");
    assert_eq!(response.status(), 200);
    let events = within("the stream", read_sse(response)).await;
    assert_eq!(events.last().map(|e| e.data.as_str()), Some("[DONE]"));
    let text: String = events
        .iter()
        .filter(|e| e.data != "[DONE]")
        .filter_map(|e| {
            e.json()
                .pointer("/choices/0/delta/content")
                .and_then(Value::as_str)
                .map(str::to_owned)
        })
        .collect();
    assert_eq!(text, REPLY);
    stalled_streams_then_one_whole(&s, 2);
    heard_asking_whole(&heard, 2);
}

#[tokio::test]
async fn when_only_streams_stall_a_gemini_stream_gets_the_whole_reply_as_one_frame() {
    let heard = Heard::default();
    let log = heard.log();
    let s = setup(mock(&[Scenario::StallStreamed]), move |c| {
        c.with_recovery_log(log)
            .with_whole_fallback(Some(WholeFallback::default().after(1)))
    })
    .await;
    let response = within(
        "the answer",
        gemini(
            &s,
            "/v1beta/models/gemini-2.5-pro:streamGenerateContent?alt=sse",
        )
        .send(),
    )
    .await
    .expect("answer");
    assert_eq!(response.status(), 200);
    let frames: Vec<Value> = within("the stream", read_sse(response))
        .await
        .iter()
        .map(Sse::json)
        .collect();
    let [frame] = frames.as_slice() else {
        panic!("one frame, the whole response: {frames:?}");
    };
    let text: String = frame
        .pointer("/candidates/0/content/parts")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|p| p["text"].as_str())
        .collect();
    assert_eq!(text, REPLY);
    assert_eq!(frame["candidates"][0]["finishReason"], "STOP");
    stalled_streams_then_one_whole(&s, 1);
    let whole = &s.mock.requests()[1];
    assert!(
        whole.path.ends_with(":generateContent") && whole.query.is_none(),
        "asked at :generateContent, alt=sse dropped: {} {:?}",
        whole.path,
        whole.query
    );
    heard_asking_whole(&heard, 1);
}
