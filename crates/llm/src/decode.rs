//! The SSE → [`Frame`] decoding layer, independent of HTTP.
//!
//! [`decode_frames`] turns any byte stream (a response body, or bytes held
//! in memory in tests) into the [`EventStream`] that
//! [`EventSource::open`](warden_core::EventSource::open) returns. It is made
//! of three layers:
//!
//! 1. A byte-level **guard** that sees every received chunk first. It
//!    enforces the frame size limit *before* the bytes reach the SSE parser
//!    (so the parser never buffers more than one chunk plus the limit),
//!    rejects invalid UTF-8 (the parser would otherwise buffer everything
//!    after a bad byte until EOF), and counts what the parser will not
//!    report: `:` comment lines, events without `data:`, and chunks that
//!    complete nothing. It does not parse fields; it only finds line ends.
//! 2. The SSE parser from `eventsource-stream`, which does the framing
//!    (fields, multi-line data, CR/LF/CRLF, BOM). It drops comments and
//!    data-less events, hence the counting above.
//! 3. A protocol **mapper** (Anthropic or OpenAI) from parsed events to
//!    [`AgentEvent`](warden_core::AgentEvent)s.
//!
//! # Liveness
//!
//! Each chunk is handed to the parser on its own; once the parser has
//! emitted the events that chunk completed, the guard's count for the chunk
//! is settled: one [`Frame::KeepAlive`] per comment line and per data-less
//! event, and one for a chunk that completed nothing at all (a frame still
//! arriving is still a sign of life). Every parsed event yields at least
//! one frame (`ping` and events that carry nothing for the session become
//! `KeepAlive`). So every raw SSE frame and every received chunk produces at
//! least one [`Frame`], whatever the timing; the watchdog is never starved
//! while bytes are flowing.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::task::{Context, Poll};

use eventsource_stream::{Event, EventStream as SseParser, EventStreamError};
use futures_util::Stream;
use serde::de::DeserializeOwned;
use warden_core::{EventStream, Frame, StreamError};

use crate::anthropic::AnthropicMapper;
use crate::openai::OpenAiMapper;

/// Which wire protocol a byte stream carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Protocol {
    /// Anthropic Messages streaming (`event: message_start` ... `message_stop`).
    Anthropic,
    /// OpenAI-compatible chat-completions streaming (`data: {chunk}` ...
    /// `data: [DONE]`).
    OpenAi,
}

/// Decodes an SSE byte stream into warden frames.
///
/// `bytes` yields the body as it arrives, in chunks of any size and split
/// anywhere (inside a line, inside a UTF-8 character); a transport error is
/// passed through as it is and ends the stream. `max_frame_bytes` bounds one
/// SSE event (its non-comment lines, line ends included): a larger one fails
/// with [`StreamError::FrameTooLarge`] as soon as the limit is crossed,
/// without waiting for the event to end.
///
/// The returned stream ends with `None` right after the terminal event
/// (`message_stop`, `[DONE]`), dropping `bytes`; an end of `bytes` before it
/// is [`StreamError::Truncated`]. After any error it ends.
pub fn decode_frames<S, B>(protocol: Protocol, bytes: S, max_frame_bytes: usize) -> EventStream
where
    S: Stream<Item = Result<B, StreamError>> + Send + 'static,
    B: AsRef<[u8]> + Send + 'static,
{
    let bytes: ByteStream<B> = Box::pin(bytes);
    match protocol {
        Protocol::Anthropic => Box::pin(SseFrames::new(
            bytes,
            max_frame_bytes,
            AnthropicMapper::default(),
        )),
        Protocol::OpenAi => Box::pin(SseFrames::new(
            bytes,
            max_frame_bytes,
            OpenAiMapper::default(),
        )),
    }
}

type ByteStream<B> = Pin<Box<dyn Stream<Item = Result<B, StreamError>> + Send>>;

/// Whether the mapped event ended the turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Flow {
    /// Keep reading.
    Continue,
    /// The terminal event: stop reading, end the stream.
    Done,
}

