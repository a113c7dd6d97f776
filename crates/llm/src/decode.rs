//! The SSE → [`Frame`] decoding layer, independent of HTTP.
//!
//! [`decode_frames`] turns any byte stream (a response body, or bytes held
//! in memory in tests) into the [`EventStream`] that
//! [`EventSource::open`](warden_core::EventSource::open) returns. It is made
//! of two layers:
//!
//! 1. The SSE parser ([`SseParser`]): line ends
//!    (CR, LF, CRLF), a leading BOM, fields, the frame size limit (checked
//!    before anything is buffered past it) and UTF-8.
//! 2. A protocol **mapper** (Anthropic or OpenAI) from parsed events to
//!    [`AgentEvent`](warden_core::AgentEvent)s.
//!
//! # Liveness: frames, not bytes
//!
//! Only a complete frame is a sign of life: every dispatched event yields at
//! least one [`Frame`] (`ping` and events that carry nothing for the session
//! become [`Frame::KeepAlive`]), and so does every `:` comment line and
//! every event with fields but no data. Bytes that complete no frame — a
//! line trickling in a byte at a time, bare blank lines — yield nothing, so
//! a server cannot keep a stream alive past the watchdog's allowance without
//! actually sending frames. The frames a body yields do not depend on how
//! it is split into reads.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures_util::Stream;
use warden_core::{EventStream, Frame, StreamError};

pub use crate::provider::Protocol;
use crate::sse::{Parsed, SseParser};
use crate::wire::{EventMapper, Flow, mapper};

/// Decodes an SSE byte stream into warden frames.
///
/// `bytes` yields the body as it arrives, in chunks of any size and split
/// anywhere (inside a line, inside a UTF-8 character); a transport error is
/// passed through as it is and ends the stream. `max_frame_bytes` bounds one
/// SSE event (its field lines, line ends included) and the line being read:
/// a larger one fails with [`StreamError::FrameTooLarge`] as soon as the
/// limit is crossed, without waiting for the event to end.
///
/// The returned stream ends with `None` right after the terminal event
/// (`message_stop`, `[DONE]`), dropping `bytes`; an end of `bytes` before it
/// is [`StreamError::Truncated`]. After any error it ends.
pub fn decode_frames<S, B>(protocol: Protocol, bytes: S, max_frame_bytes: usize) -> EventStream
where
    S: Stream<Item = Result<B, StreamError>> + Send + 'static,
    B: AsRef<[u8]> + Send + 'static,
{
    Box::pin(SseFrames::new(
        Box::pin(bytes),
        max_frame_bytes,
        mapper(protocol),
    ))
}

/// A protocol's event mapper, boxed.
pub(crate) type Mapper = Box<dyn EventMapper>;

/// The default mapper of `protocol`.
pub(crate) fn mapper_for(protocol: Protocol) -> Mapper {
    mapper(protocol)
}

/// [`decode_frames`] with a mapper of the caller's (one that notes where
/// the stream is, for a re-attach).
pub(crate) fn decode_with<S, B>(mapper: Mapper, bytes: S, max_frame_bytes: usize) -> EventStream
where
    S: Stream<Item = Result<B, StreamError>> + Send + 'static,
    B: AsRef<[u8]> + Send + 'static,
{
    Box::pin(SseFrames::new(Box::pin(bytes), max_frame_bytes, mapper))
}

type ByteStream<B> = Pin<Box<dyn Stream<Item = Result<B, StreamError>> + Send>>;

/// Parsed SSE events → frames.
struct SseFrames<B> {
    /// `None` once the stream has ended (this drops the body).
    bytes: Option<ByteStream<B>>,
    parser: SseParser,
    /// The protocol's event mapper.
    mapper: Box<dyn EventMapper>,
    /// Frames parsed from the last chunk, not yet yielded.
    parsed: VecDeque<Parsed>,
    /// Frames of the last mapped event, not yet yielded.
    queue: VecDeque<Frame>,
    /// The error that ends the stream once the frames before it are out.
    error: Option<StreamError>,
}

impl<B: AsRef<[u8]>> SseFrames<B> {
    fn new(bytes: ByteStream<B>, max_frame_bytes: usize, mapper: Box<dyn EventMapper>) -> Self {
        Self {
            bytes: Some(bytes),
            parser: SseParser::new(max_frame_bytes),
            mapper,
            parsed: VecDeque::new(),
            queue: VecDeque::new(),
            error: None,
        }
    }

    /// Stops reading: drops the body. Frames already mapped are still
    /// yielded; nothing parsed after the end is.
    fn end(&mut self) {
        self.bytes = None;
        self.parsed.clear();
    }

    /// Ends with `error` after the frames completed before it.
    fn fail(&mut self, error: StreamError) {
        self.end();
        self.error = Some(error);
    }
}

impl<B: AsRef<[u8]>> Stream for SseFrames<B> {
    type Item = Result<Frame, StreamError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        loop {
            if let Some(frame) = this.queue.pop_front() {
                return Poll::Ready(Some(Ok(frame)));
            }
            if let Some(parsed) = this.parsed.pop_front() {
                match parsed {
                    Parsed::KeepAlive => return Poll::Ready(Some(Ok(Frame::KeepAlive))),
                    Parsed::Event(event) => match this.mapper.map(&event, &mut this.queue) {
                        Ok(flow) => {
                            if this.queue.is_empty() {
                                this.queue.push_back(Frame::KeepAlive);
                            }
                            if flow == Flow::Done {
                                // Yield what is mapped, then end; the body
                                // is dropped now; nothing after the
                                // terminal event matters.
                                this.end();
                                this.error = None;
                            }
                        }
                        Err(e) => {
                            this.queue.clear();
                            this.fail(e);
                        }
                    },
                }
                continue;
            }
            if let Some(error) = this.error.take() {
                return Poll::Ready(Some(Err(error)));
            }
            let Some(bytes) = this.bytes.as_mut() else {
                return Poll::Ready(None);
            };
            match bytes.as_mut().poll_next(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Ok(chunk))) => {
                    if let Err(e) = this.parser.feed(chunk.as_ref(), &mut this.parsed) {
                        // Frames completed before the error still count.
                        let before = std::mem::take(&mut this.parsed);
                        this.fail(e);
                        this.parsed = before;
                    }
                }
                Poll::Ready(Some(Err(e))) => this.fail(e),
                Poll::Ready(None) => {
                    let terminal = this.mapper.terminal();
                    this.fail(StreamError::Truncated {
                        message: format!("the stream ended before {terminal}"),
                    });
                }
            }
        }
    }
}
