//! The conversations of the HTTP agents (what `warden_llm::Transcripts`
//! keeps in files on one machine) in the cluster's database, so a session
//! taken over by another node resumes its conversation there instead of
//! starting afresh.
//!
//! A conversation is a row of `warden_conversations` and its turns rows of
//! `warden_conversation_turns` in the order they were recorded. A turn is
//! recorded once per (turn id, user message): a unique index makes a
//! re-delivered message's second append a no-op even when two nodes race
//! (a paused old owner waking up and the new one), so the history never
//! holds a turn twice. Prompt and reply text live here as they do in the
//! transcript files: the database's access control is their protection.

use futures_util::future::BoxFuture;
use warden_core::StreamError;
use warden_core::store::{ConversationStore, Entry, Role, unknown_conversation};

use crate::PgStore;

/// The cluster's conversations: a [`ConversationStore`] on [`PgStore`].
/// Cheap to clone (it shares the store's pool).
#[derive(Clone, Debug)]
pub struct PgConversations {
    pg: PgStore,
}

impl PgStore {
    /// The conversations kept in this database.
    pub fn conversations(&self) -> PgConversations {
        PgConversations { pg: self.clone() }
    }
}

/// A database failure while a turn reads or writes its conversation: one
/// that waiting mends (the database restarting, away: see
/// [`unreachable`](crate::unreachable)) is a connection error, waited for
/// and retryable; anything else is internal.
fn failed(what: &str, e: &(dyn std::error::Error + 'static)) -> StreamError {
    let message = format!(
        "PostgreSQL: cannot {what} a conversation: {}",
        crate::error_chain(e)
    );
    match crate::unreachable(e) {
        true => StreamError::Connection { message },
        false => StreamError::Internal { message },
    }
}

/// Whether `e` is one [`failed`] says waiting mends.
fn waits_out(e: &StreamError) -> bool {
    matches!(e, StreamError::Connection { .. })
}

impl ConversationStore for PgConversations {
    fn load<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Vec<Entry>, StreamError>> {
        // A read: a database that does not answer is waited for (the
        // database restarting, a blip) rather than failing the turn.
        Box::pin(async move {
            let rows = crate::patiently(waits_out, || self.load_now(id)).await?;
            if rows.is_empty() {
                return Err(unknown_conversation(id, ""));
            }
            let mut entries = Vec::with_capacity(rows.len() * 2);
            for row in rows {
                let turn: Option<i64> = row.get(0);
                let (Some(user), Some(reply)) = (
                    row.get::<_, Option<String>>(1),
                    row.get::<_, Option<String>>(2),
                ) else {
                    continue; // the empty conversation's one joined row
                };
                let turn = turn.and_then(|t| u64::try_from(t).ok());
                entries.push(Entry {
                    role: Role::User,
                    content: user,
                    turn,
                });
                entries.push(Entry {
                    role: Role::Assistant,
                    content: reply,
                    turn,
                });
            }
            Ok(entries)
        })
    }

    fn create<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), StreamError>> {
        // Idempotent: waited for as a read is.
        Box::pin(async move { crate::patiently(waits_out, || self.create_now(id)).await })
    }

    fn append_turn_once<'a>(
        &'a self,
        id: &'a str,
        turn: u64,
        user: &'a str,
        assistant: &'a str,
    ) -> BoxFuture<'a, Result<bool, StreamError>> {
        // Idempotent (once per turn and message), so a database that does
        // not answer is waited for rather than failing the turn.
        Box::pin(async move {
            let turn = i64::try_from(turn).map_err(|e| failed("write", &e))?;
            crate::patiently(waits_out, move || {
                self.append_now(id, turn, user, assistant)
            })
            .await
        })
    }
}

impl PgConversations {
    /// One try of [`load`](ConversationStore::load)'s query.
    async fn load_now(&self, id: &str) -> Result<Vec<tokio_postgres::Row>, StreamError> {
        let client = self.pg.pooled().await.map_err(|e| failed("read", &e))?;
        client
            .query(
                "SELECT t.turn, t.user_text, t.reply \
                 FROM warden_conversations c \
                 LEFT JOIN warden_conversation_turns t ON t.id = c.id \
                 WHERE c.id = $1 ORDER BY t.seq",
                &[&id],
            )
            .await
            .map_err(|e| failed("read", &e))
    }

    /// One try of [`create`](ConversationStore::create).
    async fn create_now(&self, id: &str) -> Result<(), StreamError> {
        let client = self.pg.pooled().await.map_err(|e| failed("create", &e))?;
        client
            .execute(
                "INSERT INTO warden_conversations (id) VALUES ($1) ON CONFLICT DO NOTHING",
                &[&id],
            )
            .await
            .map_err(|e| failed("create", &e))?;
        Ok(())
    }

    /// One try of [`append_turn_once`](ConversationStore::append_turn_once).
    async fn append_now(
        &self,
        id: &str,
        turn: i64,
        user: &str,
        assistant: &str,
    ) -> Result<bool, StreamError> {
        let mut client = self.pg.pooled().await.map_err(|e| failed("write", &e))?;
        let tx = client
            .transaction()
            .await
            .map_err(|e| failed("write", &e))?;
        tx.execute(
            "INSERT INTO warden_conversations (id) VALUES ($1) ON CONFLICT DO NOTHING",
            &[&id],
        )
        .await
        .map_err(|e| failed("write", &e))?;
        let appended = tx
            .execute(
                "INSERT INTO warden_conversation_turns (id, turn, user_text, reply) \
                 VALUES ($1, $2, $3, $4) \
                 ON CONFLICT (id, turn, md5(user_text)) DO NOTHING",
                &[&id, &turn, &user, &assistant],
            )
            .await
            .map_err(|e| failed("write", &e))?;
        tx.commit().await.map_err(|e| failed("write", &e))?;
        if appended == 0 {
            tracing::info!(
                event = "pg.duplicate_turn",
                gen_ai.conversation.id = id,
                turn,
                "turn already recorded; not appended again"
            );
        }
        Ok(appended == 1)
    }
}
