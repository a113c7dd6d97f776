//! `GET /v1/turns/{id}/trace`: the turn's trace, read server-side from the
//! Jaeger query API at `--jaeger-url` (`/api/traces/{trace_id}`), so the
//! console's token stays with the console and Jaeger's API is never
//! exposed to the browser.

use std::collections::BTreeSet;
use std::sync::OnceLock;
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::Method;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use super::Param;
use crate::api::{ErrorType, TraceSpan, TurnTrace};
use crate::cluster::{Cluster, without_url};
use crate::error::{ApiError, database_unreachable};
use crate::state::AppState;

/// How long Jaeger may take to answer one query.
const JAEGER_TIMEOUT: Duration = Duration::from_secs(5);

/// `GET /v1/turns/{id}/trace`.
pub(crate) async fn turn_trace(
    State(state): State<AppState>,
    Param(id): Param,
    cluster: Cluster,
) -> Result<Response, ApiError> {
    let turn = match state.turns.one(&id).await {
        Ok(Some(turn)) => turn,
        Ok(None) => {
            let path = format!("/v1/turns/{id}/trace");
            return cluster.turn_elsewhere(&id, Method::GET, &path).await;
        }
        Err(why) => return Err(database_unreachable("cannot read the turn", &why)),
    };
    let Some(jaeger) = &state.config.jaeger_url else {
        return Err(ApiError::new(
            ErrorType::NoJaegerUrl,
            "this server reads traces from nowhere: start it with --jaeger-url \
             (Jaeger's query API, the address its UI is on)",
        ));
    };
    let Some(trace_id) = turn.asked.trace_id.clone() else {
        return Err(not_in_jaeger(
            &id,
            "it has no trace: tracing was off when it ran",
        ));
    };
    // Every trace it ran in (two when it started again in a fresh
    // session), the one it ends in last.
    let mut traces = turn.asked.trace_ids.clone();
    if traces.last() != Some(&trace_id) {
        traces.push(trace_id.clone());
    }
    let mut spans = Vec::new();
    for found in futures_util::future::join_all(traces.iter().map(|t| read(jaeger, t))).await {
        spans.extend(found?.into_iter().flatten());
    }
    if !spans.iter().any(|s| s.trace_id == trace_id) {
        return Err(not_in_jaeger(
            &id,
            &format!(
                "Jaeger has no trace {trace_id} (yet: a turn's spans are exported when they end)"
            ),
        ));
    }
    let linked = linked(jaeger, &traces, &spans).await?;
    Ok(Json(TurnTrace {
        id,
        key: turn.key.as_str().to_owned(),
        trace_id,
        spans,
        linked,
    })
    .into_response())
}

fn not_in_jaeger(id: &str, why: &str) -> ApiError {
    ApiError::new(
        ErrorType::TraceNotFound,
        format!("no trace of turn {id}: {why}"),
    )
}

/// The spans the links of `spans` point to in other traces than
/// `traces` (each trace read once, concurrently), those Jaeger has.
async fn linked(
    jaeger: &str,
    traces: &[String],
    spans: &[TraceSpan],
) -> Result<Vec<TraceSpan>, ApiError> {
    let wanted: BTreeSet<(&str, &str)> = spans
        .iter()
        .flat_map(|s| &s.references)
        .filter(|r| !traces.contains(&r.trace_id))
        .map(|r| (r.trace_id.as_str(), r.span_id.as_str()))
        .collect();
    let traces: BTreeSet<&str> = wanted.iter().map(|(t, _)| *t).collect();
    let read = traces.iter().map(|t| read(jaeger, t));
    let mut found = Vec::new();
    for spans in futures_util::future::join_all(read).await {
        found.extend(
            spans?
                .into_iter()
                .flatten()
                .filter(|s| wanted.contains(&(s.trace_id.as_str(), s.span_id.as_str()))),
        );
    }
    Ok(found)
}

/// Jaeger's answer to `/api/traces/{id}`.
#[derive(Deserialize)]
struct Traces {
    #[serde(default)]
    data: Vec<Trace>,
}

#[derive(Deserialize)]
struct Trace {
    #[serde(default)]
    spans: Vec<TraceSpan>,
}

/// Trace `trace_id`'s spans from the Jaeger at `jaeger`; `None` when it
/// has no such trace. Jaeger not answering, or answering an error, is a
/// `502 jaeger_unreachable`.
async fn read(jaeger: &str, trace_id: &str) -> Result<Option<Vec<TraceSpan>>, ApiError> {
    // A trace id is hex; anything else is no trace Jaeger could have.
    if trace_id.is_empty() || !trace_id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Ok(None);
    }
    static HTTP: OnceLock<reqwest::Client> = OnceLock::new();
    let http = HTTP.get_or_init(|| {
        reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(2))
            .timeout(JAEGER_TIMEOUT)
            .build()
            .unwrap_or_default()
    });
    let url = format!("{jaeger}/api/traces/{trace_id}");
    let unreachable = |why: String| {
        ApiError::new(
            ErrorType::JaegerUnreachable,
            format!("Jaeger's query API at {jaeger} {why}; ask again"),
        )
        .retry_after(2)
    };
    let response = http
        .get(&url)
        .send()
        .await
        .map_err(|e| unreachable(format!("did not answer ({})", without_url(&e))))?;
    match response.status().as_u16() {
        404 => return Ok(None),
        200 => {}
        status => return Err(unreachable(format!("answered {status}"))),
    }
    let body = response
        .bytes()
        .await
        .map_err(|e| unreachable(format!("broke off its answer ({})", without_url(&e))))?;
    let traces: Traces = serde_json::from_slice(&body)
        .map_err(|e| unreachable(format!("answered what is not a trace ({e})")))?;
    let spans: Vec<TraceSpan> = traces.data.into_iter().flat_map(|t| t.spans).collect();
    Ok((!spans.is_empty()).then_some(spans))
}
