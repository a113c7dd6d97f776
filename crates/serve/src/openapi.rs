//! The OpenAPI 3.1 document served at `/openapi.json`, derived from the
//! contract's types ([`crate::api`]) with `schemars`: every body and every
//! SSE event's `data` is the schema of the type the server sends. Only the
//! routes' prose (summaries, what each error type means) is written here.
//! A test checks that every path it names is routed, and the clients are
//! generated from it.

use schemars::generate::{Contract, SchemaSettings};
use schemars::{JsonSchema, SchemaGenerator};
use serde_json::{Map, Value, json};
use warden_core::lifecycle::wire::LifecycleData;
use warden_core::store::{TurnEventData, TurnEventKind};

use crate::api;

/// One operation, built from the types it takes and answers.
struct Op {
    v: Value,
}

impl Op {
    fn new(id: &str, summary: &str) -> Self {
        Self {
            v: json!({"operationId": id, "summary": summary, "responses": {}}),
        }
    }

    fn public(mut self) -> Self {
        self.v["security"] = json!([]);
        self
    }

    fn param(
        mut self,
        name: &str,
        place: &str,
        required: bool,
        schema: Value,
        about: &str,
    ) -> Self {
        let mut p = json!({"name": name, "in": place, "required": required, "schema": schema});
        if !about.is_empty() {
            p["description"] = json!(about);
        }
        match self.v["parameters"].as_array_mut() {
            Some(list) => list.push(p),
            None => self.v["parameters"] = json!([p]),
        }
        self
    }

    fn path_param(self, name: &str, about: &str) -> Self {
        self.param(name, "path", true, json!({"type": "string"}), about)
    }

    fn body(mut self, schema: Value) -> Self {
        self.v["requestBody"] =
            json!({"required": true, "content": {"application/json": {"schema": schema}}});
        self
    }

    fn answer(mut self, status: u16, description: &str, content: Option<(&str, Value)>) -> Self {
        let mut r = json!({"description": description});
        if let Some((media, schema)) = content {
            r["content"] = json!({media: {"schema": schema}});
        }
        self.v["responses"][status.to_string()] = r;
        self
    }

    fn json(self, status: u16, description: &str, schema: Value) -> Self {
        self.answer(status, description, Some(("application/json", schema)))
    }

    fn text(self, status: u16, description: &str) -> Self {
        self.answer(
            status,
            description,
            Some(("text/plain", json!({"type": "string"}))),
        )
    }

    /// An event stream: each event's `data` schema by its `event:` name,
    /// in the media type's `x-itemSchema` (OpenAPI 3.2's `itemSchema` for
    /// `text/event-stream`, under an extension name: this document is
    /// 3.1, which openapi-python-client requires and whose media type
    /// takes no other key), and in the component `events` names.
    fn sse(
        mut self,
        status: u16,
        description: &str,
        events: &str,
        kinds: &[(String, Value)],
    ) -> Self {
        let schema = json!({"type": "string", "description": format!(
            "SSE: each event has `id:`, `event:` (its type) and `data:`, the JSON of that type's schema: see `x-itemSchema`, and `{events}`")});
        let items: Vec<Value> = kinds
            .iter()
            .map(|(name, data)| {
                json!({"type": "object", "required": ["event", "data"], "properties": {
                    "event": {"const": name},
                    "data": {"type": "string", "contentMediaType": "application/json", "contentSchema": data},
                    "id": {"type": "string"},
                }})
            })
            .collect();
        self = self.answer(status, description, Some(("text/event-stream", schema)));
        self.v["responses"][status.to_string()]["content"]["text/event-stream"]["x-itemSchema"] = json!({
            "description": "One server-sent event (OpenAPI 3.2's `itemSchema`): its `event:` name and its `data:`, a JSON text of that event's schema",
            "oneOf": items,
        });
        self
    }