/// Maps the parsed SSE events of one protocol to frames.
pub(crate) trait EventMapper: Send + Unpin + 'static {
    /// Maps one parsed event, pushing its frames to `out` (pushing none is
    /// fine: the caller then yields a `KeepAlive`).
    fn map(&mut self, event: &Event, out: &mut VecDeque<Frame>) -> Result<Flow, StreamError>;

    /// The terminal event, for the `Truncated` message.
    fn terminal(&self) -> &'static str;
}

/// Parses `data` as JSON. The error message is serde's, with any quoted
/// literal it echoes from the input redacted: never the frame text.
pub(crate) fn parse_json<T: DeserializeOwned>(data: &str) -> Result<T, StreamError> {
    serde_json::from_str(data).map_err(|e| StreamError::Malformed {
        message: json_error_message(&e),
    })
}

/// serde_json's message, safe to log. Syntax and EOF messages never quote
/// the input; data errors may (`invalid type: string "..."`), so their
/// quoted parts are replaced by `…`.
pub(crate) fn json_error_message(e: &serde_json::Error) -> String {
    let message = e.to_string();
    match e.classify() {
        serde_json::error::Category::Data => redact_literals(&message),
        _ => message,
    }
}

fn redact_literals(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let mut chars = message.chars();
    while let Some(c) = chars.next() {
        out.push(c);
        if c == '"' || c == '`' {
            let mut escaped = false;
            for d in chars.by_ref() {
                if escaped {
                    escaped = false;
                } else if d == '\\' && c == '"' {
                    escaped = true;
                } else if d == c {
                    break;
                }
            }
            out.push('…');
            out.push(c);
        }
    }
    out
}

/// State shared between the guard (inside the parser) and the frame stream.
#[derive(Debug, Default)]
struct Shared {
    /// Liveness owed for chunks handed to the parser, not yet settled.
    credits: AtomicUsize,
    /// The guard returned `Pending` on purpose after a chunk: not a real
    /// wait, poll again.
    yielded: AtomicBool,
}

/// Finds line and event boundaries in raw bytes, without parsing fields.
#[derive(Debug)]
struct Scanner {
    limit: usize,
    /// Bytes of the current event's completed non-comment lines.
    event_bytes: usize,
    /// Bytes of the current, unfinished line.
    line_bytes: usize,
    at_line_start: bool,
    line_is_comment: bool,
    event_has_field: bool,
    after_cr: bool,
}

/// What one chunk completed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Scan {
    /// Events (blank-line terminated, with at least one field line).
    events: usize,
    /// Comment lines.
    comments: usize,
}

impl Scanner {
    fn new(limit: usize) -> Self {
        Self {
            limit,
            event_bytes: 0,
            line_bytes: 0,
            at_line_start: true,
            line_is_comment: false,
            event_has_field: false,
            after_cr: false,
        }
    }

    /// Scans a chunk; `Err(size)` when the current event exceeds the limit.
    fn feed(&mut self, bytes: &[u8]) -> Result<Scan, usize> {
        let mut scan = Scan::default();
        for (i, &b) in bytes.iter().enumerate() {
            if self.after_cr {
                self.after_cr = false;
                if b == b'\n' {
                    continue; // the LF of a CRLF
                }
            }
            if b == b'\r' || b == b'\n' {
                self.after_cr = b == b'\r';
                if self.at_line_start {
                    // A blank line ends the event.
                    if self.event_has_field {
                        scan.events += 1;
                    }
                    self.event_bytes = 0;
                    self.event_has_field = false;
                } else {
                    if self.line_is_comment {
                        scan.comments += 1;
                    } else {
                        self.event_bytes = self.event_bytes.saturating_add(self.line_bytes + 1);
                        self.event_has_field = true;
                        if self.event_bytes > self.limit {
                            return Err(self.event_bytes);
                        }
                    }
                    self.line_bytes = 0;
                    self.at_line_start = true;
                }
                continue;
            }
            if self.at_line_start {
                self.at_line_start = false;
                self.line_is_comment = b == b':';
            }
            self.line_bytes += 1;
            let size = self.event_bytes.saturating_add(self.line_bytes);
            if size > self.limit {
                let rest = bytes[i + 1..]
                    .iter()
                    .take_while(|&&b| b != b'\r' && b != b'\n')
                    .count();
                return Err(size.saturating_add(rest));
            }
        }
        Ok(scan)
    }
}

