//! A client that asks for a whole answer (no `"stream": true`) is answered
//! from a stream the proxy asked for in its place. What the upstream sends
//! there is never turned into something it did not say: tool input that
//! is not JSON, a page that is not an event stream and a reply past
//! `max_reply_bytes` are errors in the provider's shape. Each upstream
//! here is a raw HTTP/1.1 server on loopback, the proxy is served over
//! real TCP.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::*;
use bytes::Bytes;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use warden_proxy::{AccessRecord, Outcome, Proxy, ProxyConfig, RecoveryEvent};

/// What a raw upstream answers one request with: the status line and
/// headers (`connection: close` is added; the body ends with the
/// connection), then the body in chunks.
struct Answer {
    head: &'static str,
    body: Vec<Bytes>,
}

/// A raw upstream on loopback.
struct Raw {
    base: String,
    /// Requests read whole.
    requests: Arc<AtomicUsize>,
    /// Their bodies, as JSON.
    bodies: Arc<Mutex<Vec<Value>>>,
    /// A write of an answer failed: the proxy closed the connection before
    /// the whole answer was sent.
    cut_off: Arc<AtomicBool>,
}

async fn raw(answer: fn(usize) -> Answer) -> Raw {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    let requests = Arc::new(AtomicUsize::new(0));
    let bodies = Arc::new(Mutex::new(Vec::new()));
    let cut_off = Arc::new(AtomicBool::new(false));
    let (counted, kept, cut) = (requests.clone(), bodies.clone(), cut_off.clone());
    tokio::spawn(async move {
        loop {
            let Ok((mut tcp, _)) = listener.accept().await else {
                return;
            };
            let (counted, kept, cut) = (counted.clone(), kept.clone(), cut.clone());
            tokio::spawn(async move {
                let mut read = Vec::new();
                let mut buf = [0u8; 8192];
                let head_end = loop {
                    if let Some(at) = read.windows(4).position(|w| w == b"\r\n\r\n") {
                        break at + 4;
                    }
                    match tcp.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => read.extend_from_slice(&buf[..n]),
                    }
                };
                let head = String::from_utf8_lossy(&read[..head_end]).to_ascii_lowercase();
                let length: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(0);
                while read.len() < head_end + length {
                    match tcp.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => read.extend_from_slice(&buf[..n]),
                    }
                }
                let n = counted.fetch_add(1, Ordering::SeqCst);
                if let Ok(body) = serde_json::from_slice(&read[head_end..head_end + length]) {
                    kept.lock().expect("lock").push(body);
                }
                let answer = answer(n);
                let head = format!("{}\r\nconnection: close\r\n\r\n", answer.head);
                if tcp.write_all(head.as_bytes()).await.is_err() {
                    cut.store(true, Ordering::SeqCst);
                    return;
                }
                for chunk in answer.body {
                    if tcp.write_all(&chunk).await.is_err() {
                        cut.store(true, Ordering::SeqCst);
                        return;
                    }
                }
                let _ = tcp.shutdown().await;
            });
        }
    });
    Raw {
        base,
        requests,
        bodies,
        cut_off,
    }
}

const SSE: &str = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream";

fn event(name: &str, data: Value) -> Bytes {
    Bytes::from(format!("event: {name}\ndata: {data}\n\n"))
}

fn message_start() -> Bytes {
    event(
        "message_start",
        json!({"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-x", "content": [], "stop_reason": null, "usage": {"input_tokens": 3, "output_tokens": 1}}}),
    )
}

/// A whole Anthropic reply with one tool call whose input arrives in
/// `fragments`.
fn tool_call(fragments: &[&str]) -> Vec<Bytes> {
    let mut body = vec![
        message_start(),
        event(
            "content_block_start",
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "tool_use", "id": "toolu_1", "name": "rm", "input": {}}}),
        ),
    ];
    for f in fragments {
        body.push(event(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "input_json_delta", "partial_json": f}}),
        ));
    }
    body.extend([
        event(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": 0}),
        ),
        event(
            "message_delta",
            json!({"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": null}, "usage": {"output_tokens": 9}}),
        ),
        event("message_stop", json!({"type": "message_stop"})),
    ]);
    body
}