    /// The error answers; an operation with a path parameter also answers
    /// a key or id that is not UTF-8 with a `400`.
    fn errors(mut self, error: &Value, list: &[(u16, &str)]) -> Self {
        for (status, description) in list {
            self = self.json(*status, description, error.clone());
        }
        let in_path = self.v["parameters"]
            .as_array()
            .is_some_and(|ps| ps.iter().any(|p| p["in"] == "path"));
        if in_path {
            const BAD_PARAM: &str = "`invalid_request`: a key or id in the path that is not UTF-8 once percent-decoded (`%FF`)";
            match self.v["responses"]["400"]["description"].as_str() {
                Some(said) => {
                    let said = format!("{said}. {BAD_PARAM}");
                    self.v["responses"]["400"]["description"] = json!(said);
                }
                None => self = self.json(400, BAD_PARAM, error.clone()),
            }
        }
        self
    }
}

/// `{"$ref"}` of `T`'s schema, added to the components.
fn schema<T: JsonSchema>(g: &mut SchemaGenerator) -> Value {
    g.subschema_for::<T>().to_value()
}

/// A schema listing each event type's `data` schema: `{event: schema}`.
fn event_map(description: &str, events: Vec<(String, Value)>) -> Value {
    let mut properties = Map::new();
    for (name, schema) in events {
        properties.insert(name, schema);
    }
    json!({"type": "object", "description": description, "properties": properties})
}

/// Writes a `oneOf` of documented string constants (what schemars makes of
/// a unit enum whose variants have docs) as one `enum`, their docs in its
/// description: what generators (openapi-python-client, openapi-typescript)
/// read as an enumeration.
fn enum_of_constants(schema: &mut Value) {
    let Some(variants) = schema.get("oneOf").and_then(Value::as_array) else {
        return;
    };
    let constants: Option<Vec<(Value, String)>> = variants
        .iter()
        .map(|v| {
            let c = v.get("const").filter(|c| c.is_string())?;
            let about = v.get("description").and_then(Value::as_str).unwrap_or("");
            Some((c.clone(), about.to_owned()))
        })
        .collect();
    let Some(constants) = constants else {
        return;
    };
    let about: Vec<String> = constants
        .iter()
        .map(|(c, about)| {
            format!(
                "`{}`: {}",
                c.as_str().unwrap_or(""),
                about.replace('\n', " ")
            )
        })
        .collect();
    let head = schema
        .get("description")
        .and_then(Value::as_str)
        .map(str::to_owned);
    let description = match head {
        Some(head) => format!("{} {}", head.replace('\n', " "), about.join(" ")),
        None => about.join(" "),
    };
    *schema = json!({
        "type": "string",
        "enum": constants.into_iter().map(|(c, _)| c).collect::<Vec<_>>(),
        "description": description,
    });
}

