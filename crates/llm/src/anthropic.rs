//! Anthropic Messages API streaming: [`AnthropicSource`].

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::sse::SseEvent as Event;
use futures_util::future::BoxFuture;
use serde::{Deserialize, Serialize};
use warden_core::{AgentEvent, EventSource, EventStream, Frame, StreamError, TurnRequest, Usage};

use crate::classify::{ErrorBody, stream_error_event};
use crate::decode::{EventMapper, Flow, Protocol};
use crate::http::{Begin, BuildError, Endpoint, HttpOptions};
use crate::json::parse_json;

/// The `anthropic-version` header sent by default.
pub const ANTHROPIC_VERSION: &str = "2023-06-01";

/// Settings of an [`AnthropicSource`].
///
/// `Debug` redacts the API key.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct AnthropicOptions {
    /// The API's base URL, without `/v1/messages`; a path prefix is kept.
    /// Default `https://api.anthropic.com`.
    pub base_url: String,
    /// The API key, sent as `x-api-key` (left out when empty). Never
    /// logged. Default empty.
    pub api_key: String,
    /// The model. Default `claude-sonnet-4-5`.
    pub model: String,
    /// `max_tokens` of each request. Default 8192.
    pub max_tokens: u32,
    /// Timeouts, limits and extra headers. Default [`HttpOptions::default`].
    pub http: HttpOptions,
}

impl Default for AnthropicOptions {
    fn default() -> Self {
        Self {
            base_url: "https://api.anthropic.com".to_owned(),
            api_key: String::new(),
            model: "claude-sonnet-4-5".to_owned(),
            max_tokens: 8192,
            http: HttpOptions::default(),
        }
    }
}

impl fmt::Debug for AnthropicOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AnthropicOptions")
            .field("base_url", &self.base_url)
            .field("api_key", &"<redacted>")
            .field("model", &self.model)
            .field("max_tokens", &self.max_tokens)
            .field("http", &self.http)
            .finish()
    }
}

impl AnthropicOptions {
    /// Sets [`base_url`](Self::base_url).
    pub fn with_base_url(mut self, url: impl Into<String>) -> Self {
        self.base_url = url.into();
        self
    }

    /// Sets [`api_key`](Self::api_key).
    pub fn with_api_key(mut self, key: impl Into<String>) -> Self {
        self.api_key = key.into();
        self
    }

    /// Sets [`model`](Self::model).
    pub fn with_model(mut self, model: impl Into<String>) -> Self {
        self.model = model.into();
        self
    }

    /// Sets [`max_tokens`](Self::max_tokens).
    pub fn with_max_tokens(mut self, max_tokens: u32) -> Self {
        self.max_tokens = max_tokens;
        self
    }

    /// Sets all of [`http`](Self::http).
    pub fn with_http(mut self, http: HttpOptions) -> Self {
        self.http = http;
        self
    }

    /// Sets [`HttpOptions::connect_timeout`].
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.http.connect_timeout = timeout;
        self
    }

    /// Sets [`HttpOptions::max_frame_bytes`].
    pub fn with_max_frame_bytes(mut self, bytes: usize) -> Self {
        self.http.max_frame_bytes = bytes;
        self
    }

    /// Sets [`HttpOptions::max_retry_after`].
    pub fn with_max_retry_after(mut self, cap: Duration) -> Self {
        self.http.max_retry_after = cap;
        self
    }

    /// Adds one of [`HttpOptions::extra_headers`] (e.g. `anthropic-beta`).
    pub fn with_header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.http.extra_headers.push((name.into(), value.into()));
        self
    }
}

/// Streams turns from the Anthropic Messages API (`POST {base_url}/v1/messages`,
/// `stream: true`).
///
/// Each attempt sends one user message (the turn's
/// [`message`](TurnRequest::message)), with the turn's
/// [`append_system_prompt`](TurnRequest::append_system_prompt) as `system`.
/// The API keeps no conversation: without
/// [`HttpOptions::transcripts`] `resume_id` is ignored and every turn is a
/// one-message conversation; with them the source keeps, resumes and
/// replays conversations (see [`Transcripts`](crate::Transcripts)).
/// `workspace` is not used.
/// Cloning shares the HTTP client and its connection pool.
#[derive(Clone)]
pub struct AnthropicSource {
    inner: Arc<Inner>,
}

