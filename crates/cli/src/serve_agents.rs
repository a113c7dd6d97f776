//! `warden serve --agent A --agent B`: one source per agent, and which
//! agent each session runs.
//!
//! A session keeps the agent it was started with (its first turn's
//! `agent`, else the first `--agent`). With several agents that choice is
//! kept in the sessions' own database, in a tree of its own beside the
//! records ([`BINDINGS`], [`warden_store::SledLabels`]), written and
//! flushed before the first message is accepted: it survives a restart,
//! and the records' encoding (read by every warden and by `warden
//! sessions`) is unchanged. The supervisor makes each session's source by
//! its key from that binding, so a session started again after a restart
//! (its pending messages re-sent) runs its own agent.
//!
//! Under the wire layer each session's CLI reaches it on a route of its
//! own ([`Wire::per_session`](crate::wire::Wire::per_session)), so the
//! model stream sent on it is that session's liveness alone
//! ([`Wire::live_sessions`](crate::wire::Wire::live_sessions)). When a
//! session's source goes (the session stopped: idle, evicted, shut down)
//! its CLI's process is ended and its route removed.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures_util::future::BoxFuture;
use warden_core::{EventSource, SessionKey, StoreError};
use warden_serve::{ServeConfig, SessionAgents};
use warden_store::{SledLabels, SledStore};

use crate::chat::{Agent, CliChildren, agent_source};
use crate::exit::CliError;

/// The tree of the sessions' database that holds each session's agent.
pub(crate) const BINDINGS: &str = "session_agents";

/// What `--agent`, given once or more, makes: each agent's source, the
/// default first.
pub(crate) struct Agents {
    /// The agents, the default first, each once.
    list: Vec<Agent>,
    /// Their sources, in the same order.
    sources: Vec<Arc<dyn EventSource>>,
    /// Per agent the wire carries, its sessions' sources made live while
    /// the wire sends their CLIs their model streams.
    live: Vec<Option<Arc<LiveOnRoute>>>,
    children: Vec<CliChildren>,
    /// Each session's agent (several agents only).
    bindings: Option<Arc<Bindings>>,
}

/// A session's source made live on its wire route.
type LiveOnRoute = dyn Fn(&SessionKey, Arc<dyn EventSource>) -> Arc<dyn EventSource> + Send + Sync;

/// How the agents' sources are made (the flags they share).
pub(crate) struct AgentSettings<'a> {
    /// The wire layer, when it runs: where the agents it carries send
    /// their model requests instead of `base_url`.
    pub(crate) wire: Option<&'a crate::wire::Wire>,
    pub(crate) base_url: Option<String>,
    pub(crate) model: Option<String>,
    pub(crate) claude_bin: Option<PathBuf>,
    pub(crate) data_dir: &'a Path,
    pub(crate) conversations: Option<Arc<dyn warden_core::store::ConversationStore>>,
}

impl Agents {
    /// The sources of `agents` (repeats dropped). More than one needs the
    /// sessions' local database (`store`): on a cluster the sessions move
    /// between nodes and every node runs one agent.
    pub(crate) fn new(
        agents: &[Agent],
        settings: AgentSettings<'_>,
        store: Option<&SledStore>,
    ) -> Result<Self, CliError> {
        let mut list = Vec::new();
        for agent in agents {
            if !list.contains(agent) {
                list.push(*agent);
            }
        }
        let bindings = match (list.len(), store) {
            (0, _) => return Err(CliError::usage("--agent: name at least one agent")),
            (1, _) => None,
            (_, None) => {
                return Err(CliError::usage(
                    "several --agent need the local store: a cluster (--store) runs one agent",
                ));
            }
            (_, Some(store)) => Some(Arc::new(Bindings::open(store, list[0])?)),
        };
        let mut sources = Vec::new();
        let mut children = Vec::new();
        let mut live = Vec::new();
        for agent in &list {
            let wire = settings.wire.filter(|wire| wire.base_url(*agent).is_some());
            let base_url = settings
                .wire
                .and_then(|wire| wire.base_url(*agent))
                .or_else(|| settings.base_url.clone());
            let (source, child) = agent_source(
                *agent,
                base_url,
                settings.model.clone(),
                settings.claude_bin.clone(),
                settings.data_dir,
                settings.conversations.clone(),
            )?;
            let mut on_route = None;
            if let (Some(wire), Some(child)) = (wire, child.clone()) {
                child.set_per_session(wire.per_session());
                // A session's route goes with its source, its process first.
                let end = Arc::new(move |key: &SessionKey| child.end_session(key));
                on_route = Some(Arc::new(wire.live_sessions(*agent, end)) as Arc<LiveOnRoute>);
            }
            live.push(on_route);
            sources.push(source);
            children.extend(child);
        }
        Ok(Self {
            list,
            sources,
            live,
            children,
            bindings,
        })
    }

