//! The right epoch in every message: a write refused because this node
//! no longer holds a session's lease names the epoch it had (the one it
//! gave up or lost), not 0, on a real PostgreSQL (`WARDEN_PG_URL`; skipped
//! with a message without it). The error's text is what the session's
//! "no longer holds the session's lease; stopped here" line and a turn
//! store's refusal show.

use std::time::Duration;

use warden_core::{Durability, SessionKey, SessionRecord, SessionStore, StoreError};
use warden_pg::low_level::NodeStore;

use crate::common::{fresh_db, store};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_refused_after_the_lease_went_names_the_epoch_that_went() {
    let Some(config) = fresh_db().await else {
        return;
    };
    let pg = store(&config).await;
    let a = NodeStore::new(pg.clone(), "node-a", Duration::from_secs(10));
    let s1 = SessionKey::new("s1");
    // Epoch 1 on node-a, given back; epoch 2 on node-b.
    assert!(a.claim(&s1).await.expect("claim").is_some());
    a.release(&s1).await.expect("release");
    let b = NodeStore::new(pg.clone(), "node-b", Duration::from_secs(10));
    assert!(b.claim(&s1).await.expect("claim").is_some());
    // A late write of node-a's stopping copy names the epoch it had.
    let record = SessionRecord::new(&s1, None);
    let saved = a.save(&record, Durability::Flushed).await;
    assert!(
        matches!(saved, Err(StoreError::LeaseLost { epoch: 1, .. })),
        "the epoch given up: {saved:?}"
    );
    let opened = a.open_turn(&s1, 1, "turn_x").await;
    assert!(
        matches!(opened, Err(StoreError::LeaseLost { epoch: 1, .. })),
        "the epoch given up: {opened:?}"
    );
}
