//! OpenAI-compatible chat-completions streaming: [`OpenAiSource`].

use std::collections::{BTreeMap, VecDeque};
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

/// Settings of an [`OpenAiSource`].
///
/// `Debug` redacts the API key.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct OpenAiOptions {
    /// The API's base URL, without `/v1/chat/completions`; a path prefix is
    /// kept. Default `https://api.openai.com`.
    pub base_url: String,
    /// The API key, sent as `Authorization: Bearer <key>` (left out when
    /// empty, for local servers). Never logged. Default empty.
    pub api_key: String,
    /// The model. Default `gpt-4o-mini`.
    pub model: String,
    /// `max_tokens` of each request; not sent when `None`. Default `None`.
    pub max_tokens: Option<u32>,
    /// Timeouts, limits and extra headers. Default [`HttpOptions::default`].
    pub http: HttpOptions,
}

impl Default for OpenAiOptions {
    fn default() -> Self {
        Self {
            base_url: "https://api.openai.com".to_owned(),
            api_key: String::new(),
            model: "gpt-4o-mini".to_owned(),
            max_tokens: None,
            http: HttpOptions::default(),
        }
    }
}

impl fmt::Debug for OpenAiOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenAiOptions")
            .field("base_url", &self.base_url)
            .field("api_key", &"<redacted>")
            .field("model", &self.model)
            .field("max_tokens", &self.max_tokens)
            .field("http", &self.http)
            .finish()
    }
}

impl OpenAiOptions {
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
        self.max_tokens = Some(max_tokens);
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

    /// Adds one of [`HttpOptions::extra_headers`] (e.g. `OpenAI-Organization`).
    pub fn with_header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.http.extra_headers.push((name.into(), value.into()));
        self
    }
}

/// Streams turns from an OpenAI-compatible chat-completions API
/// (`POST {base_url}/v1/chat/completions`, `stream: true`,
/// `stream_options: {include_usage: true}`).
///
/// Each attempt sends the turn's
/// [`append_system_prompt`](TurnRequest::append_system_prompt) as a
/// `system` message, then the turn's [`message`](TurnRequest::message) as
/// the `user` message. The API keeps no conversation: without
/// [`HttpOptions::transcripts`](crate::HttpOptions::transcripts)
/// `resume_id` is ignored; with them the stored history is sent between
/// the two (see [`Transcripts`](crate::Transcripts)). `workspace` is not
/// used. Cloning shares the HTTP client and its connection pool.
#[derive(Clone)]
pub struct OpenAiSource {
    inner: Arc<Inner>,
}

struct Inner {
    endpoint: Endpoint,
    model: String,
    max_tokens: Option<u32>,
}

impl fmt::Debug for OpenAiSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenAiSource")
            .field("endpoint", &self.inner.endpoint)
            .field("model", &self.inner.model)
            .field("max_tokens", &self.inner.max_tokens)
            .finish()
    }
}

