//! What the server saw and did: [`ServerEvent`]s and [`RequestRecord`]s.
//!
//! Every request gets an id (1, 2, 3… in arrival order) and one record;
//! every step of its life is an event, kept in order for the lifetime of
//! the server. Tests read them back through
//! [`MockServer::events`](crate::MockServer::events),
//! [`MockServer::requests`](crate::MockServer::requests) and the `wait_for_*`
//! methods, or follow them live with
//! [`MockServer::subscribe`](crate::MockServer::subscribe).
//!
//! No prompt or completion text is ever recorded: a record holds the
//! method, path, model name, a digest of the answered user message and
//! what the server did.

use std::sync::atomic::{AtomicBool, Ordering};

use std::time::Instant;

use parking_lot::{Mutex, MutexGuard};

use tokio::sync::{broadcast, watch};

use crate::Scenario;

/// Id of one request: 1 for the first request the server received.
pub type RequestId = u64;

/// Which API a request addressed, from its path (a leading path prefix is
/// ignored, so `/proxy/v1/messages` is [`Endpoint::AnthropicMessages`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Endpoint {
    /// `POST …/v1/messages` (query such as `?beta=true` allowed).
    AnthropicMessages,
    /// `POST …/v1/messages/count_tokens`.
    AnthropicCountTokens,
    /// `POST …/chat/completions`.
    OpenAiChatCompletions,
    /// `POST …/v1/responses` (the Responses API).
    OpenAiResponses,
    /// `GET …/v1/responses/{id}` (`?stream=true&starting_after=N`
    /// re-attaches to a background response).
    OpenAiResponse,
    /// `POST …/v1beta/models/<model>:streamGenerateContent` (or
    /// `:generateContent`): Google's Gemini API.
    GeminiGenerateContent,
    /// `GET …/v1/models`.
    Models,
    /// `GET /` or `HEAD /`.
    Root,
    /// Anything else (answered 404 or 405 with a JSON error body).
    Unknown,
}

impl Endpoint {
    /// Whether scenarios apply to this endpoint (the streaming APIs).
    pub fn is_api(self) -> bool {
        matches!(
            self,
            Endpoint::AnthropicMessages
                | Endpoint::OpenAiChatCompletions
                | Endpoint::OpenAiResponses
                | Endpoint::GeminiGenerateContent
        )
    }
}

/// Why a request plays the scenario it plays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Selection {
    /// The `x-mock-scenario` header.
    Header,
    /// The model name (`mock-NAME` or `…:NAME`).
    Model,
    /// A `/scenario/NAME/` path prefix.
    Path,
    /// Entry `n` (0-based) of the configured sequence.
    Sequence(usize),
    /// Entry `n` (0-based) of the script of the request's session (its
    /// `/session/KEY/` path prefix).
    Session(usize),
    /// The configured default scenario.
    Default,
}

/// How a request's response ended (so far).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Outcome {
    /// The response is still being produced.
    InProgress,
    /// The server holds the connection open silently (`stall`).
    Stalled,
    /// The whole response was handed to the connection.
    Completed,
    /// The server closed the connection on purpose (`abrupt-close`).
    ServerClosed,
    /// The client closed the connection before the response was complete.
    ClientClosed,
    /// The server shut down before the response was complete.
    Interrupted,
}

/// One event in the life of a request. Every variant carries the request
/// `id`; the end of a request is exactly one of [`Completed`],
/// [`ServerClosed`], [`ClientClosed`] (none if the server shut down first).
///
/// [`Completed`]: ServerEvent::Completed
/// [`ServerClosed`]: ServerEvent::ServerClosed
/// [`ClientClosed`]: ServerEvent::ClientClosed
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ServerEvent {
    /// The request was read and routed.
    RequestStarted {
        /// Request id.
        id: RequestId,
        /// HTTP method, e.g. `POST`.
        method: String,
        /// Path without the query, e.g. `/v1/messages`.
        path: String,
        /// The API addressed.
        endpoint: Endpoint,
        /// The scenario played; `None` outside the two streaming APIs and
        /// for requests rejected before a scenario applied.
        scenario: Option<Scenario>,
    },
    /// The server started holding the connection open silently.
    Stalled {
        /// Request id.
        id: RequestId,
        /// Body frames sent before the silence.
        frames: usize,
    },
    /// The whole response was handed to the connection.
    Completed {
        /// Request id.
        id: RequestId,
        /// Body frames sent (1 for a plain JSON body).
        frames: usize,
    },
    /// The server closed the connection on purpose, mid-response.
    ServerClosed {
        /// Request id.
        id: RequestId,
        /// Body frames sent before the close.
        frames: usize,
    },
    /// The client closed the connection while the server was still
    /// streaming (or still preparing) the response.
    ClientClosed {
        /// Request id.
        id: RequestId,
        /// Body frames sent before the client left.
        frames: usize,
    },
}

