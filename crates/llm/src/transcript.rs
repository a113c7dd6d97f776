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
//! - every stream starts with [`AgentEvent::SessionStarted`] carrying that
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
//! Files: `DIR/<id>.jsonl`, one `{"role", "content"}` object per line; the
//! directory is created `0700` and files `0600` (they hold prompt text).
//! Only text is kept: tool calls and thinking are not replayed (a turn
//! without text is stored as `(no text)`).
//!
//! [`HttpOptions::with_transcripts`]: crate::HttpOptions::with_transcripts

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use futures_util::StreamExt;
use serde::{Deserialize, Serialize};
use warden_core::{AgentEvent, EventStream, Frame, StreamError, TurnRequest};

/// Stored as the reply of a turn that produced no text (tool calls only):
/// the APIs refuse an empty assistant message.
const NO_TEXT: &str = "(no text)";

/// Longest accepted conversation id.
const MAX_ID_LEN: usize = 128;

/// A directory of conversation transcripts, one JSON Lines file per
/// conversation id. Cloning refers to the same directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transcripts {
    dir: PathBuf,
}

/// Who said it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// The user's message.
    User,
    /// The model's reply text.
    Assistant,
}

impl Role {
    /// The wire name: `user` or `assistant`.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::User => "user",
            Role::Assistant => "assistant",
        }
    }
}

/// One message of a transcript.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// Who said it.
    pub role: Role,
    /// The text.
    pub content: String,
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
        Ok(Self { dir })
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

    /// The messages of conversation `id`, oldest first. A missing file,
    /// an invalid id or an unreadable line is [`StreamError::UnknownSession`]:
    /// the conversation cannot be resumed.
    pub fn load(&self, id: &str) -> Result<Vec<Entry>, StreamError> {
        let unknown = |detail: String| StreamError::UnknownSession {
            session_id: id.to_owned(),
            message: format!("No conversation found with session ID: {id}{detail}"),
        };
        let path = self.path_of(id).ok_or_else(|| unknown(String::new()))?;
        let text = match fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(unknown(String::new())),
            Err(e) => return Err(unknown(format!(" ({}: {e})", path.display()))),
        };
        text.lines()
            .enumerate()
            .filter(|(_, line)| !line.trim().is_empty())
            .map(|(n, line)| {
                serde_json::from_str::<Entry>(line).map_err(|e| {
                    unknown(format!(
                        " ({} line {} is unreadable: {e})",
                        path.display(),
                        n + 1
                    ))
                })
            })
            .collect()
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
    /// single write, creating the file `0600` if needed.
    pub fn append_turn(&self, id: &str, user: &str, assistant: &str) -> io::Result<()> {
        let mut lines = Vec::new();
        for (role, content) in [(Role::User, user), (Role::Assistant, assistant)] {
            let entry = Entry {
                role,
                content: content.to_owned(),
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

    /// Loads (on the blocking pool) the conversation `request` resumes, or
    /// starts a new one.
    pub(crate) async fn begin(&self, request: &TurnRequest) -> Result<Conversation, StreamError> {
        let transcripts = self.clone();
        let resume = request.resume_id.clone();
        let loaded = tokio::task::spawn_blocking(move || match resume {
            Some(id) => {
                let history = transcripts.load(&id)?;
                Ok(Conversation {
                    transcripts,
                    id,
                    history,
                })
            }
            None => {
                // The file exists from the start, as the id is announced
                // at once: a retry of a failed first turn resumes it.
                let id = Self::new_id();
                transcripts.create(&id).map_err(|e| StreamError::Internal {
                    message: format!("could not create the transcript of {id}: {e}"),
                })?;
                Ok(Conversation {
                    transcripts,
                    id,
                    history: Vec::new(),
                })
            }
        })
        .await;
        loaded.unwrap_or_else(|e| {
            Err(StreamError::Internal {
                message: format!("opening the transcript failed: {e}"),
            })
        })
    }
}

/// The conversation one attempt continues.
pub(crate) struct Conversation {
    transcripts: Transcripts,
    id: String,
    history: Vec<Entry>,
}

impl Conversation {
    /// The messages before this turn.
    pub(crate) fn history(&self) -> &[Entry] {
        &self.history
    }

    /// Wraps an attempt's stream: announces the conversation id first and
    /// appends the turn to the transcript when the stream completes, before
    /// `TurnComplete` is passed on (so an acknowledged turn is on disk).
    pub(crate) fn record(self, inner: EventStream, user: String, model: String) -> EventStream {
        let started = Frame::Event(AgentEvent::SessionStarted {
            session_id: self.id.clone(),
            model: Some(model),
        });
        let state = Recording {
            inner,
            user,
            reply: String::new(),
            conversation: self,
        };
        let rest = futures_util::stream::unfold(Some(state), |state| async move {
            let mut state = state?;
            let item = state.inner.next().await?;
            match &item {
                Ok(Frame::Event(AgentEvent::TextDelta(text))) => state.reply.push_str(text),
                Ok(Frame::Event(AgentEvent::TurnComplete { .. })) => {
                    if let Err(error) = state.save().await {
                        return Some((Err(error), None));
                    }
                }
                _ => {}
            }
            Some((item, Some(state)))
        });
        Box::pin(futures_util::stream::once(async { Ok(started) }).chain(rest))
    }
}

struct Recording {
    inner: EventStream,
    user: String,
    reply: String,
    conversation: Conversation,
}

impl Recording {
    async fn save(&mut self) -> Result<(), StreamError> {
        let transcripts = self.conversation.transcripts.clone();
        let id = self.conversation.id.clone();
        let user = std::mem::take(&mut self.user);
        let mut reply = std::mem::take(&mut self.reply);
        if reply.is_empty() {
            // The APIs refuse an empty assistant message in the history.
            reply.push_str(NO_TEXT);
        }
        let written =
            tokio::task::spawn_blocking(move || transcripts.append_turn(&id, &user, &reply)).await;
        match written {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(StreamError::Internal {
                message: format!(
                    "could not write the transcript of {}: {e}",
                    self.conversation.id
                ),
            }),
            Err(e) => Err(StreamError::Internal {
                message: format!("writing the transcript failed: {e}"),
            }),
        }
    }
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
        fs::write(dir.path().join("conv_bad.jsonl"), "{\"role\":\"user\"").expect("write");
        match t.load("conv_bad") {
            Err(StreamError::UnknownSession { message, .. }) => {
                assert!(message.contains("line 1 is unreadable"), "{message}")
            }
            other => panic!("{other:?}"),
        }
    }
}
