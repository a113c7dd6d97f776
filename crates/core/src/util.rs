//! Small helpers shared by the actors.

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
