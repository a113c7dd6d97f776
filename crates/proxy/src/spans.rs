//! Span names of the proxy, one dotted constant each (as
//! `warden_core::spans::names`).

/// One proxied request (fields: `warden.upstream`, `warden.path`,
/// `warden.status`, `warden.attempts`, `warden.kills`,
/// `warden.continuations`, `warden.outcome`).
pub const PROXY_REQUEST: &str = "proxy.request";
/// One upstream attempt of a watched request (child of
/// [`PROXY_REQUEST`]; fields `warden.attempt`, `warden.outcome`).
pub const PROXY_ATTEMPT: &str = "proxy.attempt";
/// Log event: the watchdog killed a silent upstream attempt.
pub const PROXY_KILL: &str = "proxy.kill";
/// Log event: a broken reply is continued and spliced.
pub const PROXY_CONTINUE: &str = "proxy.continue";
