//! A push parser for `text/event-stream`, as the HTML Standard's
//! "event stream interpretation" defines it.
//!
//! It is written here rather than taken from a crate because the one used
//! before (`eventsource-stream` 0.2.3) panics on a leading byte-order mark
//! (`start byte index 1 is not a char boundary`) and holds the last event of
//! a stream with CR-only line ends until a byte that never comes; both are
//! valid SSE. What it implements:
//!
//! - **Line ends**: CRLF, LF or CR, mixed freely; a CRLF split across two
//!   reads is one line end. A CR ends its line at once (the parser never
//!   waits to see whether an LF follows).
//! - **BOM**: one UTF-8 byte-order mark at the very start of the stream is
//!   skipped, whole or split across reads; anywhere else it is data.
//! - **Fields**: `event`, `data` (lines joined with LF), `id` (ignored when
//!   it contains NUL), `retry` (ignored: a warden stream is never
//!   reconnected by the parser), unknown fields ignored; a line without a
//!   colon is a field with an empty value; one space after the colon is
//!   dropped. Lines starting with `:` are comments.
//! - **Dispatch**: a blank line dispatches the event when its data buffer is
//!   not empty; the event type defaults to `message`. An incomplete event at
//!   the end of the stream is never dispatched.
//!
//! On top of the spec it reports liveness and enforces limits:
//! - every comment line, and every blank-line-terminated event that had
//!   field lines but no data (`event: ping` alone), is a
//!   [`Parsed::KeepAlive`]: the server deliberately sent a frame. A bare
//!   blank line is *not* life, and neither is a partial line: bytes that
//!   complete no frame never feed the watchdog (see the crate docs);
//! - one event's field lines (line ends included) may not exceed the limit,
//!   and neither may the line being read, a comment included; the error
//!   comes as soon as the limit is crossed, so at most the limit is ever
//!   buffered;
//! - a line that is not UTF-8 is an error (reported with offsets, never the
//!   bytes).

use std::collections::VecDeque;

use warden_core::StreamError;

/// The UTF-8 byte-order mark.
const BOM: [u8; 3] = [0xEF, 0xBB, 0xBF];

/// One dispatched server-sent event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    /// The event type: the last `event:` field, else `message`.
    pub event: String,
    /// The `data:` lines joined with `\n`.
    pub data: String,
    /// The last event id seen in the stream so far (`id:`), if any.
    pub id: Option<String>,
}

/// What a complete frame of the stream was.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Parsed {
    /// An event with data.
    Event(SseEvent),
    /// A comment line, or an event with fields but no data: a sign of life
    /// that carries nothing.
    KeepAlive,
}

/// Where the parser is in the optional byte-order mark.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Bom {
    /// `n` bytes of a BOM seen at the start of the stream, held back.
    Matching(usize),
    /// Past the start of the stream.
    Done,
}

/// The SSE push parser; feed it the body as it arrives.
#[derive(Debug)]
pub struct SseParser {
    limit: usize,
    bom: Bom,
    /// The line being read (without its end).
    line: Vec<u8>,
    /// The last byte fed was a CR: an LF right after it is part of it.
    after_cr: bool,
    /// Bytes of the current event's field lines, line ends included.
    event_bytes: usize,
    /// The current event had at least one field line.
    has_field: bool,
    event_type: String,
    data: String,
    /// The data buffer is not empty (the spec's test; `data:` alone makes
    /// it non-empty).
    has_data: bool,
    last_id: Option<String>,
}

impl SseParser {
    /// A parser that refuses events (and lines) larger than `limit` bytes.
    pub fn new(limit: usize) -> Self {
        Self {
            limit,
            bom: Bom::Matching(0),
            line: Vec::new(),
            after_cr: false,
            event_bytes: 0,
            has_field: false,
            event_type: String::new(),
            data: String::new(),
            has_data: false,
            last_id: None,
        }
    }

