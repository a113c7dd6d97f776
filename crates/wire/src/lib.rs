//! # warden-wire: the wire layer under an agent CLI
//!
//! warden's own watched proxy engine ([`warden_proxy`], what `warden
//! proxy` runs), in this process, on loopback, with an agent CLI's model
//! traffic pointed at it. A stall or a cut mid-reply is continued inside
//! the CLI's own request and spliced into the same response, a stall
//! inside a thinking block retried unseen (thinking is held back: no
//! human watches these streams), an overloaded answer retried per the
//! shared backoff: the CLI never sees the fault, is never killed for it,
//! and the reply is not generated twice. An outage longer than the retry
//! policy's attempts ends the session's run as soon as the wire gives up
//! (the CLI's own retries and the session's re-runs would multiply it):
//! the policy's attempts upstream in all ([`WireLayer::live`]). The process layer (a session's
//! watchdog on the CLI's stdout, [`warden_claude::CliSource`]) stays for
//! what the wire cannot see — a CLI that hangs with a healthy upstream,
//! crashes or prints garbage — and its allowance counts the model stream
//! the wire sends the CLI too, so a long thinking stream is not taken for
//! a silent CLI.
//!
//! One implementation for library users and the `warden` binary
//! (`warden chat --agent`, `warden serve --agent`). It is a crate of its
//! own, above both `warden-claude` and `warden-proxy`, so the agent-CLI
//! crate keeps depending on `warden-core` alone (a user of one adapter
//! does not pull in an HTTP client, TLS and a server) and the engine knows
//! nothing of child processes.
//!
//! ## In a line or two
//!
//! [`WiredSourceFactory::start`] takes an adapter's options (Claude Code,
//! Codex, Gemini CLI; OpenCode and Kilo Code, Qwen Code and Aider when
//! their provider is named: [`WireAdapter`]), starts the wire with the upstream
//! those options (else the CLI's environment, else the provider) name,
//! points the CLI's base URL at it, and gives each session the shared
//! source on a route of its own:
//!
//! ```no_run
//! use std::sync::Arc;
//! use warden_claude::ClaudeOptions;
//! use warden_core::{Supervisor, SupervisorConfig};
//! use warden_wire::{WireOptions, WiredSourceFactory};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let config = SupervisorConfig::from_env()?;
//! let wire = WireOptions::new(config.watchdog.default_timeout);
//! let factory = WiredSourceFactory::start(ClaudeOptions::default(), wire).await?;
//! let supervisor = Supervisor::start(config, Arc::new(factory)).await?;
//! let turn = supervisor.send_to_workspace("/work/repo", "Hello").await?;
//! let (text, _summary) = turn.finish().await?;
//! println!("{text}");
//! supervisor.shutdown().await;
//! # Ok(())
//! # }
//! ```
//!
//! It is opt-in: `warden-claude`'s own sources
//! ([`ClaudeSource`](warden_claude::ClaudeSource) and the rest) cannot run
//! the engine without the dependencies above, and a program may already
//! put a proxy of its own in front of its CLIs. [`WireOptions::off`] is
//! the off switch (the factory then gives each session a plain source of
//! its own, as [`CliSourceFactory`](warden_claude::CliSourceFactory)).
//!
//! ## What it is made of
//!
//! - [`WireLayer`]: the engine served on loopback. Each session's CLI
//!   reaches it on a route of its own, its base URL with `/s/<id>` after it
//!   ([`WireLayer::per_session`]), which the wire strips; the chunks sent on
//!   a route are that session's liveness alone
//!   ([`WireLayer::session_source`]). A route is removed when its
//!   session's last source is dropped (the session's CLI process is ended
//!   first, so no process keeps a removed route). Traffic without a route
//!   (one session: `warden chat`) is counted for [`WireLayer::live`].
//! - The server task ends when the last clone of the [`WireLayer`] (and
//!   so the last source made from it) is dropped: nothing is left running.
//! - [`anthropic_upstream`], [`openai_upstream`], [`gemini_upstream`]: where
//!   the wire sends each API's requests on, the one rule for the binary's
//!   `--base-url` and the adapters' options.
//!
//! Modules, bottom up: `upstream`, `options` and `routes` (a session's
//! route, what the wire saw on it) know nothing of each other; `live` (a
//! source live on a route) uses `routes`; `layer` ([`WireLayer`]) uses
//! those; `adapters` ([`WireAdapter`], [`WiredSourceFactory`]) is on top.

mod adapters;
mod layer;
mod live;
mod options;
mod routes;
mod upstream;

pub use adapters::{WireAdapter, WiredSourceFactory};
pub use layer::WireLayer;
pub use options::{WireError, WireOptions};
pub use upstream::{anthropic_upstream, gemini_upstream, openai_upstream};