/// What a proxy's logs got.
#[derive(Clone, Default)]
struct Logs {
    recoveries: Arc<Mutex<Vec<RecoveryEvent>>>,
    access: Arc<Mutex<Vec<AccessRecord>>>,
}

impl Logs {
    fn recoveries(&self) -> Vec<RecoveryEvent> {
        self.recoveries.lock().expect("lock").clone()
    }

    fn access(&self) -> Vec<AccessRecord> {
        self.access.lock().expect("lock").clone()
    }
}

/// A proxy in front of `upstream` (both protocols), its logs kept.
async fn proxy_for(
    upstream: &Raw,
    tune: impl FnOnce(ProxyConfig) -> ProxyConfig,
) -> (String, Logs) {
    let logs = Logs::default();
    let (recoveries, access) = (logs.recoveries.clone(), logs.access.clone());
    let config = ProxyConfig::default()
        .with_anthropic_upstream(upstream.base.clone())
        .with_openai_upstream(upstream.base.clone())
        .with_timeout(Duration::from_secs(10))
        .with_retry(
            warden_core::RetryPolicy::default()
                .with_jitter(0.0)
                .with_backoff(Duration::from_millis(10), Duration::from_millis(50)),
        )
        .with_recovery_log(move |r| recoveries.lock().expect("lock").push(r.clone()))
        .with_access_log(move |r| access.lock().expect("lock").push(r.clone()));
    let proxy = Proxy::start(tune(config)).await.expect("proxy");
    (serve(&proxy).await, logs)
}

/// A non-streaming Messages request through the proxy at `base`.
async fn whole_message(base: &str) -> reqwest::Response {
    let body = json!({"model": "claude-x", "max_tokens": 1024, "messages": [{"role": "user", "content": "hi"}]});
    within(
        "the answer",
        reqwest::Client::new()
            .post(format!("{base}/v1/messages"))
            .header("x-api-key", KEY)
            .header("anthropic-version", "2023-06-01")
            .header("content-type", "application/json")
            .body(body.to_string())
            .send(),
    )
    .await
    .expect("answer")
}

/// A non-streaming chat-completions request through the proxy at `base`.
async fn whole_completion(base: &str) -> reqwest::Response {
    let body = json!({"model": "gpt-x", "messages": [{"role": "user", "content": "hi"}]});
    within(
        "the answer",
        reqwest::Client::new()
            .post(format!("{base}/v1/chat/completions"))
            .header("authorization", format!("Bearer {KEY}"))
            .header("content-type", "application/json")
            .body(body.to_string())
            .send(),
    )
    .await
    .expect("answer")
}

/// The status, content type and JSON body of `response`.
async fn parts(response: reqwest::Response) -> (u16, String, Value) {
    let status = response.status().as_u16();
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let bytes = within("the body", response.bytes()).await.expect("body");
    let body = serde_json::from_slice(&bytes).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}), {status} {content_type}: {}",
            String::from_utf8_lossy(&bytes[..bytes.len().min(300)])
        )
    });
    (status, content_type, body)
}

/// An Anthropic error answer's message, checked for the shape
/// (`{"type":"error","error":{"type","message"}}`).
fn anthropic_error(body: &Value) -> &str {
    assert_eq!(body["type"], "error", "{body}");
    assert!(body["error"]["type"].is_string(), "{body}");
    body["error"]["message"].as_str().expect("a message")
}

/// An OpenAI error answer's message, checked for the shape
/// (`{"error":{"message","type","code"}}`).
fn openai_error(body: &Value) -> &str {
    let error = body["error"].as_object().expect("an error object");
    assert!(error["type"].is_string(), "{body}");
    assert!(error.contains_key("code"), "{body}");
    error["message"].as_str().expect("a message")
}

