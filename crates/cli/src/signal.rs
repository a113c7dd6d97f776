//! SIGINT and SIGTERM as one request to stop: [`install`] registers both
//! eagerly, before a turn starts, and [`shutdown_signal`] resolves once
//! either has arrived — also when it arrived before the future was made, so
//! there is no window in which a signal is lost or kills the process
//! without cleanup. The command then cancels the turn, flushes, and exits
//! 130 (SIGINT) or 143 (SIGTERM).

use std::future::Future;
use std::sync::OnceLock;

use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::watch;

use crate::exit::{CliError, Exit};

/// Which signal asked the command to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shutdown {
    /// SIGINT (Ctrl-C): exit 130.
    Interrupt,
    /// SIGTERM (`kill`, a service manager): exit 143.
    Terminate,
}

impl Shutdown {
    /// The exit code of a command stopped by this signal.
    pub(crate) fn exit(self) -> Exit {
        match self {
            Shutdown::Interrupt => Exit::Cancelled,
            Shutdown::Terminate => Exit::Terminated,
        }
    }
}

/// The first signal received, once one has been.
static RECEIVED: OnceLock<watch::Sender<Option<Shutdown>>> = OnceLock::new();

/// How many SIGINT/SIGTERM have arrived.
static COUNT: OnceLock<watch::Sender<u32>> = OnceLock::new();

/// Registers SIGINT and SIGTERM handlers now (not at the first poll) and
/// records the first of them that arrives. From here on neither signal
/// kills the process: the command must select on [`shutdown_signal`].
/// Idempotent. Must run inside the runtime.
pub(crate) fn install() -> Result<(), CliError> {
    if RECEIVED.get().is_some() {
        return Ok(());
    }
    let registered = signal(SignalKind::interrupt())
        .and_then(|int| signal(SignalKind::terminate()).map(|term| (int, term)));
    let (mut int, mut term) =
        registered.map_err(|e| CliError::failure(format!("cannot handle SIGINT/SIGTERM: {e}")))?;
    let (tx, _) = watch::channel(None);
    if RECEIVED.set(tx).is_err() {
        return Ok(()); // installed by a concurrent caller
    }
    let _ = COUNT.set(watch::channel(0).0);
    tokio::spawn(async move {
        loop {
            let which = tokio::select! {
                Some(()) = int.recv() => Shutdown::Interrupt,
                Some(()) = term.recv() => Shutdown::Terminate,
                else => return,
            };
            if let Some(count) = COUNT.get() {
                count.send_modify(|n| *n += 1);
            }
            if let Some(tx) = RECEIVED.get() {
                // The first signal decides the exit code.
                tx.send_if_modified(|seen| {
                    let first = seen.is_none();
                    if first {
                        *seen = Some(which);
                    }
                    first
                });
            }
        }
    });
    Ok(())
}

/// Resolves with the first SIGINT or SIGTERM, including one that arrived
/// between [`install`] and this call. Installs the handlers now if
/// [`install`] has not run (or never resolves if that fails: the signal
/// then keeps its default action).
pub(crate) fn shutdown_signal() -> impl Future<Output = Shutdown> + Send + 'static {
    let receiver = install()
        .ok()
        .and_then(|()| RECEIVED.get().map(watch::Sender::subscribe));
    async move {
        if let Some(mut rx) = receiver {
            if let Ok(seen) = rx.wait_for(Option::is_some).await {
                if let Some(which) = *seen {
                    return which;
                }
            }
        }
        std::future::pending().await
    }
}

/// Resolves once a second SIGINT or SIGTERM has arrived: the user insists
/// (never resolves if the handlers could not be installed).
pub(crate) fn second_signal() -> impl Future<Output = ()> + Send + 'static {
    let receiver = install()
        .ok()
        .and_then(|()| COUNT.get().map(watch::Sender::subscribe));
    async move {
        if let Some(mut rx) = receiver
            && rx.wait_for(|n| *n >= 2).await.is_ok()
        {
            return;
        }
        std::future::pending().await
    }
}

/// The signal received so far, if any.
pub(crate) fn received() -> Option<Shutdown> {
    RECEIVED.get().and_then(|tx| *tx.borrow())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use nix::sys::signal::{Signal, raise};

    use super::*;

    /// The only test that raises a signal: the first one received is kept
    /// for the whole process.
    #[tokio::test]
    async fn a_sigterm_raised_before_anyone_waits_is_not_lost_and_exits_143() {
        install().expect("installed");
        raise(Signal::SIGTERM).expect("raised");
        let which = tokio::time::timeout(Duration::from_secs(10), shutdown_signal())
            .await
            .expect("the SIGTERM was seen within 10 s");
        assert_eq!(which, Shutdown::Terminate);
        assert_eq!(received(), Some(Shutdown::Terminate));
        assert_eq!(which.exit().code(), 143);
    }
}
