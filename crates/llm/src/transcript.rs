//! Conversations for stateless HTTP APIs: [`Transcripts`].
//!
//! The Messages and chat-completions APIs keep no conversation: every
//! request carries the whole history. With [`HttpOptions::with_transcripts`]
//! a source keeps each conversation in a transcript file, the way the Claude
//! Code CLI does, so a warden session over HTTP behaves like an agent
//! session:
//!
//! - a turn without a `resume_id` starts a new conversation with a fresh id
//!   (`conv_` + 32 hex digits) and an empty transcript;
//! - every stream starts with [`AgentEvent::SessionStarted`](warden_core::AgentEvent::SessionStarted) carrying that
//!   id, so the session stores it and resumes it next time (after an idle
//!   reap or a restart of the process);
//! - a turn with a `resume_id` sends the stored history before the new
//!   message, so the context grows turn by turn as it would with the real
//!   agent;
//! - a `resume_id` with no readable transcript is
//!   [`StreamError::UnknownSession`] ("No conversation found with session ID:
//!   …", as the CLI says), which makes the supervisor start fresh and tell
//!   the user instead of leaving the session broken;
//! - a turn is appended (user message, then the assistant's text) only once
//!   the stream completes, so a killed or failed attempt leaves the
//!   transcript as it was and the retry sends the same history.
//!
//! Files: `DIR/<id>.jsonl`, one `{"role", "content", "turn"}` object per
//! line (`turn` is the [`TurnRequest::turn_id`](warden_core::TurnRequest::turn_id), the pending message's id;
//! transcripts written before it existed have none and still load); the
//! directory is created `0700` and files `0600` (they hold prompt text).
//! Only text is kept: tool calls and thinking are not replayed (a turn
//! without text is stored as `(no text)`).
//!
//! # Crashes
//!
//! - **A torn tail costs at most the turn being written.** A crash in the
//!   middle of an append leaves a last line without its newline (possibly
//!   cut inside a UTF-8 sequence). Reading a transcript drops that line and
//!   a user message left without its reply, keeps every earlier turn, logs a
//!   warning (sizes only, never text) and reports a [`TornTail`]; resuming
//!   the conversation cuts the file back to the last complete turn, so the
//!   next append starts on a fresh line. [`Transcripts::on_torn_tail`] lets
//!   a caller tell the user. An unreadable line *followed by* a newline is
//!   corruption, not a torn append: the conversation cannot be resumed
//!   ([`StreamError::UnknownSession`]), as before.
//! - **A turn is recorded once per id.** Delivery is at least once: after a
//!   crash the session re-sends a pending message that may already be
//!   answered in the transcript. A turn whose `turn_id` and message are
//!   already answered in the conversation is not appended again, and the
//!   source does not call the API for it: it replays the stored reply as
//!   the turn's stream (`SessionStarted`, the reply as one `TextDelta`,
//!   `Stop { reason: "replayed" }`, `TurnComplete`; no usage, as nothing
//!   was sent; a continuation gets only what follows the text it has).
//!   Same id with a different message (ids reused by a new session
//!   record) is a new turn. A re-delivered turn whose continuation says
//!   its text is the whole reply ([`Continuation::complete`](warden_core::Continuation::complete):
//!   the upstream had finished it before its node gave the session up) is
//!   recorded with that text and ends the same way, without a request.
//!
//! [`HttpOptions::with_transcripts`]: crate::HttpOptions::with_transcripts

use std::fmt;
use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures_util::future::BoxFuture;
use warden_core::StreamError;
use warden_core::store::{ConversationStore, Entry, Role, unknown_conversation};

use crate::json::json_error_message;

mod conversation;

pub(crate) use conversation::{Conversation, begin, replay_stream};

/// Stored as the reply of a turn that produced no text (tool calls only):
/// the APIs refuse an empty assistant message.
const NO_TEXT: &str = "(no text)";

/// Longest accepted conversation id.
const MAX_ID_LEN: usize = 128;

/// The stop reason of a turn replayed from the transcript instead of sent.
pub const REPLAYED_STOP_REASON: &str = "replayed";

/// A directory of conversation transcripts, one JSON Lines file per
/// conversation id. Cloning refers to the same directory (and the same
/// [`on_torn_tail`](Self::on_torn_tail) callback).
#[derive(Clone)]
pub struct Transcripts {
    dir: PathBuf,
    on_torn_tail: Option<TornTailCallback>,
}

/// Called with the conversation id and what was dropped.
type TornTailCallback = Arc<dyn Fn(&str, &TornTail) + Send + Sync>;

impl fmt::Debug for Transcripts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Transcripts")
            .field("dir", &self.dir)
            .field("on_torn_tail", &self.on_torn_tail.is_some())
            .finish()
    }
}

