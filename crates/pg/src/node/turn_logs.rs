//! A node's turn event logs under its leases: opened and appended through
//! the fence, like the session's record.

use warden_core::store::{StoredEvent, StoredTurn, TurnAsked};
use warden_core::{SessionKey, StoreError};

use super::NodeStore;

impl NodeStore {
    /// [`PgStore::open_turn`](crate::PgStore::open_turn) under this node's lease of `key`:
    /// [`StoreError::LeaseLost`] (and the lease reported lost) when it holds
    /// none or it moved on.
    pub async fn open_turn(
        &self,
        key: &SessionKey,
        message_id: u64,
        id: &str,
    ) -> Result<StoredTurn, StoreError> {
        let asked = TurnAsked::default();
        self.open_asked_turn(key, message_id, id, None, &asked)
            .await
    }

    /// [`open_turn`](Self::open_turn), keeping the request's `fingerprint`
    /// and what it `asked` (see [`PgStore::open_keyed_turn`](crate::PgStore::open_keyed_turn)).
    pub async fn open_asked_turn(
        &self,
        key: &SessionKey,
        message_id: u64,
        id: &str,
        fingerprint: Option<&str>,
        asked: &TurnAsked,
    ) -> Result<StoredTurn, StoreError> {
        let lease = self.held_or_lost(key)?;
        // As a save: a restart does not leave the turn unstored.
        let open = || {
            self.pg
                .open_keyed_turn(&lease, message_id, id, fingerprint, asked)
        };
        self.while_held(&lease, open).await
    }

    /// Appends `events` to turn `id` under this node's lease of `key`, like
    /// [`open_turn`](Self::open_turn), in the node's next group commit
    /// (one transaction carries every turn's pending batch; see
    /// [`turn_commits`](Self::turn_commits)). Returns once that transaction
    /// has committed; [`StoreError::LeaseLost`] for this batch alone when
    /// the lease is no longer the session's.
    pub async fn append_turn(
        &self,
        key: &SessionKey,
        id: &str,
        events: &[StoredEvent],
        ended: bool,
    ) -> Result<(), StoreError> {
        let lease = self.held_or_lost(key)?;
        let appended = if self.grouped {
            let batch = crate::group::TurnBatch {
                lease: lease.clone(),
                id: id.to_owned(),
                events: events.to_vec(),
                ended,
            };
            self.group.append(batch).await
        } else {
            self.pg.append_turn(&lease, id, events, ended).await
        };
        self.forget_if_lost(&lease, &appended);
        appended
    }

    /// What this node's group commit of turn events did: transactions and
    /// the batches they carried.
    pub fn turn_commits(&self) -> crate::group::GroupStats {
        self.group.stats()
    }
}
