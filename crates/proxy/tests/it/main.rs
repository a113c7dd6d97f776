//! warden-proxy's integration tests as one binary (one link instead of one
//! per file): each module was a test file of its own and its tests keep
//! their names under the module's. They run as threads of one process:
//! each proxy, mock and hand-written upstream listens on a loopback port
//! the system picks, and none sets the environment, the current directory
//! or a subscriber. What the proxy logs is tested in a binary of its own
//! (`tests/what_the_proxy_logs.rs`): its scoped subscribers would miss
//! spans while the tests here run beside them.

mod common;
mod held_thinking_is_retried_unseen;
mod proxy_assembles_whole_answers;
mod proxy_keeps_streams_alive;
mod the_proxy_follows_the_sessions_rules;
mod the_proxy_reuses_upstream_connections_safely;

#[path = "../../../../tests/support/at_once.rs"]
mod at_once;

// Its tests wait on stalls, timeouts and loopback peers, not a CPU: 14.0 s
// at two at once on two cores, 5.5 s at six.
at_once::at_least_at_once!(6);
