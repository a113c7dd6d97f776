//! Where the conversations of a stateless HTTP API are kept.
//!
//! The Messages and chat-completions APIs keep no conversation: every
//! request carries the whole history, so a source that speaks them keeps
//! it. `warden-llm`'s `Transcripts` keeps it in files on one machine;
//! `warden-pg`'s `PgConversations` in a database the nodes of a cluster
//! share, so a session taken over by another node resumes its conversation
//! there.

use futures_util::future::BoxFuture;
use serde::{Deserialize, Serialize};

use crate::error::StreamError;

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

/// One message of a conversation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// Who said it.
    pub role: Role,
    /// The text.
    pub content: String,
    /// The turn ([`TurnRequest::turn_id`](crate::TurnRequest::turn_id)) it
    /// belongs to; `None` in transcripts written before turns were recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn: Option<u64>,
}

/// Where the conversations of a stateless HTTP API are kept.
///
/// The Messages and chat-completions APIs keep no conversation: every
/// request carries the whole history, so a source that speaks them keeps
/// it — in files on one machine (`warden-llm`'s `Transcripts`) or in a
/// database the nodes of a cluster share (`warden-pg`'s `PgConversations`).
pub trait ConversationStore: Send + Sync + std::fmt::Debug + 'static {
    /// The complete turns of conversation `id`, oldest first. A conversation
    /// that does not exist (or cannot be read back) is
    /// [`StreamError::UnknownSession`] — [`unknown_conversation`] says it the
    /// way the CLI does — so the session starts fresh and tells the user.
    fn load<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Vec<Entry>, StreamError>>;

    /// Creates the empty conversation `id`.
    fn create<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), StreamError>>;

    /// Appends turn `turn` (the user's message, then the reply) to
    /// conversation `id` unless that turn, with this very `user` message, is
    /// already recorded there (a re-delivered message); whether it was
    /// appended.
    fn append_turn_once<'a>(
        &'a self,
        id: &'a str,
        turn: u64,
        user: &'a str,
        assistant: &'a str,
    ) -> BoxFuture<'a, Result<bool, StreamError>>;
}

/// The error for a conversation that cannot be resumed: "No conversation
/// found with session ID: …", as the Claude Code CLI says, plus `detail`.
pub fn unknown_conversation(id: &str, detail: &str) -> StreamError {
    StreamError::UnknownSession {
        session_id: id.to_owned(),
        message: format!("No conversation found with session ID: {id}{detail}"),
    }
}