    /// The supervisor's factory: each session gets its agent's source.
    pub(crate) fn factory(&self) -> impl Fn(&SessionKey) -> Arc<dyn EventSource> + use<> {
        let default = self.list[0];
        let list = self.list.clone();
        let sources = self.sources.clone();
        let live = self.live.clone();
        let bindings = self.bindings.clone();
        move |key: &SessionKey| {
            let agent = bindings.as_ref().map_or(default, |b| b.agent_to_start(key));
            let at = list.iter().position(|a| *a == agent).unwrap_or(0);
            let source = Arc::clone(&sources[at]);
            match &live[at] {
                Some(live) => live(key, source),
                None => source,
            }
        }
    }

    /// `config` told which agents this server runs and where each
    /// session's is kept.
    pub(crate) fn configure(&self, config: ServeConfig) -> ServeConfig {
        // An agent that runs in its workspace needs it to exist: checked
        // at the door when any agent here does.
        let config =
            config.with_workspaces_must_exist(self.list.iter().any(|a| a.runs_in_workspace()));
        match &self.bindings {
            Some(b) => {
                config.with_agents(self.list.clone(), Arc::clone(b) as Arc<dyn SessionAgents>)
            }
            None => config.with_agent(self.list[0]),
        }
    }

    /// Ends the agent CLIs' processes.
    pub(crate) async fn shutdown(&self) {
        for child in &self.children {
            child.shutdown().await;
        }
    }
}

/// Each session's agent, in [`BINDINGS`].
struct Bindings {
    labels: SledLabels,
    default: Agent,
}

impl Bindings {
    fn open(store: &SledStore, default: Agent) -> Result<Self, CliError> {
        let labels = store
            .labels(BINDINGS)
            .map_err(|e| CliError::failure(format!("cannot open the sessions' agents: {e}")))?;
        Ok(Self { labels, default })
    }

    /// The agent session `key` starts with: its own, else (a session
    /// started before any turn bound it, or stored by a server of one
    /// agent) the default, which it keeps from now on.
    fn agent_to_start(&self, key: &SessionKey) -> Agent {
        match self.get(key) {
            Ok(Some(agent)) => agent,
            Ok(None) => self
                .labels
                .set_if_absent(key.as_str(), self.default.as_str())
                .ok()
                .and_then(|name| Agent::parse(&name))
                .unwrap_or(self.default),
            Err(e) => {
                eprintln!(
                    "warden: session {key}: cannot read its agent ({e}); running {}",
                    self.default
                );
                self.default
            }
        }
    }
}

impl SessionAgents for Bindings {
    fn get(&self, key: &SessionKey) -> Result<Option<Agent>, StoreError> {
        let Some(name) = self.labels.get(key.as_str())? else {
            return Ok(None);
        };
        Agent::parse(&name)
            .map(Some)
            .ok_or_else(|| StoreError::Corrupt {
                key: key.as_str().to_owned(),
                message: format!("its agent {name:?} is none this warden knows"),
            })
    }

    fn bind<'a>(
        &'a self,
        key: &'a SessionKey,
        agent: Agent,
    ) -> BoxFuture<'a, Result<Agent, StoreError>> {
        Box::pin(async move {
            let name = self.labels.label(key.as_str(), agent.as_str()).await?;
            Agent::parse(&name).ok_or_else(|| StoreError::Corrupt {
                key: key.as_str().to_owned(),
                message: format!("its agent {name:?} is none this warden knows"),
            })
        })
    }
}