/// The document.
pub(crate) fn document() -> Value {
    let mut settings = SchemaSettings::draft2020_12();
    settings.definitions_path = "/components/schemas".into();
    settings.meta_schema = None;
    // Answers are described as the server writes them (a field it may
    // leave out is not required).
    settings.contract = Contract::Serialize;
    let mut g = settings.into_generator();
    let error = schema::<api::Error>(&mut g);
    // Every error type, with its meaning, as a component: the list the
    // answers' `type` is one of.
    let _ = schema::<api::ErrorType>(&mut g);
    let too_large = format!(
        "`{}`: the body is over the limit (`--max-body-bytes`; the message names it)",
        api::ErrorType::TooLarge
    );
    let unauthorized = (
        401,
        "`unauthorized`: no token, or a wrong one (the message says which and where the server's token file is)",
    );

    let turn_events: Vec<(String, Value)> = TurnEventData::schemas(&mut g)
        .into_iter()
        .map(|(kind, s)| (kind.as_str().to_owned(), s.to_value()))
        .collect();
    let mut lifecycle: Vec<(String, Value)> = LifecycleData::schemas(&mut g)
        .into_iter()
        .map(|(name, s)| (name.to_owned(), s.to_value()))
        .collect();
    lifecycle.push((
        "reset".into(),
        schema::<api::Timed<api::LifecycleReset>>(&mut g),
    ));
    lifecycle.push(("lagged".into(), schema::<api::Timed<api::Lagged>>(&mut g)));
    let turn_event_names: Vec<&str> = TurnEventKind::ALL.map(TurnEventKind::as_str).to_vec();
    let lifecycle_names: Vec<String> = lifecycle.iter().map(|(n, _)| n.clone()).collect();

    let create_turn = Op::new("createTurn", "Run a turn")
        .param("Idempotency-Key", "header", false,
            json!({"type": "string", "minLength": 1, "maxLength": 255, "pattern": "^[!-~]+$"}),
            "A key the client chose for this message (a UUID), sent once. A request repeating a key of the same session while its turn is kept gets that turn (`Idempotent-Replayed: true`), not a second one, if it has the same `message`, `model` and `agent` (each as sent; a turn stored without them, by an older server, is answered whatever they are); with others it is a 422 `idempotency_key_reused`. The turn's id is derived from session and key, so it is the same after a restart or on another node")
        .body(schema::<api::NewTurn>(&mut g))
        .json(202, "Accepted: the message is stored; follow the turn by its id. A repeated Idempotency-Key: the turn it named, with `Idempotent-Replayed: true`", schema::<api::TurnCreated>(&mut g))
        .sse(200, "With `Accept: text/event-stream`: the turn's events", "TurnEvents", &turn_events)
        .errors(&error, &[
            (400, "`invalid_request`: bad JSON, neither or both of workspace/key, an empty message. `invalid_idempotency_key`: empty, over 255 characters, not visible ASCII, or the header sent more than once. `invalid_workspace`: not absolute, a NUL byte, over 4,096 bytes, not a directory (or, for an agent that runs in its workspace, not an existing one)"),
            unauthorized,
            (409, "`session_failed`: the session was given up (reset it). `agent_mismatch`: `agent` names another agent than the session's (it keeps the one it was started with), or one this server does not run (`agent`: the session's, `requested`: the one asked for); nothing was sent. `turn_recovering`: the Idempotency-Key's message was accepted before a restart and is being re-delivered as turn `id`; ask again after `Retry-After`"),
            (413, &too_large),
            (415, "`unsupported_media_type`: not application/json"),
            (422, "`invalid_fields`: a field missing, unknown or of the wrong type (the message names the fields a turn takes), or a body that is not a JSON object (an array). `idempotency_key_reused`: the Idempotency-Key named turn `id` of this session, sent with another `message`, `model` or `agent`; nothing was sent (use a new key for a new message)"),
            (503, "`too_many_sessions`: the live-session bound is reached and every session is busy (`limit`, `Retry-After`). `unavailable`: the session's store failed (a full disk). `session_elsewhere` (cluster): another node runs the session and the request was already forwarded once, or its owner cannot be reached; `Retry-After`, `owner`, `advertise`. `database_unreachable` (cluster): this node cannot reach the cluster's database; ask another node or after `Retry-After`"),
        ]);
    let turn_events_op = Op::new("turnEvents", "The turn's events (re-attach)")
        .path_param("id", "")
        .param(
            "Last-Event-ID",
            "header",
            false,
            json!({"type": "integer"}),
            "Only events after this id",
        )
        .sse(200, "The events", "TurnEvents", &turn_events)
        .errors(
            &error,
            &[
                (
                    400,
                    "`invalid_request`: a Last-Event-ID that is not a number",
                ),
                unauthorized,
                (404, "`not_found`: unknown or expired turn"),
                (
                    503,
                    "`node_unreachable`: the cluster node keeping the turn cannot be reached. `database_unreachable` (cluster): this node cannot reach the cluster's database to read the turn; `Retry-After`",
                ),
            ],
        );
    let cancel = Op::new("cancelTurn", "Cancel a turn (queued or running)")
        .path_param("id", "")
        .json(
            200,
            "Cancelled (or already over)",
            schema::<api::TurnCancelled>(&mut g),
        )
        .errors(
            &error,
            &[unauthorized, (404, "`not_found`: unknown or expired turn")],
        );
    let one_turn = Op::new("getTurn", "One turn as kept: its outcome, prompt (first 2 KB), model, times and trace id")
        .path_param("id", "")
        .json(200, "The turn", schema::<api::Turn>(&mut g))
        .errors(&error, &[unauthorized, (404, "`not_found`: unknown or expired turn"),
            (503, "`database_unreachable` (cluster): this node cannot reach the cluster's database; `Retry-After`. `node_unreachable`: the cluster node keeping the turn cannot be reached")]);
    let trace = Op::new("turnTrace", "The turn's trace, read by the server from the Jaeger query API at `--jaeger-url` (the browser never reaches Jaeger): its spans and the spans its links point to, in Jaeger's own JSON")
        .path_param("id", "")
        .json(200, "The trace", schema::<api::TurnTrace>(&mut g))
        .errors(&error, &[unauthorized,
            (404, "`not_found`: unknown or expired turn. `trace_not_found`: Jaeger has no trace of it (not yet: a turn's spans are exported when they end; or tracing was off)"),
            (501, "`no_jaeger_url`: the server was started without `--jaeger-url`"),
            (502, "`jaeger_unreachable`: Jaeger's query API did not answer, or answered an error; `Retry-After`"),
            (503, "`database_unreachable` (cluster): this node cannot reach the cluster's database; `Retry-After`. `node_unreachable`: the cluster node keeping the turn cannot be reached")]);
    let sessions = Op::new("listSessions", "Running sessions (on a cluster node: every session of the cluster)")
        .param("detail", "query", false, json!({"type": "string", "enum": ["full"]}),
            "`full`: every stored session (running or not), each with its record as getSession shows it")
        .json(200, "The sessions", schema::<api::SessionList>(&mut g))
        .errors(&error, &[(400, "`invalid_request`: an unknown `detail`"), unauthorized,
            (503, "`unavailable`: the store failed (a full disk). `database_unreachable` (cluster): this node cannot reach the cluster's database; `Retry-After`")]);
    let session = Op::new("getSession", "One session (key percent-encoded)")
        .path_param("key", "The session's key, percent-encoded (a `/` is `%2F`)")
        .json(
            200,
            "Its record, and while it runs its turn",
            schema::<api::Session>(&mut g),
        )
        .errors(
            &error,
            &[unauthorized, (404, "`not_found`: unknown session")],
        );
    let session_turns = Op::new(
        "sessionTurns",
        "The session's recent turns still kept, newest first, with their outcome and final text",
    )
    .path_param("key", "")
    .json(
        200,
        "Its turns (an empty list for a session with none kept)",
        schema::<api::TurnList>(&mut g),
    )
    .errors(
        &error,
        &[
            unauthorized,
            (
                503,
                "`database_unreachable` (cluster): this node cannot reach the cluster's database; `Retry-After`",
            ),
        ],
    );
    let reset = Op::new("resetSession", "Forget that the session was given up")
        .path_param("key", "")
        .json(200, "Reset", schema::<api::SessionReset>(&mut g))
        .errors(
            &error,
            &[unauthorized, (404, "`not_found`: a session never seen")],
        );
    let recover = Op::new("recoverSession", "Unstick the session's running turn: `retry` stops its attempt as failed so it is retried (the conversation kept); `fresh` restarts the session without its stored conversation (the user is told). On a cluster node, the session's owner does it")
        .path_param("key", "")
        .param("how", "query", true, schema::<api::RecoverHow>(&mut g), "")
        .json(200, "Done, or nothing was stuck (`recovered: false`)", schema::<api::SessionRecovered>(&mut g))
        .errors(&error, &[(400, "`invalid_request`: `how` missing or not retry/fresh"), unauthorized,
            (503, "`node_unreachable`: the session's owner cannot be reached")]);
    let server = Op::new("serverInfo", "This server: version, agent, the watchdog's stream timeout, its node, the trace UI, its token file")
        .json(200, "The server", schema::<api::ServerInfo>(&mut g))
        .errors(&error, &[unauthorized]);
    let cluster = Op::new(
        "clusterView",
        "The cluster's nodes, this node's lease figures and the latest session moves",
    )
    .json(200, "The cluster", schema::<api::ClusterView>(&mut g))
    .errors(
        &error,
        &[
            unauthorized,
            (404, "`not_found`: not a cluster node"),
            (
                503,
                "`database_unreachable`: the cluster's database cannot be reached",
            ),
        ],
    );
    let events = Op::new("lifecycleEvents", "Every session's lifecycle events")
        .param("Last-Event-ID", "header", false, json!({"type": "integer"}),
            "Replay the events after this id (the last 1,024 are kept); older, or from an earlier run: a `reset` event first")
        .sse(200, "Lifecycle events", "LifecycleEvents", &lifecycle)
        .errors(&error, &[(400, "`invalid_request`: a Last-Event-ID that is not a number"), unauthorized]);
    let metrics = Op::new(
        "metrics",
        "Prometheus text (no token needed when the server runs with `--public-metrics`)",
    )
    .text(200, "Prometheus text exposition")
    .errors(&error, &[unauthorized]);
    let ready = Op::new(
        "ready",
        "Ready while the supervisor runs and, on a cluster node, the cluster's database answers (no token: it says up or not, nothing more)",
    )
    .public()
    .text(200, "`ok`")
    .errors(
        &error,
        &[(
            503,
            "`not_ready` (the supervisor stopped) or `database_unreachable` (cluster); `Retry-After`",
        )],
    );
    let console = Op::new(
        "console",
        "The web console (a page that asks for the token and keeps it in the tab)",
    )
    .public()
    .answer(
        200,
        "HTML, with a Content-Security-Policy allowing this origin only",
        Some(("text/html", json!({"type": "string"}))),
    );
    let health = Op::new("health", "Alive").public().text(200, "`ok`");
    let openapi = Op::new("openapi", "This document").public().json(
        200,
        "OpenAPI 3.1",
        json!({"type": "object"}),
    );

    let mut schemas = g.take_definitions(true);
    for schema in schemas.values_mut() {
        enum_of_constants(schema);
    }
    schemas.insert("TurnEvents".into(), event_map(
        "The `data:` of each turn event, by its `event:` name. Every event carries `at` (when the server made it). `done` or `error` is the last; `retrying` and `restarting` drop the text shown since the last `started` (`discard`), `continuing` keeps it.",
        turn_events));
    schemas.insert(
        "TurnEvent".into(),
        json!({"type": "string", "enum": turn_event_names,
        "description": "The SSE `event:` of a turn event"}),
    );
    schemas.insert("LifecycleEvents".into(), event_map(
        "The `data:` of each lifecycle event on `/v1/events`, by its `event:` name. The events of a turn also carry `turn_id` (the turn's id on this server) once it is known, and every event `at`.",
        lifecycle));
    schemas.insert(
        "LifecycleEvent".into(),
        json!({"type": "string", "enum": lifecycle_names,
        "description": "The SSE `event:` of a lifecycle event"}),
    );

    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "warden serve",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "warden's workspace sessions over HTTP + SSE. Every route but /healthz, /ui and /openapi.json needs `Authorization: Bearer <token>`. The schemas are derived from the server's Rust types."
        },
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": schemas,
        },
        "security": [{"bearer": []}],
        "paths": {
            "/v1/turns": {"post": create_turn.v},
            "/v1/turns/{id}/events": {"get": turn_events_op.v},
            "/v1/turns/{id}": {"get": one_turn.v, "delete": cancel.v},
            "/v1/turns/{id}/trace": {"get": trace.v},
            "/v1/sessions": {"get": sessions.v},
            "/v1/sessions/{key}": {"get": session.v},
            "/v1/sessions/{key}/turns": {"get": session_turns.v},
            "/v1/sessions/{key}/reset": {"post": reset.v},
            "/v1/sessions/{key}/recover": {"post": recover.v},
            "/v1/server": {"get": server.v},
            "/v1/cluster": {"get": cluster.v},
            "/v1/events": {"get": events.v},
            "/metrics": {"get": metrics.v},
            "/readyz": {"get": ready.v},
            "/ui": {"get": console.v},
            "/healthz": {"get": health.v},
            "/openapi.json": {"get": openapi.v},
        }
    })
}
