//! Reading a message or a request body with a size limit, so `- </dev/zero`
//! or `--body /dev/zero` is a usage error instead of running out of memory.

use std::io::Read;

use crate::exit::CliError;

/// The largest message (`chat -`) or request body (`stream --body`)
/// accepted: 32 MiB. Larger ones are usage errors naming this limit.
pub(crate) const MAX_INPUT_BYTES: u64 = 32 * 1024 * 1024;

/// Reads all of `reader`, at most `limit` bytes: one byte more is read to
/// tell "exactly the limit" from "larger", and is a usage error that names
/// `what` and the limit.
pub(crate) fn read_bounded(reader: impl Read, limit: u64, what: &str) -> Result<Vec<u8>, CliError> {
    let mut bytes = Vec::new();
    reader
        .take(limit.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|e| CliError::usage(format!("cannot read {what}: {e}")))?;
    if bytes.len() as u64 > limit {
        const MIB: u64 = 1024 * 1024;
        let shown = if limit > 0 && limit % MIB == 0 {
            format!("{} MiB", limit / MIB)
        } else {
            format!("{limit} bytes")
        };
        return Err(CliError::usage(format!(
            "{what} is larger than the limit of {shown}"
        )));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn input_up_to_the_limit_is_read_and_one_byte_more_is_refused() {
        let read = read_bounded(&[7u8; 10][..], 10, "the message").expect("at the limit");
        assert_eq!(read.len(), 10);
        let err = read_bounded(std::io::repeat(0), 10, "the message").expect_err("endless");
        assert_eq!(err.exit.code(), 2);
        assert_eq!(
            err.message,
            "the message is larger than the limit of 10 bytes"
        );
    }
}
