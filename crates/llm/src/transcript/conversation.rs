//! One attempt's conversation: the history it sends (loaded, or a new
//! conversation), the stored reply of a turn already answered, and the
//! recording of the reply, appended once the stream completes.

use std::sync::Arc;

use futures_util::StreamExt;
use warden_core::store::{ConversationStore, Entry};
use warden_core::{AgentEvent, EventStream, Frame, StreamError, TurnRequest};

use super::{NO_TEXT, REPLAYED_STOP_REASON, Transcript, Transcripts};

/// Loads the conversation `request` resumes, or starts a new one (the
/// stored conversation exists from the start, as its id is announced at
/// once: a retry of a failed first turn resumes it).
pub(crate) async fn begin(
    store: Arc<dyn ConversationStore>,
    request: &TurnRequest,
) -> Result<Conversation, StreamError> {
    let turn = request.turn_id;
    match &request.resume_id {
        Some(id) => {
            let entries = store.load(id).await?;
            let transcript = Transcript {
                entries,
                torn_tail: None,
            };
            let replay = transcript
                .answer_to(turn, &request.message)
                .map(str::to_owned);
            Ok(Conversation {
                store,
                id: id.clone(),
                turn,
                history: transcript.entries,
                replay,
            })
        }
        None => {
            let id = Transcripts::new_id();
            store.create(&id).await?;
            Ok(Conversation {
                store,
                id,
                turn,
                history: Vec::new(),
                replay: None,
            })
        }
    }
}

/// The conversation one attempt continues.
pub(crate) struct Conversation {
    store: Arc<dyn ConversationStore>,
    id: String,
    /// The turn this attempt runs.
    turn: u64,
    history: Vec<Entry>,
    /// The stored reply when this turn is already answered.
    replay: Option<String>,
}

impl Conversation {
    /// The messages before this turn.
    pub(crate) fn history(&self) -> &[Entry] {
        &self.history
    }

    /// The stored reply, when this turn (its id and message) is already
    /// answered in the transcript: a re-delivered message.
    pub(crate) fn replay(&self) -> Option<&str> {
        self.replay.as_deref()
    }

    /// Wraps an attempt's stream: announces the conversation id first and
    /// appends the turn to the transcript when the stream completes, before
    /// `TurnComplete` is passed on (so an acknowledged turn is on disk). A
    /// turn already answered is not appended again.
    /// Records the reply `inner` streams (after `partial`, the text a
    /// continuation continues) as the answer to `user`, saved at the turn's
    /// end.
    pub(crate) fn record(
        self,
        inner: EventStream,
        user: String,
        model: String,
        partial: String,
    ) -> EventStream {
        let started = Frame::Event(AgentEvent::SessionStarted {
            session_id: self.id.clone(),
            model: Some(model),
        });
        let state = Recording {
            inner,
            user,
            reply: partial,
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

/// The stream of a turn answered before: its stored reply (or what of it
/// the caller does not have yet; nothing if it has it all), without
/// calling the API.
pub(crate) fn replay_stream(reply: String) -> EventStream {
    let text = (!reply.is_empty()).then_some(AgentEvent::TextDelta(reply));
    let frames = text.into_iter().chain([
        AgentEvent::Stop {
            reason: REPLAYED_STOP_REASON.to_owned(),
        },
        AgentEvent::TurnComplete {
            context_window: None,
            duration: None,
        },
    ]);
    Box::pin(futures_util::stream::iter(
        frames.map(|e| Ok(Frame::Event(e))),
    ))
}

struct Recording {
    inner: EventStream,
    user: String,
    reply: String,
    conversation: Conversation,
}

impl Recording {
    async fn save(&mut self) -> Result<(), StreamError> {
        let user = std::mem::take(&mut self.user);
        let mut reply = std::mem::take(&mut self.reply);
        if reply.is_empty() {
            // The APIs refuse an empty assistant message in the history.
            reply.push_str(NO_TEXT);
        }
        let c = &self.conversation;
        c.store
            .append_turn_once(&c.id, c.turn, &user, &reply)
            .await
            .map(drop)
    }
}
