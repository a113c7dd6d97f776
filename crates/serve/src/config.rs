//! How the server behaves: [`ServeConfig`].

use std::sync::Arc;
use std::time::Duration;

use derive_setters::Setters;
use warden_core::cluster::Placement;
use warden_core::store::TurnStore;

use crate::agent::{Agent, SessionAgents};

/// Request bodies larger than this get 413: 10 MiB.
pub const DEFAULT_MAX_BODY_BYTES: usize = 10 * 1024 * 1024;

/// How the server behaves.
#[derive(Clone, Setters)]
#[setters(prefix = "with_", strip_option)]
#[non_exhaustive]
pub struct ServeConfig {
    /// The bearer token every route requires but the probes (`/healthz`,
    /// `/readyz`), the document, the console's files and, when
    /// [`public_metrics`](Self::public_metrics), `/metrics`.
    #[setters(skip)]
    pub token: String,
    /// Whether `GET /metrics` answers without the token (for a scraper
    /// that cannot send one). Default `false`.
    pub public_metrics: bool,
    /// How long a finished turn's events stay available for re-attach.
    /// Default 10 min.
    pub keep_finished: Duration,
    /// Largest request body accepted. Default [`DEFAULT_MAX_BODY_BYTES`].
    pub max_body_bytes: usize,
    /// The agent kinds this server's sessions run, the default first: a
    /// session keeps the one its first turn asked for (else the default),
    /// and a turn asking for another `agent` is refused with `409
    /// agent_mismatch`. Default empty: not checked.
    #[setters(skip)]
    pub agents: Vec<Agent>,
    /// Which agent each session runs, kept durably; needed with more than
    /// one of [`agents`](Self::agents) (without it every session runs the
    /// first). Default `None`.
    #[setters(skip)]
    pub session_agents: Option<Arc<dyn SessionAgents>>,
    /// Whether a session's workspace must be an existing directory when a
    /// turn names it: set it for agents that run in their workspace
    /// (Claude Code), for which a path that does not exist yet would be
    /// the agent's working directory. Checked at the door only where every
    /// session runs here (no [`placement`](Self::placement): on a cluster
    /// the directory may exist on the session's node). Default `false`:
    /// the HTTP agents use no directory, so a workspace there is a name.
    pub workspaces_must_exist: bool,
    /// How long a running turn waits for an attached client that lags
    /// more than 1,024 events behind (the turn's source is paused
    /// meanwhile); past it that client's event stream ends and it
    /// re-attaches with `Last-Event-ID`, missing nothing. Default 30 s.
    pub slow_client_grace: Duration,
    /// Where sessions run, for a node of a cluster. Default `None`: every
    /// session runs here.
    pub placement: Option<Arc<dyn Placement>>,
    /// Where a cluster node stores its turns' events before it sends them,
    /// so a turn re-delivered elsewhere keeps its id and event numbers.
    /// Default `None`: they live in this process only.
    pub turn_store: Option<Arc<dyn TurnStore>>,
    /// A Jaeger's base URL (`http://jaeger:16686`, its UI and query API):
    /// the console links each session to its trace there, and `GET
    /// /v1/turns/{id}/trace` reads a turn's trace from its query API
    /// (server-side) for the console to draw. Default `None`: neither.
    #[setters(skip)]
    pub jaeger_url: Option<String>,
    /// Where the token is kept on the server's machine, named by `GET
    /// /v1/server` and in a 401's message so a user knows where to find it.
    /// Default `None`: not said.
    #[setters(into)]
    pub token_file: Option<std::path::PathBuf>,
    /// The supervisor's re-delivered turns, relayed as turns of this
    /// server (see [`with_recovered_turns`](Self::with_recovered_turns)).
    #[setters(skip)]
    pub(crate) recovered: Option<Arc<parking_lot::Mutex<Option<RecoveredRx>>>>,
}

/// The receiving end of the supervisor's re-delivered turns.
pub type RecoveredRx = tokio::sync::mpsc::UnboundedReceiver<warden_core::RecoveredTurn>;

impl std::fmt::Debug for ServeConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServeConfig")
            .field("token", &"<redacted>")
            .field("public_metrics", &self.public_metrics)
            .field("keep_finished", &self.keep_finished)
            .field("max_body_bytes", &self.max_body_bytes)
            .field("slow_client_grace", &self.slow_client_grace)
            .field("workspaces_must_exist", &self.workspaces_must_exist)
            .field("agents", &self.agents)
            .field("session_agents", &self.session_agents.is_some())
            .field("placement", &self.placement.is_some())
            .field("turn_store", &self.turn_store.is_some())
            .field("jaeger_url", &self.jaeger_url)
            .field("token_file", &self.token_file)
            .finish()
    }
}

impl ServeConfig {
    /// A configuration requiring `token`, with the defaults.
    pub fn new(token: impl Into<String>) -> Self {
        Self {
            token: token.into(),
            public_metrics: false,
            keep_finished: Duration::from_secs(600),
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            slow_client_grace: Duration::from_secs(30),
            workspaces_must_exist: false,
            agents: Vec::new(),
            session_agents: None,
            placement: None,
            turn_store: None,
            jaeger_url: None,
            token_file: None,
            recovered: None,
        }
    }

    /// Sets [`jaeger_url`](Self::jaeger_url) (a trailing `/` is dropped).
    pub fn with_jaeger_url(mut self, url: impl Into<String>) -> Self {
        self.jaeger_url = Some(url.into().trim_end_matches('/').to_owned());
        self
    }

    /// Relays the turns the supervisor re-delivers (give it the sender with
    /// [`SupervisorBuilder::recovered_turns`](warden_core::SupervisorBuilder::recovered_turns)):
    /// each becomes a turn of this server, and with a
    /// [`turn_store`](Self::turn_store) it keeps the id and the events its
    /// message had on the node that died, so its clients re-attach to it.
    pub fn with_recovered_turns(mut self, rx: RecoveredRx) -> Self {
        self.recovered = Some(Arc::new(parking_lot::Mutex::new(Some(rx))));
        self
    }

    /// Every session runs `agent` ([`agents`](Self::agents) is it alone).
    pub fn with_agent(mut self, agent: Agent) -> Self {
        self.agents = vec![agent];
        self
    }

    /// Sets [`agents`](Self::agents) (the default first) and
    /// [`session_agents`](Self::session_agents), where each session's is
    /// kept.
    pub fn with_agents(mut self, agents: Vec<Agent>, sessions: Arc<dyn SessionAgents>) -> Self {
        self.agents = agents;
        self.session_agents = Some(sessions);
        self
    }
}
