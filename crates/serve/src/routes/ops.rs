//! What operators and monitors use: the token check, readiness, metrics,
//! and every session's lifecycle events.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, header};
use axum::middleware::Next;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq as _;
use warden_core::cluster::{ClusterStats, Placement};

use crate::api::ErrorType;
use crate::api::{self, LifecycleReset};
use crate::cluster::Cluster;
use crate::error::ApiError;
use crate::history;
use crate::metrics::ClusterView;
use crate::state::AppState;

/// Requires `Authorization: Bearer <token>` (compared in constant time).
pub(crate) async fn authorize(
    State(state): State<AppState>,
    request: Request,
    next: Next,
) -> Response {
    let given = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer_token)
        .unwrap_or("");
    let ok: bool = given.as_bytes().ct_eq(state.config.token.as_bytes()).into();
    if ok && !state.config.token.is_empty() {
        return next.run(request).await;
    }
    let whose = match &state.config.token_file {
        Some(path) => format!("the server's token is in {} on its machine", path.display()),
        None => "ask the server's operator for its token".to_owned(),
    };
    let message = if given.is_empty() {
        format!("no token: send the header `Authorization: Bearer <token>` ({whose})")
    } else {
        format!("the token sent is not this server's ({whose})")
    };
    ApiError::new(ErrorType::Unauthorized, message).into_response()
}

/// The token of an `Authorization: Bearer <token>` value. The scheme is
/// case-insensitive (RFC 9110 §11.1), and spaces around the token are not
/// part of it.
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim_start().split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then_some(token.trim())
}

/// `GET /metrics`: Prometheus text.
pub(crate) async fn render_metrics(State(state): State<AppState>, cluster: Cluster) -> Response {
    let view = match cluster.placement() {
        Some(placement) => {
            let (forwarded_answered, forwarded_unreachable) = cluster.forwarded();
            Some(ClusterView {
                stats: placement.stats().await,
                forwarded_answered,
                forwarded_unreachable,
            })
        }
        None => None,
    };
    let body = state.metrics.render(&state.supervisor, view).await;
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        body,
    )
        .into_response()
}

/// `GET /readyz` (no token): `ok` while the supervisor runs and, on a
/// cluster node, the placement can reach the cluster's database; else
/// `503` saying which — its type only: the reason (a host name, a pool's
/// text) is not for unauthenticated callers, and is in the node's log.
pub(crate) async fn ready(State(state): State<AppState>, cluster: Cluster) -> Response {
    if let Err(e) = state.supervisor.sessions().await {
        tracing::debug!(error = %e, "not ready: the supervisor stopped");
        return ApiError::new(ErrorType::NotReady, "the supervisor is not running").into_response();
    }
    if let Some(placement) = cluster.placement()
        && let Err(why) = placement.ready().await
    {
        tracing::debug!(error = %why, "not ready: the cluster's database cannot be reached");
        return ApiError::new(
            ErrorType::DatabaseUnreachable,
            "this node cannot reach the cluster's database",
        )
        .retry_after(1)
        .into_response();
    }
    "ok".into_response()
}

/// `GET /v1/events`: every session's lifecycle events from now on — or,
/// with `Last-Event-ID`, from after that event: the missed ones are
/// replayed from the window kept ([`history::KEPT`](crate::history::KEPT)
/// events); a client that missed more than that, or whose id is from an
/// earlier run of the server, first gets a `reset` event saying so
/// (`{"reason": "missed" | "restarted"}`), then every event kept, then
/// the live events: one `reset` per miss, never a loop of them.
pub(crate) async fn lifecycle_events(
    State(state): State<AppState>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let seen = super::last_event_id(&headers, "the id of a lifecycle event")?
        .unwrap_or_else(|| state.history.now());
    let history = Arc::clone(&state.history);
    let events = futures_util::stream::unfold(
        (history, seen, VecDeque::<Event>::new()),
        |(history, mut seen, mut queue)| async move {
            loop {
                if let Some(e) = queue.pop_front() {
                    return Some((Ok::<_, Infallible>(e), (history, seen, queue)));
                }
                let kept = match history.after(seen).await {
                    history::Next::Events(events) => events,
                    history::Next::Reset {
                        reason,
                        events,
                        position,
                    } => {
                        // Placed from here on (the events below move it
                        // on): the next `after` waits for live events
                        // instead of resetting again.
                        seen = position;
                        queue.push_back(
                            Event::default()
                                .event("reset")
                                .data(history::timed(&LifecycleReset::new(reason)).to_string()),
                        );
                        events
                    }
                };
                for k in kept {
                    seen = k.id;
                    queue.push_back(
                        Event::default()
                            .id(k.id.to_string())
                            .event(k.kind)
                            .data(k.data.to_string()),
                    );
                }
            }
        },
    );
    Ok(Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response())
}

