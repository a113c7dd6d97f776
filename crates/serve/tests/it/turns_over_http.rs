//! The API over real HTTP (reqwest, and curl as a client no one here
//! wrote): a turn streamed as numbered SSE events, a client that drops
//! mid-turn re-attaching with `Last-Event-ID` (nothing lost, nothing twice),
//! cancel, auth, and typed errors for bad requests. The agent is an
//! in-process channel source the test drives.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt as _;
use serde_json::Value;
use warden_core::testing::{ChannelSource, ChannelSourceControl};
use warden_core::{EventSource, SessionKey, Supervisor};
use warden_serve::ServeConfig;

const TOKEN: &str = "test-token-0123456789";
const PATIENCE: Duration = Duration::from_secs(20);

async fn within<T>(what: &str, fut: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(PATIENCE, fut)
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}

struct Server {
    base: String,
    ctl: ChannelSourceControl,
    client: reqwest::Client,
    _task: tokio::task::JoinHandle<()>,
}

async fn server_with(config: ServeConfig) -> Server {
    server_over(warden_core::SupervisorConfig::default(), config).await
}

/// A server whose supervisor runs with `sup_config`.
async fn server_over(sup_config: warden_core::SupervisorConfig, config: ServeConfig) -> Server {
    let (source, ctl) = ChannelSource::new();
    let sup = Supervisor::builder(Arc::new(move |_: &SessionKey| {
        source.clone() as Arc<dyn EventSource>
    }))
    .config(sup_config)
    .start()
    .await
    .expect("supervisor");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    let app = warden_serve::router(sup, config);
    let task = tokio::spawn(async move {
        axum_serve(listener, app).await;
    });
    Server {
        base,
        ctl,
        client: reqwest::Client::new(),
        _task: task,
    }
}

async fn axum_serve(listener: tokio::net::TcpListener, app: axum::Router) {
    let _ = axum::serve(listener, app).await;
}

async fn server() -> Server {
    server_with(ServeConfig::new(TOKEN)).await
}

impl Server {
    fn post(&self, body: &str) -> reqwest::RequestBuilder {
        self.client
            .post(format!("{}/v1/turns", self.base))
            .bearer_auth(TOKEN)
            .header("content-type", "application/json")
            .body(body.to_owned())
    }

    /// Creates a turn (`202`): its id, and the whole answer.
    async fn create(&self, body: &str) -> (String, Value) {
        let response = self.post(body).send().await.expect("post");
        assert_eq!(response.status(), 202);
        let created = response.json_value().await;
        let id = created["id"].as_str().expect("id").to_owned();
        (id, created)
    }

