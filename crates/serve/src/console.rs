//! The web console at `/ui`: one HTML page, its script and its style,
//! embedded in the binary (no build step, no dependency, nothing loaded
//! from elsewhere). The page asks for the token and keeps it in the tab's
//! `sessionStorage`; its requests carry it like any client's. Every answer
//! here forbids other origins (`Content-Security-Policy`), framing and
//! referrers, so nothing the page shows — prompts, replies, the token —
//! is sent anywhere but this node.

use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};

/// What the console's page may load and connect to: this origin only; no
/// inline script or style, no plug-ins, no framing, no form posts
/// elsewhere.
pub(crate) const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
     style-src 'self'; img-src 'self' data:; connect-src 'self'; base-uri 'none'; \
     form-action 'self'; frame-ancestors 'none'";

const INDEX: &str = include_str!("console/index.html");
const SCRIPT: &str = include_str!("console/console.js");
const STYLE: &str = include_str!("console/console.css");

/// `GET /ui`: the page.
pub(crate) async fn index() -> Response {
    asset("text/html; charset=utf-8", INDEX)
}

/// `GET /ui/console.js`.
pub(crate) async fn script() -> Response {
    asset("text/javascript; charset=utf-8", SCRIPT)
}

/// `GET /ui/console.css`.
pub(crate) async fn style() -> Response {
    asset("text/css; charset=utf-8", STYLE)
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    let mut response = body.into_response();
    let headers = response.headers_mut();
    let set = |h: &mut axum::http::HeaderMap, name: header::HeaderName, value: &'static str| {
        h.insert(name, HeaderValue::from_static(value));
    };
    set(headers, header::CONTENT_TYPE, content_type);
    set(
        headers,
        header::CONTENT_SECURITY_POLICY,
        CONTENT_SECURITY_POLICY,
    );
    set(headers, header::X_CONTENT_TYPE_OPTIONS, "nosniff");
    set(headers, header::X_FRAME_OPTIONS, "DENY");
    set(headers, header::REFERRER_POLICY, "no-referrer");
    // The binary's own files: a new version is a new binary.
    set(headers, header::CACHE_CONTROL, "no-cache");
    response
}