/// The byte-level guard: size limit, UTF-8, liveness counting; hands the
/// parser one chunk at a time.
struct Guard<B> {
    inner: ByteStream<B>,
    scanner: Scanner,
    /// The incomplete UTF-8 sequence at the end of the last chunk (< 4 bytes).
    carry: Vec<u8>,
    shared: Arc<Shared>,
    yield_next: bool,
    done: bool,
}

impl<B: AsRef<[u8]>> Stream for Guard<B> {
    type Item = Result<Vec<u8>, StreamError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        if this.done {
            return Poll::Ready(None);
        }
        if this.yield_next {
            // Let the frame stream settle this chunk's liveness before the
            // next one; it polls again at once (no wake-up needed).
            this.yield_next = false;
            this.shared.yielded.store(true, Ordering::Release);
            return Poll::Pending;
        }
        loop {
            let chunk = match this.inner.as_mut().poll_next(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => {
                    this.done = true;
                    return Poll::Ready(None);
                }
                Poll::Ready(Some(Err(e))) => {
                    this.done = true;
                    return Poll::Ready(Some(Err(e)));
                }
                Poll::Ready(Some(Ok(chunk))) => chunk,
            };
            let bytes = chunk.as_ref();
            if bytes.is_empty() {
                continue;
            }
            let scan = match this.scanner.feed(bytes) {
                Ok(scan) => scan,
                Err(size) => {
                    this.done = true;
                    return Poll::Ready(Some(Err(StreamError::FrameTooLarge {
                        size,
                        limit: this.scanner.limit,
                    })));
                }
            };
            let mut text = std::mem::take(&mut this.carry);
            text.extend_from_slice(bytes);
            if let Err(e) = std::str::from_utf8(&text) {
                if e.error_len().is_some() {
                    this.done = true;
                    return Poll::Ready(Some(Err(StreamError::Malformed {
                        // Utf8Error's Display gives offsets, never the bytes.
                        message: format!("invalid UTF-8 in the event stream: {e}"),
                    })));
                }
                // An incomplete character at the end: keep it for later.
                this.carry = text.split_off(e.valid_up_to());
            }
            let owed = (scan.events + scan.comments).max(1);
            this.shared.credits.fetch_add(owed, Ordering::AcqRel);
            this.yield_next = true;
            return Poll::Ready(Some(Ok(text)));
        }
    }
}

/// Parsed SSE events → frames, with liveness accounting.
struct SseFrames<B, M> {
    /// `None` once the stream has ended (this drops the body).
    parser: Option<SseParser<Guard<B>>>,
    shared: Arc<Shared>,
    mapper: M,
    /// Parsed events since the last settled chunk.
    events_since: usize,
    /// Frames of the last parsed event, not yet yielded.
    queue: VecDeque<Frame>,
    /// Liveness frames owed, not yet yielded (a count: no allocation per
    /// comment line).
    keepalives: usize,
}

impl<B: AsRef<[u8]>, M: EventMapper> SseFrames<B, M> {
    fn new(bytes: ByteStream<B>, max_frame_bytes: usize, mapper: M) -> Self {
        let shared = Arc::new(Shared::default());
        let guard = Guard {
            inner: bytes,
            scanner: Scanner::new(max_frame_bytes),
            carry: Vec::new(),
            shared: Arc::clone(&shared),
            yield_next: false,
            done: false,
        };
        Self {
            parser: Some(SseParser::new(guard)),
            shared,
            mapper,
            events_since: 0,
            queue: VecDeque::new(),
            keepalives: 0,
        }
    }

    fn settle_chunk(&mut self) {
        let owed = self.shared.credits.swap(0, Ordering::AcqRel);
        self.keepalives = self
            .keepalives
            .saturating_add(owed.saturating_sub(self.events_since));
        self.events_since = 0;
    }

    /// Stops reading: drops the parser and with it the body. Frames
    /// already queued are still yielded.
    fn end(&mut self) {
        self.parser = None;
        self.keepalives = 0;
    }

