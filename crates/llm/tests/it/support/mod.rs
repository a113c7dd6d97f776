//! Test helpers: a loopback HTTP/1.1 server writing raw, scripted
//! responses, SSE fixtures and stream collectors.
#![allow(dead_code, unreachable_pub)]

pub mod memory;

use std::net::SocketAddr;
use std::time::Duration;

use futures_util::StreamExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use warden_core::{AgentEvent, EventStream, Frame, SessionKey, StreamError, TurnRequest};
use warden_llm::{AnthropicOptions, AnthropicSource, OpenAiOptions, OpenAiSource};

/// The API key the test sources send.
pub const KEY: &str = "sk-test-very-secret-key";

/// How the body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// `Transfer-Encoding: chunked`, one chunk per part.
    Chunked,
    /// `Connection: close`, the body runs to EOF.
    Close,
    /// `Content-Length` (all parts concatenated).
    Length,
}

/// What the server does after writing the parts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum After {
    /// End the body properly (final chunk, or close for `Close`).
    End,
    /// Close the socket in the middle of a chunked body (no final chunk).
    Abort,
    /// Keep the connection open and report when the client closes it.
    Hold,
}

/// One scripted response.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub parts: Vec<Vec<u8>>,
    pub delay: Duration,
    pub framing: Framing,
    pub after: After,
}

impl Reply {
    /// A 200 SSE stream, chunked, 5 ms between parts, ended properly.
    pub fn sse(parts: Vec<Vec<u8>>) -> Self {
        Self {
            status: 200,
            headers: vec![("content-type".into(), "text/event-stream".into())],
            parts,
            delay: Duration::from_millis(5),
            framing: Framing::Chunked,
            after: After::End,
        }
    }

    /// An error status with a JSON body.
    pub fn error(status: u16, body: &str) -> Self {
        Self {
            status,
            headers: vec![("content-type".into(), "application/json".into())],
            parts: vec![body.as_bytes().to_vec()],
            delay: Duration::ZERO,
            framing: Framing::Length,
            after: After::End,
        }
    }

    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    pub fn framing(mut self, framing: Framing) -> Self {
        self.framing = framing;
        self
    }

    pub fn after(mut self, after: After) -> Self {
        self.after = after;
        self
    }
}

/// A request as the server read it.
#[derive(Debug, Clone)]
pub struct Request {
    /// Request line and headers, as sent.
    pub head: String,
    pub body: Vec<u8>,
}

impl Request {
    /// A header's value (name case-insensitive).
    pub fn header(&self, name: &str) -> Option<String> {
        self.head.lines().skip(1).find_map(|line| {
            let (n, v) = line.split_once(':')?;
            n.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_owned())
        })
    }

    pub fn request_line(&self) -> &str {
        self.head.lines().next().unwrap_or_default()
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).expect("the request body is JSON")
    }
}

/// How a held connection ended, seen from the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientClosed {
    /// `read` returned 0 (FIN) or an error (reset).
    Yes,
    /// Still open after the server's patience ran out.
    No,
}

/// A loopback server answering each connection with the next reply (the
/// last one repeats).
pub struct Server {
    pub addr: SocketAddr,
    requests: mpsc::UnboundedReceiver<Request>,
    closed: mpsc::UnboundedReceiver<ClientClosed>,
}

impl Server {
    pub async fn start(replies: Vec<Reply>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (req_tx, requests) = mpsc::unbounded_channel();
        let (closed_tx, closed) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut n = 0usize;
            loop {
                let Ok((socket, _)) = listener.accept().await else {
                    return;
                };
                let reply = replies
                    .get(n)
                    .or(replies.last())
                    .cloned()
                    .expect("at least one reply");
                n += 1;
                let req_tx = req_tx.clone();
                let closed_tx = closed_tx.clone();
                tokio::spawn(async move {
                    serve(socket, reply, req_tx, closed_tx).await;
                });
            }
        });
        Self {
            addr,
            requests,
            closed,
        }
    }

    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The next request received.
    pub async fn request(&mut self) -> Request {
        tokio::time::timeout(Duration::from_secs(5), self.requests.recv())
            .await
            .expect("a request within 5 s")
            .expect("server running")
    }

    /// How the next held connection ended.
    pub async fn client_closed(&mut self) -> ClientClosed {
        tokio::time::timeout(Duration::from_secs(10), self.closed.recv())
            .await
            .expect("a held connection ended within 10 s")
            .expect("server running")
    }
}

