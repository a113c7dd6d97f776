//! Taking over the orphans of dead nodes: the one way in
//! ([`Node::take_over`]) to the store's scan, and what it reports.

use std::time::Duration;

use tokio::sync::broadcast;
use warden_core::Supervisor;

use super::TakeOver;
use super::event::report;
use super::{Counters, Node, NodeEvent, failover};
use crate::NodeStore;

impl Node {
    /// How often the joined node runs [`take_over`](Self::take_over) on its
    /// own: a quarter of the lease TTL, at most 500 ms, so a dead node's
    /// sessions are taken over within the TTL plus half a second of its
    /// last renewal.
    pub fn scan_interval(&self) -> Duration {
        self.store.scan_interval()
    }

    /// Takes over every orphan it can now (a session with acknowledged,
    /// unanswered messages whose lease ran out: its node died) and starts
    /// it in `supervisor`, which re-sends its pending messages, reporting
    /// each as a [`NodeEvent`]. A session bound to a workspace directory (a
    /// Claude Code session lives where its workspace and transcript are)
    /// is taken only where that directory exists; elsewhere it stays with
    /// its lease expired until such a node takes it. An orphan whose copy
    /// still runs here (one stopping after this node gave its lease up) is
    /// left for a later scan. A session with waiting messages whose lease
    /// this node holds but that does not run here is started
    /// ([`TakeOver::resumed`]); and a turn of a session this node gave up
    /// lately whose message was answered but whose end was never stored
    /// gets one ([`TakeOver::ended_lost`]).
    ///
    /// The joined node does this on its own every
    /// [`scan_interval`](Self::scan_interval) (sooner when
    /// [`TakeOver::next_scan`] says so). Call it once right after the front
    /// end is ready, so the sessions waiting since before this node started
    /// are not left for the first tick.
    pub async fn take_over(&self, supervisor: &Supervisor) -> TakeOver {
        take_over(&self.store, supervisor, &self.events, &self.counters).await
    }
}

pub(super) async fn take_over(
    store: &NodeStore,
    supervisor: &Supervisor,
    events: &broadcast::Sender<NodeEvent>,
    counters: &Counters,
) -> TakeOver {
    counters.failovers.scan_begins();
    let done = store.scan_orphans(supervisor).await;
    failover::scan_ends(store, &counters.failovers, &done.taken).await;
    Counters::add(&counters.takeovers, done.taken.len() as u64);
    Counters::add(&counters.returns, done.returned.len() as u64);
    for (key, epoch) in &done.taken {
        report(
            events,
            NodeEvent::TookOver {
                key: key.clone(),
                epoch: *epoch,
            },
        );
    }
    for (key, epoch) in &done.returned {
        report(
            events,
            NodeEvent::CameHome {
                key: key.clone(),
                epoch: *epoch,
            },
        );
    }
    for (key, epoch) in &done.resumed {
        report(
            events,
            NodeEvent::Resumed {
                key: key.clone(),
                epoch: *epoch,
            },
        );
    }
    for (key, reason) in &done.released {
        report(
            events,
            NodeEvent::Released {
                key: key.clone(),
                reason: reason.clone(),
            },
        );
    }
    done
}
