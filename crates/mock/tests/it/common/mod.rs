//! Helpers shared by the integration tests: request bodies, an SSE parser
//! and a raw HTTP/1.1 client over a plain `TcpStream` (to see EOFs, the
//! chunked terminator and silence exactly as the socket shows them).

#![allow(dead_code, unreachable_pub, missing_docs)]

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Generous bound for things that must happen (loaded CI machines).
pub const WITHIN: Duration = Duration::from_secs(5);

/// An Anthropic Messages request like the Claude Code CLI sends (system,
/// tools, metadata and thinking fields the mock must ignore).
pub fn anthropic_request(model: &str, stream: bool) -> Value {
    json!({
        "model": model,
        "max_tokens": 1024,
        "stream": stream,
        "system": [{"type": "text", "text": "You are a test.", "cache_control": {"type": "ephemeral"}}],
        "tools": [{"name": "Bash", "description": "run", "input_schema": {"type": "object"}}],
        "metadata": {"user_id": "u"},
        "temperature": 1,
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "hello there"}]}
        ]
    })
}

/// An OpenAI chat completions request.
pub fn openai_request(model: &str, stream: bool, include_usage: bool) -> Value {
    let mut req = json!({
        "model": model,
        "stream": stream,
        "messages": [
            {"role": "system", "content": "You are a test."},
            {"role": "user", "content": "hello there"}
        ]
    });
    if include_usage {
        req["stream_options"] = json!({"include_usage": true});
    }
    req
}

/// One SSE frame.
#[derive(Debug, Clone, PartialEq)]
pub enum Sse {
    /// `event:` (if any) and the joined `data:` lines.
    Event { event: Option<String>, data: String },
    /// A `: comment` frame.
    Comment(String),
}

impl Sse {
    pub fn name(&self) -> Option<&str> {
        match self {
            Sse::Event { event, .. } => event.as_deref(),
            Sse::Comment(_) => None,
        }
    }

    pub fn data(&self) -> Option<&str> {
        match self {
            Sse::Event { data, .. } => Some(data),
            Sse::Comment(_) => None,
        }
    }

    /// The data parsed as JSON; panics with the data if it is not JSON.
    pub fn json(&self) -> Value {
        let data = self.data().expect("a data frame");
        serde_json::from_str(data).unwrap_or_else(|e| panic!("not JSON ({e}): {data:.200}"))
    }
}

/// Parses complete SSE frames (blank-line separated); an unterminated
/// trailing frame is ignored.
pub fn parse_sse(text: &str) -> Vec<Sse> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(end) = rest.find("\n\n") {
        let frame = &rest[..end];
        rest = &rest[end + 2..];
        let mut event = None;
        let mut data: Vec<&str> = Vec::new();
        let mut comment = None;
        for line in frame.lines() {
            if let Some(v) = line.strip_prefix("event:") {
                event = Some(v.trim().to_owned());
            } else if let Some(v) = line.strip_prefix("data:") {
                data.push(v.strip_prefix(' ').unwrap_or(v));
            } else if let Some(v) = line.strip_prefix(':') {
                comment = Some(v.trim().to_owned());
            }
        }
        if event.is_none() && data.is_empty() {
            if let Some(c) = comment {
                out.push(Sse::Comment(c));
            }
            continue;
        }
        out.push(Sse::Event {
            event,
            data: data.join("\n"),
        });
    }
    out
}

/// Event names of the frames that have one.
pub fn names(frames: &[Sse]) -> Vec<String> {
    frames
        .iter()
        .filter_map(|f| f.name().map(str::to_owned))
        .collect()
}

/// Decodes a chunked body read so far: the data, and whether the final
/// zero-size chunk was seen.
pub fn dechunk(raw: &[u8]) -> (Vec<u8>, bool) {
    let mut out = Vec::new();
    let mut rest = raw;
    loop {
        let Some(eol) = rest.windows(2).position(|w| w == b"\r\n") else {
            return (out, false);
        };
        let size_line = std::str::from_utf8(&rest[..eol]).expect("chunk size line");
        let size = usize::from_str_radix(size_line.trim(), 16).expect("hex chunk size");
        if size == 0 {
            return (out, true);
        }
        let start = eol + 2;
        if rest.len() < start + size + 2 {
            out.extend_from_slice(&rest[start..rest.len().min(start + size)]);
            return (out, false);
        }
        out.extend_from_slice(&rest[start..start + size]);
        rest = &rest[start + size + 2..];
    }
}