impl OpenAiSource {
    /// A source with these options. Fails on a bad base URL or header.
    pub fn new(options: OpenAiOptions) -> Result<Self, BuildError> {
        let authorization = if options.api_key.is_empty() {
            String::new()
        } else {
            format!("Bearer {}", options.api_key)
        };
        let endpoint = Endpoint::new(
            "openai",
            Protocol::OpenAi,
            &options.base_url,
            "/v1/chat/completions",
            &[("authorization", authorization)],
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
struct ChatRequest<'a> {
    model: &'a str,
    stream: bool,
    stream_options: StreamOptions,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_tokens: Option<u32>,
    messages: Vec<Message<'a>>,
}

#[derive(Serialize)]
struct StreamOptions {
    include_usage: bool,
}

#[derive(Serialize)]
struct Message<'a> {
    role: &'a str,
    content: &'a str,
}

impl OpenAiSource {
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

impl EventSource for OpenAiSource {
    fn open(&self, request: TurnRequest) -> BoxFuture<'static, Result<EventStream, StreamError>> {
        let inner = Arc::clone(&self.inner);
        Box::pin(async move {
            let conversation = match inner.endpoint.begin(&request, &inner.model).await? {
                Begin::Send(conversation) => conversation,
                Begin::Replayed(stream) => return Ok(stream),
            };
            let history = conversation.as_ref().map_or(&[][..], |c| c.history());
            let mut messages = Vec::with_capacity(history.len() + 2);
            if let Some(system) = request.append_system_prompt.as_deref() {
                messages.push(Message {
                    role: "system",
                    content: system,
                });
            }
            messages.extend(history.iter().map(|e| Message {
                role: e.role.as_str(),
                content: &e.content,
            }));
            messages.push(Message {
                role: "user",
                content: &request.message,
            });
            let body = ChatRequest {
                model: &inner.model,
                stream: true,
                stream_options: StreamOptions {
                    include_usage: true,
                },
                max_tokens: inner.max_tokens,
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
        "openai"
    }
}

// --- Wire format -----------------------------------------------------------

#[derive(Deserialize)]
struct Chunk {
    #[serde(default)]
    choices: Option<Vec<Choice>>,
    #[serde(default)]
    usage: Option<WireUsage>,
    #[serde(default)]
    error: Option<ErrorBody>,
}

#[derive(Deserialize)]
struct Choice {
    #[serde(default)]
    delta: Option<Delta>,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct Delta {
    #[serde(default)]
    content: Option<String>,
    /// Reasoning text of compatible servers (DeepSeek, vLLM).
    #[serde(default)]
    reasoning_content: Option<String>,
    #[serde(default)]
    tool_calls: Option<Vec<ToolCallDelta>>,
}

#[derive(Deserialize)]
struct ToolCallDelta {
    #[serde(default)]
    index: Option<u64>,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    function: Option<FunctionDelta>,
}

#[derive(Deserialize)]
struct FunctionDelta {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    arguments: Option<String>,
}

#[derive(Deserialize)]
struct WireUsage {
    #[serde(default)]
    prompt_tokens: Option<u64>,
    #[serde(default)]
    completion_tokens: Option<u64>,
}

/// OpenAI chunks → frames. Tracks the tool calls in progress by index;
/// they are finished (`ToolUseFinished`) at the `finish_reason`, or at
/// `[DONE]` if none came.
#[derive(Debug, Default)]
pub(crate) struct OpenAiMapper {
    /// Tool calls in progress: index → id.
    tools: BTreeMap<u64, String>,
}

impl OpenAiMapper {
    fn finish_tools(&mut self, out: &mut VecDeque<Frame>) {
        for (_, id) in std::mem::take(&mut self.tools) {
            out.push_back(Frame::Event(AgentEvent::ToolUseFinished { id }));
        }
    }

    fn tool_call(&mut self, call: ToolCallDelta, out: &mut VecDeque<Frame>) {
        let index = call.index.unwrap_or(0);
        let (name, arguments) = call
            .function
            .map_or((None, None), |f| (f.name, f.arguments));
        let id = match self.tools.get(&index) {
            Some(id) => id.clone(),
            None if call.id.is_some() || name.is_some() => {
                let id = call.id.unwrap_or_else(|| index.to_string());
                self.tools.insert(index, id.clone());
                out.push_back(Frame::Event(AgentEvent::ToolUseStarted {
                    id: id.clone(),
                    name: name.unwrap_or_default(),
                }));
                id
            }
            None => index.to_string(),
        };
        if let Some(partial_json) = arguments.filter(|a| !a.is_empty()) {
            out.push_back(Frame::Event(AgentEvent::ToolInputDelta {
                id,
                partial_json,
            }));
        }
    }
}

impl EventMapper for OpenAiMapper {
    fn map(&mut self, event: &Event, out: &mut VecDeque<Frame>) -> Result<Flow, StreamError> {
        if event.data.trim() == "[DONE]" {
            self.finish_tools(out);
            out.push_back(Frame::Event(AgentEvent::TurnComplete {
                context_window: None,
                duration: None,
            }));
            return Ok(Flow::Done);
        }
        let chunk = parse_json::<Chunk>(&event.data)?;
        if let Some(error) = chunk.error {
            return Err(stream_error_event(error));
        }
        for choice in chunk.choices.unwrap_or_default() {
            if let Some(delta) = choice.delta {
                if let Some(text) = delta.reasoning_content.filter(|t| !t.is_empty()) {
                    out.push_back(Frame::Event(AgentEvent::ThinkingDelta(text)));
                }
                if let Some(text) = delta.content.filter(|t| !t.is_empty()) {
                    out.push_back(Frame::Event(AgentEvent::TextDelta(text)));
                }
                for call in delta.tool_calls.unwrap_or_default() {
                    self.tool_call(call, out);
                }
            }
            if let Some(reason) = choice.finish_reason {
                self.finish_tools(out);
                out.push_back(Frame::Event(AgentEvent::Stop { reason }));
            }
        }
        if let Some(usage) = chunk.usage {
            out.push_back(Frame::Event(AgentEvent::Usage(Usage {
                input_tokens: usage.prompt_tokens.unwrap_or(0),
                output_tokens: usage.completion_tokens.unwrap_or(0),
                ..Usage::default()
            })));
        }
        Ok(Flow::Continue)
    }

    fn terminal(&self) -> &'static str {
        "data: [DONE]"
    }
}
