//! The proxy and the sessions judge streams by the same rules
//! (`docs/runtime-semantics.md`, "Progress" and "What follows a broken
//! attempt"), against a hand-written upstream over real loopback HTTP:
//! progress is content, not any event; any `retry-after` holds the whole
//! upstream, not only a 429's.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::common::*;
use axum::Router;
use axum::body::Body;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;
use axum::routing::post;
use futures_util::StreamExt as _;
use warden_proxy::{Proxy, ProxyConfig, RecoveryEvent};

/// Serves `app` on a free loopback port: its base URL.
async fn upstream(app: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    tokio::spawn(async move { axum::serve(listener, app).await });
    base
}

fn sse(body: Body) -> Response {
    let mut r = Response::new(body);
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    r
}

/// A proxy in front of `base`, its recovery log kept.
async fn proxy(
    base: &str,
    tune: impl FnOnce(ProxyConfig) -> ProxyConfig,
) -> (String, Arc<std::sync::Mutex<Vec<RecoveryEvent>>>, Proxy) {
    let heard = Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = heard.clone();
    let config = ProxyConfig::default()
        .with_anthropic_upstream(base)
        .with_openai_upstream(base)
        .with_timeout(TIMEOUT)
        .with_retry(
            warden_core::RetryPolicy::default()
                .with_jitter(0.0)
                .with_max_attempts(2)
                .with_backoff(Duration::from_millis(10), Duration::from_millis(10)),
        )
        .with_recovery_log(move |r: &RecoveryEvent| {
            log.lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(r.clone());
        });
    let proxy = Proxy::start(tune(config)).await.expect("proxy");
    (serve(&proxy).await, heard, proxy)
}

/// Chat chunks that carry nothing (an empty `delta`), every 50 ms, after
/// the role: what some OpenAI-compatible servers send while they think.
/// They are frames (the stream is alive) but not content (no progress):
/// the progress allowance ends the stream, as it ends a session's.
#[tokio::test]
async fn empty_chat_chunks_keep_a_stream_alive_but_are_not_progress() {
    let app = Router::new().route(
        "/v1/chat/completions",
        post(|| async {
            let chunk = |delta: &str| {
                format!(
                    "data: {{\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[{{\"index\":0,\"delta\":{delta},\"finish_reason\":null}}]}}\n\n"
                )
            };
            let first = futures_util::stream::once(std::future::ready(chunk(
                "{\"role\":\"assistant\"}",
            )));
            let empty = futures_util::stream::unfold((), move |()| async move {
                tokio::time::sleep(Duration::from_millis(50)).await;
                Some((chunk("{}"), ()))
            });
            sse(Body::from_stream(
                first
                    .chain(empty)
                    .map(Ok::<_, std::convert::Infallible>),
            ))
        }),
    );
    let base = upstream(app).await;
    let (proxy_base, heard, _proxy) = proxy(&base, |c| {
        c.with_progress_timeout(Duration::from_millis(600))
    })
    .await;
    let t0 = Instant::now();
    let response = within(
        "the answer",
        reqwest::Client::new()
            .post(format!("{proxy_base}/v1/chat/completions"))
            .header("authorization", "Bearer sk-test")
            .header("content-type", "application/json")
            .body(
                r#"{"model":"gpt-test","stream":true,"messages":[{"role":"user","content":"hi"}]}"#,
            )
            .send(),
    )
    .await
    .expect("answer");
    // The empty chunks went out as they came; the stream ends with the
    // API's error chunk.
    assert_eq!(response.status(), StatusCode::OK);
    let body = within("the body", response.bytes()).await.expect("body");
    let body = String::from_utf8_lossy(&body);
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    let last = body
        .split("\n\n")
        .filter(|e| !e.trim().is_empty())
        .last()
        .unwrap_or_default();
    assert!(last.contains("\"error\""), "{body}");
    let heard = heard.lock().unwrap_or_else(|p| p.into_inner()).clone();
    assert!(
        heard.iter().any(|r| matches!(
            r,
            RecoveryEvent::GaveUp {
                code: "ESTREAM_NO_PROGRESS",
                ..
            }
        )),
        "{heard:?}"
    );
}