    /// Ends with `error`; nothing queued is yielded after it.
    fn fail(&mut self, error: StreamError) -> Poll<Option<Result<Frame, StreamError>>> {
        self.end();
        self.queue.clear();
        Poll::Ready(Some(Err(error)))
    }
}

impl<B: AsRef<[u8]>, M: EventMapper> Stream for SseFrames<B, M> {
    type Item = Result<Frame, StreamError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        loop {
            if let Some(frame) = this.queue.pop_front() {
                return Poll::Ready(Some(Ok(frame)));
            }
            if this.keepalives > 0 {
                this.keepalives -= 1;
                return Poll::Ready(Some(Ok(Frame::KeepAlive)));
            }
            let Some(parser) = this.parser.as_mut() else {
                return Poll::Ready(None);
            };
            match Pin::new(parser).poll_next(cx) {
                Poll::Ready(Some(Ok(event))) => {
                    this.events_since += 1;
                    match this.mapper.map(&event, &mut this.queue) {
                        Ok(flow) => {
                            if this.queue.is_empty() {
                                this.queue.push_back(Frame::KeepAlive);
                            }
                            if flow == Flow::Done {
                                // Yield what is queued, then end; the body
                                // is dropped now.
                                this.end();
                            }
                        }
                        Err(e) => return this.fail(e),
                    }
                }
                Poll::Ready(Some(Err(e))) => return this.fail(parser_error(e)),
                Poll::Ready(None) => {
                    let terminal = this.mapper.terminal();
                    return this.fail(StreamError::Truncated {
                        message: format!("the stream ended before {terminal}"),
                    });
                }
                Poll::Pending => {
                    this.settle_chunk();
                    if this.shared.yielded.swap(false, Ordering::AcqRel) {
                        continue;
                    }
                    if this.keepalives == 0 {
                        return Poll::Pending;
                    }
                }
            }
        }
    }
}

fn parser_error(e: EventStreamError<StreamError>) -> StreamError {
    match e {
        EventStreamError::Transport(e) => e,
        EventStreamError::Utf8(e) => StreamError::Malformed {
            message: format!("invalid UTF-8 in the event stream: {}", e.utf8_error()),
        },
        EventStreamError::Parser(_) => StreamError::Malformed {
            message: "invalid SSE line".to_owned(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scanner_counts_events_comments_and_crlf() {
        let mut s = Scanner::new(1024);
        let scan = s
            .feed(b": keep-alive\r\n\r\nevent: ping\r\ndata: {}\r\n\r\n")
            .expect("under the limit");
        assert_eq!(
            scan,
            Scan {
                events: 1,
                comments: 1
            }
        );
        // Split inside a CRLF and across events.
        let scan = s.feed(b"data: x\r").expect("ok");
        assert_eq!(scan, Scan::default());
        let scan = s.feed(b"\n\r\nevent: ping\n\n").expect("ok");
        assert_eq!(
            scan,
            Scan {
                events: 2,
                comments: 0
            }
        );
    }

    #[test]
    fn scanner_limits_an_event_but_not_comment_lines() {
        let mut s = Scanner::new(10);
        // Comment lines are dropped by the parser once complete: only the
        // line being read counts.
        for _ in 0..100 {
            s.feed(b": ping\n").expect("comments are not buffered");
        }
        assert_eq!(s.feed(b": a long comment\n"), Err(16));
        let mut s = Scanner::new(10);
        s.feed(b"data: 123").expect("9 bytes");
        assert_eq!(s.feed(b"\ndata: 4567"), Err(20));
        // The line end that crosses the limit is enough.
        let mut s = Scanner::new(9);
        assert_eq!(s.feed(b"data: 123\n"), Err(10));
    }

    #[test]
    fn data_errors_are_redacted() {
        #[derive(serde::Deserialize, Debug)]
        #[allow(dead_code)]
        struct T {
            n: u64,
        }
        let err = parse_json::<T>(r#"{"n":"secret \"quoted\" text"}"#).expect_err("bad type");
        let message = err.to_string();
        assert!(!message.contains("secret"), "{message}");
        assert!(message.contains("invalid type"), "{message}");
        let err = parse_json::<T>(r#"{"n": 1, secret"#).expect_err("bad syntax");
        assert!(!err.to_string().contains("secret"));
    }
}
