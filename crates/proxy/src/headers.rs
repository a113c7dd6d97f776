//! Which headers cross the proxy.

use axum::http::{HeaderMap, HeaderName, header};

/// Hop-by-hop headers (RFC 9110 §7.6.1) and the ones the proxy sets
/// itself: never forwarded in either direction.
const HOP_BY_HOP: [HeaderName; 9] = [
    header::CONNECTION,
    header::HOST,
    header::CONTENT_LENGTH,
    header::TRANSFER_ENCODING,
    header::TE,
    header::TRAILER,
    header::UPGRADE,
    header::PROXY_AUTHORIZATION,
    header::PROXY_AUTHENTICATE,
];

/// `map` without hop-by-hop headers (and without those named by
/// `Connection`), everything else untouched.
pub(crate) fn end_to_end(map: &HeaderMap) -> HeaderMap {
    let named: Vec<String> = map
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|n| n.trim().to_ascii_lowercase())
        .collect();
    let mut out = HeaderMap::with_capacity(map.len());
    for (name, value) in map {
        if HOP_BY_HOP.contains(name)
            || name.as_str() == "keep-alive"
            || named.iter().any(|n| n == name.as_str())
        {
            continue;
        }
        out.append(name.clone(), value.clone());
    }
    out
}

/// The headers of a watched request: end to end, asking the upstream for
/// an uncompressed body (the proxy reads the stream's events).
pub(crate) fn watched_request(map: &HeaderMap) -> HeaderMap {
    let mut out = end_to_end(map);
    out.insert(
        header::ACCEPT_ENCODING,
        header::HeaderValue::from_static("identity"),
    );
    out
}

/// The headers of a watched stream's response: end to end, without the
/// length and encoding of a body the proxy re-frames.
pub(crate) fn watched_response(map: &HeaderMap) -> HeaderMap {
    let mut out = end_to_end(map);
    out.remove(header::CONTENT_ENCODING);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn credentials_and_provider_headers_pass_and_hop_by_hop_ones_do_not() {
        let mut h = HeaderMap::new();
        for (k, v) in [
            ("x-api-key", "sk-secret"),
            ("authorization", "Bearer sk-secret"),
            ("anthropic-version", "2023-06-01"),
            ("anthropic-beta", "a,b"),
            ("connection", "keep-alive, x-drop-me"),
            ("x-drop-me", "1"),
            ("keep-alive", "timeout=5"),
            ("host", "127.0.0.1:8787"),
            ("content-length", "10"),
            ("transfer-encoding", "chunked"),
        ] {
            h.append(k, HeaderValue::from_static(v));
        }
        let out = end_to_end(&h);
        let names: Vec<&str> = out.keys().map(HeaderName::as_str).collect();
        assert_eq!(
            names,
            [
                "x-api-key",
                "authorization",
                "anthropic-version",
                "anthropic-beta"
            ]
        );
        assert_eq!(out["x-api-key"], "sk-secret");
        assert_eq!(watched_request(&h)["accept-encoding"], "identity");
    }
}
