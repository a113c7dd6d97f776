//! A node of a cluster: requests for sessions and turns another node runs
//! are forwarded to it.
//!
//! - `POST /v1/turns` for a session another live node owns is sent on to
//!   the owner's advertised address with the caller's `Authorization`
//!   (every node of a cluster checks the same token) and the answer —
//!   `202` or the turn's event stream — is relayed as it comes. A request
//!   already forwarded (`x-warden-forwarded`) is never forwarded again, so
//!   ownership moving in between cannot make two nodes bounce a request:
//!   the second node answers `503 session_elsewhere` itself. An owner that
//!   cannot be reached (dead, its lease not yet expired), or does not
//!   answer within 5 s (paused), gets the same `503` with `Retry-After`.
//! - Turn ids of a cluster node name the node (`turn_<node in hex>_<random>`),
//!   so `GET /v1/turns/{id}/events` (with `Last-Event-ID`) and
//!   `DELETE /v1/turns/{id}` work on any node: a turn kept elsewhere is
//!   fetched from its node.

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, HeaderName, Method};
use axum::response::Response;

/// The header a forwarded request carries: the forwarding node's id.
pub(crate) const FORWARDED: &str = "x-warden-forwarded";

/// How long the owner may take to answer a forwarded request's head. A
/// paused owner (its process stopped, its kernel still accepting
/// connections) would otherwise hold the caller until it wakes; after this
/// the caller gets `503` and asks again. A forwarded turn the owner accepts
/// late is still run (delivery is at least once).
const HEAD_TIMEOUT: Duration = Duration::from_secs(5);

/// Request headers passed on to the owner.
const REQUEST_HEADERS: [&str; 4] = ["authorization", "accept", "content-type", "last-event-id"];

/// Response headers relayed back.
const RESPONSE_HEADERS: [&str; 4] = [
    "content-type",
    "retry-after",
    "cache-control",
    "x-warden-turn-id",
];

/// A turn id naming `node`: `turn_<node in hex>_<16 hex digits>`.
pub(crate) fn turn_id(node: Option<&str>) -> String {
    let tail = rand::random::<u64>();
    match node {
        None => format!("turn_{tail:016x}"),
        Some(n) => {
            let hex: String = n.bytes().map(|b| format!("{b:02x}")).collect();
            format!("turn_{hex}_{tail:016x}")
        }
    }
}

/// The node a turn id names, if it names one.
pub(crate) fn node_of_turn(id: &str) -> Option<String> {
    let (hex, tail) = id.strip_prefix("turn_")?.split_once('_')?;
    let is_hex = |s: &str| s.bytes().all(|b| b.is_ascii_hexdigit());
    if hex.is_empty() || hex.len() % 2 != 0 || !is_hex(hex) || tail.len() != 16 || !is_hex(tail) {
        return None;
    }
    let bytes = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect::<Option<Vec<u8>>>()?;
    String::from_utf8(bytes).ok()
}

/// Whether this request was already forwarded by another node.
pub(crate) fn was_forwarded(headers: &HeaderMap) -> bool {
    headers.contains_key(FORWARDED)
}

/// Why a forward failed: the owner could not be reached.
#[derive(Debug)]
pub(crate) struct Unreachable(pub(crate) String);

/// Sends the request on to `base` (another node) and relays its answer,
/// streaming the body as it arrives.
pub(crate) async fn forward(
    http: &reqwest::Client,
    me: &str,
    method: Method,
    base: &str,
    path: &str,
    headers: &HeaderMap,
    body: Option<Bytes>,
) -> Result<Response, Unreachable> {
    let url = format!("{}{path}", base.trim_end_matches('/'));
    let mut req = http.request(method, &url).header(FORWARDED, me);
    for name in REQUEST_HEADERS {
        if let Some(v) = headers.get(name) {
            req = req.header(name, v);
        }
    }
    if let Some(body) = body {
        req = req.body(body);
    }
    // The head only: a turn's stream then lasts as long as the turn.
    let answer = tokio::time::timeout(HEAD_TIMEOUT, req.send())
        .await
        .map_err(|_| Unreachable(format!("{base}: no answer within {HEAD_TIMEOUT:?}")))?
        .map_err(|e| Unreachable(format!("{base}: {}", without_url(&e))))?;
    let mut out = Response::builder().status(answer.status());
    for name in RESPONSE_HEADERS {
        if let Some(v) = answer.headers().get(name) {
            out = out.header(HeaderName::from_static(name), v);
        }
    }
    out.body(Body::from_stream(answer.bytes_stream()))
        .map_err(|e| Unreachable(e.to_string()))
}

/// The client used for forwarding: a short connect timeout (a dead owner
/// is found out fast), no overall timeout (a turn's stream lasts as long as
/// the turn).
pub(crate) fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(2))
        .tcp_nodelay(true)
        .no_proxy()
        .build()
        .unwrap_or_default()
}

/// A reqwest error's text without its URL's query (none is sent, but
/// keep it short).
fn without_url(e: &reqwest::Error) -> String {
    let mut e = e.to_string();
    if let Some(i) = e.find(" for url") {
        e.truncate(i);
    }
    e
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_turn_id_names_its_node_and_only_a_clusters_ids_do() {
        let id = turn_id(Some("node-a_1.x"));
        assert!(id.starts_with("turn_"), "{id}");
        assert_eq!(node_of_turn(&id).as_deref(), Some("node-a_1.x"));
        assert_eq!(node_of_turn(&turn_id(None)), None);
        assert_eq!(node_of_turn("turn_zz_0000000000000001"), None);
        assert_eq!(node_of_turn("turn_6_0000000000000001"), None);
        assert_eq!(node_of_turn("nope"), None);
        assert_eq!(node_of_turn("turn_61_../../x/0000000"), None);
    }
}