/// Equal when they use the same directory and the same callback (or none).
impl PartialEq for Transcripts {
    fn eq(&self, other: &Self) -> bool {
        self.dir == other.dir
            && match (&self.on_torn_tail, &other.on_torn_tail) {
                (None, None) => true,
                (Some(a), Some(b)) => Arc::ptr_eq(a, b),
                _ => false,
            }
    }
}

impl Eq for Transcripts {}

/// The end of a transcript that a crash cut off in the middle of an append
/// (see the module's "Crashes" section).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct TornTail {
    /// Bytes of the file that are kept: every complete turn.
    pub kept_bytes: u64,
    /// Bytes after them that are dropped: the torn line, and the user
    /// message of the turn whose reply was torn.
    pub dropped_bytes: u64,
    /// Whether a turn was lost (something was dropped). `false` when the
    /// last line is complete and only its newline is missing.
    pub lost_turn: bool,
    /// The last line ends without a newline (and is kept): the repair adds
    /// it.
    pub missing_newline: bool,
}

/// A transcript as read: its complete turns and, if a crash tore its end,
/// what was dropped.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Transcript {
    /// The messages of the complete turns, oldest first.
    pub entries: Vec<Entry>,
    /// The torn end, if any.
    pub torn_tail: Option<TornTail>,
}

impl Transcript {
    /// The stored reply of turn `turn` if that turn, with this very
    /// `message`, is answered in the transcript.
    pub fn answer_to(&self, turn: u64, message: &str) -> Option<&str> {
        self.entries.windows(2).find_map(|pair| {
            let (user, reply) = (&pair[0], &pair[1]);
            (user.role == Role::User
                && reply.role == Role::Assistant
                && user.turn == Some(turn)
                && reply.turn == Some(turn)
                && user.content == message)
                .then_some(reply.content.as_str())
        })
    }
}

/// The files of a [`Transcripts`] directory as a [`ConversationStore`]
/// (blocking work on the blocking pool).
impl ConversationStore for Transcripts {
    fn load<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Vec<Entry>, StreamError>> {
        let (t, id) = (self.clone(), id.to_owned());
        Box::pin(blocking(move || t.read_and_repair(&id).map(|t| t.entries)))
    }

    fn create<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), StreamError>> {
        let (t, id) = (self.clone(), id.to_owned());
        Box::pin(blocking(move || {
            t.create(&id).map_err(|e| StreamError::Internal {
                message: format!("could not create the transcript of {id}: {e}"),
            })
        }))
    }

    fn append_turn_once<'a>(
        &'a self,
        id: &'a str,
        turn: u64,
        user: &'a str,
        assistant: &'a str,
    ) -> BoxFuture<'a, Result<bool, StreamError>> {
        let t = self.clone();
        let (id, user, assistant) = (id.to_owned(), user.to_owned(), assistant.to_owned());
        Box::pin(blocking(move || {
            t.append_turn_once(&id, turn, &user, &assistant)
                .map_err(|e| StreamError::Internal {
                    message: format!("could not write the transcript of {id}: {e}"),
                })
        }))
    }
}

/// Runs `f` on the blocking pool.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, StreamError> + Send + 'static,
) -> Result<T, StreamError> {
    tokio::task::spawn_blocking(f).await.unwrap_or_else(|e| {
        Err(StreamError::Internal {
            message: format!("transcript work failed: {e}"),
        })
    })
}

impl Transcripts {
    /// Uses (and creates, private to the user) the directory `dir`.
    pub fn open(dir: impl Into<PathBuf>) -> io::Result<Self> {
        let dir = dir.into();
        let mut builder = fs::DirBuilder::new();
        builder.recursive(true);
        #[cfg(unix)]
        std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
        builder.create(&dir)?;
        Ok(Self {
            dir,
            on_torn_tail: None,
        })
    }