struct Inner {
    endpoint: Endpoint,
    model: String,
    max_tokens: u32,
}

impl fmt::Debug for AnthropicSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AnthropicSource")
            .field("endpoint", &self.inner.endpoint)
            .field("model", &self.inner.model)
            .field("max_tokens", &self.inner.max_tokens)
            .finish()
    }
}

impl AnthropicSource {
    /// A source with these options. Fails on a bad base URL or header.
    pub fn new(options: AnthropicOptions) -> Result<Self, BuildError> {
        let endpoint = Endpoint::new(
            "anthropic",
            Protocol::Anthropic,
            &options.base_url,
            "/v1/messages",
            &[
                ("x-api-key", options.api_key),
                ("anthropic-version", ANTHROPIC_VERSION.to_owned()),
            ],
            &options.http,
        )?;
        Ok(Self {
            inner: Arc::new(Inner {
                endpoint,
                model: options.model,
                max_tokens: options.max_tokens,
            }),
        })
    }
}

#[derive(Serialize)]
struct MessagesRequest<'a> {
    model: &'a str,
    max_tokens: u32,
    stream: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    system: Option<&'a str>,
    messages: Vec<Message<'a>>,
}

#[derive(Serialize)]
struct Message<'a> {
    role: &'a str,
    content: &'a str,
}

impl AnthropicSource {
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

impl EventSource for AnthropicSource {
    fn open(&self, request: TurnRequest) -> BoxFuture<'static, Result<EventStream, StreamError>> {
        let inner = Arc::clone(&self.inner);
        Box::pin(async move {
            let conversation = match inner.endpoint.begin(&request, &inner.model).await? {
                Begin::Send(conversation) => conversation,
                Begin::Replayed(stream) => return Ok(stream),
            };
            let history = conversation.as_ref().map_or(&[][..], |c| c.history());
            let mut messages: Vec<Message<'_>> = history
                .iter()
                .map(|e| Message {
                    role: e.role.as_str(),
                    content: &e.content,
                })
                .collect();
            messages.push(Message {
                role: "user",
                content: &request.message,
            });
            let body = MessagesRequest {
                model: &inner.model,
                max_tokens: inner.max_tokens,
                stream: true,
                system: request.append_system_prompt.as_deref(),
                messages,
            };
            let body = serde_json::to_vec(&body).map_err(|e| StreamError::Internal {
                message: format!("could not encode the request: {e}"),
            })?;
            let stream = inner.endpoint.open(body, &request, &inner.model).await?;
            Ok(match conversation {
                Some(c) => c.record(stream, request.message, inner.model.clone()),
                None => stream,
            })
        })
    }

    fn provider(&self) -> &str {
        "anthropic"
    }
}

// --- Wire format -----------------------------------------------------------

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum WireEvent {
    MessageStart {
        message: WireMessage,
    },
    ContentBlockStart {
        index: u64,
        content_block: WireBlock,
    },
    ContentBlockDelta {
        index: u64,
        delta: WireDelta,
    },
    ContentBlockStop {
        index: u64,
    },
    MessageDelta {
        #[serde(default)]
        delta: WireMessageDelta,
        #[serde(default)]
        usage: Option<WireUsage>,
    },
    MessageStop,
    Ping,
    Error {
        error: ErrorBody,
    },
    #[serde(other)]
    Other,
}

