//! The supervisor: spawns sessions on demand, restarts them
//! per policy, recovers them from failed resumes, owns the watchdog, and
//! shuts the tree down in order.
//!
//! ```text
//! WorkspaceSupervisor         (actor.rs; use the [`Supervisor`] handle)
//!  ├─ WatchdogActor            (one; every stream registers here)
//!  └─ SessionActor  (per key)
//!      └─ StreamTask (per attempt)
//! ```
//!
//! **Restarts** follow [`Restart`] and [`RestartIntensity`], counted per
//! session. When a session fails more often than the intensity allows, the
//! supervisor *escalates*: it stops restarting that session, keeps the
//! original cause (returned by [`Supervisor::session`] for that key until
//! [`Supervisor::reset`]), logs it and publishes
//! [`LifecycleEvent::SupervisorEscalated`]. Other sessions are unaffected.
//! A failure of the watchdog is fatal to the supervisor: warden never runs
//! streams without a watchdog.
//!
//! **Resume failures** (unknown id, prompt too long, blocking limit) arrive
//! as an escalation from the session with every unanswered turn. The
//! supervisor logs the diagnostics, clears the stored id durably (keeping it
//! among the past ids), starts the session fresh with those turns, and
//! tells the user through the [`Notifier`]. If the fresh start fails too,
//! the record is marked failed with both causes and the user is told; there
//! is no loop.
//!
//! **Workspaces**: every path entry point ([`Supervisor::workspace`],
//! [`Supervisor::send_to_workspace`], [`Supervisor::bind`]) normalizes the
//! path first, so two spellings of one directory reach one session.
//!
//! | file | owns | may not |
//! | --- | --- | --- |
//! | `handle.rs` | [`Supervisor`], [`SupervisorBuilder`]: the API, path normalization, bindings | hold session state |
//! | `actor.rs` | the actor: the session map, restarts, give-ups, shutdown order | write a running session's record |
//! | `fallback.rs` | resume failure → fresh start, and the failed mark | — |

mod actor;
mod exit;
mod fallback;
mod handle;
mod state;
mod workspace;

use std::path::PathBuf;
use std::time::Duration;

use derive_setters::Setters;

use crate::error::{ActorError, ConfigError};
use crate::policy::{Restart, RestartIntensity};
use crate::session::{SessionConfig, SubmitError};
use crate::source::SessionKey;
use crate::store::StoreError;
use crate::watchdog::WatchdogConfig;

pub use handle::{Supervisor, SupervisorBuilder};

/// Configuration of a supervisor tree.
#[derive(Debug, Clone, Default, PartialEq, Setters)]
#[setters(prefix = "with_", strip_option)]
#[non_exhaustive]
pub struct SupervisorConfig {
    /// Which session exits are restarted. Default [`Restart::Transient`].
    pub restart: Restart,
    /// Restart limit per session. Default 3 within 60 s.
    pub intensity: RestartIntensity,
    /// Configuration of every session (retries, idle reap, context).
    pub session: SessionConfig,
    /// Configuration of the watchdog. Default 45 s.
    pub watchdog: WatchdogConfig,
    /// How long each step of a shutdown may take.
    pub shutdown: ShutdownTimeouts,
    /// Live sessions at most. A session asked for past it makes room by
    /// stopping the least recently used idle one (no turn running, no
    /// message waiting; its record is kept and it resumes when next asked
    /// for); when none is idle the request fails
    /// [`SupervisorError::TooManySessions`]. Default `None`: no bound
    /// (idle sessions are still reaped after
    /// [`SessionConfig::idle_timeout`](crate::SessionConfig)).
    #[setters(skip)]
    pub max_sessions: Option<usize>,
}

/// How long each step of a supervisor's shutdown may take before it is cut
/// short (the actor is then dropped; a stream's source is released when
/// its task is dropped).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Setters)]
#[setters(prefix = "with_", strip_option)]
#[non_exhaustive]
pub struct ShutdownTimeouts {
    /// The whole tree, [`Supervisor::shutdown`]. Default 30 s.
    pub tree: Duration,
    /// Each session (its stream released, its record written). Default
    /// 10 s. A session's own wait for its stream is
    /// [`SessionConfig::stream_stop_timeout`](crate::SessionConfig).
    pub session: Duration,
    /// The watchdog, stopped last. Default 5 s.
    pub watchdog: Duration,
}