    /// Calls `callback` with the conversation id and the [`TornTail`] each
    /// time resuming a conversation finds (and repairs) a torn tail, e.g. to
    /// tell the user that the last turn was lost. It runs on the blocking
    /// pool; it must not block for long. The source also logs a warning.
    pub fn on_torn_tail(
        mut self,
        callback: impl Fn(&str, &TornTail) + Send + Sync + 'static,
    ) -> Self {
        self.on_torn_tail = Some(Arc::new(callback));
        self
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The file of conversation `id`, or `None` when `id` is not a valid
    /// conversation id (ASCII letters, digits, `-` and `_`, at most 128).
    pub fn path_of(&self, id: &str) -> Option<PathBuf> {
        let valid = !id.is_empty()
            && id.len() <= MAX_ID_LEN
            && id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        valid.then(|| self.dir.join(format!("{id}.jsonl")))
    }

    /// The messages of the complete turns of conversation `id`, oldest
    /// first (a torn tail is left out, see [`read`](Self::read)). A missing
    /// file, an invalid id or an unreadable line before the last one is
    /// [`StreamError::UnknownSession`]: the conversation cannot be resumed.
    pub fn load(&self, id: &str) -> Result<Vec<Entry>, StreamError> {
        self.read(id).map(|t| t.entries)
    }

    /// Reads conversation `id` without changing it: its complete turns and
    /// its torn tail, if a crash left one. Errors as [`load`](Self::load).
    pub fn read(&self, id: &str) -> Result<Transcript, StreamError> {
        let unknown = |detail: String| unknown_conversation(id, &detail);
        let path = self.path_of(id).ok_or_else(|| unknown(String::new()))?;
        let bytes = match fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(unknown(String::new())),
            Err(e) => return Err(unknown(format!(" ({}: {e})", path.display()))),
        };
        parse(&bytes).map_err(|(line, e)| {
            unknown(format!(
                " ({} line {line} is unreadable: {e})",
                path.display()
            ))
        })
    }

    /// Reads conversation `id` and, if its end is torn, cuts the file back
    /// to its last complete turn (or adds the missing newline), logs a
    /// warning and calls the [`on_torn_tail`](Self::on_torn_tail) callback.
    /// Errors as [`load`](Self::load); a failed repair is
    /// [`StreamError::Internal`].
    pub fn read_and_repair(&self, id: &str) -> Result<Transcript, StreamError> {
        let transcript = self.read(id)?;
        if let Some(torn) = &transcript.torn_tail {
            self.repair(id, torn).map_err(|e| StreamError::Internal {
                message: format!("could not repair the torn end of the transcript of {id}: {e}"),
            })?;
            tracing::warn!(
                event = "transcript.torn_tail",
                gen_ai.conversation.id = id,
                kept_bytes = torn.kept_bytes,
                dropped_bytes = torn.dropped_bytes,
                lost_turn = torn.lost_turn,
                "the transcript's last append was torn by a crash; earlier turns are kept"
            );
            if let Some(callback) = &self.on_torn_tail {
                callback(id, torn);
            }
        }
        Ok(transcript)
    }

    fn repair(&self, id: &str, torn: &TornTail) -> io::Result<()> {
        let path = self.path_of(id).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("invalid conversation id {id:?}"),
            )
        })?;
        let mut file = fs::OpenOptions::new().write(true).open(&path)?;
        file.set_len(torn.kept_bytes)?;
        if torn.missing_newline {
            use std::io::Seek;
            file.seek(io::SeekFrom::End(0))?;
            file.write_all(b"\n")?;
        }
        file.sync_data()
    }

    /// Creates the (empty) transcript of a new conversation `id`, `0600`.
    pub fn create(&self, id: &str) -> io::Result<()> {
        self.open_append(id).map(drop)
    }

    fn open_append(&self, id: &str) -> io::Result<fs::File> {
        let path = self.path_of(id).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("invalid conversation id {id:?}"),
            )
        })?;
        let mut options = fs::OpenOptions::new();
        options.create(true).append(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        options.open(&path)
    }

    /// Appends one finished turn (the user's message, then the reply) in a
    /// single write, creating the file `0600` if needed. The lines carry no
    /// turn id; see [`append_turn_once`](Self::append_turn_once).
    pub fn append_turn(&self, id: &str, user: &str, assistant: &str) -> io::Result<()> {
        self.write_turn(id, None, user, assistant)
    }

    /// Appends turn `turn` of conversation `id` unless that turn, with this
    /// `user` message, is already answered in it (a re-delivered message).
    /// A torn tail is repaired first, so the new lines never glue onto torn
    /// bytes. Returns whether the turn was appended.
    pub fn append_turn_once(
        &self,
        id: &str,
        turn: u64,
        user: &str,
        assistant: &str,
    ) -> io::Result<bool> {
        let existing = match self.read_and_repair(id) {
            Ok(transcript) => transcript,
            // A missing file is a new conversation.
            Err(StreamError::UnknownSession { .. })
                if self.path_of(id).is_some_and(|p| !p.exists()) =>
            {
                Transcript::default()
            }
            Err(e) => return Err(io::Error::other(e.to_string())),
        };
        if existing.answer_to(turn, user).is_some() {
            tracing::info!(
                event = "transcript.duplicate_turn",
                gen_ai.conversation.id = id,
                turn,
                "turn already recorded; not appended again"
            );
            return Ok(false);
        }
        self.write_turn(id, Some(turn), user, assistant)?;
        Ok(true)
    }

    fn write_turn(
        &self,
        id: &str,
        turn: Option<u64>,
        user: &str,
        assistant: &str,
    ) -> io::Result<()> {
        let mut lines = Vec::new();
        for (role, content) in [(Role::User, user), (Role::Assistant, assistant)] {
            let entry = Entry {
                role,
                content: content.to_owned(),
                turn,
            };
            serde_json::to_writer(&mut lines, &entry).map_err(io::Error::other)?;
            lines.push(b'\n');
        }
        let mut file = self.open_append(id)?;
        file.write_all(&lines)?;
        file.flush()
    }

    /// A new conversation id: `conv_` and 128 random bits in hex.
    pub fn new_id() -> String {
        format!("conv_{:032x}", rand::random::<u128>())
    }
}

