//! `--hold-thinking`: thinking reaches the client only whole — an
//! Anthropic thinking block, a Responses reasoning item.
//!
//! Thinking cannot be continued (an Anthropic block's signature comes at
//! its end; a reasoning item is the model's own), and once the client has
//! part of it, it cannot be taken back either: the proxy must end the
//! stream with an error event (which a streaming SDK raises, not retries).
//! Held, its frames wait here until it ends; a break inside it drops them,
//! and the client, which saw none of it, gets the reply again from
//! scratch. The text after it is not delayed: the thinking is released the
//! moment it ends, before any text. What the client waits for is the
//! thinking itself, shown at once instead of as it streams. (Gemini's
//! thought parts are held in `gemini.rs`: they have no end of their own.)

/// Thinking held back from the client until it is whole.
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

    /// After one event wrote `out[mark..]`, with `open` the item the
    /// client has open: while the held one is, its frames are kept back
    /// (the client's stream kept live meanwhile by a comment for each
    /// event, which the client ignores but its idle timer, and warden's
    /// watch on an agent CLI, counts); once it is whole they go out; a
    /// stream that ended inside it (an error event) never shows them.
    pub(super) fn settle(&mut self, out: &mut String, mark: usize, done: bool, open: Option<u64>) {
        let Some(index) = self.block else { return };
        if done {
            self.drop_held();
        } else if open == Some(index) {
            self.divert(out, mark);
            if out.len() == mark {
                out.push_str(":\n\n");
            }
        } else {
            self.release(out, mark);
        }
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
        assert_eq!(hold.block, None);
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
        assert_eq!(hold.block, None);
        let mut off = Hold::default();
        off.begin(0, 0);
        assert_eq!(off.block, None);
    }
}
