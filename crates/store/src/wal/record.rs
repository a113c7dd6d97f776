//! The write-ahead log's record format (see the parent module): encoding
//! a batch's operations as one checksummed record, and reading a file's
//! intact records back, past a torn tail or damage.

use super::Op;

fn put_len(buf: &mut Vec<u8>, len: usize) {
    let len = u32::try_from(len).expect("a turn log entry under 4 GiB");
    buf.extend_from_slice(&len.to_le_bytes());
}

/// Appends one record holding `ops` to `buf`; returns `buf`'s new length.
pub(crate) fn encode(buf: &mut Vec<u8>, ops: &[Op]) -> usize {
    let start = buf.len();
    buf.extend_from_slice(&[0; 8]); // length and checksum, below
    for op in ops {
        match op {
            Op::Insert(k, v) => {
                buf.push(1);
                put_len(buf, k.len());
                buf.extend_from_slice(k);
                put_len(buf, v.len());
                buf.extend_from_slice(v);
            }
            Op::Remove(k) => {
                buf.push(0);
                put_len(buf, k.len());
                buf.extend_from_slice(k);
            }
        }
    }
    let payload = &buf[start + 8..];
    let len = u32::try_from(payload.len()).expect("a turn log record under 4 GiB");
    let crc = crc32fast::hash(payload);
    buf[start..start + 4].copy_from_slice(&len.to_le_bytes());
    buf[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
    buf.len()
}

/// A record longer than this is not one the writer made: a torn tail
/// declares at most a group's worth (a single batch may exceed
/// [`GROUP_BYTES`](super::GROUP_BYTES), but not by orders of magnitude).
const MAX_RECORD: usize = 256 * 1024 * 1024;

/// What a log file holds ([`scan`]).
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Scan {
    /// Every intact record, in order.
    pub(crate) records: Vec<Vec<Op>>,
    /// Stretches that did not read and were followed by an intact record,
    /// or that end the file without being a torn tail: `(offset, len)`.
    pub(crate) skipped: Vec<(usize, usize)>,
    /// Bytes of a torn tail (a crash mid-append) dropped at the end.
    pub(crate) torn_tail: usize,
}

/// Reads every intact record of `bytes`, resynchronising past what does
/// not read: from a bad byte on, the next offset where a whole record
/// with a matching checksum starts is where reading goes on. A stretch
/// that runs to the end is a torn tail when it looks like one (shorter
/// than a header, zeros, or a header whose plausible length runs past the
/// end), else damage.
pub(crate) fn scan(bytes: &[u8]) -> Scan {
    let mut out = Scan {
        records: Vec::new(),
        skipped: Vec::new(),
        torn_tail: 0,
    };
    let mut at = 0;
    while at < bytes.len() {
        if let Some((ops, used)) = decode_one(&bytes[at..]) {
            out.records.push(ops);
            at += used;
            continue;
        }
        let next = (at + 1..bytes.len()).find(|&i| decode_one(&bytes[i..]).is_some());
        match next {
            Some(next) => {
                out.skipped.push((at, next - at));
                at = next;
            }
            None => {
                let tail = &bytes[at..];
                if is_torn(tail) {
                    out.torn_tail = tail.len();
                } else {
                    out.skipped.push((at, tail.len()));
                }
                break;
            }
        }
    }
    out
}

/// Whether `tail` (bytes at the end of a file, no intact record among
/// them) is what a crash mid-append leaves.
fn is_torn(tail: &[u8]) -> bool {
    if tail.len() < 8 || tail.iter().all(|&b| b == 0) {
        return true;
    }
    let len = u32::from_le_bytes([tail[0], tail[1], tail[2], tail[3]]) as usize;
    len > 0 && len <= MAX_RECORD && 8 + len > tail.len()
}

/// Every whole, intact record at the start of `bytes`, and how many bytes
/// after them were not (a torn or damaged tail).
#[cfg(test)]
pub(crate) fn decode_all(bytes: &[u8]) -> (Vec<Vec<Op>>, usize) {
    let mut records = Vec::new();
    let mut at = 0;
    while let Some((ops, used)) = decode_one(&bytes[at..]) {
        records.push(ops);
        at += used;
    }
    (records, bytes.len() - at)
}

fn decode_one(bytes: &[u8]) -> Option<(Vec<Op>, usize)> {
    let len = u32::from_le_bytes(bytes.get(0..4)?.try_into().ok()?) as usize;
    if len == 0 {
        // The writer never writes an empty record; eight zero bytes (a
        // zeroed stretch) would otherwise read as one.
        return None;
    }
    let crc = u32::from_le_bytes(bytes.get(4..8)?.try_into().ok()?);
    let payload = bytes.get(8..8usize.checked_add(len)?)?;
    if crc32fast::hash(payload) != crc {
        return None;
    }
    let mut ops = Vec::new();
    let mut rest = payload;
    let take = |rest: &mut &[u8]| -> Option<Vec<u8>> {
        let n = u32::from_le_bytes(rest.get(0..4)?.try_into().ok()?) as usize;
        let v = rest.get(4..4usize.checked_add(n)?)?.to_vec();
        *rest = &rest[4 + n..];
        Some(v)
    };
    while let Some((&tag, after)) = rest.split_first() {
        rest = after;
        let key = take(&mut rest)?;
        ops.push(match tag {
            1 => Op::Insert(key, take(&mut rest)?),
            0 => Op::Remove(key),
            _ => return None,
        });
    }
    Some((ops, 8 + len))
}