/// Parses a transcript. `Err((line number, message))` for an unreadable
/// line that is not the torn end (the message never quotes the line).
fn parse(bytes: &[u8]) -> Result<Transcript, (usize, String)> {
    // Each entry with the offset its line starts at.
    let mut entries: Vec<(Entry, usize)> = Vec::new();
    let mut torn_at = None;
    let mut missing_newline = false;
    let mut pos = 0;
    let mut line_no = 0;
    while pos < bytes.len() {
        line_no += 1;
        let rest = &bytes[pos..];
        let (line, next, terminated) = match rest.iter().position(|&b| b == b'\n') {
            Some(i) => (&rest[..i], pos + i + 1, true),
            None => (rest, bytes.len(), false),
        };
        if !line.trim_ascii().is_empty() {
            match serde_json::from_slice::<Entry>(line) {
                Ok(entry) => {
                    entries.push((entry, pos));
                    missing_newline = !terminated;
                }
                Err(e) if terminated => return Err((line_no, json_error_message(&e))),
                // The last line, cut off: what a crash mid-append leaves.
                Err(_) => torn_at = Some(pos),
            }
        }
        pos = next;
    }
    let mut kept = torn_at.unwrap_or(bytes.len());
    let mut lost_turn = torn_at.is_some();
    // A user message without its reply: the turn being written when the
    // crash came (both lines go out in one write).
    let unanswered = entries
        .last()
        .filter(|(e, _)| e.role == Role::User)
        .map(|(_, start)| *start);
    if let Some(start) = unanswered {
        entries.pop();
        kept = start;
        lost_turn = true;
        missing_newline = false;
    }
    let torn_tail = (lost_turn || missing_newline).then(|| TornTail {
        kept_bytes: kept as u64,
        dropped_bytes: (bytes.len() - kept) as u64,
        lost_turn,
        missing_newline,
    });
    Ok(Transcript {
        entries: entries.into_iter().map(|(e, _)| e).collect(),
        torn_tail,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn turns_round_trip_and_files_are_private() {
        let dir = tempfile::tempdir().expect("tempdir");
        let t = Transcripts::open(dir.path().join("t")).expect("open");
        let id = Transcripts::new_id();
        t.append_turn(&id, "hi \"there\"\nline", "hello")
            .expect("append");
        t.append_turn(&id, "again", "sure").expect("append");
        let entries = t.load(&id).expect("load");
        assert_eq!(entries.len(), 4);
        assert_eq!(entries[0].role, Role::User);
        assert_eq!(entries[0].content, "hi \"there\"\nline");
        assert_eq!(entries[3].content, "sure");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let file = t.path_of(&id).expect("valid id");
            let mode = fs::metadata(file).expect("meta").permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
            let mode = fs::metadata(t.dir()).expect("meta").permissions().mode();
            assert_eq!(mode & 0o777, 0o700);
        }
    }

    #[test]
    fn missing_invalid_and_corrupt_transcripts_are_unknown_sessions() {
        let dir = tempfile::tempdir().expect("tempdir");
        let t = Transcripts::open(dir.path()).expect("open");
        for id in ["conv_missing", "../etc/passwd", ""] {
            match t.load(id) {
                Err(StreamError::UnknownSession {
                    session_id,
                    message,
                }) => {
                    assert_eq!(session_id, id);
                    assert!(message.starts_with("No conversation found with session ID:"));
                }
                other => panic!("{id:?}: {other:?}"),
            }
        }
        fs::write(dir.path().join("conv_bad.jsonl"), "{\"role\":\"user\"\n").expect("write");
        match t.load("conv_bad") {
            Err(StreamError::UnknownSession { message, .. }) => {
                assert!(message.contains("line 1 is unreadable"), "{message}")
            }
            other => panic!("{other:?}"),
        }
    }
}