#[derive(Deserialize)]
struct WireMessage {
    #[serde(default)]
    usage: Option<WireUsage>,
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum WireBlock {
    Text {
        #[serde(default)]
        text: String,
    },
    Thinking {
        #[serde(default)]
        thinking: String,
    },
    ToolUse {
        id: String,
        name: String,
    },
    ServerToolUse {
        id: String,
        name: String,
    },
    McpToolUse {
        id: String,
        name: String,
    },
    #[serde(other)]
    Other,
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum WireDelta {
    TextDelta {
        text: String,
    },
    ThinkingDelta {
        thinking: String,
    },
    InputJsonDelta {
        partial_json: String,
    },
    #[serde(other)]
    Other,
}

#[derive(Deserialize, Default)]
struct WireMessageDelta {
    #[serde(default)]
    stop_reason: Option<String>,
}

#[derive(Deserialize)]
struct WireUsage {
    #[serde(default)]
    input_tokens: Option<u64>,
    #[serde(default)]
    cache_creation_input_tokens: Option<u64>,
    #[serde(default)]
    cache_read_input_tokens: Option<u64>,
    #[serde(default)]
    output_tokens: Option<u64>,
}

impl WireUsage {
    /// Overwrites the fields this report carries; the others keep their
    /// earlier value (`message_delta` usually reports only output tokens).
    fn merge_into(&self, usage: &mut Usage) {
        let fields = [
            (self.input_tokens, &mut usage.input_tokens),
            (
                self.cache_creation_input_tokens,
                &mut usage.cache_creation_input_tokens,
            ),
            (
                self.cache_read_input_tokens,
                &mut usage.cache_read_input_tokens,
            ),
            (self.output_tokens, &mut usage.output_tokens),
        ];
        for (reported, field) in fields {
            if let Some(v) = reported {
                *field = v;
            }
        }
    }
}

/// Anthropic events → frames. Tracks which content blocks are tool calls
/// (by index) and the usage reported so far.
#[derive(Debug, Default)]
pub(crate) struct AnthropicMapper {
    /// Open tool-use blocks: index → tool-use id.
    tools: HashMap<u64, String>,
    usage: Usage,
}

impl EventMapper for AnthropicMapper {
    fn map(&mut self, event: &Event, out: &mut VecDeque<Frame>) -> Result<Flow, StreamError> {
        if event.event == "ping" {
            return Ok(Flow::Continue);
        }
        let mut push = |e: AgentEvent| out.push_back(Frame::Event(e));
        match parse_json::<WireEvent>(&event.data)? {
            WireEvent::MessageStart { message } => {
                if let Some(usage) = message.usage {
                    self.usage = Usage::default();
                    usage.merge_into(&mut self.usage);
                    push(AgentEvent::Usage(self.usage));
                }
            }
            WireEvent::ContentBlockStart {
                index,
                content_block,
            } => match content_block {
                WireBlock::ToolUse { id, name }
                | WireBlock::ServerToolUse { id, name }
                | WireBlock::McpToolUse { id, name } => {
                    self.tools.insert(index, id.clone());
                    push(AgentEvent::ToolUseStarted { id, name });
                }
                WireBlock::Text { text } if !text.is_empty() => push(AgentEvent::TextDelta(text)),
                WireBlock::Thinking { thinking } if !thinking.is_empty() => {
                    push(AgentEvent::ThinkingDelta(thinking));
                }
                WireBlock::Text { .. } | WireBlock::Thinking { .. } | WireBlock::Other => {}
            },
            WireEvent::ContentBlockDelta { index, delta } => match delta {
                WireDelta::TextDelta { text } if !text.is_empty() => {
                    push(AgentEvent::TextDelta(text));
                }
                WireDelta::ThinkingDelta { thinking } if !thinking.is_empty() => {
                    push(AgentEvent::ThinkingDelta(thinking));
                }
                WireDelta::InputJsonDelta { partial_json } if !partial_json.is_empty() => {
                    let id = self
                        .tools
                        .get(&index)
                        .cloned()
                        .unwrap_or_else(|| index.to_string());
                    push(AgentEvent::ToolInputDelta { id, partial_json });
                }
                _ => {}
            },
            WireEvent::ContentBlockStop { index } => {
                if let Some(id) = self.tools.remove(&index) {
                    push(AgentEvent::ToolUseFinished { id });
                }
            }
            WireEvent::MessageDelta { delta, usage } => {
                if let Some(usage) = usage {
                    usage.merge_into(&mut self.usage);
                    push(AgentEvent::Usage(self.usage));
                }
                if let Some(reason) = delta.stop_reason {
                    push(AgentEvent::Stop { reason });
                }
            }
            WireEvent::MessageStop => {
                push(AgentEvent::TurnComplete {
                    context_window: None,
                    duration: None,
                });
                return Ok(Flow::Done);
            }
            WireEvent::Error { error } => return Err(stream_error_event(error)),
            WireEvent::Ping | WireEvent::Other => {}
        }
        Ok(Flow::Continue)
    }

    fn terminal(&self) -> &'static str {
        "message_stop"
    }
}
