//! The one HTTP [`EventSource`]: [`HttpSource`], parameterised by the
//! [`Api`] it talks to ([`AnthropicSource`], [`OpenAiSource`]).

use std::fmt;
use std::sync::Arc;

use futures_util::future::BoxFuture;
use warden_core::{EventSource, EventStream, StreamError, TurnRequest};

use std::collections::HashMap;

use parking_lot::Mutex;

use warden_core::SessionKey;

use crate::continuation::{self, Mode, Modes};
use crate::options::SourceOptions;
use crate::provider::Protocol;
use crate::provider::{Anthropic, Api, OpenAi, OpenAiResponses};
use crate::transport::{Begin, BuildError, Endpoint};
use crate::wire::responses::{ResponsesMapper, SharedPoint};
use crate::wire::{Message, Turn, auth_headers, request_body};

/// Streams turns from the Anthropic Messages API (`POST
/// {base_url}/v1/messages`, `stream: true`); see [`Anthropic`] and
/// [`HttpSource`].
pub type AnthropicSource = HttpSource<Anthropic>;

/// Streams turns from an OpenAI-compatible chat-completions API (`POST
/// {base_url}/v1/chat/completions`, `stream: true`, `stream_options:
/// {include_usage: true}`); see [`OpenAi`] and [`HttpSource`].
pub type OpenAiSource = HttpSource<OpenAi>;

/// Streams turns from OpenAI's Responses API (`POST {base_url}/v1/responses`,
/// `stream`, `background`, `store`); a broken stream is re-attached after
/// the last event received, so nothing is generated twice. See
/// [`OpenAiResponses`] and [`HttpSource`].
pub type OpenAiResponsesSource = HttpSource<OpenAiResponses>;

/// Streams turns from the HTTP API `P`: [`AnthropicSource`] or
/// [`OpenAiSource`].
///
/// Each attempt sends one user message (the turn's
/// [`message`](TurnRequest::message)), with the turn's
/// [`append_system_prompt`](TurnRequest::append_system_prompt) as system
/// text (the API's way: see [`Anthropic`], [`OpenAi`]). The APIs keep no
/// conversation: without [`HttpOptions::transcripts`](crate::HttpOptions::transcripts)
/// `resume_id` is ignored and every turn is a one-message conversation;
/// with them the source keeps, resumes and replays conversations, sending
/// the stored history before the new message (see
/// [`Transcripts`](crate::Transcripts)). `workspace` is not used. Cloning
/// shares the HTTP client and its connection pool.
pub struct HttpSource<P: Api> {
    inner: Arc<Inner<P>>,
}

struct Inner<P: Api> {
    endpoint: Endpoint,
    model: String,
    max_tokens: P::MaxTokens,
    /// How each model takes a continuation, as learned.
    modes: Modes,
    /// Where each session's last Responses stream is, for a re-attach.
    points: Mutex<HashMap<(SessionKey, u64), SharedPoint>>,
}

impl<P: Api> Clone for HttpSource<P> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<P: Api> fmt::Debug for HttpSource<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpSource")
            .field("endpoint", &self.inner.endpoint)
            .field("model", &self.inner.model)
            .field("max_tokens", &self.inner.max_tokens)
            .finish()
    }
}

impl<P: Api> HttpSource<P> {
    /// A source with these options. Fails on a bad base URL or header.
    pub fn new(options: SourceOptions<P>) -> Result<Self, BuildError> {
        let endpoint = Endpoint::new(
            P::PROTOCOL,
            &options.base_url,
            &auth_headers(P::PROTOCOL, &options.api_key),
            &options.http,
        )?;
        Ok(Self {
            inner: Arc::new(Inner {
                endpoint,
                model: options.model,
                max_tokens: options.max_tokens,
                modes: Modes::default(),
                points: Mutex::default(),
            }),
        })
    }

    /// Sends `body`, a complete request the caller wrote (it must ask for a
    /// stream), instead of one built from the turn, and decodes the answer
    /// like [`open`](EventSource::open) does. `request` only labels the
    /// logs; transcripts are not used.
    pub fn open_body(
        &self,
        body: Vec<u8>,
        request: TurnRequest,
    ) -> BoxFuture<'static, Result<EventStream, StreamError>> {
        let inner = Arc::clone(&self.inner);
        Box::pin(async move { inner.endpoint.open(body, &request, &inner.model).await })
    }
}

impl<P: Api> Inner<P> {
    /// The model of `request`: the one its turn asks for, else this
    /// source's.
    fn model_for<'a>(&'a self, request: &'a TurnRequest) -> &'a str {
        request.model.as_deref().unwrap_or(&self.model)
    }