impl ServerEvent {
    /// The request this event belongs to.
    pub fn id(&self) -> RequestId {
        match self {
            ServerEvent::RequestStarted { id, .. }
            | ServerEvent::Stalled { id, .. }
            | ServerEvent::Completed { id, .. }
            | ServerEvent::ServerClosed { id, .. }
            | ServerEvent::ClientClosed { id, .. } => *id,
        }
    }
}

/// Everything recorded about one request (never its prompt text).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RequestRecord {
    /// Request id.
    pub id: RequestId,
    /// HTTP method.
    pub method: String,
    /// Path without the query.
    pub path: String,
    /// Query string without `?`, if any (e.g. `beta=true`).
    pub query: Option<String>,
    /// The API addressed.
    pub endpoint: Endpoint,
    /// The scenario played, for API requests that got that far.
    pub scenario: Option<Scenario>,
    /// Why that scenario.
    pub selection: Option<Selection>,
    /// The `model` field of the request body.
    pub model: Option<String>,
    /// Whether the request asked for a stream (`"stream": true`).
    pub stream: bool,
    /// HTTP status sent; `None` while none was sent (or if none ever was).
    pub status: Option<u16>,
    /// Body frames sent so far.
    pub frames: usize,
    /// How the response ended (so far).
    pub outcome: Outcome,
    /// How the request continued a partial reply, if it did: `"prefill"`
    /// or `"turn"` (see the crate docs, "Continuing a broken reply").
    pub continuation: Option<&'static str>,
    /// Output tokens the reply generated (what a continuation saves shows
    /// here), for replies that got that far.
    pub output_tokens: Option<u64>,
    /// [`prompt_digest`](crate::prompt_digest) of the user message the
    /// reply answers (never its text), for replies that got that far: a
    /// test tells which message, hence which session, a request served.
    pub prompt_digest: Option<u64>,
    /// When the server read the request's head.
    pub received_at: Instant,
}

/// The server's shared log (crate-internal).
pub(crate) struct Journal {
    state: Mutex<State>,
    changed: watch::Sender<u64>,
    live: broadcast::Sender<ServerEvent>,
    shutting_down: AtomicBool,
}

#[derive(Default)]
struct State {
    next_id: RequestId,
    scripted: usize,
    /// The next slot of each session's script.
    scripted_by_session: std::collections::HashMap<String, usize>,
    records: Vec<RequestRecord>,
    events: Vec<ServerEvent>,
}

/// Capacity of the live event channel; slower subscribers see `Lagged`.
const LIVE_CAPACITY: usize = 1024;

