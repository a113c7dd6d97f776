//! The web console at `/ui`: one HTML page, its script (a few ES modules,
//! each its own file under `/ui/`) and its style, embedded in the binary
//! (no build step, no dependency, nothing loaded from elsewhere). The page
//! asks for the token and keeps it in the tab's `sessionStorage`; its
//! requests carry it like any client's. Every answer
//! here forbids other origins (`Content-Security-Policy`), framing and
//! referrers, so nothing the page shows — prompts, replies, the token —
//! is sent anywhere but this node.

use axum::extract::Path;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

/// What the console's page may load and connect to: this origin only; no
/// inline script or style, no plug-ins, no framing, no form posts
/// elsewhere.
pub(crate) const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
     style-src 'self'; img-src 'self' data:; connect-src 'self'; base-uri 'none'; \
     form-action 'self'; frame-ancestors 'none'";

const INDEX: &str = include_str!("console/index.html");

/// The files under `/ui/`: the page's modules (`console.js` imports the
/// others) and its style sheet.
const FILES: &[(&str, &str, &str)] = &[
    ("console.js", JS, include_str!("console/console.js")),
    ("state.js", JS, include_str!("console/state.js")),
    ("api.js", JS, include_str!("console/api.js")),
    ("text.js", JS, include_str!("console/text.js")),
    ("sessions.js", JS, include_str!("console/sessions.js")),
    ("turn.js", JS, include_str!("console/turn.js")),
    ("timeline.js", JS, include_str!("console/timeline.js")),
    ("trace.js", JS, include_str!("console/trace.js")),
    ("cluster.js", JS, include_str!("console/cluster.js")),
    ("health.js", JS, include_str!("console/health.js")),
    ("console.css", CSS, include_str!("console/console.css")),
];

const JS: &str = "text/javascript; charset=utf-8";
const CSS: &str = "text/css; charset=utf-8";

/// `GET /ui`: the page.
pub(crate) async fn index() -> Response {
    asset("text/html; charset=utf-8", INDEX)
}

/// `GET /ui/{file}`: one of the page's [`FILES`]; any other name is a 404.
pub(crate) async fn file(Path(name): Path<String>) -> Response {
    match FILES.iter().find(|(n, _, _)| *n == name) {
        Some((_, content_type, body)) => asset(content_type, body),
        None => {
            let mut response = asset("text/plain; charset=utf-8", "no such file of the console\n");
            *response.status_mut() = StatusCode::NOT_FOUND;
            response
        }
    }
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
