//! `--hold-thinking`: a thinking block reaches the client only whole.
//!
//! A thinking block's signature comes at its end, so a stream that breaks
//! inside one cannot be continued, and once the client has part of it, it
//! cannot be taken back either: the proxy must end the stream with an
//! error event (which a streaming SDK raises, not retries). Held, the
//! block's frames wait here until its `content_block_stop`; a break inside
//! it drops them, and the client, which saw none of it, gets the reply
//! again from scratch. The text after the block is not delayed: the block
//! is released the moment it ends, before any text. What the client waits
//! for is the thinking itself, shown at once instead of as it streams.

/// Thinking held back from the client until its block is whole.
#[derive(Debug, Default)]
pub(super) struct Hold {
    /// Whether thinking blocks are held at all.
    pub(super) on: bool,
    /// The downstream index of the block held, if one is.
    block: Option<u64>,
    /// Where in this event's output the held block's first frame begins.
    from: Option<usize>,
    /// Its frames so far.
    held: String,
}

impl Hold {
    /// Starts holding block `index`, whose frames begin at `at` in this
    /// event's output.
    pub(super) fn begin(&mut self, index: u64, at: usize) {
        if self.on {
            self.block = Some(index);
            self.from = Some(at);
        }
    }

    /// The block held, if any.
    pub(super) fn block(&self) -> Option<u64> {
        self.block
    }

    /// After one event wrote `out[mark..]`: what belongs to the held block
    /// is kept back.
    pub(super) fn divert(&mut self, out: &mut String, mark: usize) {
        let from = self.from.take().unwrap_or(mark).max(mark);
        if from < out.len() {
            self.held.push_str(&out[from..]);
            out.truncate(from);
        }
    }

    /// The held block ended in this event: its frames go out, then what
    /// this event wrote after `mark` (its stop).
    pub(super) fn release(&mut self, out: &mut String, mark: usize) {
        let from = self.from.take().unwrap_or(mark).max(mark);
        let tail = out.split_off(from.min(out.len()));
        out.push_str(&self.held);
        out.push_str(&tail);
        self.held.clear();
        self.block = None;
    }

    /// The attempt broke (or ended) while holding: the held frames, which
    /// the client never saw, are dropped. The block's index, if one was
    /// held.
    pub(super) fn drop_held(&mut self) -> Option<u64> {
        self.held.clear();
        self.from = None;
        self.block.take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_block_goes_out_whole_before_its_stop_and_nothing_before_it_is_held() {
        let mut hold = Hold {
            on: true,
            ..Hold::default()
        };
        // One event: a text block's held stop, then the thinking start.
        let mut out = String::from("[before]");
        let mark = out.len();
        out.push_str("[text stop]");
        let at = out.len();
        out.push_str("[thinking start]");
        hold.begin(1, at);
        hold.divert(&mut out, mark);
        assert_eq!(out, "[before][text stop]");
        // A delta: all of it held.
        out.clear();
        out.push_str("[delta]");
        hold.divert(&mut out, 0);
        assert_eq!(out, "");
        // Its stop: released in order.
        out.push_str("[stop]");
        hold.release(&mut out, 0);
        assert_eq!(out, "[thinking start][delta][stop]");
        assert_eq!(hold.block(), None);
    }

    #[test]
    fn a_break_drops_what_was_held_and_off_holds_nothing() {
        let mut hold = Hold {
            on: true,
            ..Hold::default()
        };
        let mut out = String::from("[start]");
        hold.begin(3, 0);
        hold.divert(&mut out, 0);
        assert_eq!(hold.drop_held(), Some(3));
        assert_eq!(hold.block(), None);
        let mut off = Hold::default();
        off.begin(0, 0);
        assert_eq!(off.block(), None);
    }
}
