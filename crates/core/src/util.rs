//! Small helpers shared by the actors.

use std::time::Duration;

use ractor::{ActorRef, RpcReplyPort, rpc::CallResult};
use tokio::task::JoinHandle;

use crate::error::ActorError;

/// Aborts a task when dropped, so a task never outlives the state that owns it
/// (an actor's state is dropped on every kind of exit, kill and panic included).
#[derive(Debug)]
pub(crate) struct AbortOnDrop<T = ()>(pub(crate) JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A ractor call mapped onto [`ActorError`].
pub(crate) async fn call<M, T>(
    actor: &ActorRef<M>,
    what: &'static str,
    build: impl FnOnce(RpcReplyPort<T>) -> M,
    timeout: Option<Duration>,
) -> Result<T, ActorError>
where
    M: ractor::Message,
    T: Send + 'static,
{
    match actor.call(build, timeout).await {
        Ok(CallResult::Success(v)) => Ok(v),
        _ => Err(ActorError::NotRunning { what }),
    }
}
