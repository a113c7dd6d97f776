//! The errors of this crate.

use std::net::SocketAddr;

/// Why a [`MockServer`](crate::MockServer) could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MockError {
    /// Binding the listening socket failed (port in use, no permission).
    /// **Fatal** for that configuration; retrying with another port (or
    /// none) may work.
    #[error("warden-mock: cannot listen on {addr}: {source}")]
    Bind {
        /// The address that was asked for.
        addr: SocketAddr,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
}
