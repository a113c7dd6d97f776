//! Driving the SSE decoder from memory, shared by the decoder's property
//! tests and its fuzz targets.
#![allow(dead_code, unreachable_pub)]

use futures_util::{FutureExt, StreamExt, stream};
use warden_core::{EventStream, Frame, StreamError};
use warden_llm::decode::{Protocol, decode_frames};

/// Reads `stream` to its end without a runtime: an in-memory source never
/// waits, so neither may the decoder. `max_items` guards against a decoder
/// that never ends.
pub fn drain(mut stream: EventStream, max_items: usize) -> (Vec<Frame>, Option<StreamError>) {
    let mut frames = Vec::new();
    for _ in 0..max_items {
        match stream.next().now_or_never() {
            None => panic!("the decoder waited on an in-memory stream"),
            Some(None) => return (frames, None),
            Some(Some(Ok(frame))) => frames.push(frame),
            Some(Some(Err(e))) => {
                assert!(
                    matches!(stream.next().now_or_never(), Some(None)),
                    "nothing after an error"
                );
                return (frames, Some(e));
            }
        }
    }
    panic!("the decoder did not end within {max_items} items");
}

pub fn decode(
    protocol: Protocol,
    chunks: Vec<Vec<u8>>,
    limit: usize,
) -> (Vec<Frame>, Option<StreamError>) {
    let total: usize = chunks.iter().map(Vec::len).sum();
    let bytes = stream::iter(chunks.into_iter().map(Ok::<_, StreamError>));
    drain(decode_frames(protocol, bytes, limit), 4 * total + 16)
}

/// Splits `bytes` at the given (sorted, deduplicated) points.
pub fn split(bytes: &[u8], mut points: Vec<usize>) -> Vec<Vec<u8>> {
    points.retain(|&p| p > 0 && p < bytes.len());
    points.sort_unstable();
    points.dedup();
    let mut chunks = Vec::new();
    let mut start = 0;
    for p in points {
        chunks.push(bytes[start..p].to_vec());
        start = p;
    }
    chunks.push(bytes[start..].to_vec());
    chunks
}