    /// The request body: the stored history, the user's message, then
    /// `extra` (a continuation's partial text and ask).
    fn body(
        &self,
        request: &TurnRequest,
        history: &[warden_core::store::Entry],
        extra: &[Message<'_>],
    ) -> Result<Vec<u8>, StreamError> {
        let user = Message {
            role: "user",
            content: &request.message,
        };
        let messages: Vec<Message<'_>> = history
            .iter()
            .map(|e| Message {
                role: e.role.as_str(),
                content: &e.content,
            })
            .chain([user])
            .chain(extra.iter().copied())
            .collect();
        let turn = Turn {
            model: self.model_for(request),
            max_tokens: self.max_tokens.into(),
            system: request.append_system_prompt.as_deref(),
            messages,
        };
        request_body(P::PROTOCOL, &turn)
    }

    /// Messages and chat completions: a continuation (Anthropic) by prefill
    /// or, for a model that refuses it, a continuation turn.
    async fn open_messages(
        &self,
        request: &TurnRequest,
        history: &[warden_core::store::Entry],
        partial: Option<&str>,
    ) -> Result<EventStream, StreamError> {
        let model = self.model_for(request);
        let mut mode = partial.map(|_| self.modes.mode_for(model));
        let stream = loop {
            let mut extra = Vec::new();
            if let (Some(partial), Some(mode)) = (partial, mode) {
                extra.push(Message {
                    role: "assistant",
                    content: continuation::assistant_text(partial),
                });
                if mode == Mode::Turn {
                    extra.push(Message {
                        role: "user",
                        content: continuation::CONTINUE_ASK,
                    });
                }
            }
            let body = self.body(request, history, &extra)?;
            match self.endpoint.open(body, request, model).await {
                // The model refuses prefill: remember it, ask again with a
                // continuation turn (one extra request, once).
                Err(e) if mode == Some(Mode::Prefill) && continuation::is_prefill_refusal(&e) => {
                    self.modes.refuses_prefill(model);
                    mode = Some(Mode::Turn);
                }
                other => break other?,
            }
        };
        Ok(match (partial, mode) {
            (Some(partial), Some(mode)) => continuation::adapt(stream, mode, partial),
            _ => stream,
        })
    }

    /// The Responses API: a new response in background, or, for a
    /// continuation, a re-attach to the broken one after the last event the
    /// consumer has. A response that cannot be re-attached (gone, or its
    /// events do not line up with the consumer's text) fails the attempt
    /// with `ContinuationFailed`: the turn restarts.
    async fn open_response(
        &self,
        request: &TurnRequest,
        history: &[warden_core::store::Entry],
        partial: Option<&str>,
    ) -> Result<EventStream, StreamError> {
        let key = (request.session_key.clone(), request.turn_id);
        if let Some(partial) = partial {
            let point = crate::util_lock(&self.points).get(&key).cloned();
            let Some((id, after, point)) = point.and_then(|p| {
                let mut g = crate::util_lock(&p);
                let after = g.after_text(partial.len())?;
                let id = g.id.clone()?;
                // Events after `after` come again: forget them.
                g.truncate(after, partial.len());
                drop(g);
                Some((id, after, p))
            }) else {
                return Err(StreamError::ContinuationFailed {
                    message: "no response to re-attach to at this point".into(),
                });
            };
            let mapper = Box::new(ResponsesMapper::new(point));
            return match self.endpoint.reattach(&id, after, request, mapper).await {
                Err(StreamError::Api {
                    status: Some(404),
                    message,
                    ..
                }) => Err(StreamError::ContinuationFailed {
                    message: format!("the response is gone: {message}"),
                }),
                other => other,
            };
        }
        let point = SharedPoint::default();
        {
            let mut points = crate::util_lock(&self.points);
            // One broken response per session is all a re-attach needs.
            points.retain(|(k, _), _| *k != request.session_key);
            points.insert(key, point.clone());
        }
        let body = self.body(request, history, &[])?;
        self.endpoint
            .open_mapped(
                body,
                request,
                self.model_for(request),
                Box::new(ResponsesMapper::new(point)),
            )
            .await
    }
}

impl<P: Api> EventSource for HttpSource<P> {
    fn open(&self, request: TurnRequest) -> BoxFuture<'static, Result<EventStream, StreamError>> {
        let inner = Arc::clone(&self.inner);
        Box::pin(async move {
            let model = inner.model_for(&request).to_owned();
            let conversation = match inner.endpoint.begin(&request, &model).await? {
                Begin::Send(conversation) => conversation,
                Begin::Replayed(stream) => return Ok(stream),
            };
            let history = conversation.as_ref().map_or(&[][..], |c| c.history());
            let partial = request
                .continuation
                .as_ref()
                .filter(|_| P::CONTINUES)
                .map(|c| c.partial_text.as_str());
            let stream = match P::PROTOCOL {
                Protocol::OpenAiResponses => {
                    inner.open_response(&request, history, partial).await?
                }
                _ => inner.open_messages(&request, history, partial).await?,
            };
            Ok(match conversation {
                Some(c) => c.record(
                    stream,
                    request.message,
                    model,
                    partial.unwrap_or_default().to_owned(),
                ),
                None => stream,
            })
        })
    }

    fn provider(&self) -> &str {
        P::PROTOCOL.provider().name
    }

    fn continues(&self) -> bool {
        P::CONTINUES
    }

    /// The API runs no tool: a silent `tool_use` block is a stall.
    fn tools_run_in_stream(&self) -> bool {
        false
    }
}