/// `GET /v1/server`: what a client (the console) needs to know of this
/// server: its version, agent kind, the watchdog's stream timeout, its
/// node id on a cluster, and where traces are looked at.
pub(crate) async fn server_info(State(state): State<AppState>, cluster: Cluster) -> Response {
    let timeout = state.supervisor.watchdog().default_timeout();
    axum::Json(api::ServerInfo {
        version: env!("CARGO_PKG_VERSION").to_owned(),
        agent: state.config.agents.first().copied(),
        agents: state.config.agents.clone(),
        stream_timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
        cluster: cluster.placement().is_some(),
        node: cluster.node().map(str::to_owned),
        jaeger_url: state.config.jaeger_url.clone(),
        token_file: state
            .config
            .token_file
            .as_ref()
            .map(|p| p.display().to_string()),
    })
    .into_response()
}

/// Session moves listed by `GET /v1/cluster`.
const RECENT_MOVES: usize = 50;

/// How far back `GET /v1/cluster` counts the cluster's moves: an hour.
const MOVES_WITHIN: std::time::Duration = std::time::Duration::from_secs(3600);

/// A placement's move kind (`failover`, `handover`) in the contract.
fn move_kind(kind: &str) -> api::MoveKind {
    match kind {
        "failover" => api::MoveKind::Failover,
        _ => api::MoveKind::Handover,
    }
}

/// How long `GET /v1/cluster` waits for each read of the cluster's moves.
const READ_WITHIN: std::time::Duration = std::time::Duration::from_secs(2);

/// `GET /v1/cluster`: the cluster's members (heartbeat age, sessions held,
/// address), this node's lease figures, the latest session moves
/// (failovers and handovers) and the last hour's moves counted cluster
/// wide, as the database sees them. `404` on a single node. While the
/// database cannot be read (its round trip just failed, or a read does)
/// the node answers what it knows, `stale`: its own figures as ever, the
/// members and the moves as it last read them (an operator opening it
/// mid-outage sees the outage counters and the last known members, not a
/// `503`).
pub(crate) async fn cluster_view(cluster: Cluster) -> Result<Response, ApiError> {
    let Some(placement) = cluster.placement() else {
        return Err(ApiError::new(
            ErrorType::NotFound,
            "this server is not a cluster node",
        ));
    };
    let Some(stats) = placement.stats().await else {
        return Err(ApiError::new(
            ErrorType::NotFound,
            "this node's placement keeps no cluster figures",
        ));
    };
    let read = match stats.database_round_trip {
        Some(_) => read_cluster(placement, &stats).await,
        None => Err("no answer to SELECT 1".to_owned()),
    };
    let view = match read {
        Ok(view) => {
            *cluster.last_view().lock() = Some(view.clone());
            view
        }
        Err(why) => {
            tracing::debug!(error = %why, "the cluster's database cannot be read: GET /v1/cluster answers what this node last read");
            let last = cluster.last_view().lock().clone();
            let nodes = members(placement, &stats, |node| {
                let known = last.as_ref()?.nodes.iter().find(|n| n.node == node)?;
                known.advertise.clone()
            });
            let (moves, counts) = last
                .map(|l| (l.moves, l.moved_last_hour))
                .unwrap_or_default();
            view_of(placement, &stats, nodes, moves, counts, true)
        }
    };
    Ok(axum::Json(view).into_response())
}