/// Anthropic's `529 overloaded_error` answer.
fn overloaded() -> Response {
    let mut r = Response::new(Body::from(
        r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
    ));
    *r.status_mut() = StatusCode::from_u16(529).expect("529");
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

/// The Anthropic stream of a short reply.
fn reply() -> String {
    [
        ("message_start", r#"{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","model":"claude-test","content":[],"stop_reason":null,"usage":{"input_tokens":3,"output_tokens":1}}}"#),
        ("content_block_start", r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#),
        ("content_block_delta", r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"hello"}}"#),
        ("content_block_stop", r#"{"type":"content_block_stop","index":0}"#),
        ("message_delta", r#"{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":2}}"#),
        ("message_stop", r#"{"type":"message_stop"}"#),
    ]
    .iter()
    .map(|(e, d)| format!("event: {e}\ndata: {d}\n\n"))
    .collect()
}

/// A 529 that asks to wait (`retry-after-ms`) holds every request to that
/// upstream, not only the one it answered, as a session's does: a second
/// request sent meanwhile reaches the upstream only once the wait is over.
/// (The 529 itself, before any byte, goes back to its client at once: its
/// own retries take it up.)
#[tokio::test]
async fn an_overloaded_answers_retry_after_holds_every_request() {
    const WAIT: Duration = Duration::from_millis(800);
    let calls = Arc::new(AtomicUsize::new(0));
    let arrivals = Arc::new(std::sync::Mutex::new(Vec::<Instant>::new()));
    let (c, a) = (calls.clone(), arrivals.clone());
    let app = Router::new().route(
        "/v1/messages",
        post(move || {
            let (calls, arrivals) = (c.clone(), a.clone());
            async move {
                arrivals
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(Instant::now());
                if calls.fetch_add(1, Ordering::SeqCst) == 0 {
                    let mut r = overloaded();
                    r.headers_mut().insert(
                        "retry-after-ms",
                        HeaderValue::from_str(&WAIT.as_millis().to_string()).expect("header"),
                    );
                    return r;
                }
                sse(Body::from(reply()))
            }
        }),
    );
    let base = upstream(app).await;
    let (proxy_base, _heard, _proxy) = proxy(&base, |c| c).await;
    let client = reqwest::Client::new();
    let send = |client: reqwest::Client| {
        let url = format!("{proxy_base}/v1/messages");
        async move {
            client
                .post(url)
                .header("x-api-key", KEY)
                .header("anthropic-version", "2023-06-01")
                .header("content-type", "application/json")
                .body(messages_body("claude-test", "hi"))
                .send()
                .await
                .expect("answer")
        }
    };
    let t0 = Instant::now();
    let first = tokio::spawn(send(client.clone()));
    // The second request leaves once the first has its 529.
    within("the 529", async {
        while calls.load(Ordering::SeqCst) == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let second = within("the second answer", send(client.clone())).await;
    let first = within("the first answer", first)
        .await
        .expect("first request");
    assert_eq!(first.status(), 529, "handed back at once");
    assert_eq!(second.status(), 200);
    let arrivals = arrivals.lock().unwrap_or_else(|p| p.into_inner()).clone();
    assert_eq!(arrivals.len(), 2, "a 529, then the second request");
    // Neither later request reached the upstream before the wait was over.
    for at in &arrivals[1..] {
        assert!(
            at.duration_since(arrivals[0]) >= WAIT - Duration::from_millis(50),
            "a request reached the upstream {:?} after the 529 that asked for {WAIT:?}",
            at.duration_since(arrivals[0])
        );
    }
    assert!(t0.elapsed() < Duration::from_secs(10));
}

/// What the upstream behind [`switchable`] does with a connection.
#[derive(Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Mode {
    /// Drops it at once: unreachable, as an API behind a load balancer.
    Drops,
    /// Reads the request and never says a word.
    Hangs,
    /// Hands it to an upstream that answers like the API (one request a
    /// connection, so that a switch holds for the next request too).
    Answers,
}

/// A loopback upstream doing what `mode` says with each new connection:
/// its base URL, and how many connections it accepted.
async fn switchable(mode: Arc<AtomicU8>) -> (String, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    let closing = |mut r: Response| {
        r.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
        r
    };
    let real = upstream(
        Router::new()
            .route(
                "/v1/messages",
                post(move || async move { closing(sse(Body::from(reply()))) }),
            )
            .route(
                "/v1/messages/count_tokens",
                post(move |body: bytes::Bytes| async move {
                    let mut r = closing(Response::new(Body::from(format!(
                        r#"{{"input_tokens":{}}}"#,
                        body.len()
                    ))));
                    r.headers_mut().insert(
                        header::CONTENT_TYPE,
                        HeaderValue::from_static("application/json"),
                    );
                    r
                }),
            ),
    )
    .await;
    let real = real.trim_start_matches("http://").to_owned();
    tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            count.fetch_add(1, Ordering::SeqCst);
            let now = mode.load(Ordering::SeqCst);
            if now == Mode::Answers as u8 {
                let real = real.clone();
                tokio::spawn(async move {
                    if let Ok(mut to) = tokio::net::TcpStream::connect(real).await {
                        let _ = tokio::io::copy_bidirectional(&mut socket, &mut to).await;
                    }
                });
            } else if now == Mode::Hangs as u8 {
                tokio::spawn(async move {
                    let _ = tokio::io::copy(&mut socket, &mut tokio::io::sink()).await;
                });
            } else {
                drop(socket);
            }
        }
    });
    (base, accepted)
}

/// An upstream that accepts connections and drops them at once (an
/// unreachable API behind a load balancer): the circuit opens after two
/// such attempts, new requests are answered at once naming the cause, the
/// upstream is asked at most once per probe interval, and the first probe
/// that gets an answer closes it.
#[tokio::test]
async fn an_unreachable_upstream_is_asked_once_per_probe_and_answers_close_the_circuit() {
    const PROBE: Duration = Duration::from_millis(500);
    let mode = Arc::new(AtomicU8::new(Mode::Drops as u8));
    let (base, accepted) = switchable(mode.clone()).await;
    let (proxy_base, heard, _proxy) = proxy(&base, |c| {
        c.with_circuit(Some(
            warden_proxy::CircuitConfig::default()
                .after(2)
                .probe_every(PROBE),
        ))
    })
    .await;
    let client = reqwest::Client::new();
    let ask = || {
        client
            .post(format!("{proxy_base}/v1/messages"))
            .header("x-api-key", KEY)
            .header("anthropic-version", "2023-06-01")
            .header("content-type", "application/json")
            .body(messages_body("claude-test", "hi"))
            .send()
    };
    // The first request spends two attempts finding out.
    let first = within("the first answer", ask()).await.expect("answer");
    assert_eq!(first.status(), StatusCode::BAD_GATEWAY);
    assert_eq!(accepted.load(Ordering::SeqCst), 2);
    // For 2.2 s, a request every 50 ms: each answered at once.
    let t0 = Instant::now();
    let mut asked = 0;
    while t0.elapsed() < Duration::from_millis(2200) {
        let started = Instant::now();
        let answer = within("an answer", ask()).await.expect("answer");
        assert_eq!(answer.status(), StatusCode::BAD_GATEWAY);
        let body = within("a body", answer.text()).await.expect("body");
        assert!(body.contains("cannot be reached"), "{body}");
        assert!(
            started.elapsed() < Duration::from_millis(400),
            "{:?}",
            started.elapsed()
        );
        asked += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(asked > 20, "{asked}");
    // At most one probe per interval reached the upstream (4 in 2.2 s,
    // plus the first request's two attempts).
    let reached = accepted.load(Ordering::SeqCst);
    assert!(
        (3..=2 + 5).contains(&reached),
        "the upstream was asked {reached} times for {asked} requests"
    );
    // The upstream answers again: the next probe closes the circuit.
    mode.store(Mode::Answers as u8, Ordering::SeqCst);
    let ok = within("the circuit to close", async {
        loop {
            let answer = ask().await.expect("answer");
            if answer.status() == StatusCode::OK {
                return answer;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert!(
        within("the reply", ok.text())
            .await
            .expect("body")
            .contains("hello")
    );
    let heard = heard.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let opened = heard
        .iter()
        .filter(|r| matches!(r, RecoveryEvent::CircuitOpened { .. }))
        .count();
    let closed = heard
        .iter()
        .filter(|r| matches!(r, RecoveryEvent::CircuitClosed { .. }))
        .count();
    assert_eq!((opened, closed), (1, 1), "{heard:?}");
}

/// One streamed Anthropic request through the proxy at `base`.
fn ask(client: &reqwest::Client, base: &str) -> reqwest::RequestBuilder {
    client
        .post(format!("{base}/v1/messages"))
        .header("x-api-key", KEY)
        .header("anthropic-version", "2023-06-01")
        .header("content-type", "application/json")
        .body(messages_body("claude-test", "hi"))
}

/// Sets `mode`.
fn set(mode: &AtomicU8, to: Mode) {
    mode.store(to as u8, Ordering::SeqCst);
}

/// A pass-through upload whose chunked body is malformed: the client's
/// fault, not the upstream's. Two of them (the circuit opens after two
/// unreachable attempts) must not shut every other client out: each gets
/// a `400` naming its body, and the next requests are all served.
#[tokio::test]
async fn a_client_whose_body_breaks_does_not_open_the_upstreams_circuit() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mode = Arc::new(AtomicU8::new(Mode::Answers as u8));
    let (base, _accepted) = switchable(mode).await;
    let (proxy_base, heard, _proxy) = proxy(&base, |c| c).await;
    let addr = proxy_base.trim_start_matches("http://").to_owned();
    for _ in 0..2 {
        let mut socket = within("a connection", tokio::net::TcpStream::connect(&addr))
            .await
            .expect("connect");
        let upload = format!(
            "POST /v1/messages/count_tokens HTTP/1.1\r\nhost: {addr}\r\nx-api-key: {KEY}\r\n\
             anthropic-version: 2023-06-01\r\ncontent-type: application/json\r\n\
             transfer-encoding: chunked\r\n\r\n5\r\n{{\"a\":\r\nnot a size\r\n\r\n"
        );
        socket.write_all(upload.as_bytes()).await.expect("write");
        let mut answer = Vec::new();
        within(
            "the answer to the broken upload",
            socket.read_to_end(&mut answer),
        )
        .await
        .expect("read");
        let answer = String::from_utf8_lossy(&answer);
        assert!(
            answer.starts_with("HTTP/1.1 400") && answer.contains("body could not be read"),
            "{answer}"
        );
    }
    let client = reqwest::Client::new();
    let mut statuses = Vec::new();
    for _ in 0..10 {
        let response = within("an answer", ask(&client, &proxy_base).send())
            .await
            .expect("answer");
        statuses.push(response.status().as_u16());
    }
    assert_eq!(statuses, [200; 10]);
    let heard = heard.lock().unwrap_or_else(|p| p.into_inner()).clone();
    assert!(
        !heard.iter().any(|r| matches!(
            r,
            RecoveryEvent::CircuitOpened { .. } | RecoveryEvent::Unreachable { .. }
        )),
        "{heard:?}"
    );
}

/// The probe of an open circuit that ends with neither an answer nor an
/// unreachable attempt — its client hangs up, or the watchdog kills it
/// while the upstream holds the connection without a word — frees its
/// slot: a request after the next probe interval goes as the probe and is
/// served, instead of every request being refused for ever.
#[tokio::test]
async fn a_probe_lost_without_an_answer_lets_the_next_one_go() {
    const PROBE: Duration = Duration::from_millis(300);
    for client_hangs_up in [true, false] {
        let what = if client_hangs_up {
            "the probe's client hung up"
        } else {
            "the watchdog killed the probe"
        };
        let mode = Arc::new(AtomicU8::new(Mode::Drops as u8));
        let (base, accepted) = switchable(mode.clone()).await;
        let (proxy_base, _heard, _proxy) = proxy(&base, |c| {
            let c = c.with_circuit(Some(
                warden_proxy::CircuitConfig::default()
                    .after(2)
                    .probe_every(PROBE),
            ));
            // A hung-up client must free the probe on its own, long
            // before a watchdog would.
            if client_hangs_up {
                c.with_timeout(Duration::from_secs(60))
            } else {
                c
            }
        })
        .await;
        let client = reqwest::Client::new();
        let first = within("the first answer", ask(&client, &proxy_base).send())
            .await
            .expect("answer");
        assert_eq!(first.status(), StatusCode::BAD_GATEWAY, "{what}");
        set(&mode, Mode::Hangs);
        tokio::time::sleep(PROBE + Duration::from_millis(50)).await;
        let before = accepted.load(Ordering::SeqCst);
        if client_hangs_up {
            let probe =
                tokio::time::timeout(Duration::from_millis(300), ask(&client, &proxy_base).send())
                    .await;
            assert!(probe.is_err(), "{what}: the probe got no answer: {probe:?}");
        } else {
            let probe = within(
                "the killed probe's answer",
                ask(&client, &proxy_base).send(),
            )
            .await
            .expect("answer");
            assert_eq!(probe.status(), 529, "{what}");
        }
        assert!(
            accepted.load(Ordering::SeqCst) > before,
            "{what}: the probe reached the upstream"
        );
        set(&mode, Mode::Answers);
        let served = within(&format!("a later probe to be served ({what})"), async {
            loop {
                let answer = ask(&client, &proxy_base).send().await.expect("answer");
                if answer.status() == StatusCode::OK {
                    return answer;
                }
                assert_eq!(answer.status(), StatusCode::BAD_GATEWAY, "{what}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await;
        let body = within("the reply", served.text()).await.expect("body");
        assert!(body.contains("message_stop"), "{what}: {body}");
    }
}

/// "Consecutive" unreachable attempts are consecutive: an answer between
/// two of them starts the count again, whether or not the circuit was
/// open. Two failures with twenty answered requests between them leave it
/// closed.
#[tokio::test]
async fn answers_between_two_unreachable_attempts_keep_the_circuit_closed() {
    let mode = Arc::new(AtomicU8::new(Mode::Drops as u8));
    let (base, _accepted) = switchable(mode.clone()).await;
    // One attempt a request: each unreachable request counts one.
    let (proxy_base, heard, _proxy) = proxy(&base, |c| {
        c.with_retry(warden_core::RetryPolicy::default().with_max_attempts(1))
    })
    .await;
    let client = reqwest::Client::new();
    let status = |r: reqwest::Response| r.status();
    let unreachable = within("an answer", ask(&client, &proxy_base).send())
        .await
        .expect("answer");
    assert_eq!(status(unreachable), StatusCode::BAD_GATEWAY);
    set(&mode, Mode::Answers);
    for _ in 0..20 {
        let answered = within("an answer", ask(&client, &proxy_base).send())
            .await
            .expect("answer");
        assert_eq!(status(answered), StatusCode::OK);
    }
    set(&mode, Mode::Drops);
    let unreachable = within("an answer", ask(&client, &proxy_base).send())
        .await
        .expect("answer");
    assert_eq!(status(unreachable), StatusCode::BAD_GATEWAY);
    set(&mode, Mode::Answers);
    let answered = within("an answer", ask(&client, &proxy_base).send())
        .await
        .expect("answer");
    assert_eq!(status(answered), StatusCode::OK, "the circuit is closed");
    let heard = heard.lock().unwrap_or_else(|p| p.into_inner()).clone();
    assert!(
        !heard
            .iter()
            .any(|r| matches!(r, RecoveryEvent::CircuitOpened { .. })),
        "{heard:?}"
    );
}

/// A request the proxy stops retrying before any byte reached the client
/// gets a status the client retries itself (a 529 here, as the SDKs and
/// Claude Code do), and the client's retry completes: the operator's line
/// says the proxy handed the 529 back, never that it "gave up" on a
/// request that then completed.
#[tokio::test]
async fn a_529_handed_back_to_a_client_that_then_completes_is_not_a_give_up() {
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    let app = Router::new().route(
        "/v1/messages",
        post(move || {
            let calls = c.clone();
            async move {
                // The first two requests are overloaded, then it answers.
                if calls.fetch_add(1, Ordering::SeqCst) < 2 {
                    return overloaded();
                }
                sse(Body::from(reply()))
            }
        }),
    );
    let base = upstream(app).await;
    // A 529 before any byte goes back at once: each request is one attempt.
    let (proxy_base, heard, _proxy) = proxy(&base, |c| c).await;
    let client = reqwest::Client::new();
    // The client's own retries, as an SDK's: a 529 is sent again.
    let mut statuses = Vec::new();
    let body = within("the client's retries", async {
        for _ in 0..3 {
            let response = client
                .post(format!("{proxy_base}/v1/messages"))
                .header("x-api-key", KEY)
                .header("anthropic-version", "2023-06-01")
                .header("content-type", "application/json")
                .body(messages_body("claude-test", "hi"))
                .send()
                .await
                .expect("answer");
            statuses.push(response.status().as_u16());
            if response.status() == StatusCode::OK {
                return response.text().await.expect("body");
            }
        }
        String::new()
    })
    .await;
    assert_eq!(statuses, [529, 529, 200], "{body}");
    assert!(body.contains("message_stop"), "{body}");
    let heard = heard.lock().unwrap_or_else(|p| p.into_inner()).clone();
    assert!(
        !heard
            .iter()
            .any(|r| matches!(r, RecoveryEvent::GaveUp { .. })),
        "no give-up for a request that completed: {heard:?}"
    );
    let handed: Vec<&RecoveryEvent> = heard
        .iter()
        .filter(|r| matches!(r, RecoveryEvent::HandedBack { .. }))
        .collect();
    assert!(
        handed.len() == 2
            && handed.iter().all(|r| matches!(
                r,
                RecoveryEvent::HandedBack {
                    attempts: 1,
                    status: 529,
                    ..
                }
            )),
        "{heard:?}"
    );
    let line = handed[0].to_string();
    assert!(
        line.contains("answered 529 after 1 attempt(s)")
            && line.contains("handed back to the client as it came")
            && !line.contains("gave up"),
        "{line}"
    );
}