impl Journal {
    pub(crate) fn new() -> Self {
        Self {
            state: Mutex::new(State {
                next_id: 1,
                ..State::default()
            }),
            changed: watch::channel(0).0,
            live: broadcast::channel(LIVE_CAPACITY).0,
            shutting_down: AtomicBool::new(false),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave the log inconsistent
        // in a way that matters to a test; keep serving.
        self.state.lock()
    }

    /// Registers a new request and returns its id.
    pub(crate) fn begin(
        &self,
        method: &str,
        path: &str,
        query: Option<&str>,
        endpoint: Endpoint,
    ) -> RequestId {
        let mut st = self.lock();
        let id = st.next_id;
        st.next_id += 1;
        st.records.push(RequestRecord {
            id,
            method: method.to_owned(),
            path: path.to_owned(),
            query: query.map(str::to_owned),
            endpoint,
            scenario: None,
            selection: None,
            model: None,
            stream: false,
            status: None,
            frames: 0,
            outcome: Outcome::InProgress,
            continuation: None,
            output_tokens: None,
            prompt_digest: None,
            received_at: Instant::now(),
        });
        id
    }

    /// Records how request `id` continued a partial reply and what its
    /// reply generated.
    pub(crate) fn generated(&self, id: RequestId, continuation: Option<&'static str>, tokens: u64) {
        let mut st = self.lock();
        if let Some(rec) = st.records.iter_mut().find(|r| r.id == id) {
            rec.continuation = continuation;
            rec.output_tokens = Some(tokens);
        }
    }

    /// Records the digest of the user message request `id` answers.
    pub(crate) fn answers(&self, id: RequestId, digest: Option<u64>) {
        self.update(id, |r| r.prompt_digest = digest);
    }

    /// Takes the next slot of the sequence script (0-based).
    /// The next slot of session `key`'s script (0, 1, …).
    pub(crate) fn next_scripted_for(&self, key: &str) -> usize {
        let mut st = self.lock();
        let n = st.scripted_by_session.entry(key.to_owned()).or_default();
        let slot = *n;
        *n += 1;
        slot
    }

    pub(crate) fn next_scripted(&self) -> usize {
        let mut st = self.lock();
        let n = st.scripted;
        st.scripted += 1;
        n
    }

    /// Records what a request asked for and emits `RequestStarted`.
    pub(crate) fn started(
        &self,
        id: RequestId,
        model: Option<String>,
        stream: bool,
        chosen: Option<(Scenario, Selection)>,
    ) {
        let event = {
            let mut st = self.lock();
            let Some(rec) = st.records.iter_mut().find(|r| r.id == id) else {
                return;
            };
            rec.model = model;
            rec.stream = stream;
            rec.scenario = chosen.map(|c| c.0);
            rec.selection = chosen.map(|c| c.1);
            ServerEvent::RequestStarted {
                id,
                method: rec.method.clone(),
                path: rec.path.clone(),
                endpoint: rec.endpoint,
                scenario: rec.scenario,
            }
        };
        self.emit(event);
    }

    /// Records the HTTP status about to be sent.
    pub(crate) fn status(&self, id: RequestId, status: u16) {
        self.update(id, |r| r.status = Some(status));
    }

    /// Records one more body frame.
    pub(crate) fn frame(&self, id: RequestId) {
        self.update(id, |r| r.frames += 1);
    }

    /// Records a change of outcome and emits the matching event, if any.
    pub(crate) fn outcome(&self, id: RequestId, outcome: Outcome, frames: usize) {
        self.update(id, |r| {
            r.outcome = outcome;
            r.frames = frames;
        });
        let event = match outcome {
            Outcome::Stalled => ServerEvent::Stalled { id, frames },
            Outcome::Completed => ServerEvent::Completed { id, frames },
            Outcome::ServerClosed => ServerEvent::ServerClosed { id, frames },
            Outcome::ClientClosed => ServerEvent::ClientClosed { id, frames },
            Outcome::InProgress | Outcome::Interrupted => return,
        };
        self.emit(event);
    }

    fn update(&self, id: RequestId, f: impl FnOnce(&mut RequestRecord)) {
        let mut st = self.lock();
        if let Some(rec) = st.records.iter_mut().rev().find(|r| r.id == id) {
            f(rec);
        }
    }

    fn emit(&self, event: ServerEvent) {
        tracing::debug!(target: "warden_mock", ?event, "mock server event");
        self.lock().events.push(event.clone());
        // No subscriber is fine.
        let _ = self.live.send(event);
        self.changed.send_modify(|n| *n += 1);
    }

    pub(crate) fn set_shutting_down(&self) {
        self.shutting_down.store(true, Ordering::SeqCst);
    }

    pub(crate) fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::SeqCst)
    }

    pub(crate) fn records(&self) -> Vec<RequestRecord> {
        self.lock().records.clone()
    }

    pub(crate) fn events(&self) -> Vec<ServerEvent> {
        self.lock().events.clone()
    }

    pub(crate) fn find_event(&self, pred: &impl Fn(&ServerEvent) -> bool) -> Option<ServerEvent> {
        self.lock().events.iter().find(|e| pred(e)).cloned()
    }

    pub(crate) fn count_events(&self, pred: impl Fn(&ServerEvent) -> bool) -> usize {
        self.lock().events.iter().filter(|e| pred(e)).count()
    }

    pub(crate) fn watch_changes(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    pub(crate) fn subscribe(&self) -> broadcast::Receiver<ServerEvent> {
        self.live.subscribe()
    }
}