    /// Parses `bytes`, pushing every frame they complete to `out` in order.
    /// After an error the parser must not be fed again; frames completed
    /// before the error are in `out`.
    pub fn feed(
        &mut self,
        mut bytes: &[u8],
        out: &mut VecDeque<Parsed>,
    ) -> Result<(), StreamError> {
        if let Bom::Matching(mut seen) = self.bom {
            while let Some((&b, rest)) = bytes.split_first() {
                if b != BOM[seen] {
                    // Not a BOM after all: what was held back is data.
                    self.bom = Bom::Done;
                    let held = &BOM[..seen];
                    self.feed_body(held, out)?;
                    break;
                }
                bytes = rest;
                seen += 1;
                if seen == BOM.len() {
                    self.bom = Bom::Done;
                    break;
                }
            }
            if let Bom::Matching(_) = self.bom {
                self.bom = Bom::Matching(seen);
                return Ok(());
            }
        }
        self.feed_body(bytes, out)
    }

    fn feed_body(
        &mut self,
        mut bytes: &[u8],
        out: &mut VecDeque<Parsed>,
    ) -> Result<(), StreamError> {
        if self.after_cr && !bytes.is_empty() {
            self.after_cr = false;
            if bytes[0] == b'\n' {
                bytes = &bytes[1..]; // the LF of a CRLF split across reads
            }
        }
        while !bytes.is_empty() {
            match bytes.iter().position(|&b| b == b'\n' || b == b'\r') {
                None => {
                    self.extend_line(bytes)?;
                    return Ok(());
                }
                Some(end) => {
                    self.extend_line(&bytes[..end])?;
                    let cr = bytes[end] == b'\r';
                    bytes = &bytes[end + 1..];
                    if cr {
                        match bytes.first() {
                            Some(b'\n') => bytes = &bytes[1..],
                            Some(_) => {}
                            None => self.after_cr = true,
                        }
                    }
                    self.end_line(out)?;
                }
            }
        }
        Ok(())
    }

    fn extend_line(&mut self, part: &[u8]) -> Result<(), StreamError> {
        let size = self
            .event_bytes
            .saturating_add(self.line.len())
            .saturating_add(part.len());
        if size > self.limit {
            return Err(StreamError::FrameTooLarge {
                size,
                limit: self.limit,
            });
        }
        self.line.extend_from_slice(part);
        Ok(())
    }

    fn end_line(&mut self, out: &mut VecDeque<Parsed>) -> Result<(), StreamError> {
        if self.line.is_empty() {
            self.dispatch(out);
            return Ok(());
        }
        if self.line[0] == b':' {
            self.line.clear();
            out.push_back(Parsed::KeepAlive);
            return Ok(());
        }
        // The line end counts towards the event's size.
        let size = self.event_bytes.saturating_add(self.line.len() + 1);
        if size > self.limit {
            return Err(StreamError::FrameTooLarge {
                size,
                limit: self.limit,
            });
        }
        self.event_bytes = size;
        let line = std::mem::take(&mut self.line);
        let text = std::str::from_utf8(&line).map_err(|e| StreamError::Malformed {
            // Utf8Error's Display gives offsets, never the bytes.
            message: format!("invalid UTF-8 in the event stream: {e}"),
        })?;
        let (name, value) = match text.split_once(':') {
            Some((name, value)) => (name, value.strip_prefix(' ').unwrap_or(value)),
            None => (text, ""),
        };
        self.has_field = true;
        match name {
            "event" => {
                self.event_type.clear();
                self.event_type.push_str(value);
            }
            "data" => {
                if self.has_data {
                    self.data.push('\n');
                }
                self.data.push_str(value);
                self.has_data = true;
            }
            "id" if !value.contains('\0') => self.last_id = Some(value.to_owned()),
            _ => {} // retry, unknown fields
        }
        // Keep the buffer's capacity for the next line.
        self.line = line;
        self.line.clear();
        Ok(())
    }