/// The view read from the database now.
async fn read_cluster(
    placement: &dyn Placement,
    stats: &ClusterStats,
) -> Result<api::ClusterView, String> {
    let mut advertised = std::collections::HashMap::new();
    for n in &stats.nodes {
        advertised.insert(n.node.clone(), placement.advertise_of(&n.node).await);
    }
    let nodes = members(placement, stats, |node| {
        advertised.get(node).cloned().flatten()
    });
    let moves = match within(placement.moves(RECENT_MOVES)).await {
        Some(moves) => moves?
            .into_iter()
            .map(|m| api::SessionMove {
                kind: move_kind(m.kind),
                key: m.key,
                from: m.from,
                to: m.to,
                epoch: m.epoch,
                at_ms: m.at_ms,
            })
            .collect(),
        None => Vec::new(),
    };
    let counts = match within(placement.move_counts(MOVES_WITHIN)).await {
        Some(counts) => counts?
            .into_iter()
            .map(|c| api::MoveCount {
                kind: move_kind(c.kind),
                from: c.from,
                to: c.to,
                sessions: c.sessions,
            })
            .collect(),
        None => Vec::new(),
    };
    Ok(view_of(placement, stats, nodes, moves, counts, false))
}

/// A placement's read of the cluster's moves, waited for at most
/// [`READ_WITHIN`] (a partition drops packets: no answer is an answer).
async fn within<T>(
    read: impl std::future::Future<Output = Option<Result<T, String>>>,
) -> Option<Result<T, String>> {
    tokio::time::timeout(READ_WITHIN, read)
        .await
        .unwrap_or_else(|_| Some(Err("no answer in time".to_owned())))
}

/// The members as `stats` lists them, each with its address.
fn members(
    placement: &dyn Placement,
    stats: &ClusterStats,
    advertise: impl Fn(&str) -> Option<String>,
) -> Vec<api::ClusterNode> {
    stats
        .nodes
        .iter()
        .map(|n| api::ClusterNode {
            node: n.node.clone(),
            advertise: advertise(&n.node),
            heartbeat_age_secs: n.heartbeat_age_secs,
            sessions: n.sessions,
            here: placement.node() == Some(n.node.as_str()),
            state: n.state.and_then(api::MemberState::parse),
        })
        .collect()
}

/// The view: this node's figures from `stats`, the members, the moves and
/// the last hour's counts.
fn view_of(
    placement: &dyn Placement,
    stats: &ClusterStats,
    nodes: Vec<api::ClusterNode>,
    moves: Vec<api::SessionMove>,
    moved_last_hour: Vec<api::MoveCount>,
    stale: bool,
) -> api::ClusterView {
    let of = |kind| {
        moved_last_hour
            .iter()
            .filter(|c: &&api::MoveCount| c.kind == kind)
            .map(|c| c.sessions)
            .sum()
    };
    api::ClusterView {
        node: placement.node().map(str::to_owned),
        nodes,
        leases_held: stats.leases_held,
        leases_lost: stats.leases_lost,
        takeovers: stats.takeovers,
        returns: stats.returns,
        lease_ttl_secs: stats.lease_ttl.map(|t| t.as_secs_f64()),
        database_outages: stats.database_outages,
        database_outage_secs: stats.database_outage.as_secs_f64(),
        failover_seconds: api::FailoverTimings::new(
            stats.failovers.count,
            stats.failovers.sum_secs,
            stats.failovers.quantile(0.5),
            stats.failovers.quantile(0.9),
            stats.failovers.quantile(0.99),
        ),
        failovers_last_hour: of(api::MoveKind::Failover),
        handovers_last_hour: of(api::MoveKind::Handover),
        moved_last_hour,
        database_round_trip_ms: stats.database_round_trip.map(|d| d.as_secs_f64() * 1000.0),
        moves,
        stale,
    }
}
