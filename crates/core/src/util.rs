//! Small helpers shared by the actors.

use std::sync::{Mutex, MutexGuard, PoisonError};

use ractor::{ActorRef, RpcReplyPort, rpc::CallResult};

use crate::error::ActorError;

/// A ractor call mapped onto [`ActorError`]. No timeout: every call is
/// answered by the actor's handler or fails when the actor stops.
pub(crate) async fn call<M, T>(
    actor: &ActorRef<M>,
    what: &'static str,
    build: impl FnOnce(RpcReplyPort<T>) -> M,
) -> Result<T, ActorError>
where
    M: ractor::Message,
    T: Send + 'static,
{
    match actor.call(build, None).await {
        Ok(CallResult::Success(v)) => Ok(v),
        _ => Err(ActorError::NotRunning { what }),
    }
}

/// Locks `m`, ignoring poison. The one rule for every lock in this crate:
/// each guards a value changed in a single step (one insert, one take, one
/// replace), so a thread that panicked while holding it cannot have left it
/// half-written, and the value is sound to use.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}