    fn dispatch(&mut self, out: &mut VecDeque<Parsed>) {
        if self.has_data {
            let event = if self.event_type.is_empty() {
                "message".to_owned()
            } else {
                std::mem::take(&mut self.event_type)
            };
            out.push_back(Parsed::Event(SseEvent {
                event,
                data: std::mem::take(&mut self.data),
                id: self.last_id.clone(),
            }));
        } else if self.has_field {
            out.push_back(Parsed::KeepAlive);
        }
        self.event_type.clear();
        self.data.clear();
        self.has_data = false;
        self.has_field = false;
        self.event_bytes = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn parse_chunks(chunks: &[&[u8]], limit: usize) -> (Vec<Parsed>, Option<StreamError>) {
        let mut p = SseParser::new(limit);
        let mut out = VecDeque::new();
        for c in chunks {
            if let Err(e) = p.feed(c, &mut out) {
                return (out.into(), Some(e));
            }
        }
        (out.into(), None)
    }

    fn event(kind: &str, data: &str) -> Parsed {
        Parsed::Event(SseEvent {
            event: kind.into(),
            data: data.into(),
            id: None,
        })
    }

    #[test]
    fn a_leading_bom_is_skipped_whole_or_split() {
        let body = b"\xEF\xBB\xBFdata: x\n\n";
        for split in 0..body.len() {
            let (out, err) = parse_chunks(&[&body[..split], &body[split..]], 64);
            assert_eq!(err, None, "split at {split}");
            assert_eq!(out, vec![event("message", "x")], "split at {split}");
        }
        // Byte by byte.
        let chunks: Vec<&[u8]> = body.chunks(1).collect();
        assert_eq!(parse_chunks(&chunks, 64).0, vec![event("message", "x")]);
    }

    #[test]
    fn a_bom_is_only_skipped_at_the_start() {
        // A second BOM is part of the field name: an unknown field.
        let (out, err) = parse_chunks(&[b"\xEF\xBB\xBF\xEF\xBB\xBFdata: x\n\ndata: y\n\n"], 64);
        assert_eq!(err, None);
        assert_eq!(out, vec![Parsed::KeepAlive, event("message", "y")]);
        // A partial BOM followed by other bytes is data: here, invalid UTF-8.
        let (_, err) = parse_chunks(&[b"\xEF\xBB", b"data: x\n\n"], 64);
        assert!(
            matches!(err, Some(StreamError::Malformed { .. })),
            "{err:?}"
        );
    }

    #[test]
    fn cr_only_line_ends_dispatch_at_once() {
        let (out, err) = parse_chunks(&[b"event: a\rdata: 1\r\r"], 64);
        assert_eq!(err, None);
        assert_eq!(out, vec![event("a", "1")]);
    }

    #[test]
    fn a_crlf_split_across_reads_is_one_line_end() {
        let (out, _) = parse_chunks(&[b"data: 1\r", b"\n\r", b"\n"], 64);
        assert_eq!(out, vec![event("message", "1")]);
    }

    #[test]
    fn fields_follow_the_spec() {
        let body = b"data\ndata:\ndata:  two spaces\nid: 7\nretry: 10\nfoo: bar\nevent:x\n\n";
        let (out, err) = parse_chunks(&[body], 256);
        assert_eq!(err, None);
        assert_eq!(
            out,
            vec![Parsed::Event(SseEvent {
                event: "x".into(),
                data: "\n\n two spaces".into(),
                id: Some("7".into()),
            })]
        );
    }

    #[test]
    fn comments_and_dataless_events_are_life_but_blank_lines_and_partial_lines_are_not() {
        let (out, _) = parse_chunks(&[b": hi\n\n\n\n\r\n\revent: ping\n\ndata: parti"], 256);
        assert_eq!(out, vec![Parsed::KeepAlive, Parsed::KeepAlive]);
    }

    #[test]
    fn the_limit_covers_an_event_and_the_line_being_read() {
        let (_, err) = parse_chunks(&[b"data: 123\ndata: 4567"], 10);
        assert_eq!(
            err,
            Some(StreamError::FrameTooLarge {
                size: 20,
                limit: 10
            })
        );
        // The line end that crosses the limit is enough.
        let (_, err) = parse_chunks(&[b"data: 123\n"], 9);
        assert_eq!(err, Some(StreamError::FrameTooLarge { size: 10, limit: 9 }));
        // Complete comment lines are not buffered, a long one is refused.
        let many = b": ping\n".repeat(100);
        assert_eq!(parse_chunks(&[&many], 10).1, None);
        assert!(parse_chunks(&[b": a long comment"], 10).1.is_some());
    }

    /// One generated event: optional type, data lines, comments before it.
    #[derive(Debug, Clone)]
    struct Ev {
        comments: usize,
        kind: Option<String>,
        data: Vec<String>,
    }

    fn ev() -> impl Strategy<Value = Ev> {
        (
            0usize..3,
            prop::option::of("[a-z_]{1,12}"),
            prop::collection::vec("[^\r\n]{0,12}", 0..4),
        )
            .prop_map(|(comments, kind, data)| Ev {
                comments,
                kind,
                data,
            })
    }

    fn ending() -> impl Strategy<Value = &'static str> {
        prop_oneof![Just("\n"), Just("\r"), Just("\r\n")]
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: 512,
            failure_persistence: None,
            ..ProptestConfig::default()
        })]

        /// Any mix of the three line ends, with or without a BOM, split at
        /// any points, gives exactly the events and keep-alives written.
        #[test]
        fn any_line_ends_bom_and_chunking_give_the_written_frames(
            events in prop::collection::vec(ev(), 0..8),
            endings in prop::collection::vec(ending(), 1..8),
            bom in any::<bool>(),
            points in prop::collection::vec(0usize..1024, 0..12),
        ) {
            let mut body = Vec::new();
            if bom {
                body.extend_from_slice(&BOM);
            }
            let mut n = 0usize;
            let mut last = "";
            // A CR followed by an LF is one CRLF line end: write CR again.
            let mut eol = || {
                n += 1;
                let mut e = endings[n % endings.len()];
                if last == "\r" && e == "\n" {
                    e = "\r";
                }
                last = e;
                e
            };
            let mut expected = Vec::new();
            for e in &events {
                for _ in 0..e.comments {
                    body.extend_from_slice(b": keep-alive");
                    body.extend_from_slice(eol().as_bytes());
                    expected.push(Parsed::KeepAlive);
                }
                if let Some(kind) = &e.kind {
                    body.extend_from_slice(format!("event: {kind}").as_bytes());
                    body.extend_from_slice(eol().as_bytes());
                }
                for line in &e.data {
                    body.extend_from_slice(format!("data: {line}").as_bytes());
                    body.extend_from_slice(eol().as_bytes());
                }
                body.extend_from_slice(eol().as_bytes());
                if !e.data.is_empty() {
                    expected.push(Parsed::Event(SseEvent {
                        event: e.kind.clone().unwrap_or_else(|| "message".into()),
                        data: e.data.join("\n"),
                        id: None,
                    }));
                } else if e.kind.is_some() {
                    expected.push(Parsed::KeepAlive);
                }
            }
            let mut points = points;
            points.retain(|&p| p < body.len());
            points.sort_unstable();
            points.dedup();
            let mut chunks = Vec::new();
            let mut start = 0;
            for p in points {
                chunks.push(&body[start..p]);
                start = p;
            }
            chunks.push(&body[start..]);
            let (out, err) = parse_chunks(&chunks, 1 << 20);
            prop_assert_eq!(err, None);
            prop_assert_eq!(out, expected);
        }

        /// Arbitrary bytes never panic, and a refused frame is over the limit.
        #[test]
        fn arbitrary_bytes_never_panic(
            chunks in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..64), 0..16),
            limit in 1usize..256,
        ) {
            let chunks: Vec<&[u8]> = chunks.iter().map(Vec::as_slice).collect();
            if let (_, Some(StreamError::FrameTooLarge { size, limit: l })) = parse_chunks(&chunks, limit) {
                prop_assert_eq!(l, limit);
                prop_assert!(size > limit);
            }
        }
    }
}
