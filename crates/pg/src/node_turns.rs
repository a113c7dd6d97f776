//! [`NodeTurns`]: the turn store of a cluster node (`warden serve`'s
//! [`TurnStore`]), over [`PgStore::open_turn`](crate::PgStore::open_turn)
//! and its siblings, under the node's leases.

use futures_util::future::BoxFuture;
use warden_core::store::{StoredEvent, StoredTurn, TurnAsked, TurnStore, TurnStoreError};
use warden_core::{SessionKey, StoreError};

use crate::NodeStore;

/// One node's turn event logs in the cluster's database, written under its
/// leases: `warden serve`'s [`TurnStore`] on a cluster node
/// ([`NodeStore::turns`]). Cheap to clone.
#[derive(Clone, Debug)]
pub struct NodeTurns {
    node: NodeStore,
}

impl NodeStore {
    /// This node's turn event logs, for `warden serve`
    /// (`ServeConfig::with_turn_store`).
    pub fn turns(&self) -> NodeTurns {
        NodeTurns { node: self.clone() }
    }
}

fn turn_error(e: StoreError) -> TurnStoreError {
    match e {
        StoreError::LeaseLost { key, epoch } => {
            TurnStoreError::Moved(format!("lease of {key} (epoch {epoch}) lost"))
        }
        e => TurnStoreError::Failed(e.to_string()),
    }
}

impl TurnStore for NodeTurns {
    fn open<'a>(
        &'a self,
        key: &'a SessionKey,
        message_id: u64,
        id: &'a str,
        fingerprint: Option<&'a str>,
        asked: &'a TurnAsked,
    ) -> BoxFuture<'a, Result<StoredTurn, TurnStoreError>> {
        Box::pin(async move {
            // Opened with its fingerprint and what it asked in one
            // statement, under the lease the node holds (a lease it lost
            // meanwhile is reported lost, as for every write).
            let turn = self
                .node
                .open_asked_turn(key, message_id, id, fingerprint, asked)
                .await;
            turn.map_err(turn_error)
        })
    }

    fn append<'a>(
        &'a self,
        key: &'a SessionKey,
        id: &'a str,
        events: &'a [StoredEvent],
        ended: bool,
    ) -> BoxFuture<'a, Result<(), TurnStoreError>> {
        Box::pin(async move {
            let appended = self.node.append_turn(key, id, events, ended).await;
            appended.map_err(turn_error)
        })
    }

    fn recent<'a>(
        &'a self,
        key: &'a SessionKey,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<StoredTurn>, TurnStoreError>> {
        Box::pin(async move {
            let turns = self.node.pg().recent_turns(key, limit).await;
            turns.map_err(turn_error)
        })
    }

    fn read<'a>(
        &'a self,
        id: &'a str,
        after: u64,
    ) -> BoxFuture<'a, Result<Option<StoredTurn>, TurnStoreError>> {
        Box::pin(async move {
            let turn = self.node.pg().read_turn(id, after).await;
            turn.map_err(turn_error)
        })
    }
}