    /// Runs a turn on session `key` over SSE, the agent answering `text`;
    /// its events.
    async fn answer(&self, key: &str, text: &str) -> Vec<Sse> {
        let turn = self
            .post(&format!(r#"{{"key": "{key}", "message": "hi"}}"#))
            .header("accept", "text/event-stream")
            .send()
            .await
            .expect("post");
        let attempt = within("the stream to open", self.ctl.next_attempt())
            .await
            .expect("opened");
        attempt.text(text);
        attempt.finish();
        read_events(turn, |_| false).await
    }

    /// `GET path` with the token: the JSON answer.
    async fn get_json(&self, path: &str) -> Value {
        self.client
            .get(format!("{}{path}", self.base))
            .bearer_auth(TOKEN)
            .send()
            .await
            .expect("get")
            .json_value()
            .await
    }

    fn events(&self, id: &str) -> reqwest::RequestBuilder {
        self.client
            .get(format!("{}/v1/turns/{id}/events", self.base))
            .bearer_auth(TOKEN)
    }
}

/// One parsed SSE event.
#[derive(Debug, Clone, PartialEq)]
struct Sse {
    id: u64,
    event: String,
    data: Value,
}

/// Reads SSE events from `response` until `stop` says so or the body ends.
async fn read_events(
    response: reqwest::Response,
    mut stop: impl FnMut(&[Sse]) -> bool,
) -> Vec<Sse> {
    let mut body = response.bytes_stream();
    let mut buf = String::new();
    let mut out = Vec::new();
    while let Some(chunk) = within("an SSE chunk", body.next()).await {
        buf.push_str(std::str::from_utf8(&chunk.expect("chunk")).expect("utf-8"));
        while let Some(end) = buf.find("\n\n") {
            let block: String = buf.drain(..end + 2).collect();
            let (mut id, mut event, mut data) = (None, String::new(), String::new());
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("id:") {
                    id = v.trim().parse().ok();
                } else if let Some(v) = line.strip_prefix("event:") {
                    event = v.trim().to_owned();
                } else if let Some(v) = line.strip_prefix("data:") {
                    data.push_str(v.trim_start());
                }
            }
            if let Some(id) = id {
                out.push(Sse {
                    id,
                    event,
                    data: serde_json::from_str(&data).expect("JSON data"),
                });
                if stop(&out) {
                    return out;
                }
            }
        }
    }
    out
}

fn ids(events: &[Sse]) -> Vec<u64> {
    events.iter().map(|e| e.id).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_streams_as_numbered_events_ending_with_done() {
    let s = server().await;
    let response = s
        .post(r#"{"key": "ws-1", "message": "hi"}"#)
        .header("accept", "text/event-stream")
        .send()
        .await
        .expect("post");
    assert_eq!(response.status(), 200);
    assert!(response.headers().contains_key("x-warden-turn-id"));
    let attempt = within("the stream to open", s.ctl.next_attempt())
        .await
        .expect("opened");
    attempt.text("Hello");
    attempt.text(" world");
    attempt.finish();
    let events = read_events(response, |_| false).await;
    let kinds: Vec<&str> = events.iter().map(|e| e.event.as_str()).collect();
    assert_eq!(kinds, ["started", "text", "text", "done"]);
    assert_eq!(ids(&events), [1, 2, 3, 4]);
    assert_eq!(events[3].data["text"], "Hello world");
    assert_eq!(events[3].data["attempts"], 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_drops_mid_turn_reattaches_and_misses_nothing() {
    let s = server().await;
    let (id, created) = s.create(r#"{"key": "ws-2", "message": "hi"}"#).await;
    assert_eq!(created["key"], "ws-2");
    let attempt = within("the stream to open", s.ctl.next_attempt())
        .await
        .expect("opened");
    attempt.text("one ");
    // A client reads two events, then its connection drops.
    let first = s.events(&id).send().await.expect("get");
    let seen = read_events(first, |e| e.len() == 2).await;
    assert_eq!(ids(&seen), [1, 2]);
    assert_eq!(seen[1].data["text"], "one ");
    // Meanwhile the turn goes on.
    attempt.text("two");
    attempt.finish();
    // It comes back with the last id it saw: exactly the rest.
    let again = s
        .events(&id)
        .header("last-event-id", "2")
        .send()
        .await
        .expect("get");
    let rest = read_events(again, |_| false).await;
    assert_eq!(ids(&rest), [3, 4]);
    assert_eq!(rest[0].data["text"], "two");
    assert_eq!(rest[1].event, "done");
    assert_eq!(rest[1].data["text"], "one two");
    // Without Last-Event-ID: the whole turn again, from its first event.
    let all = read_events(s.events(&id).send().await.expect("get"), |_| false).await;
    assert_eq!(ids(&all), [1, 2, 3, 4]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_is_cancelled_by_its_id() {
    let s = server().await;
    let (id, _) = s.create(r#"{"key": "ws-3", "message": "hi"}"#).await;
    let attempt = within("the stream to open", s.ctl.next_attempt())
        .await
        .expect("opened");
    let cancelled: Value = s
        .client
        .delete(format!("{}/v1/turns/{id}", s.base))
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("delete")
        .json_value()
        .await;
    assert_eq!(cancelled["cancelled"], true);
    within("the stream to be dropped", attempt.dropped()).await;
    let events = read_events(s.events(&id).send().await.expect("get"), |_| false).await;
    let last = events.last().expect("events");
    assert_eq!(last.event, "error");
    assert_eq!(last.data["code"], "ECANCELLED");
    assert_eq!(last.data["exit"], 130);
    let unknown = s
        .client
        .delete(format!("{}/v1/turns/turn_nope", s.base))
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("delete");
    assert_eq!(unknown.status(), 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_but_healthz_needs_the_token() {
    let s = server().await;
    let health = s
        .client
        .get(format!("{}/healthz", s.base))
        .send()
        .await
        .expect("get");
    assert_eq!(health.status(), 200);
    for token in [None, Some("wrong"), Some("")] {
        let mut request = s.client.get(format!("{}/v1/sessions", s.base));
        if let Some(t) = token {
            request = request.bearer_auth(t);
        }
        let response = request.send().await.expect("get");
        assert_eq!(response.status(), 401, "token {token:?}");
        assert_eq!(
            response
                .headers()
                .get("www-authenticate")
                .and_then(|v| v.to_str().ok()),
            Some("Bearer")
        );
        let body = response.json_value().await;
        assert_eq!(body["error"]["type"], "unauthorized");
    }
    let ok = s
        .client
        .get(format!("{}/v1/sessions", s.base))
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("get");
    assert_eq!(ok.status(), 200);
    // The scheme is case-insensitive (RFC 9110): `bearer` and `BEARER` work.
    for scheme in ["bearer", "BEARER"] {
        let ok = s
            .client
            .get(format!("{}/v1/sessions", s.base))
            .header("authorization", format!("{scheme} {TOKEN}"))
            .send()
            .await
            .expect("get");
        assert_eq!(ok.status(), 200, "{scheme}");
    }
    // Another scheme with the right token is not a bearer token.
    let basic = s
        .client
        .get(format!("{}/v1/sessions", s.base))
        .header("authorization", format!("Basic {TOKEN}"))
        .send()
        .await
        .expect("get");
    assert_eq!(basic.status(), 401);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_typed_errors_never_a_500() {
    let mut config = ServeConfig::new(TOKEN);
    config.max_body_bytes = 1024;
    let s = server_with(config).await;
    let cases: Vec<(reqwest::RequestBuilder, u16, &str)> = vec![
        (
            s.post(r#"{"message": "no session"}"#),
            400,
            "invalid_request",
        ),
        (
            s.post(r#"{"key": "a", "workspace": "/tmp", "message": "both"}"#),
            400,
            "invalid_request",
        ),
        (s.post("{not json"), 400, "invalid_request"),
        (
            s.post(r#"{"key": "a", "message": "x", "extra": 1}"#),
            422,
            "invalid_fields",
        ),
        (s.post(r#"{"key": "a"}"#), 422, "invalid_fields"),
        (
            s.client
                .post(format!("{}/v1/sessions/never-seen/reset", s.base))
                .bearer_auth(TOKEN),
            404,
            "not_found",
        ),
        (
            s.client
                .post(format!("{}/v1/turns", s.base))
                .bearer_auth(TOKEN)
                .header("content-type", "text/plain")
                .body(r#"{"key": "a", "message": "x"}"#),
            415,
            "unsupported_media_type",
        ),
        (
            s.post(&format!(
                r#"{{"key": "a", "message": "{}"}}"#,
                "x".repeat(2048)
            )),
            413,
            "too_large",
        ),
        (
            s.post(r#"{"workspace": "relative/not/there", "message": "x"}"#),
            400,
            "invalid_workspace",
        ),
        (s.events("turn_unknown"), 404, "not_found"),
        (
            s.events("turn_unknown").header("last-event-id", "abc"),
            400,
            "invalid_request",
        ),
    ];
    for (i, (request, status, kind)) in cases.into_iter().enumerate() {
        let response = request.send().await.expect("send");
        assert_eq!(response.status().as_u16(), status, "case {i}");
        let body = response.json_value().await;
        assert_eq!(body["error"]["type"], kind, "case {i}: {body}");
        if status == 422 {
            // The error names the fields a turn takes.
            let message = body["error"]["message"].as_str().unwrap_or_default();
            assert!(
                message.contains("`workspace`") || message.contains("missing field `message`"),
                "case {i}: {message}"
            );
        }
    }
}

/// What axum would answer on its own is the API's typed JSON too: a key
/// or id that is not UTF-8 once percent-decoded (`%FF`) on every route
/// the document gives a path parameter (axum: `400 text/plain`), and a
/// JSON array for a turn (serde takes a struct's fields in order from an
/// array: `[null, "k", "hi"]` ran as a turn).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_axum_would_refuse_in_plain_text_is_a_typed_error() {
    let s = server().await;
    let doc = s.get_json("/openapi.json").await;
    let mut routes = 0;
    for (path, ops) in doc["paths"].as_object().expect("paths") {
        if !path.contains('{') {
            continue;
        }
        for method in ops.as_object().expect("operations").keys() {
            let m = reqwest::Method::from_bytes(method.to_uppercase().as_bytes()).expect("method");
            let concrete = path.replace("{id}", "%FF").replace("{key}", "%FF");
            let response = s
                .client
                .request(m, format!("{}{concrete}?how=retry", s.base))
                .bearer_auth(TOKEN)
                .send()
                .await
                .expect("send");
            assert_eq!(response.status(), 400, "{method} {path}");
            let content_type = response
                .headers()
                .get("content-type")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned();
            assert_eq!(content_type, "application/json", "{method} {path}");
            let body = response.json_value().await;
            assert_eq!(
                body["error"]["type"], "invalid_request",
                "{method} {path}: {body}"
            );
            let documented = ops[method]["responses"]["400"]["description"]
                .as_str()
                .unwrap_or_default();
            assert!(
                documented.contains("`invalid_request`: a key or id in the path"),
                "{method} {path} documents its 400: {documented:?}"
            );
            routes += 1;
        }
    }
    assert_eq!(routes, 8, "the routes with a key or id");

    for array in [r#"[null, "k", "hi"]"#, r#"["hi"]"#, "[]"] {
        let response = s.post(array).send().await.expect("post");
        assert_eq!(response.status(), 422, "{array}");
        let body = response.json_value().await;
        assert_eq!(body["error"]["type"], "invalid_fields", "{array}: {body}");
    }
    assert!(
        s.get_json("/v1/sessions").await["sessions"]
            .as_array()
            .is_some_and(Vec::is_empty),
        "no array ran as a turn"
    );
}

/// The error types a description of the API document names: each
/// sentence that starts `` `name`: `` (or `` `name` (cluster): ``).
fn named_types(text: &str) -> Vec<String> {
    let parts: Vec<&str> = text.split('`').collect();
    (1..parts.len())
        .step_by(2)
        .filter(|&i| {
            let before = parts[i - 1];
            let after = parts.get(i + 1).copied().unwrap_or_default();
            (before.is_empty() || before.ends_with(". "))
                && (after.starts_with(':') || after.starts_with(" (cluster):"))
        })
        .map(|i| parts[i].to_owned())
        .collect()
}

/// One declaration of the error types (`warden_serve::api::ErrorType`):
/// the document lists them as a component, every error answer it
/// describes names one of them under its status, the docs' catalogue
/// lists each under its status, and the wire sends them — the `413` the
/// document calls `too_large` is `too_large` on the wire (it documented
/// `body_too_large`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_error_type_is_declared_once_and_documented_as_sent() {
    use warden_serve::api::ErrorType;
    let status_of = |name: &str| {
        ErrorType::ALL
            .iter()
            .find(|t| t.as_str() == name)
            .map(|t| t.status())
    };
    let mut config = ServeConfig::new(TOKEN);
    config.max_body_bytes = 1024;
    let s = server_with(config).await;
    let doc = s.get_json("/openapi.json").await;

    let listed: Vec<&str> = doc["components"]["schemas"]["ErrorType"]["enum"]
        .as_array()
        .expect("the ErrorType component")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let declared: Vec<&str> = ErrorType::ALL.iter().map(|t| t.as_str()).collect();
    assert_eq!(listed, declared, "the document's error types");

    for (path, ops) in doc["paths"].as_object().expect("paths") {
        for (method, op) in ops.as_object().expect("operations") {
            for (status, answer) in op["responses"].as_object().expect("responses") {
                let status: u16 = status.parse().expect("a status");
                if status < 400 {
                    continue;
                }
                let described = answer["description"].as_str().unwrap_or_default();
                for name in named_types(described) {
                    assert_eq!(
                        status_of(&name),
                        Some(status),
                        "{method} {path} documents `{name}` under {status}: {described}"
                    );
                }
            }
        }
    }

    // The docs' catalogue: every type under its status, no other.
    let catalogue = include_str!("../../../../docs/serve.md");
    let start = catalogue
        .find("| status | `type` | meaning; extra fields |")
        .expect("the catalogue");
    let mut in_docs = Vec::new();
    for row in catalogue[start..]
        .lines()
        .skip(2)
        .take_while(|l| l.starts_with('|'))
    {
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        let status: u16 = cells[1].parse().expect("a status");
        for name in cells[2].split('`').skip(1).step_by(2) {
            assert_eq!(status_of(name), Some(status), "docs/serve.md: {row}");
            in_docs.push(name.to_owned());
        }
    }
    in_docs.sort();
    let mut all: Vec<String> = declared.iter().map(|n| (*n).to_owned()).collect();
    all.sort();
    assert_eq!(
        in_docs, all,
        "docs/serve.md's catalogue lists every type once"
    );

    // On the wire: the 413 is the type the document names for it.
    let documented = named_types(
        doc["paths"]["/v1/turns"]["post"]["responses"]["413"]["description"]
            .as_str()
            .expect("a 413"),
    );
    let response = s
        .post(&format!(
            r#"{{"key": "a", "message": "{}"}}"#,
            "x".repeat(2048)
        ))
        .send()
        .await
        .expect("post");
    assert_eq!(response.status(), 413);
    let body = response.json_value().await;
    assert_eq!(
        [body["error"]["type"]
            .as_str()
            .unwrap_or_default()
            .to_owned()],
        documented.as_slice(),
        "{body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_streams_a_turn() {
    let Some(curl) = which("curl") else {
        assert_ne!(
            std::env::var("WARDEN_REQUIRE_CURL").as_deref(),
            Ok("1"),
            "WARDEN_REQUIRE_CURL=1 but curl is not installed"
        );
        eprintln!("skipped: curl is not installed");
        return;
    };
    let s = server().await;
    let child = tokio::process::Command::new(curl)
        .args([
            "-sS",
            "-N",
            "-H",
            &format!("Authorization: Bearer {TOKEN}"),
            "-H",
            "Accept: text/event-stream",
            "-H",
            "Content-Type: application/json",
            "-d",
            r#"{"key": "ws-curl", "message": "hi"}"#,
            &format!("{}/v1/turns", s.base),
        ])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("curl starts");
    let attempt = within("the stream to open", s.ctl.next_attempt())
        .await
        .expect("opened");
    attempt.text("from curl");
    attempt.finish();
    let out = within("curl to finish", child.wait_with_output())
        .await
        .expect("curl output");
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).expect("utf-8");
    assert!(
        text.contains("id: 1\n") || text.contains("id:1\n"),
        "{text}"
    );
    assert!(
        text.contains("event: done") || text.contains("event:done"),
        "{text}"
    );
    assert!(text.contains(r#""text":"from curl""#), "{text}");
}

fn which(bin: &str) -> Option<std::path::PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join(bin))
            .find(|p| p.is_file())
    })
}

trait JsonValue {
    async fn json_value(self) -> Value;
}

impl JsonValue for reqwest::Response {
    async fn json_value(self) -> Value {
        serde_json::from_str(&self.text().await.expect("body")).expect("JSON body")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_are_shown_reset_and_their_lifecycle_streamed() {
    let s = server().await;
    // Lifecycle events from now on.
    let lifecycle = s
        .client
        .get(format!("{}/v1/events", s.base))
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("get events");
    assert_eq!(lifecycle.status(), 200);
    s.answer("ws-s", "ok").await;
    let seen = read_events(lifecycle, |e| e.iter().any(|e| e.event == "turn_finished")).await;
    let kinds: Vec<&str> = seen.iter().map(|e| e.event.as_str()).collect();
    assert!(kinds.contains(&"turn_started"), "{kinds:?}");
    let finished = seen
        .iter()
        .find(|e| e.event == "turn_finished")
        .expect("finished");
    assert_eq!(finished.data["key"], "ws-s");
    assert_eq!(finished.data["code"], Value::Null);

    let get = |key: &str| {
        s.client
            .get(format!("{}/v1/sessions/{key}", s.base))
            .bearer_auth(TOKEN)
            .send()
    };
    let shown = get("ws-s").await.expect("get").json_value().await;
    assert_eq!(shown["key"], "ws-s");
    assert_eq!(shown["running"], true);
    assert_eq!(shown["turns_finished"], 1);
    assert_eq!(shown["pending"], 0);
    assert_eq!(get("nobody").await.expect("get").status(), 404);
    let reset = s
        .client
        .post(format!("{}/v1/sessions/ws-s/reset", s.base))
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("post")
        .json_value()
        .await;
    assert_eq!(reset["reset"], true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_turns_and_show_sessions_in_the_prometheus_format() {
    let s = server().await;
    s.answer("ws-m", "ok").await;
    let scrape = || async {
        s.client
            .get(format!("{}/metrics", s.base))
            .bearer_auth(TOKEN)
            .send()
            .await
            .expect("get")
            .text()
            .await
            .expect("body")
    };
    // The bus delivers the turn's end a moment after the reply.
    let mut text = String::new();
    for _ in 0..50 {
        text = scrape().await;
        if text.contains(r#"warden_turns_total{outcome="answered"} 1"#) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        text.contains(r#"warden_turns_total{outcome="answered"} 1"#),
        "{text}"
    );
    assert!(
        text.contains(r#"warden_sessions{state="running"} 1"#),
        "{text}"
    );
    assert!(
        text.contains("warden_turn_duration_seconds_count 1"),
        "{text}"
    );
    assert!(
        text.contains(r#"warden_transitions_total{transition="stream_timed_out"} 0"#),
        "{text}"
    );
    assert!(text.ends_with("# EOF\n"), "{text}");
    let unauthorized = s
        .client
        .get(format!("{}/metrics", s.base))
        .send()
        .await
        .expect("get");
    assert_eq!(unauthorized.status(), 401);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openapi_document_names_exactly_the_routes_served() {
    let s = server().await;
    let doc = s
        .client
        .get(format!("{}/openapi.json", s.base))
        .send()
        .await
        .expect("get")
        .json_value()
        .await;
    assert_eq!(doc["openapi"], "3.1.0");
    let paths = doc["paths"].as_object().expect("paths");
    assert!(paths.len() >= 10, "{paths:?}");
    for (path, ops) in paths {
        let concrete = path.replace("{id}", "turn_x").replace("{key}", "some-key");
        for method in ops.as_object().expect("operations").keys() {
            let m = reqwest::Method::from_bytes(method.to_uppercase().as_bytes()).expect("method");
            // Unauthenticated: a routed path answers 401 (or 200 for the open
            // ones), an unrouted one 404.
            let status = s
                .client
                .request(m, format!("{}{concrete}", s.base))
                .send()
                .await
                .expect("send")
                .status()
                .as_u16();
            assert!(
                status == 401 || status == 200,
                "{method} {path} answered {status}: documented but not routed"
            );
        }
    }
}

/// Each event stream's media type links every event's schema where a
/// tool looks for it (`x-itemSchema`, OpenAPI 3.2's `itemSchema` under an
/// extension name), not only in prose: one item per event of the stream's
/// map, its `data` that event's schema.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_event_stream_links_its_event_schemas() {
    let doc = served_document().await;
    for (path, method, map) in [
        ("/v1/turns", "post", "TurnEvents"),
        ("/v1/turns/{id}/events", "get", "TurnEvents"),
        ("/v1/events", "get", "LifecycleEvents"),
    ] {
        let media = &doc["paths"][path][method]["responses"]["200"]["content"]["text/event-stream"];
        let items = media["x-itemSchema"]["oneOf"]
            .as_array()
            .unwrap_or_else(|| panic!("{method} {path}: no x-itemSchema: {media}"));
        let linked: Vec<(String, Value)> = items
            .iter()
            .map(|i| {
                let event = i["properties"]["event"]["const"].as_str().expect("event");
                let data = i["properties"]["data"]["contentSchema"].clone();
                (event.to_owned(), data)
            })
            .collect();
        let expected: Vec<(String, Value)> = doc["components"]["schemas"][map]["properties"]
            .as_object()
            .expect("the event map")
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let mut sorted = linked.clone();
        sorted.sort_by(|a, b| a.0.cmp(&b.0));
        let mut expected_sorted = expected;
        expected_sorted.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(sorted, expected_sorted, "{method} {path}");
        for (event, data) in &linked {
            let target = data["$ref"]
                .as_str()
                .and_then(|r| r.strip_prefix("#/components/schemas/"))
                .unwrap_or_else(|| panic!("{event}: {data}"));
            assert!(
                doc["components"]["schemas"][target].is_object(),
                "{event}'s schema {target} is in the document"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_turns_events_expire_after_the_configured_time() {
    let s =
        server_with(ServeConfig::new(TOKEN).with_keep_finished(Duration::from_millis(100))).await;
    let (id, _) = s.create(r#"{"key": "ws-e", "message": "hi"}"#).await;
    let attempt = within("the stream to open", s.ctl.next_attempt())
        .await
        .expect("opened");
    attempt.finish();
    let events = read_events(s.events(&id).send().await.expect("get"), |_| false).await;
    assert_eq!(events.last().map(|e| e.event.as_str()), Some("done"));
    let mut status = 200;
    for _ in 0..100 {
        status = s.events(&id).send().await.expect("get").status().as_u16();
        if status == 404 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(status, 404, "forgotten after keep_finished");
}

/// A placement whose database is gone: it cannot place any session and
/// says so (what `warden-pg`'s lease placement answers in an outage; that
/// side is tested on a real PostgreSQL in `warden-pg`).
struct DatabaseDown;

impl warden_core::cluster::Placement for DatabaseDown {
    fn place<'a>(
        &'a self,
        _: &'a SessionKey,
    ) -> futures_util::future::BoxFuture<'a, Result<(), warden_core::cluster::Elsewhere>> {
        Box::pin(async {
            Err(warden_core::cluster::Elsewhere::store_unreachable(
                "connection refused",
                Duration::from_secs(2),
            ))
        })
    }

    fn node(&self) -> Option<&str> {
        Some("node-a")
    }

    fn ready(&self) -> futures_util::future::BoxFuture<'_, Result<(), String>> {
        Box::pin(async {
            Err("the cluster's database cannot be reached: connection refused".into())
        })
    }
}

/// A node that cannot reach its database is not ready (a load balancer
/// stops sending it turns), and a turn sent anyway gets a typed 503 that
/// says so — not "runs on node (unknown)".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_without_its_database_is_not_ready_and_says_why() {
    let s = server_with(ServeConfig::new(TOKEN).with_placement(Arc::new(DatabaseDown))).await;
    let ready = within(
        "readyz",
        s.client
            .get(format!("{}/readyz", s.base))
            .bearer_auth(TOKEN)
            .send(),
    )
    .await
    .expect("answer");
    assert_eq!(ready.status(), 503);
    let body: Value = ready.json_value().await;
    assert_eq!(body["error"]["type"], "database_unreachable", "{body}");

    let turn = within("a turn", s.post(r#"{"key":"k","message":"hi"}"#).send())
        .await
        .expect("answer");
    assert_eq!(turn.status(), 503);
    assert_eq!(
        turn.headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok()),
        Some("2")
    );
    let body: Value = turn.json_value().await;
    assert_eq!(body["error"]["type"], "database_unreachable", "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("connection refused"), "{body}");
}

/// A path that can never be a workspace is a 400 before any session
/// starts: a NUL byte, a regular file (also through `..`), a path over
/// `PATH_MAX`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn impossible_workspaces_are_refused_at_the_door() {
    let s = server().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"x").expect("file");
    let through = dir.path().join("sub/../a-file");
    let long = format!("/{}", "a".repeat(4097));
    for workspace in [
        "/tmp/a\u{0}b".to_owned(),
        file.display().to_string(),
        through.display().to_string(),
        long,
    ] {
        let body = serde_json::json!({"workspace": workspace, "message": "hi"}).to_string();
        let response = within("an answer", s.post(&body).send())
            .await
            .expect("send");
        assert_eq!(response.status(), 400, "{workspace:.60}");
        let body = response.json_value().await;
        assert_eq!(body["error"]["type"], "invalid_workspace", "{body}");
    }
    let sessions: Value = s
        .client
        .get(format!("{}/v1/sessions", s.base))
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("get")
        .json_value()
        .await;
    assert_eq!(sessions["sessions"], serde_json::json!([]), "none started");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_past_its_size_cap_ends_the_turn_with_a_typed_error() {
    const CAP: usize = 1_000;
    let mut config = warden_core::SupervisorConfig::default();
    config.session = config.session.with_max_reply_bytes(CAP);
    let server = server_over(config, ServeConfig::new(TOKEN)).await;
    let turn = server
        .post(r#"{"key": "big", "message": "hi"}"#)
        .header("accept", "text/event-stream")
        .send()
        .await
        .expect("post");
    let attempt = within("the stream to open", server.ctl.next_attempt())
        .await
        .expect("opened");
    // A runaway upstream: 100-byte deltas without end, until warden stops
    // reading them.
    let chunk = "x".repeat(100);
    let sent = within("warden to stop reading", async {
        let mut sent = 0;
        while attempt.text(&chunk) {
            sent += 1;
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        sent
    })
    .await;
    let events = read_events(turn, |_| false).await;
    let text: usize = events
        .iter()
        .filter(|e| e.event == "text")
        .map(|e| e.data["text"].as_str().expect("text").len())
        .sum();
    let last = events.last().expect("events");
    assert_eq!(last.event, "error", "{events:?}");
    assert_eq!(last.data["code"], "EREPLY_TOO_LARGE", "{last:?}");
    assert_eq!(last.data["exit"], 3, "{last:?}");
    assert!(text <= CAP, "no more than the cap reaches a client: {text}");
    assert!(
        sent < 1_000,
        "the stream was stopped near the cap, not read on: {sent} deltas sent"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_live_session_bound_a_busy_server_answers_503() {
    let config = warden_core::SupervisorConfig::default().with_max_sessions(1);
    let server = server_over(config, ServeConfig::new(TOKEN)).await;
    server
        .create(r#"{"key": "busy", "message": "long job"}"#)
        .await;
    let _attempt = within("the stream to open", server.ctl.next_attempt())
        .await
        .expect("opened");
    let response = server
        .post(r#"{"key": "another", "message": "hi"}"#)
        .send()
        .await
        .expect("post");
    assert_eq!(response.status(), 503);
    assert_eq!(
        response
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok()),
        Some("5")
    );
    let body = response.json_value().await;
    assert_eq!(body["error"]["type"], "too_many_sessions", "{body}");
    assert_eq!(body["error"]["limit"], 1, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_runs_in_its_workspace_needs_it_to_exist() {
    let s = server_with(ServeConfig::new(TOKEN).with_workspaces_must_exist(true)).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let missing = dir.path().join("not-yet");
    let response = s
        .post(
            &serde_json::json!({"workspace": missing.to_str().expect("utf-8"), "message": "hi"})
                .to_string(),
        )
        .send()
        .await
        .expect("post");
    assert_eq!(response.status(), 400);
    let body = response.json_value().await;
    assert_eq!(body["error"]["type"], "invalid_workspace", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("not an existing directory")),
        "{body}"
    );
    // An existing one is taken.
    let (_, created) = s
        .create(
            &serde_json::json!({"workspace": dir.path().to_str().expect("utf-8"), "message": "hi"})
                .to_string(),
        )
        .await;
    assert!(created["id"].is_string(), "{created}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_whose_session_stops_ends_deferred_not_failed() {
    let (source, ctl) = ChannelSource::new();
    let sup = Supervisor::start(
        Default::default(),
        Arc::new(move |_: &SessionKey| source.clone() as Arc<dyn EventSource>),
    )
    .await
    .expect("supervisor");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    let _task = tokio::spawn(axum_serve(
        listener,
        warden_serve::router(sup.clone(), ServeConfig::new(TOKEN)),
    ));
    let turn = reqwest::Client::new()
        .post(format!("{base}/v1/turns"))
        .bearer_auth(TOKEN)
        .header("content-type", "application/json")
        .header("accept", "text/event-stream")
        .body(r#"{"key": "stopping", "message": "hi"}"#)
        .send()
        .await
        .expect("post");
    let attempt = within("the stream to open", ctl.next_attempt())
        .await
        .expect("opened");
    assert!(attempt.text("partial"));
    // The server stops its sessions (a shutdown) mid-turn: the message
    // stays pending, and the turn's error says so with its own class.
    within("the shutdown", sup.shutdown()).await;
    let events = read_events(turn, |_| false).await;
    let last = events.last().expect("events");
    assert_eq!(last.event, "error", "{events:?}");
    assert_eq!(last.data["code"], "ESESSION_STOPPED", "{last:?}");
    assert_eq!(last.data["exit"], 6, "deferred, not a failure: {last:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_behind_another_of_its_session_is_told_it_waits() {
    let s = server().await;
    let (_first, _) = s.create(r#"{"key": "busy", "message": "first"}"#).await;
    let attempt = within("the first turn's stream", s.ctl.next_attempt())
        .await
        .expect("opened");
    let (second, _) = s.create(r#"{"key": "busy", "message": "second"}"#).await;
    let waiting = within(
        "the second turn's first event",
        read_events(s.events(&second).send().await.expect("get"), |events| {
            !events.is_empty()
        }),
    )
    .await;
    assert_eq!(waiting[0].event, "queued", "{waiting:?}");
    assert_eq!(waiting[0].data["behind"], 1, "{waiting:?}");
    // The first ends; the second runs.
    attempt.text("one");
    attempt.finish();
    let next = within("the second turn's stream", s.ctl.next_attempt())
        .await
        .expect("opened");
    next.text("two");
    next.finish();
    let all = read_events(s.events(&second).send().await.expect("get"), |_| false).await;
    let kinds: Vec<&str> = all.iter().map(|e| e.event.as_str()).collect();
    assert_eq!(kinds.first(), Some(&"queued"), "{kinds:?}");
    assert_eq!(kinds.last(), Some(&"done"), "{kinds:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_events_are_replayed_after_last_event_id() {
    let s = server().await;
    let events = |last: Option<&str>| {
        let mut request = s
            .client
            .get(format!("{}/v1/events", s.base))
            .bearer_auth(TOKEN);
        if let Some(id) = last {
            request = request.header("last-event-id", id);
        }
        request.send()
    };
    let live = events(None).await.expect("get events");
    s.answer("replayed", "ok").await;
    let seen = within(
        "the turn's lifecycle",
        read_events(live, |e| e.iter().any(|e| e.event == "turn_finished")),
    )
    .await;
    assert!(seen.len() >= 2, "{seen:?}");
    // Reconnected after the first: the rest again, the same ids, in order.
    let again = events(Some(&seen[0].id.to_string())).await.expect("get");
    let replayed = within(
        "the replay",
        read_events(again, |e| e.iter().any(|e| e.event == "turn_finished")),
    )
    .await;
    assert_eq!(ids(&replayed), ids(&seen[1..]), "{replayed:?}");
    assert_eq!(replayed, seen[1..].to_vec());
    // An id of an earlier run of the server: told so, then what is kept.
    let old = events(Some("5")).await.expect("get");
    let mut body = old.bytes_stream();
    let mut text = String::new();
    while !text.contains("event: turn_finished") {
        let chunk = within("the reset and the replay", body.next())
            .await
            .expect("the stream goes on")
            .expect("chunk");
        text.push_str(&String::from_utf8_lossy(&chunk));
    }
    let reset = text.find("event: reset").expect("a reset event first");
    let data = text[reset..]
        .strip_prefix("event: reset\ndata: ")
        .and_then(|rest| rest.lines().next())
        .expect("the reset's data");
    let data: serde_json::Value = serde_json::from_str(data).expect("JSON");
    assert_eq!(data["reason"], "restarted", "{text}");
    // The reasons sent are the ones documented (one enum for both).
    let doc = s.get_json("/openapi.json").await;
    let reasons = reset_reasons(&doc);
    assert_eq!(reasons, ["missed", "restarted"], "the document's reasons");
    assert!(
        data["at"].as_str().is_some_and(|at| at.ends_with('Z')),
        "{text}"
    );
    assert!(
        reset < text.find("event: turn_started").expect("the replay"),
        "{text}"
    );
    // Not a number: a typed 400.
    let bad = events(Some("abc")).await.expect("get");
    assert_eq!(bad.status(), 400);
}

/// A fresh (or just restarted) server keeps no lifecycle event yet; a
/// client that reconnects with an id it cannot place (one of an earlier
/// run, 0, the largest) is told so once, then follows the live events.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lifecycle_reader_the_server_cannot_place_is_reset_once_then_follows_live_events() {
    let s = server().await;
    for last in ["0", "1", &u64::MAX.to_string()] {
        let response = s
            .client
            .get(format!("{}/v1/events", s.base))
            .bearer_auth(TOKEN)
            .header("last-event-id", last)
            .send()
            .await
            .expect("get events");
        assert_eq!(response.status(), 200);
        let mut body = response.bytes_stream();
        // Whatever the server sends within half a second of quiet.
        let mut text = String::new();
        let quiet = tokio::time::sleep(Duration::from_millis(500));
        tokio::pin!(quiet);
        loop {
            tokio::select! {
                chunk = body.next() => {
                    let chunk = chunk.expect("the stream stays open").expect("chunk");
                    text.push_str(&String::from_utf8_lossy(&chunk));
                    assert!(text.len() < 64 * 1024, "a stream of resets: {} bytes, {}…", text.len(), &text[..200]);
                }
                () = &mut quiet => break,
            }
        }
        assert_eq!(
            text.matches("event: reset").count(),
            1,
            "one reset for id {last}: {text}"
        );
        // Then the live events, on the same connection.
        let finished = text.matches("event: turn_finished").count();
        s.answer(&format!("placed-{}", last.len()), "ok").await;
        while text.matches("event: turn_finished").count() == finished {
            let chunk = within("a live event after the reset", body.next())
                .await
                .expect("the stream goes on")
                .expect("chunk");
            text.push_str(&String::from_utf8_lossy(&chunk));
        }
        assert_eq!(text.matches("event: reset").count(), 1, "{text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sessions_recent_turns_are_listed_with_their_outcome() {
    let s = server().await;
    s.answer("listed", "first answer").await;
    s.answer("listed", "second answer").await;
    let list = |key: &str| {
        s.client
            .get(format!("{}/v1/sessions/{key}/turns", s.base))
            .bearer_auth(TOKEN)
            .send()
    };
    let body = list("listed").await.expect("get").json_value().await;
    let turns = body["turns"].as_array().expect("turns");
    assert_eq!(turns.len(), 2, "{body}");
    assert_eq!(turns[0]["message_id"], 2, "newest first: {body}");
    assert_eq!(turns[0]["outcome"], "done");
    assert_eq!(turns[0]["text"], "second answer");
    assert_eq!(turns[1]["text"], "first answer");
    assert!(
        turns[0]["id"]
            .as_str()
            .is_some_and(|id| id.starts_with("turn_"))
    );
    let none = list("nobody").await.expect("get").json_value().await;
    assert_eq!(none["turns"], serde_json::json!([]));
}

/// A session store whose writes take 50 ms (a slow disk): requests that
/// race each other overlap for that long.
struct SlowStore(warden_core::MemoryStore);

impl warden_core::SessionStore for SlowStore {
    fn load(
        &self,
        key: &SessionKey,
    ) -> futures_util::future::BoxFuture<
        '_,
        Result<Option<warden_core::SessionRecord>, warden_core::StoreError>,
    > {
        self.0.load(key)
    }

    fn save<'a>(
        &'a self,
        record: &'a warden_core::SessionRecord,
        durability: warden_core::Durability,
    ) -> futures_util::future::BoxFuture<'a, Result<(), warden_core::StoreError>> {
        Box::pin(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            self.0.save(record, durability).await
        })
    }

    fn list(
        &self,
    ) -> futures_util::future::BoxFuture<
        '_,
        Result<
            Vec<Result<warden_core::SessionRecord, warden_core::StoreError>>,
            warden_core::StoreError,
        >,
    > {
        self.0.list()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_post_with_its_idempotency_key_gets_the_same_turn() {
    let (source, ctl) = ChannelSource::new();
    let sup = Supervisor::builder(Arc::new(move |_: &SessionKey| {
        source.clone() as Arc<dyn EventSource>
    }))
    .store(Arc::new(SlowStore(warden_core::MemoryStore::new())))
    .start()
    .await
    .expect("supervisor");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    let app = warden_serve::router(sup, ServeConfig::new(TOKEN));
    let s = Server {
        base,
        ctl,
        client: reqwest::Client::new(),
        _task: tokio::spawn(axum_serve(listener, app)),
    };
    let body = r#"{"key": "idem", "message": "once"}"#;
    let post = |k: &'static str| s.post(body).header("idempotency-key", k).send();
    // Sent several times at once, before any of them has a turn: one turn,
    // answered to all, one of them as the first.
    let burst = futures_util::future::join_all((0..4).map(|_| post("order-42"))).await;
    let mut ids = Vec::new();
    let mut firsts = 0;
    for r in burst {
        let r = r.expect("post");
        assert_eq!(r.status(), 202);
        firsts += usize::from(!r.headers().contains_key("idempotent-replayed"));
        ids.push(r.json_value().await["id"].as_str().expect("id").to_owned());
    }
    assert_eq!(firsts, 1, "one request sent it, the others got it");
    let id = ids[0].clone();
    assert!(ids.iter().all(|i| *i == id), "{ids:?}");
    let attempt = within("the stream to open", s.ctl.next_attempt())
        .await
        .expect("opened");
    // Retries while it runs, several at once: the same turn each time.
    let retries = futures_util::future::join_all((0..4).map(|_| post("order-42"))).await;
    for r in retries {
        let r = r.expect("post");
        assert_eq!(r.status(), 202);
        assert_eq!(r.headers()["idempotent-replayed"], "true");
        assert_eq!(r.headers()["x-warden-turn-id"], id.as_str());
        assert_eq!(r.json_value().await["id"], id.as_str());
    }
    attempt.text("answered once");
    attempt.finish();
    // After it ended, still the same turn, and with events the whole turn.
    let replayed = post("order-42").await.expect("post");
    assert_eq!(replayed.json_value().await["id"], id.as_str());
    let events = read_events(
        s.post(body)
            .header("idempotency-key", "order-42")
            .header("accept", "text/event-stream")
            .send()
            .await
            .expect("post"),
        |e| e.iter().any(|e| e.event == "done"),
    )
    .await;
    assert_eq!(events.first().map(|e| e.id), Some(1), "{events:?}");
    assert_eq!(events.last().expect("events").data["text"], "answered once");
    // Another key is another turn.
    let (other, _) = s.create(body).await;
    assert_ne!(other, id);
    let second = post("order-43").await.expect("post").json_value().await;
    assert_ne!(second["id"], id.as_str());
    // Nothing else was sent: one attempt per distinct turn.
    for _ in 0..2 {
        let a = within("the next turn", s.ctl.next_attempt())
            .await
            .expect("opened");
        a.finish();
    }
    let listed = s.get_json("/v1/sessions/idem/turns").await;
    assert_eq!(
        listed["turns"].as_array().map(Vec::len),
        Some(3),
        "order-42, no key, order-43: {listed}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_idempotency_key_is_refused_and_sends_nothing() {
    let s = server().await;
    let long = "k".repeat(256);
    for bad in ["", long.as_str(), "has space", "ünicode"] {
        let Ok(value) = reqwest::header::HeaderValue::from_bytes(bad.as_bytes()) else {
            continue;
        };
        let r = s
            .post(r#"{"key": "bad-key", "message": "hi"}"#)
            .header("idempotency-key", value)
            .send()
            .await
            .expect("post");
        assert_eq!(r.status(), 400, "{bad:?}");
        let body = r.json_value().await;
        assert_eq!(body["error"]["type"], "invalid_idempotency_key", "{bad:?}");
    }
    let r = s
        .client
        .get(format!("{}/v1/sessions/bad-key", s.base))
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("get");
    assert_eq!(r.status(), 404, "no session was started");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_events_and_the_session_name_the_turn_by_its_id() {
    let s = server().await;
    let lifecycle = s
        .client
        .get(format!("{}/v1/events", s.base))
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("get events");
    let (id, _) = s.create(r#"{"key": "named", "message": "hi"}"#).await;
    let attempt = within("the stream to open", s.ctl.next_attempt())
        .await
        .expect("opened");
    let shown = s.get_json("/v1/sessions/named").await;
    assert_eq!(shown["turn"]["turn_id"], id.as_str(), "{shown}");
    attempt.text("ok");
    attempt.finish();
    let seen = read_events(lifecycle, |e| e.iter().any(|e| e.event == "turn_finished")).await;
    let of_turn: Vec<&Sse> = seen
        .iter()
        .filter(|e| e.data.get("turn").is_some())
        .collect();
    assert!(
        of_turn.iter().any(|e| e.event == "turn_started"),
        "{seen:?}"
    );
    for e in of_turn {
        assert_eq!(e.data["turn_id"], id.as_str(), "{e:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_says_what_a_console_needs_and_a_single_node_has_no_cluster() {
    let s = server_with(
        ServeConfig::new(TOKEN)
            .with_agent(warden_serve::Agent::Anthropic)
            .with_jaeger_url("http://jaeger.example:16686/"),
    )
    .await;
    let info = s.get_json("/v1/server").await;
    assert_eq!(info["agent"], "anthropic");
    assert_eq!(info["cluster"], false);
    assert_eq!(info["node"], Value::Null);
    assert_eq!(info["jaeger_url"], "http://jaeger.example:16686");
    let default = warden_core::WatchdogConfig::default().default_timeout;
    assert_eq!(info["stream_timeout_ms"], default.as_millis() as u64);
    let cluster = s.get_json("/v1/cluster").await;
    assert_eq!(
        cluster["error"]["type"], "not_found",
        "404 on a single node"
    );
    // The console's page: this origin only, nothing inline.
    let page = s
        .client
        .get(format!("{}/ui", s.base))
        .send()
        .await
        .expect("get /ui");
    assert_eq!(page.status(), 200, "the page needs no token");
    let csp = page.headers()["content-security-policy"]
        .to_str()
        .expect("ascii")
        .to_owned();
    for part in [
        "default-src 'none'",
        "script-src 'self'",
        "connect-src 'self'",
        "frame-ancestors 'none'",
    ] {
        assert!(csp.contains(part), "{part} in {csp}");
    }
    assert_eq!(page.headers()["referrer-policy"], "no-referrer");
    let html = page.text().await.expect("html");
    assert!(
        !html.contains("<script>") && !html.contains("style="),
        "nothing inline"
    );
    for asset in ["/ui/console.js", "/ui/console.css"] {
        let r = s
            .client
            .get(format!("{}{asset}", s.base))
            .send()
            .await
            .expect("get");
        assert_eq!(r.status(), 200, "{asset}");
        assert!(
            r.headers().contains_key("content-security-policy"),
            "{asset}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_full_session_list_shows_every_stored_session_with_its_record() {
    let s = server().await;
    s.answer("full-a", "one").await;
    let (id, _) = s.create(r#"{"key": "full-b", "message": "hi"}"#).await;
    let attempt = within("the stream to open", s.ctl.next_attempt())
        .await
        .expect("opened");
    let list = |query: &str| {
        s.client
            .get(format!("{}/v1/sessions{query}", s.base))
            .bearer_auth(TOKEN)
            .send()
    };
    let full = s.get_json("/v1/sessions?detail=full").await;
    let sessions = full["sessions"].as_array().expect("sessions");
    let find = |key: &str| {
        sessions
            .iter()
            .find(|v| v["key"] == key)
            .unwrap_or_else(|| panic!("{key} in {full}"))
    };
    assert_eq!(find("full-a")["turns_finished"], 1, "{full}");
    assert_eq!(find("full-a")["status"], "active");
    let b = find("full-b");
    assert_eq!(b["turn"]["turn_id"], id.as_str(), "{b}");
    assert_eq!(b["pending"], 1, "{b}");
    // Without detail, keys only; an unknown detail is refused.
    let plain = s.get_json("/v1/sessions").await;
    assert!(plain["sessions"][0].get("status").is_none(), "{plain}");
    let bad = list("?detail=everything").await.expect("get");
    assert_eq!(bad.status(), 400);
    attempt.finish();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_turn_is_recovered_by_retrying_its_attempt() {
    let s = server().await;
    let (id, _) = s.create(r#"{"key": "stuck", "message": "hi"}"#).await;
    let first = within("the stream to open", s.ctl.next_attempt())
        .await
        .expect("opened");
    first.text("half");
    let recover = |key: &str, how: &str| {
        s.client
            .post(format!("{}/v1/sessions/{key}/recover?how={how}", s.base))
            .bearer_auth(TOKEN)
            .send()
    };
    let bad = recover("stuck", "harder").await.expect("post");
    assert_eq!(bad.status(), 400);
    assert_eq!(bad.json_value().await["error"]["type"], "invalid_request");
    let done = recover("stuck", "retry")
        .await
        .expect("post")
        .json_value()
        .await;
    assert_eq!(done["recovered"], true, "{done}");
    assert_eq!(done["how"], "retry");
    within("the first attempt to be dropped", first.dropped()).await;
    let second = within("a second attempt", s.ctl.next_attempt())
        .await
        .expect("retried");
    second.text("whole");
    second.finish();
    let events = read_events(s.events(&id).send().await.expect("get"), |e| {
        e.iter().any(|e| e.event == "done")
    })
    .await;
    assert!(
        events
            .iter()
            .any(|e| e.event == "retrying" || e.event == "continuing"),
        "{events:?}"
    );
    // Nothing runs: nothing to recover.
    let idle = recover("stuck", "fresh")
        .await
        .expect("post")
        .json_value()
        .await;
    assert_eq!(idle["recovered"], false, "{idle}");
    let never = recover("never-seen", "retry")
        .await
        .expect("post")
        .json_value()
        .await;
    assert_eq!(never["recovered"], false, "{never}");
}

/// Every error says what to do next, in the catalogue's shape: a 401 says
/// whether the token was missing or wrong and where the server keeps it, a
/// 413 names the limit, an empty message is a 400, a wrong method a 405,
/// and a key with a `/` left unencoded is told to percent-encode it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_say_what_to_do() {
    let s = server_with(
        ServeConfig::new(TOKEN)
            .with_token_file("/srv/warden/token")
            .with_max_body_bytes(1024),
    )
    .await;
    let error = |r: reqwest::Response| async move {
        let status = r.status().as_u16();
        let body = r.json_value().await;
        let kind = body["error"]["type"].as_str().expect("a type").to_owned();
        let message = body["error"]["message"]
            .as_str()
            .expect("a message")
            .to_owned();
        (status, kind, message)
    };
    let get = |path: &str| s.client.get(format!("{}{path}", s.base));
    let (status, kind, message) = error(get("/v1/sessions").send().await.expect("get")).await;
    assert_eq!((status, kind.as_str()), (401, "unauthorized"));
    assert!(
        message.contains("no token") && message.contains("/srv/warden/token"),
        "{message}"
    );
    let wrong = get("/v1/sessions")
        .bearer_auth("nope")
        .send()
        .await
        .expect("get");
    let (_, _, message) = error(wrong).await;
    assert!(
        message.contains("not this server's") && message.contains("/srv/warden/token"),
        "{message}"
    );
    let info = get("/v1/server")
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("get")
        .json_value()
        .await;
    assert_eq!(info["token_file"], "/srv/warden/token", "{info}");

    let big = format!(r#"{{"key": "a", "message": "{}"}}"#, "x".repeat(2048));
    let (status, kind, message) = error(s.post(&big).send().await.expect("post")).await;
    assert_eq!((status, kind.as_str()), (413, "too_large"));
    assert!(message.contains("1024 bytes"), "{message}");
    let (status, kind, message) = error(
        s.post(r#"{"key": "a", "message": "  "}"#)
            .send()
            .await
            .expect("post"),
    )
    .await;
    assert_eq!(
        (status, kind.as_str()),
        (400, "invalid_request"),
        "{message}"
    );
    let (status, kind, _) = error(
        get("/v1/turns")
            .bearer_auth(TOKEN)
            .send()
            .await
            .expect("get"),
    )
    .await;
    assert_eq!((status, kind.as_str()), (405, "method_not_allowed"));
    let nested = get("/v1/sessions/team/a/turns")
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("get");
    let (status, kind, message) = error(nested).await;
    assert_eq!((status, kind.as_str()), (404, "not_found"));
    assert!(message.contains("percent-encoded"), "{message}");
}

/// A turn is one request away after it ran: `GET /v1/turns/{id}` and the
/// session's turn list give its prompt's head, model, outcome and the
/// server's times (`started_at` ≤ `ended_at`, each event's `at` between).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_is_shown_with_its_prompt_model_and_times() {
    let s = server().await;
    let long = "ü".repeat(1500); // 3,000 bytes
    let body = serde_json::json!({"key": "shown", "message": long, "model": "m-9"}).to_string();
    let (id, _) = s.create(&body).await;
    let attempt = within("the stream to open", s.ctl.next_attempt())
        .await
        .expect("opened");
    attempt.text("Hi");
    attempt.finish();
    let events = read_events(s.events(&id).send().await.expect("get"), |_| false).await;
    assert_eq!(events.last().map(|e| e.event.as_str()), Some("done"));
    let get = |path: String| s.client.get(format!("{}{path}", s.base)).bearer_auth(TOKEN);
    let turn = get(format!("/v1/turns/{id}")).send().await.expect("get");
    assert_eq!(turn.status(), 200);
    let turn = turn.json_value().await;
    assert_eq!(
        (turn["key"].as_str(), turn["outcome"].as_str()),
        (Some("shown"), Some("done")),
        "{turn}"
    );
    assert_eq!(turn["model"], "m-9", "{turn}");
    let prompt = turn["prompt"].as_str().expect("the prompt's head");
    assert_eq!(
        (prompt.len(), prompt.chars().count()),
        (2048, 1024),
        "cut whole at 2 KB"
    );
    let time = |v: &Value| {
        humantime::parse_rfc3339(v.as_str().unwrap_or_else(|| panic!("a time: {v}")))
            .expect("RFC 3339")
    };
    let (started, ended) = (time(&turn["started_at"]), time(&turn["ended_at"]));
    for e in &events {
        let at = time(&e.data["at"]);
        assert!(
            started <= at && at <= ended,
            "{e:?} between {started:?} and {ended:?}"
        );
    }
    let list = get("/v1/sessions/shown/turns".into())
        .send()
        .await
        .expect("get")
        .json_value()
        .await;
    assert_eq!(list["turns"][0]["prompt"], turn["prompt"], "{list}");
    assert_eq!(list["turns"][0]["started_at"], turn["started_at"], "{list}");
    let unknown = get("/v1/turns/turn_unknown".into())
        .send()
        .await
        .expect("get");
    assert_eq!(unknown.status(), 404);
}

/// One name per transition at every edge of the server: each event of
/// `/v1/events` is named as core names it, the API document lists exactly
/// core's published transitions, and `/metrics` counts each under the same
/// name (every one from the first scrape, each event seen counted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_edge_names_a_transition_as_core_does() {
    use std::collections::BTreeSet;
    use warden_core::names::TRANSITIONS;
    let published: BTreeSet<&str> = TRANSITIONS
        .iter()
        .filter(|t| t.published)
        .map(|t| t.name)
        .collect();

    // The document: its lifecycle event names are core's, plus the two the
    // stream itself sends.
    let doc = served_document().await;
    let mut documented: BTreeSet<String> =
        doc["components"]["schemas"]["LifecycleEvents"]["properties"]
            .as_object()
            .expect("LifecycleEvents")
            .keys()
            .cloned()
            .collect();
    assert!(documented.remove("reset") && documented.remove("lagged"));
    let core: BTreeSet<String> = published.iter().map(|n| (*n).to_owned()).collect();
    assert_eq!(documented, core, "the document's lifecycle events");

    // A turn whose attempt is recovered and retried, watched on /v1/events.
    let s = server().await;
    let lifecycle = s
        .client
        .get(format!("{}/v1/events", s.base))
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("get events");
    let (_, _) = s.create(r#"{"key": "named", "message": "hi"}"#).await;
    let first = within("the stream to open", s.ctl.next_attempt())
        .await
        .expect("opened");
    first.text("half");
    let recovered = s
        .client
        .post(format!("{}/v1/sessions/named/recover?how=retry", s.base))
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("post")
        .json_value()
        .await;
    assert_eq!(recovered["recovered"], true, "{recovered}");
    let second = within("a second attempt", s.ctl.next_attempt())
        .await
        .expect("retried");
    second.text("whole");
    second.finish();
    let seen = read_events(lifecycle, |e| e.iter().any(|e| e.event == "turn_finished")).await;
    let names: BTreeSet<&str> = seen.iter().map(|e| e.event.as_str()).collect();
    for name in &names {
        assert!(
            published.contains(name),
            "/v1/events sent {name}, not core's"
        );
    }
    for needed in ["turn_started", "attempt_started", "turn_finished"] {
        assert!(names.contains(needed), "{needed} in {names:?}");
    }
    assert!(
        names.contains("retry_scheduled") || names.contains("continue_scheduled"),
        "{names:?}"
    );

    // /metrics: one series per published transition, under its name; each
    // event seen above counted (the bus feeds both; wait for the last).
    let mut text = String::new();
    for _ in 0..50 {
        text = s
            .client
            .get(format!("{}/metrics", s.base))
            .bearer_auth(TOKEN)
            .send()
            .await
            .expect("get")
            .text()
            .await
            .expect("body");
        if text.contains(r#"warden_transitions_total{transition="turn_finished"} 1"#) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut labelled = BTreeSet::new();
    for line in text
        .lines()
        .filter(|l| l.starts_with("warden_transitions_total{"))
    {
        let (label, count) = line
            .strip_prefix(r#"warden_transitions_total{transition=""#)
            .and_then(|r| r.split_once(r#""} "#))
            .unwrap_or_else(|| panic!("{line}"));
        let count: u64 = count.parse().unwrap_or_else(|_| panic!("{line}"));
        if names.contains(label) {
            assert!(count >= 1, "{label} was seen but counted {count}");
        }
        labelled.insert(label.to_owned());
    }
    assert_eq!(labelled, core, "the metric's labels:\n{text}");
}

/// A store that cannot read one session's record.
struct OneBrokenRecord(warden_core::MemoryStore);

impl warden_core::SessionStore for OneBrokenRecord {
    fn load(
        &self,
        key: &SessionKey,
    ) -> futures_util::future::BoxFuture<
        '_,
        Result<Option<warden_core::SessionRecord>, warden_core::StoreError>,
    > {
        if key.as_str() == "broken" {
            let key = key.as_str().to_owned();
            return Box::pin(async move {
                Err(warden_core::StoreError::Corrupt {
                    key,
                    message: "a flipped byte".into(),
                })
            });
        }
        self.0.load(key)
    }

    fn save<'a>(
        &'a self,
        record: &'a warden_core::SessionRecord,
        durability: warden_core::Durability,
    ) -> futures_util::future::BoxFuture<'a, Result<(), warden_core::StoreError>> {
        self.0.save(record, durability)
    }

    fn list(
        &self,
    ) -> futures_util::future::BoxFuture<
        '_,
        Result<
            Vec<Result<warden_core::SessionRecord, warden_core::StoreError>>,
            warden_core::StoreError,
        >,
    > {
        self.0.list()
    }
}

/// Every lifecycle event the API document lists can arrive on
/// `/v1/events`, the four a filter once held back included: a workspace
/// given in another spelling (`workspace_normalized`), the agent naming
/// its conversation (`agent_session_id`), a turn queued behind the only
/// stream slot and then admitted (`attempt_admitted`), and a record the
/// store cannot read (`store_failed`, what an orchestrator alerts on).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_lifecycle_event_the_document_lists_can_arrive_on_v1_events() {
    use warden_core::{Admission, AdmissionConfig, AgentEvent, Frame};
    let (source, ctl) = ChannelSource::new();
    let sup = Supervisor::builder(Arc::new(move |_: &SessionKey| {
        source.clone() as Arc<dyn EventSource>
    }))
    .store(Arc::new(OneBrokenRecord(warden_core::MemoryStore::new())))
    .admission(Admission::new(
        AdmissionConfig::default()
            .with_release_jitter(Duration::ZERO)
            .with_max_streams(1),
    ))
    .start()
    .await
    .expect("supervisor");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    let app = warden_serve::router(sup, ServeConfig::new(TOKEN));
    let s = Server {
        base,
        ctl,
        client: reqwest::Client::new(),
        _task: tokio::spawn(axum_serve(listener, app)),
    };
    let lifecycle = s
        .client
        .get(format!("{}/v1/events", s.base))
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("get events");

    // A workspace in another spelling; its attempt takes the one slot and
    // the agent names its conversation.
    let spelled = std::env::temp_dir().join(format!("warden-events-{}", std::process::id()));
    let spelled = format!("{}/./ws/", spelled.display());
    s.create(&serde_json::json!({"workspace": spelled, "message": "hi"}).to_string())
        .await;
    let first = within("the first stream", s.ctl.next_attempt())
        .await
        .expect("opened");
    first.send(Frame::Event(AgentEvent::SessionStarted {
        session_id: "conv-1".into(),
        model: None,
    }));
    first.text("hello");
    // A second session's turn waits for the slot, then is admitted.
    s.create(r#"{"key": "queued", "message": "hi"}"#).await;
    first.finish();
    let second = within("the queued stream", s.ctl.next_attempt())
        .await
        .expect("admitted");
    second.finish();
    // A record the store cannot read.
    let broken = s
        .post(r#"{"key": "broken", "message": "hi"}"#)
        .send()
        .await
        .expect("post");
    assert_eq!(broken.status(), 503);

    let wanted = [
        "workspace_normalized",
        "agent_session_id",
        "attempt_queued",
        "attempt_admitted",
        "store_failed",
    ];
    let seen = tokio::time::timeout(
        PATIENCE,
        read_events(lifecycle, |seen| {
            wanted.iter().all(|w| seen.iter().any(|e| e.event == *w))
        }),
    )
    .await;
    let Ok(seen) = seen else {
        panic!("/v1/events did not send every one of {wanted:?} within {PATIENCE:?}");
    };
    let names: std::collections::BTreeSet<&str> = seen.iter().map(|e| e.event.as_str()).collect();
    for w in wanted {
        assert!(names.contains(w), "{w} not in {names:?}");
    }
    let failed = seen
        .iter()
        .find(|e| e.event == "store_failed")
        .expect("store_failed");
    assert_eq!(failed.data["key"], "broken", "{:?}", failed.data);
    let named = seen
        .iter()
        .find(|e| e.event == "agent_session_id")
        .expect("agent_session_id");
    assert_eq!(named.data["conversation"], "conv-1", "{:?}", named.data);
}

/// The `reason`s a `reset` event's schema allows, following `$ref`s.
fn reset_reasons(doc: &Value) -> Vec<String> {
    let resolve = |v: &Value| -> Value {
        let mut v = v.clone();
        while let Some(r) = v["$ref"].as_str() {
            let name = r.rsplit('/').next().unwrap_or_default();
            v = doc["components"]["schemas"][name].clone();
        }
        v
    };
    let reset = resolve(&doc["components"]["schemas"]["LifecycleEvents"]["properties"]["reset"]);
    let reason = resolve(&reset["properties"]["reason"]);
    reason["enum"]
        .as_array()
        .unwrap_or_else(|| panic!("reset's reason is an enumeration: {reason}"))
        .iter()
        .filter_map(|r| r.as_str().map(str::to_owned))
        .collect()
}

/// The served API document.
async fn served_document() -> Value {
    let s = server().await;
    s.get_json("/openapi.json").await
}

/// `GET /v1/turns/{id}/trace` reads from `--jaeger-url`: without one it is
/// `501 no_jaeger_url`; a turn without a trace (no OpenTelemetry layer
/// here) is `404 trace_not_found`, and an unknown turn `404 not_found` —
/// typed errors, never a 500 or Jaeger's own answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turns_trace_without_a_jaeger_or_a_trace_is_a_typed_error() {
    let trace = |s: &Server, id: &str| {
        s.client
            .get(format!("{}/v1/turns/{id}/trace", s.base))
            .bearer_auth(TOKEN)
            .send()
    };
    let s = server().await;
    let (id, _) = s.create(r#"{"key": "traced", "message": "hi"}"#).await;
    let r = trace(&s, &id).await.expect("get");
    assert_eq!(r.status(), 501);
    let body = r.json_value().await;
    assert_eq!(body["error"]["type"], "no_jaeger_url", "{body}");

    // Jaeger would not be asked: nothing listens there.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
    let nowhere = format!("http://{}", closed.local_addr().expect("addr"));
    drop(closed);
    let s = server_with(ServeConfig::new(TOKEN).with_jaeger_url(nowhere)).await;
    s.answer("traced", "an answer").await;
    let list = s.get_json("/v1/sessions/traced/turns").await;
    let id = list["turns"][0]["id"]
        .as_str()
        .expect("the turn")
        .to_owned();
    let r = trace(&s, &id).await.expect("get");
    assert_eq!(r.status(), 404);
    let body = r.json_value().await;
    assert_eq!(body["error"]["type"], "trace_not_found", "{body}");
    let r = trace(&s, "turn_unknown").await.expect("get");
    assert_eq!(r.status(), 404);
    let body = r.json_value().await;
    assert_eq!(body["error"]["type"], "not_found", "{body}");
}
