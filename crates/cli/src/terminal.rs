//! Agent text bound for a terminal: its control characters are shown, not
//! obeyed. An agent's reply is whatever its model or its tools printed; a
//! terminal would act on the escape sequences in it (set the window
//! title, write the clipboard with OSC 52, clear the screen), so on a
//! terminal every control character but `\n` and `\t` is replaced by a
//! visible stand-in. One character at a time, so a sequence split across
//! two deltas is made inert all the same. Piped output is left as it is.

use std::borrow::Cow;

/// `text` with every C0 control but `\n` and `\t` shown as its Unicode
/// control picture (`ESC` → `␛`, `BEL` → `␇`), `DEL` as `␡`, and every C1
/// control (U+0080–U+009F, which some terminals obey like `ESC [`) as
/// `�`.
pub(crate) fn inert(text: &str) -> Cow<'_, str> {
    if !text.chars().any(obeyed) {
        return Cow::Borrowed(text);
    }
    Cow::Owned(
        text.chars()
            .map(|c| match c {
                c if !obeyed(c) => c,
                '\u{7f}' => '\u{2421}',
                c if u32::from(c) < 0x20 => {
                    char::from_u32(0x2400 + u32::from(c)).unwrap_or(char::REPLACEMENT_CHARACTER)
                }
                _ => char::REPLACEMENT_CHARACTER,
            })
            .collect(),
    )
}

/// Whether a terminal would act on `c` rather than print it.
fn obeyed(c: char) -> bool {
    c.is_control() && c != '\n' && c != '\t'
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_sequences_are_shown_and_plain_text_is_untouched() {
        assert!(matches!(inert("plain\ttext\n"), Cow::Borrowed(_)));
        let shown = inert("a\x1b]52;c;aGk=\x07b\x1b[2J\r\u{9b}31m\u{7f}");
        assert_eq!(shown, "a␛]52;c;aGk=␇b␛[2J␍�31m␡");
        assert!(!shown.chars().any(obeyed));
    }
}