/// Tool input whose fragments are not JSON is never answered as a tool
/// call with input the model did not give (`"input": {}`): it is a broken
/// stream, which is not retried (a garbling upstream garbles again) nor
/// continued (a tool call is answered by its result), so the client gets
/// a 502 in the provider's shape naming it. Whole input still arrives
/// whole.
#[tokio::test]
async fn tool_input_that_is_not_json_is_an_error_never_an_empty_input() {
    let upstream = raw(|_| Answer {
        head: SSE,
        body: tool_call(&["{\"path\": \"/ho", "me\", \"recursive\": tr"]),
    })
    .await;
    let (base, logs) = proxy_for(&upstream, |c| c).await;
    let (status, content_type, body) = parts(whole_message(&base).await).await;
    assert_ne!(status, 200, "a tool call the model never made: {body}");
    assert_eq!(status, 502, "{body}");
    assert!(
        content_type.starts_with("application/json"),
        "{content_type}"
    );
    let message = anthropic_error(&body);
    assert_eq!(body["error"]["type"], "api_error", "{body}");
    assert!(
        message.contains("tool input") && message.contains("EMALFORMED"),
        "{message}"
    );
    assert_eq!(upstream.requests.load(Ordering::SeqCst), 1, "not retried");
    let heard = logs.recoveries();
    assert!(
        matches!(
            heard.as_slice(),
            [RecoveryEvent::GaveUp {
                code: "EMALFORMED",
                ..
            }]
        ),
        "{heard:?}"
    );
    let access = within("the access record", async {
        loop {
            if let [record] = logs.access().as_slice() {
                return record.clone();
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert_eq!(access.status, 502);
    assert_eq!(
        access.outcome,
        Outcome::UpstreamError,
        "not logged complete"
    );

    // The same call with its input whole.
    let upstream = raw(|_| Answer {
        head: SSE,
        body: tool_call(&["{\"path\": \"/ho", "me\", \"recursive\": true}"]),
    })
    .await;
    let (base, _) = proxy_for(&upstream, |c| c).await;
    let (status, _, message) = parts(whole_message(&base).await).await;
    assert_eq!(status, 200, "{message}");
    assert_eq!(
        message["content"],
        json!([{"type": "tool_use", "id": "toolu_1", "name": "rm", "input": {"path": "/home", "recursive": true}}])
    );
    assert_eq!(message["stop_reason"], "tool_use");
    let sent = upstream.bodies.lock().expect("lock").clone();
    assert_eq!(sent[0]["stream"], true, "asked upstream as a stream");
}

/// A `200` page that is neither an event stream nor JSON, in answer to a
/// request the proxy turned into a stream, is a 502 in the provider's
/// shape — not a `text/html` success. A JSON answer (an upstream that
/// ignores `stream`) is still passed on.
#[tokio::test]
async fn a_page_that_is_not_an_event_stream_is_an_error_in_the_providers_shape() {
    let upstream = raw(|_| Answer {
        head: "HTTP/1.1 200 OK\r\ncontent-type: text/html; charset=utf-8",
        body: vec![Bytes::from_static(
            b"<html><body>Sign in to the corporate network</body></html>",
        )],
    })
    .await;
    let (base, _) = proxy_for(&upstream, |c| c).await;

    let (status, content_type, body) = parts(whole_message(&base).await).await;
    assert_eq!(status, 502, "{body}");
    assert!(
        content_type.starts_with("application/json"),
        "{content_type}"
    );
    let message = anthropic_error(&body);
    assert!(
        message.contains("text/html") && message.contains("200"),
        "{message}"
    );

    let (status, content_type, body) = parts(whole_completion(&base).await).await;
    assert_eq!(status, 502, "{body}");
    assert!(
        content_type.starts_with("application/json"),
        "{content_type}"
    );
    let message = openai_error(&body);
    assert!(message.contains("text/html"), "{message}");

    // An error page keeps its status (the SDKs' retry rules go by it), in
    // the provider's shape.
    let upstream = raw(|_| Answer {
        head: "HTTP/1.1 403 Forbidden\r\ncontent-type: text/html",
        body: vec![Bytes::from_static(b"<html>denied</html>")],
    })
    .await;
    let (base, _) = proxy_for(&upstream, |c| c).await;
    let (status, _, body) = parts(whole_message(&base).await).await;
    assert_eq!(status, 403, "{body}");
    let message = anthropic_error(&body);
    assert!(message.contains("text/html"), "{message}");

    // A JSON answer to the stream request: the client asked for JSON.
    let upstream = raw(|_| Answer {
        head: "HTTP/1.1 200 OK\r\ncontent-type: application/json",
        body: vec![Bytes::from(
            json!({"id": "msg_1", "type": "message", "role": "assistant", "content": [{"type": "text", "text": "hi"}], "stop_reason": "end_turn"}).to_string(),
        )],
    })
    .await;
    let (base, _) = proxy_for(&upstream, |c| c).await;
    let (status, _, message) = parts(whole_message(&base).await).await;
    assert_eq!(status, 200, "{message}");
    assert_eq!(message["content"][0]["text"], "hi");
}

/// 1 KiB of text per delta.
fn kib_delta(index: u64) -> Bytes {
    event(
        "content_block_delta",
        json!({"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": "x".repeat(1024)}}),
    )
}

/// An assembled reply is capped (16 MiB by default, as `warden serve`'s
/// `--max-reply-bytes`): past it the proxy stops reading — the upstream's
/// writes fail — and answers a 502 in the provider's shape naming the cap,
/// instead of holding the whole reply.
#[tokio::test]
async fn an_assembled_reply_past_the_cap_is_a_typed_error_and_the_rest_is_not_read() {
    // 24 MiB of text, past the default cap.
    let upstream = raw(|_| {
        let mut body = vec![
            message_start(),
            event(
                "content_block_start",
                json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
            ),
        ];
        let delta = kib_delta(0);
        body.extend(std::iter::repeat_n(delta, 24 * 1024));
        body.push(event(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": 0}),
        ));
        body.push(event("message_stop", json!({"type": "message_stop"})));
        Answer { head: SSE, body }
    })
    .await;
    let (base, logs) = proxy_for(&upstream, |c| c).await;
    let (status, content_type, body) = parts(whole_message(&base).await).await;
    assert_eq!(
        status,
        502,
        "{}",
        &body.to_string()[..300.min(body.to_string().len())]
    );
    assert!(
        content_type.starts_with("application/json"),
        "{content_type}"
    );
    let message = anthropic_error(&body);
    assert!(
        message.contains("EREPLY_TOO_LARGE")
            && message.contains("--max-reply-bytes")
            && message.contains(&(16 * 1024 * 1024).to_string()),
        "{message}"
    );
    within("the upstream cut off", async {
        while !upstream.cut_off.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert_eq!(upstream.requests.load(Ordering::SeqCst), 1, "not retried");
    let heard = logs.recoveries();
    assert!(
        matches!(
            heard.as_slice(),
            [RecoveryEvent::GaveUp {
                code: "EREPLY_TOO_LARGE",
                ..
            }]
        ),
        "{heard:?}"
    );

    // Chat completions, with a cap of 64 KiB: the OpenAI shape, typed.
    let upstream = raw(|_| {
        let chunk = |content: &str| {
            Bytes::from(format!(
                "data: {}\n\n",
                json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "gpt-x", "choices": [{"index": 0, "delta": {"content": content}, "finish_reason": null}]})
            ))
        };
        let mut body: Vec<Bytes> = std::iter::repeat_n(chunk(&"y".repeat(1024)), 4 * 1024).collect();
        body.push(Bytes::from_static(b"data: [DONE]\n\n"));
        Answer {
            head: "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream",
            body,
        }
    })
    .await;
    let (base, _) = proxy_for(&upstream, |c| c.with_max_reply_bytes(64 * 1024)).await;
    let (status, _, body) = parts(whole_completion(&base).await).await;
    assert_eq!(status, 502);
    let message = openai_error(&body);
    assert!(
        message.contains("--max-reply-bytes") && message.contains("65536"),
        "{message}"
    );
    assert_eq!(body["error"]["code"], "reply_too_large", "{body}");

    // Under the cap, the whole reply.
    let (base, _) = proxy_for(&upstream, |c| c.with_max_reply_bytes(8 * 1024 * 1024)).await;
    let (status, _, completion) = parts(whole_completion(&base).await).await;
    assert_eq!(status, 200);
    assert_eq!(
        completion["choices"][0]["message"]["content"]
            .as_str()
            .map(str::len),
        Some(4 * 1024 * 1024)
    );
}