/// How a raw read ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadEnd {
    /// The server closed the connection (EOF).
    Eof,
    /// Still open when the time was up.
    StillOpen,
}

/// A response read straight off the socket.
pub struct Raw {
    stream: TcpStream,
    pub status: u16,
    pub headers: Vec<(String, String)>,
    /// Body bytes read so far, still chunk-encoded.
    pub body: Vec<u8>,
}

/// Sends one request over a fresh connection and reads the response head.
pub async fn raw_request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &Value,
) -> Raw {
    let body = body.to_string();
    let mut stream = tokio::time::timeout(WITHIN, TcpStream::connect(addr))
        .await
        .expect("connect in time")
        .expect("connect");
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(&body);
    stream
        .write_all(req.as_bytes())
        .await
        .expect("write request");

    let mut buf = Vec::new();
    let head_end = loop {
        if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break p;
        }
        let mut chunk = [0u8; 4096];
        let n = tokio::time::timeout(WITHIN, stream.read(&mut chunk))
            .await
            .expect("response head in time")
            .expect("read head");
        assert!(n > 0, "EOF before the response head");
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let status_line = lines.next().expect("status line");
    let status = status_line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("status code");
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    Raw {
        stream,
        status,
        headers,
        body: buf[head_end + 4..].to_vec(),
    }
}

impl Raw {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The body decoded so far, as text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&dechunk(&self.body).0).into_owned()
    }

    /// Whether the final zero-size chunk arrived.
    pub fn complete(&self) -> bool {
        dechunk(&self.body).1
    }

    /// Reads until the decoded body contains `needle`; panics on EOF or
    /// after [`WITHIN`].
    pub async fn read_until(&mut self, needle: &str) {
        let deadline = tokio::time::Instant::now() + WITHIN;
        while !self.text().contains(needle) {
            let mut chunk = [0u8; 65536];
            let n = tokio::time::timeout_at(deadline, self.stream.read(&mut chunk))
                .await
                .unwrap_or_else(|_| panic!("{needle:?} not seen in time; got {:?}", self.text()))
                .expect("read");
            assert!(n > 0, "EOF before {needle:?}; got {:?}", self.text());
            self.body.extend_from_slice(&chunk[..n]);
        }
    }

    /// Reads for at most `dur`; reports whether the server closed the
    /// connection in that time.
    pub async fn read_for(&mut self, dur: Duration) -> ReadEnd {
        let deadline = tokio::time::Instant::now() + dur;
        loop {
            let mut chunk = [0u8; 65536];
            match tokio::time::timeout_at(deadline, self.stream.read(&mut chunk)).await {
                Err(_) => return ReadEnd::StillOpen,
                Ok(Ok(0)) | Ok(Err(_)) => return ReadEnd::Eof,
                Ok(Ok(n)) => self.body.extend_from_slice(&chunk[..n]),
            }
        }
    }

    /// Reads to EOF; panics if the connection is still open after
    /// [`WITHIN`].
    pub async fn read_to_eof(&mut self) {
        assert_eq!(
            self.read_for(WITHIN).await,
            ReadEnd::Eof,
            "connection still open"
        );
    }
}

/// Sends one request over a fresh connection and returns the socket
/// without reading anything.
pub async fn raw_send(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    body: &Value,
) -> TcpStream {
    let body = body.to_string();
    let mut stream = tokio::time::timeout(WITHIN, TcpStream::connect(addr))
        .await
        .expect("connect in time")
        .expect("connect");
    let mut req = format!(
        "POST {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(&body);
    stream
        .write_all(req.as_bytes())
        .await
        .expect("write request");
    stream
}

/// Reads from `stream` for at most `dur`: the bytes read and how it ended.
pub async fn read_for(stream: &mut TcpStream, dur: Duration) -> (Vec<u8>, ReadEnd) {
    let deadline = tokio::time::Instant::now() + dur;
    let mut got = Vec::new();
    loop {
        let mut chunk = [0u8; 65536];
        match tokio::time::timeout_at(deadline, stream.read(&mut chunk)).await {
            Err(_) => return (got, ReadEnd::StillOpen),
            Ok(Ok(0)) | Ok(Err(_)) => return (got, ReadEnd::Eof),
            Ok(Ok(n)) => got.extend_from_slice(&chunk[..n]),
        }
    }
}