async fn serve(
    mut socket: TcpStream,
    reply: Reply,
    requests: mpsc::UnboundedSender<Request>,
    closed: mpsc::UnboundedSender<ClientClosed>,
) {
    let Some(request) = read_request(&mut socket).await else {
        return;
    };
    let _ = requests.send(request);

    let reason = match reply.status {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        529 => "Overloaded",
        _ => "Whatever",
    };
    let mut head = format!("HTTP/1.1 {} {reason}\r\n", reply.status);
    for (n, v) in &reply.headers {
        head.push_str(&format!("{n}: {v}\r\n"));
    }
    match reply.framing {
        Framing::Chunked => head.push_str("transfer-encoding: chunked\r\n"),
        Framing::Close => head.push_str("connection: close\r\n"),
        Framing::Length => {
            let len: usize = reply.parts.iter().map(Vec::len).sum();
            head.push_str(&format!("content-length: {len}\r\n"));
        }
    }
    head.push_str("\r\n");
    if socket.write_all(head.as_bytes()).await.is_err() {
        return;
    }
    for part in &reply.parts {
        if !reply.delay.is_zero() {
            tokio::time::sleep(reply.delay).await;
        }
        let written = match reply.framing {
            Framing::Chunked => {
                let mut chunk = format!("{:x}\r\n", part.len()).into_bytes();
                chunk.extend_from_slice(part);
                chunk.extend_from_slice(b"\r\n");
                socket.write_all(&chunk).await
            }
            Framing::Close | Framing::Length => socket.write_all(part).await,
        };
        if written.is_err() {
            // The client went away (EPIPE or reset).
            if reply.after == After::Hold {
                let _ = closed.send(ClientClosed::Yes);
            }
            return;
        }
    }
    match reply.after {
        After::End => {
            if reply.framing == Framing::Chunked {
                let _ = socket.write_all(b"0\r\n\r\n").await;
            }
            if reply.framing == Framing::Close {
                let _ = socket.shutdown().await;
            } else {
                // Keep the connection until the client is done with it.
                let mut buf = [0u8; 1024];
                let _ = tokio::time::timeout(Duration::from_secs(5), socket.read(&mut buf)).await;
            }
        }
        After::Abort => {
            let _ = socket.write_all(b"100\r\npartial").await;
            drop(socket);
        }
        After::Hold => {
            let _ = socket.flush().await;
            let mut buf = [0u8; 1024];
            let outcome = tokio::time::timeout(Duration::from_secs(8), async {
                loop {
                    match socket.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(_) => {}
                    }
                }
            })
            .await;
            let _ = closed.send(match outcome {
                Ok(()) => ClientClosed::Yes,
                Err(_) => ClientClosed::No,
            });
        }
    }
}

