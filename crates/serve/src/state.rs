//! What every handler shares.

use std::sync::Arc;

use warden_core::Supervisor;

use axum::extract::FromRef;

use crate::cluster::ClusterState;
use crate::config::ServeConfig;
use crate::metrics::Metrics;
use crate::turns::Turns;

/// The server's state, cloned into each request.
#[derive(Clone)]
pub(crate) struct AppState {
    /// The node's place in a cluster, for the [`Cluster`](crate::cluster::Cluster)
    /// extractor.
    pub(crate) cluster: ClusterState,
    pub(crate) supervisor: Supervisor,
    pub(crate) turns: Arc<Turns>,
    pub(crate) config: Arc<ServeConfig>,
    pub(crate) metrics: Arc<Metrics>,
    /// The recent lifecycle events, for `GET /v1/events` replays.
    pub(crate) history: Arc<crate::history::History>,
}

impl FromRef<AppState> for ClusterState {
    fn from_ref(state: &AppState) -> Self {
        state.cluster.clone()
    }
}