impl Default for ShutdownTimeouts {
    fn default() -> Self {
        Self {
            tree: Duration::from_secs(30),
            session: Duration::from_secs(10),
            watchdog: Duration::from_secs(5),
        }
    }
}

impl SupervisorConfig {
    /// The defaults with `WARDEN_STREAM_TIMEOUT`, `WARDEN_PROGRESS_TIMEOUT`
    /// and `WARDEN_TURN_DEADLINE` applied (see [`crate::config`]).
    pub fn from_env() -> Result<Self, ConfigError> {
        let var = |k: &str| std::env::var(k).ok();
        let mut session = SessionConfig::default();
        session.stream.progress_timeout =
            crate::config::optional_millis_from(crate::config::PROGRESS_TIMEOUT_ENV, var)?;
        session.turn_deadline =
            crate::config::optional_millis_from(crate::config::TURN_DEADLINE_ENV, var)?;
        Ok(Self {
            watchdog: WatchdogConfig::from_env()?,
            session,
            ..Self::default()
        })
    }

    /// Bounds the live sessions (see [`max_sessions`](Self::max_sessions)).
    pub fn with_max_sessions(mut self, max: usize) -> Self {
        self.max_sessions = Some(max.max(1));
        self
    }
}

/// Errors of the supervisor API.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SupervisorError {
    /// The session was given up (restart intensity exceeded, or a fresh
    /// start after a resume failure failed too); `cause` says why. Fatal
    /// until [`Supervisor::reset`].
    #[error("session {key} failed and was given up: {cause}")]
    SessionFailed {
        /// The session.
        key: SessionKey,
        /// The original failure.
        cause: String,
    },
    /// The session's record could not be read or written (corrupt, newer
    /// schema, I/O). The record is left as it is.
    #[error("session {key}: {error}")]
    Store {
        /// The session.
        key: SessionKey,
        /// The store's error.
        error: StoreError,
    },
    /// [`SupervisorConfig::max_sessions`] sessions are live and none is
    /// idle: the new one is not started. Ask again when a turn has ended.
    #[error(
        "{limit} sessions are live and every one is busy (a turn running or a message waiting); \
         no room for session {key} now: retry when a turn has ended"
    )]
    TooManySessions {
        /// The session asked for.
        key: SessionKey,
        /// The bound.
        limit: usize,
    },
    /// The workspace path could not be normalized.
    #[error("workspace {path}: {message}")]
    Workspace {
        /// The path as given.
        path: PathBuf,
        /// What failed.
        message: String,
    },
    /// No workspace is bound to this name.
    #[error("nothing is bound to {0:?}")]
    Unbound(String),
    /// The session's agent works in a workspace and none is known for it
    /// (see [`EventSource::runs_in_workspace`](crate::EventSource::runs_in_workspace)).
    /// Fatal for this call: name one.
    #[error(
        "session {key} runs an agent in its workspace and has none: send with \
         send_to_workspace, key it with SessionKey::for_workspace, or give \
         SessionSpec::with_workspace (it would have run in this process's own directory)"
    )]
    NoWorkspace {
        /// The session.
        key: SessionKey,
    },
    /// A spec was given for a session that is running with another one
    /// (another source or other settings). Fatal for this call: send
    /// without a spec, or stop the session first.
    #[error(
        "session {key} is running with another spec: send without one, or stop the session \
         first (its spec applies from its next start)"
    )]
    SpecConflict {
        /// The session.
        key: SessionKey,
    },
    /// The message could not be accepted.
    #[error(transparent)]
    Submit(#[from] SubmitError),
    /// Actor plumbing failed (the supervisor is stopping or stopped).
    #[error(transparent)]
    Actor(#[from] ActorError),
}