/// Reads the request head and a `content-length` body.
async fn read_request(socket: &mut TcpStream) -> Option<Request> {
    let mut data = Vec::new();
    let mut buf = [0u8; 4096];
    let head_end = loop {
        if let Some(i) = data.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = socket.read(&mut buf).await.ok()?;
        if n == 0 {
            return None;
        }
        data.extend_from_slice(&buf[..n]);
    };
    let head = String::from_utf8_lossy(&data[..head_end]).into_owned();
    let mut request = Request {
        head,
        body: Vec::new(),
    };
    let len: usize = request
        .header("content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let mut body = data[head_end..].to_vec();
    while body.len() < len {
        let n = socket.read(&mut buf).await.ok()?;
        if n == 0 {
            return None;
        }
        body.extend_from_slice(&buf[..n]);
    }
    request.body = body;
    Some(request)
}

// --- SSE fixtures ------------------------------------------------------------

/// `event: {name}\ndata: {data}\n\n`.
pub fn sse(name: &str, data: &str) -> Vec<u8> {
    format!("event: {name}\ndata: {data}\n\n").into_bytes()
}

/// `data: {data}\n\n`.
pub fn data(data: &str) -> Vec<u8> {
    format!("data: {data}\n\n").into_bytes()
}

pub fn message_start() -> Vec<u8> {
    sse(
        "message_start",
        r#"{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","content":[],"model":"claude-x","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":25,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":1}}}"#,
    )
}

pub fn text_block(index: u32, text: &str) -> Vec<Vec<u8>> {
    vec![
        sse(
            "content_block_start",
            &format!(
                r#"{{"type":"content_block_start","index":{index},"content_block":{{"type":"text","text":""}}}}"#
            ),
        ),
        sse(
            "content_block_delta",
            &format!(
                r#"{{"type":"content_block_delta","index":{index},"delta":{{"type":"text_delta","text":{}}}}}"#,
                serde_json::to_string(text).expect("json")
            ),
        ),
        sse(
            "content_block_stop",
            &format!(r#"{{"type":"content_block_stop","index":{index}}}"#),
        ),
    ]
}

pub fn ping() -> Vec<u8> {
    sse("ping", r#"{"type": "ping"}"#)
}

pub fn message_end(stop_reason: &str) -> Vec<Vec<u8>> {
    vec![
        sse(
            "message_delta",
            &format!(
                r#"{{"type":"message_delta","delta":{{"stop_reason":"{stop_reason}","stop_sequence":null}},"usage":{{"output_tokens":15}}}}"#
            ),
        ),
        sse("message_stop", r#"{"type":"message_stop"}"#),
    ]
}

/// A whole text turn: "Hello" then " world".
pub fn anthropic_text_turn() -> Vec<Vec<u8>> {
    let mut parts = vec![message_start()];
    parts.extend(text_block(0, "Hello"));
    parts.extend(message_end("end_turn"));
    parts
}

// --- Sources and collection ------------------------------------------------

pub fn anthropic(server: &Server) -> AnthropicSource {
    anthropic_with(server, |o| o)
}

pub fn anthropic_with(
    server: &Server,
    f: impl FnOnce(AnthropicOptions) -> AnthropicOptions,
) -> AnthropicSource {
    AnthropicSource::new(f(AnthropicOptions::default()
        .with_base_url(server.base_url())
        .with_api_key(KEY)
        .with_model("claude-test")))
    .expect("valid options")
}

pub fn openai(server: &Server) -> OpenAiSource {
    openai_with(server, |o| o)
}

pub fn openai_with(
    server: &Server,
    f: impl FnOnce(OpenAiOptions) -> OpenAiOptions,
) -> OpenAiSource {
    OpenAiSource::new(f(OpenAiOptions::default()
        .with_base_url(server.base_url())
        .with_api_key(KEY)
        .with_model("gpt-test")))
    .expect("valid options")
}

pub fn turn(message: &str) -> TurnRequest {
    TurnRequest::new(SessionKey::new("/work/test"), 1, message)
}

/// Everything a stream yields, until its end or first error (5 s at most).
/// Also checks that nothing comes after an error.
pub async fn collect(mut stream: EventStream) -> (Vec<Frame>, Option<StreamError>) {
    tokio::time::timeout(Duration::from_secs(5), async move {
        let mut frames = Vec::new();
        while let Some(item) = stream.next().await {
            match item {
                Ok(frame) => frames.push(frame),
                Err(e) => {
                    assert!(stream.next().await.is_none(), "the stream ends after {e}");
                    return (frames, Some(e));
                }
            }
        }
        (frames, None)
    })
    .await
    .expect("the stream ended within 5 s")
}

/// The events among `frames`.
pub fn events(frames: &[Frame]) -> Vec<AgentEvent> {
    frames
        .iter()
        .filter_map(|f| match f {
            Frame::Event(e) => Some(e.clone()),
            Frame::KeepAlive => None,
        })
        .collect()
}

/// How many keep-alives are among `frames`.
pub fn keepalives(frames: &[Frame]) -> usize {
    frames
        .iter()
        .filter(|f| matches!(f, Frame::KeepAlive))
        .count()
}

pub const TURN_COMPLETE: AgentEvent = AgentEvent::TurnComplete {
    context_window: None,
    duration: None,
};
