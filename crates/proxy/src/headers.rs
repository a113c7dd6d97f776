//! Which headers cross the proxy.

use axum::http::{HeaderMap, HeaderName, HeaderValue, header};

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
///
/// The values are copied, not shared: hyper's header values are slices of
/// the connection's 8 KiB read buffer, and a map kept for a stream's whole
/// life (the request's, for each retry; the response's, for the client)
/// would keep that buffer alive while hyper allocates another to go on
/// reading — 8 KiB per open stream on each side.
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
        let mut owned = HeaderValue::from_bytes(value.as_bytes()).unwrap_or_else(|_| value.clone());
        owned.set_sensitive(value.is_sensitive());
        out.append(name.clone(), owned);
    }
    out
}

/// The headers of a watched request: end to end, asking the upstream for
/// an uncompressed body (the proxy reads the stream's events).
pub(crate) fn watched_request(map: &HeaderMap) -> HeaderMap {
    let mut out = end_to_end(map);
    out.insert(
        header::ACCEPT_ENCODING,
        HeaderValue::from_static("identity"),
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

    #[test]
    fn kept_values_do_not_share_the_buffer_they_were_read_from() {
        // hyper's values are slices of its read buffer; a copy lets the
        // buffer go.
        let buffer = bytes::Bytes::from_static(b"x-api-key: sk-secret\r\n");
        let mut value =
            HeaderValue::from_maybe_shared(buffer.slice(11..20)).expect("a valid value");
        value.set_sensitive(true);
        let mut h = HeaderMap::new();
        h.insert("x-api-key", value.clone());
        let out = end_to_end(&h);
        assert_eq!(out["x-api-key"], value);
        assert!(out["x-api-key"].is_sensitive());
        assert_ne!(
            out["x-api-key"].as_bytes().as_ptr(),
            value.as_bytes().as_ptr()
        );
    }
}
