//! A proxy in front of `warden-mock`, over real loopback HTTP, and an SSE
//! reader for its answers.
#![allow(dead_code, unreachable_pub)]

use std::future::Future;
use std::time::Duration;

use futures_util::StreamExt as _;
use serde_json::Value;
use warden_core::RetryPolicy;
use warden_mock::{MockConfig, MockServer};
use warden_proxy::{Proxy, ProxyConfig};

/// The watchdog timeout of the proxies under test.
pub const TIMEOUT: Duration = Duration::from_millis(300);
/// Every wait in these tests is bounded by this.
pub const BOUND: Duration = Duration::from_secs(20);

pub async fn within<T>(what: &str, fut: impl Future<Output = T>) -> T {
    tokio::time::timeout(BOUND, fut)
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}

pub struct Setup {
    pub mock: MockServer,
    pub proxy: Proxy,
    /// `http://127.0.0.1:PORT` of the proxy.
    pub base: String,
    pub client: reqwest::Client,
}

pub fn config_for(mock: &MockServer) -> ProxyConfig {
    ProxyConfig::default()
        .with_anthropic_upstream(mock.base_url())
        .with_openai_upstream(mock.base_url())
        .with_gemini_upstream(mock.base_url())
        .with_timeout(TIMEOUT)
        .with_retry(
            RetryPolicy::default()
                .with_jitter(0.0)
                .with_backoff(Duration::from_millis(10), Duration::from_millis(50)),
        )
}

pub async fn serve(proxy: &Proxy) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    let app = proxy.router();
    tokio::spawn(async move { axum::serve(listener, app).await });
    base
}

pub async fn setup(mock: MockConfig, tune: impl FnOnce(ProxyConfig) -> ProxyConfig) -> Setup {
    let mock = MockServer::start(mock).await.expect("mock");
    let proxy = Proxy::start(tune(config_for(&mock))).await.expect("proxy");
    let base = serve(&proxy).await;
    Setup {
        mock,
        proxy,
        base,
        client: reqwest::Client::new(),
    }
}

pub const KEY: &str = "sk-ant-test-key-0123456789";

/// A streaming Messages request, as the SDKs send it.
pub fn messages_body(model: &str, prompt: &str) -> String {
    serde_json::json!({
        "model": model,
        "max_tokens": 1024,
        "stream": true,
        "messages": [{"role": "user", "content": prompt}],
    })
    .to_string()
}

impl Setup {
    pub fn messages(&self, body: String) -> reqwest::RequestBuilder {
        self.client
            .post(format!("{}/v1/messages", self.base))
            .header("x-api-key", KEY)
            .header("anthropic-version", "2023-06-01")
            .header("content-type", "application/json")
            .body(body)
    }

    pub fn chat(&self, prompt: &str) -> reqwest::RequestBuilder {
        let body = serde_json::json!({
            "model": "gpt-test",
            "stream": true,
            "messages": [{"role": "user", "content": prompt}],
        });
        self.client
            .post(format!("{}/v1/chat/completions", self.base))
            .header("authorization", format!("Bearer {KEY}"))
            .header("content-type", "application/json")
            .body(body.to_string())
    }
}

/// One SSE event: its name (`message` when none) and data.
#[derive(Debug, Clone)]
pub struct Sse {
    pub event: String,
    pub data: String,
}

impl Sse {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.data)
            .unwrap_or_else(|e| panic!("event data is not JSON ({e}): {}", self.data))
    }
}

/// Reads the whole body as SSE events, failing on a torn event (bytes
/// after the last blank line).
pub async fn read_sse(response: reqwest::Response) -> Vec<Sse> {
    let mut body = response.bytes_stream();
    let mut text = String::new();
    within("the whole proxied stream", async {
        while let Some(chunk) = body.next().await {
            text.push_str(std::str::from_utf8(&chunk.expect("body chunk")).expect("utf-8"));
        }
    })
    .await;
    assert!(
        text.is_empty() || text.ends_with("\n\n"),
        "the stream ends with a torn event: {:?}",
        &text[text.len().saturating_sub(200)..]
    );
    parse_sse(&text)
}

/// The SSE events of a whole body.
pub fn parse_sse(text: &str) -> Vec<Sse> {
    text.split("\n\n")
        .filter(|b| !b.trim().is_empty())
        .filter(|b| !b.lines().all(|l| l.starts_with(':')))
        .map(|block| {
            let mut event = "message".to_owned();
            let mut data = String::new();
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("event:") {
                    event = v.trim().to_owned();
                } else if let Some(v) = line.strip_prefix("data:") {
                    data.push_str(v.trim_start());
                }
            }
            Sse { event, data }
        })
        .collect()
}

/// Checks an Anthropic stream is well formed — one `message_start` first,
/// blocks opened and closed in order with indexes 0, 1, 2 …, deltas only
/// inside an open block, `message_stop` last — and returns its text.
pub fn well_formed_anthropic(events: &[Sse]) -> String {
    let names: Vec<&str> = events.iter().map(|e| e.event.as_str()).collect();
    assert_eq!(names.first(), Some(&"message_start"), "{names:?}");
    assert_eq!(
        names.iter().filter(|n| **n == "message_start").count(),
        1,
        "{names:?}"
    );
    assert_eq!(names.last(), Some(&"message_stop"), "{names:?}");
    let mut next = 0;
    let mut open: Option<u64> = None;
    let mut text = String::new();
    for e in events {
        let d = e.json();
        assert_eq!(d["type"].as_str(), Some(e.event.as_str()), "{e:?}");
        match e.event.as_str() {
            "content_block_start" => {
                assert_eq!(open, None, "a block opened inside another: {names:?}");
                assert_eq!(d["index"], next, "block indexes run 0, 1, 2 …");
                open = Some(next);
                next += 1;
            }
            "content_block_delta" => {
                assert_eq!(d["index"].as_u64(), open, "a delta outside its block");
                if let Some(t) = d.pointer("/delta/text").and_then(Value::as_str) {
                    text.push_str(t);
                }
            }
            "content_block_stop" => {
                assert_eq!(d["index"].as_u64(), open, "a stop for another block");
                open = None;
            }
            _ => {}
        }
    }
    assert_eq!(open, None, "a block left open");
    text
}
