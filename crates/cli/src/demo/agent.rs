//! The demo's agents: real Anthropic SSE sources talking to the in-process
//! mock server, each request routed to the scenario the workspace's script
//! names.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use parking_lot::Mutex;

use futures_util::StreamExt;
use futures_util::future::BoxFuture;
use warden_core::{
    EventSource, EventStream, Frame, SessionKey, SourceFactory, StreamError, StreamPhase,
    TurnRequest,
};
use warden_llm::{AnthropicOptions, AnthropicSource, Transcripts};
use warden_mock::{MockServer, Scenario};

use crate::exit::CliError;

/// What a workspace's stream looks like right now, for the live view.
#[derive(Debug, Default)]
pub(super) struct Liveness {
    /// Milliseconds since the demo started of the last frame (or of the
    /// attempt's start), as the watchdog's heartbeat would stamp it.
    pub(super) last_frame_ms: AtomicU64,
    /// Keep-alive frames (pings) seen.
    pub(super) pings: AtomicU64,
    /// Where the current attempt's stream is (a `StreamPhase`, as
    /// [`phase_code`]).
    pub(super) phase: std::sync::atomic::AtomicU8,
}

/// A phase as a number for [`Liveness::phase`].
fn phase_code(p: StreamPhase) -> u8 {
    match p {
        StreamPhase::BeforeContent => 0,
        StreamPhase::Thinking => 1,
        StreamPhase::Text => 2,
        StreamPhase::ToolCall => 3,
        _ => 4,
    }
}

impl Liveness {
    /// The current attempt's phase.
    pub(super) fn phase(&self) -> StreamPhase {
        match self.phase.load(Ordering::Relaxed) {
            0 => StreamPhase::BeforeContent,
            1 => StreamPhase::Thinking,
            2 => StreamPhase::Text,
            3 => StreamPhase::ToolCall,
            _ => StreamPhase::AfterToolCall,
        }
    }
}

/// Routes every workspace's requests; one per demo.
pub(super) struct DemoAgents {
    /// One source per scenario, all pointed at the mock (through
    /// `/scenario/NAME/`) and sharing one transcript directory.
    sources: HashMap<Scenario, AnthropicSource>,
    /// Workspace session key → (name, scenario of each request in order).
    scripts: HashMap<String, (String, Vec<Scenario>)>,
    /// Requests opened per workspace so far.
    opened: Mutex<HashMap<String, usize>>,
    liveness: HashMap<String, Arc<Liveness>>,
    started: Instant,
}

impl DemoAgents {
    /// Agents for `scripts` (session key → name and request scenarios).
    pub(super) fn new(
        mock: &MockServer,
        transcripts: &Transcripts,
        scripts: HashMap<String, (String, Vec<Scenario>)>,
        started: Instant,
    ) -> Result<Self, CliError> {
        let mut sources = HashMap::new();
        for &scenario in Scenario::all() {
            let options = AnthropicOptions::default()
                .with_base_url(mock.scenario_base_url(scenario))
                .with_model("claude-demo")
                .with_http(
                    warden_llm::HttpOptions::default().with_transcripts(transcripts.clone()),
                );
            let source = AnthropicSource::new(options)
                .map_err(|e| CliError::failure(format!("demo agent: {e}")))?;
            sources.insert(scenario, source);
        }
        let liveness = scripts
            .values()
            .map(|(name, _)| (name.clone(), Arc::new(Liveness::default())))
            .collect();
        Ok(Self {
            sources,
            scripts,
            opened: Mutex::new(HashMap::new()),
            liveness,
            started,
        })
    }

    /// The liveness of workspace `name`.
    pub(super) fn liveness(&self, name: &str) -> Option<Arc<Liveness>> {
        self.liveness.get(name).cloned()
    }

    /// The scenario of the next request of session `key`.
    fn next_scenario(&self, key: &str) -> Scenario {
        let Some((_, script)) = self.scripts.get(key) else {
            return Scenario::Normal;
        };
        let mut opened = self.opened.lock();
        let n = opened.entry(key.to_owned()).or_insert(0);
        let scenario = script
            .get(*n)
            .or(script.last())
            .copied()
            .unwrap_or(Scenario::Normal);
        *n += 1;
        scenario
    }
}

/// The source of one workspace's session.
struct WorkspaceAgent {
    agents: Arc<DemoAgents>,
    key: String,
    liveness: Arc<Liveness>,
}

impl EventSource for WorkspaceAgent {
    fn open(&self, request: TurnRequest) -> BoxFuture<'static, Result<EventStream, StreamError>> {
        let scenario = self.agents.next_scenario(&self.key);
        let source = self.agents.sources[&scenario].clone();
        let liveness = self.liveness.clone();
        let started = self.agents.started;
        let stamp = move |live: &Liveness| {
            live.last_frame_ms
                .store(started.elapsed().as_millis() as u64, Ordering::Relaxed);
        };
        stamp(&liveness);
        liveness
            .phase
            .store(phase_code(StreamPhase::BeforeContent), Ordering::Relaxed);
        Box::pin(async move {
            let stream = source.open(request).await?;
            let stamped = stream.inspect(move |frame| {
                stamp(&liveness);
                match frame {
                    Ok(Frame::KeepAlive) => {
                        liveness.pings.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(Frame::Event(e)) => {
                        let next = liveness.phase().after(e);
                        liveness.phase.store(phase_code(next), Ordering::Relaxed);
                    }
                    Err(_) => {}
                }
            });
            Ok(Box::pin(stamped) as EventStream)
        })
    }

    fn provider(&self) -> &str {
        "anthropic"
    }

    /// Every source behind it is an Anthropic source, which continues a
    /// reply broken mid-text.
    fn continues(&self) -> bool {
        true
    }

    fn tools_run_in_stream(&self) -> bool {
        false
    }
}

/// Gives each workspace session its [`WorkspaceAgent`].
pub(super) struct DemoFactory(pub(super) Arc<DemoAgents>);

impl SourceFactory for DemoFactory {
    fn source_for(&self, key: &SessionKey) -> Arc<dyn EventSource> {
        let name = self
            .0
            .scripts
            .get(key.as_str())
            .map(|(name, _)| name.clone())
            .unwrap_or_default();
        let liveness = self.0.liveness(&name).unwrap_or_default();
        Arc::new(WorkspaceAgent {
            agents: self.0.clone(),
            key: key.as_str().to_owned(),
            liveness,
        })
    }
}
