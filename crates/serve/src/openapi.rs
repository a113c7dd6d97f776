//! The OpenAPI 3.1 document served at `/openapi.json`: the routes, their
//! bodies, answers and the event types. Kept next to the router; a test
//! checks that every path it names is routed.

use serde_json::{Value, json};
use warden_core::store::TurnEventKind;

/// The document.
pub(crate) fn document() -> Value {
    let error = json!({"$ref": "#/components/schemas/Error"});
    let schema = |name: &str| json!({"$ref": format!("#/components/schemas/{name}")});
    let ok = |description: &str, name: &str| json!({"description": description, "content": {"application/json": {"schema": schema(name)}}});
    let text = |description: &str| json!({"description": description, "content": {"text/plain": {"schema": {"type": "string"}}}});
    let err = |description: &str| json!({"description": description, "content": {"application/json": {"schema": error}}});
    let sse = |description: &str| {
        json!({"description": description, "content": {"text/event-stream": {"schema": {"type": "string",
        "description": "SSE: each event has `id:` (unique, increasing within the turn, from 1), `event:` (see TurnEvent) and JSON `data:`"}}}})
    };
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "warden serve",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "warden's workspace sessions over HTTP + SSE. Every route but /healthz needs `Authorization: Bearer <token>`."
        },
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {
                "Error": {"type": "object", "required": ["error"], "properties": {"error": {"$ref": "#/components/schemas/ErrorBody"}}},
                "ErrorBody": {"type": "object", "required": ["type", "message"], "additionalProperties": true,
                    "description": "`type` names the error (see docs/serve.md's catalogue); some types add fields: `limit` (too_many_sessions), `owner`/`advertise` (session_elsewhere), `agent`/`requested` (agent_mismatch), `workspace` (workspace_unavailable)",
                    "properties": {"type": {"type": "string"}, "message": {"type": "string"}}},
                "TurnCreated": {"type": "object", "required": ["id", "key"],
                    "properties": {"id": {"type": "string"}, "key": {"type": "string"}}},
                "TurnCancelled": {"type": "object", "required": ["id", "key", "cancelled"],
                    "properties": {"id": {"type": "string"}, "key": {"type": "string"},
                        "cancelled": {"type": "boolean", "description": "Whether it was still queued or running"}}},
                "SessionSummary": {"type": "object", "required": ["key"], "additionalProperties": true,
                    "description": "On a cluster node also `owner`, `advertise`, `epoch`, `lease_remaining_secs`, `here`; with `?detail=full` also the fields of a Session",
                    "properties": {"key": {"type": "string"}}},
                "SessionList": {"type": "object", "required": ["sessions"],
                    "properties": {"sessions": {"type": "array", "items": {"$ref": "#/components/schemas/SessionSummary"}}}},
                "Context": {"type": "object", "properties": {"tokens": {"type": "integer"}, "window": {"type": "integer"}, "percent": {"type": "integer"}}},
                "RunningTurn": {"type": "object", "properties": {"id": {"type": ["integer", "null"], "description": "The turn's number (its message's id in the session)"},
                    "turn_id": {"type": ["string", "null"], "description": "The turn's id (for /v1/turns/{id}/events) while this node relays it"},
                    "streaming_attempt": {"type": ["integer", "null"]}, "backing_off": {"type": "boolean"},
                    "waiting_for_admission": {"type": "boolean"}, "running_ms": {"type": ["integer", "null"]}}},
                "Session": {"type": "object", "required": ["key", "running"],
                    "properties": {"key": {"type": ["string", "null"]}, "running": {"type": "boolean"},
                        "workspace": {"type": ["string", "null"]}, "conversation": {"type": ["string", "null"]},
                        "model": {"type": ["string", "null"]}, "status": {"type": "string", "enum": ["new", "active", "idle", "failed", "unknown"]},
                        "failure": {"type": "string"}, "pending": {"type": "integer"}, "restarts": {"type": "integer"},
                        "context": {"anyOf": [{"$ref": "#/components/schemas/Context"}, {"type": "null"}]},
                        "last_active_ms": {"type": "integer"},
                        "turn": {"$ref": "#/components/schemas/RunningTurn"}, "queued": {"type": "integer"}, "turns_finished": {"type": "integer"},
                        "trace_id": {"type": "string", "description": "While it runs, with tracing on: the trace of its incarnation (its turns are spans in it)"}}},
                "TurnSummary": {"type": "object", "required": ["id", "message_id", "outcome"],
                    "properties": {"id": {"type": "string"}, "message_id": {"type": "integer"},
                        "outcome": {"type": "string", "enum": ["done", "error", "running", "pending", "moved"]},
                        "text": {"type": "string", "description": "done: the answer"}, "attempts": {"type": "integer"},
                        "code": {"type": "string", "description": "error: its code"}, "message": {"type": "string"}, "exit": {"type": "integer"}}},
                "TurnList": {"type": "object", "required": ["key", "turns"],
                    "properties": {"key": {"type": "string"}, "turns": {"type": "array", "items": {"$ref": "#/components/schemas/TurnSummary"}}}},
                "SessionRecovered": {"type": "object", "required": ["key", "how", "recovered"],
                    "properties": {"key": {"type": "string"}, "how": {"type": "string", "enum": ["retry", "fresh"]},
                        "recovered": {"type": "boolean", "description": "false: nothing was stuck (no turn running, or one waiting for admission or its stream)"}}},
                "ServerInfo": {"type": "object", "required": ["version", "stream_timeout_ms", "cluster"],
                    "properties": {"version": {"type": "string"}, "agent": {"type": ["string", "null"]},
                        "stream_timeout_ms": {"type": "integer", "description": "The watchdog's default silence allowance per stream"},
                        "cluster": {"type": "boolean"}, "node": {"type": ["string", "null"]},
                        "jaeger_url": {"type": ["string", "null"], "description": "Where traces are looked at (`--jaeger-url`): `{jaeger_url}/trace/{trace_id}`"}}},
                "ClusterNode": {"type": "object", "required": ["node", "heartbeat_age_secs", "sessions", "here"],
                    "properties": {"node": {"type": "string"}, "advertise": {"type": ["string", "null"]},
                        "heartbeat_age_secs": {"type": "number"}, "sessions": {"type": "integer"}, "here": {"type": "boolean"}}},
                "SessionMove": {"type": "object", "required": ["key", "from", "to", "epoch", "kind", "at_ms"],
                    "properties": {"key": {"type": "string"}, "from": {"type": "string"}, "to": {"type": "string"},
                        "epoch": {"type": "integer"}, "kind": {"type": "string", "enum": ["failover", "handover"]},
                        "at_ms": {"type": "integer", "description": "Unix milliseconds"}}},
                "ClusterView": {"type": "object", "required": ["nodes", "moves", "leases_held", "leases_lost", "takeovers"],
                    "properties": {"node": {"type": ["string", "null"]},
                        "nodes": {"type": "array", "items": {"$ref": "#/components/schemas/ClusterNode"}},
                        "leases_held": {"type": "integer"}, "leases_lost": {"type": "integer"}, "takeovers": {"type": "integer"},
                        "database_round_trip_ms": {"type": ["number", "null"]},
                        "moves": {"type": "array", "items": {"$ref": "#/components/schemas/SessionMove"},
                            "description": "The latest move of each session that changed nodes, newest first (at most 50)"}}},
                "SessionReset": {"type": "object", "required": ["key", "reset"],
                    "properties": {"key": {"type": "string"}, "reset": {"type": "boolean"}}},
                "NewTurn": {"type": "object", "required": ["message"], "additionalProperties": false,
                    "description": "Exactly one of `workspace` (an absolute directory) or `key` (a name).",
                    "properties": {"workspace": {"type": "string"}, "key": {"type": "string"}, "message": {"type": "string"},
                        "model": {"type": "string", "description": "This turn's model (the next turn may ask for another); default: the server's"},
                        "agent": {"type": "string", "description": "The agent kind the client expects (`anthropic`, `openai`, `claude-code`); another than the session's is a 409"}}},
                "TurnEvent": {"type": "string", "enum": TurnEventKind::ALL.map(TurnEventKind::as_str),
                    "description": "The SSE `event:` of a turn event; `done` (the summary) or `error` (`code`, `message`, `exit`: 3 API, 4 timeout, 5 unavailable, 6 deferred — ESESSION_STOPPED, the message stays pending —, 130 cancelled, 1 other) is the last. `queued` with `behind`: waiting behind that many turns of its session."}
            }
        },
        "security": [{"bearer": []}],
        "paths": {
            "/v1/turns": {"post": {
                "operationId": "createTurn",
                "summary": "Run a turn",
                "parameters": [
                    {"name": "Idempotency-Key", "in": "header", "required": false,
                     "schema": {"type": "string", "minLength": 1, "maxLength": 255, "pattern": "^[!-~]+$"},
                     "description": "A key the client chose for this message (a UUID), sent once. A request repeating a key of the same session while its turn is kept gets that turn (`Idempotent-Replayed: true`), not a second one, if it has the same `message`, `model` and `agent` (each as sent; a turn stored without them, by an older server, is answered whatever they are); with others it is a 422 `idempotency_key_reused`. The turn's id is derived from session and key, so it is the same after a restart or on another node"}
                ],
                "requestBody": {"required": true, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/NewTurn"}}}},
                "responses": {
                    "202": {"description": "Accepted: the message is stored; follow the turn by its id. A repeated Idempotency-Key: the turn it named, with `Idempotent-Replayed: true`",
                        "headers": {"Idempotent-Replayed": {"schema": {"type": "string", "enum": ["true"]}, "description": "The Idempotency-Key named a turn already sent: this is it"},
                                    "X-Warden-Turn-Id": {"schema": {"type": "string"}, "description": "The turn's id"}},
                        "content": {"application/json": {"schema": schema("TurnCreated")}}},
                    "200": sse("With `Accept: text/event-stream`: the turn's events"),
                    "400": err("`invalid_request`: bad JSON, neither or both of workspace/key. `invalid_idempotency_key`: empty, over 255 characters, not visible ASCII, or the header sent more than once. `invalid_workspace`: not absolute, a NUL byte, over 4,096 bytes, not a directory (or, for an agent that runs in its workspace, not an existing one)"),
                    "401": err("No or a wrong token"),
                    "409": err("`session_failed`: the session was given up (reset it). `agent_mismatch`: `agent` names another kind than the session's (`agent`, `requested`); nothing was sent. `turn_recovering`: the Idempotency-Key's message was accepted before a restart and is being re-delivered as turn `id`; ask again after `Retry-After`"),
                    "413": err("Body over the limit (10 MiB)"),
                    "415": err("Not application/json"),
                    "422": err("`invalid_fields`: a field missing, unknown or of the wrong type (the message names the fields a turn takes). `idempotency_key_reused`: the Idempotency-Key named turn `id` of this session, sent with another `message`, `model` or `agent`; nothing was sent (use a new key for a new message)"),
                    "503": err("`too_many_sessions`: the live-session bound is reached and every session is busy (`limit`, `Retry-After`). `unavailable`: the session's store failed (a full disk). `session_elsewhere` (cluster): another node runs the session and the request was already forwarded once, or its owner cannot be reached; `Retry-After`, `owner`, `advertise`. `database_unreachable` (cluster): this node cannot reach the cluster's database; ask another node or after `Retry-After`")
                }
            }},
            "/v1/turns/{id}/events": {"get": {
                "operationId": "turnEvents",
                "summary": "The turn's events (re-attach)",
                "parameters": [
                    {"name": "id", "in": "path", "required": true, "schema": {"type": "string"}},
                    {"name": "Last-Event-ID", "in": "header", "required": false, "schema": {"type": "integer"},
                     "description": "Only events after this id"}
                ],
                "responses": {"200": sse("The events"), "400": err("A Last-Event-ID that is not a number"),
                              "404": err("Unknown or expired turn"),
                              "503": err("`node_unreachable`: the cluster node keeping the turn cannot be reached")}
            }},
            "/v1/turns/{id}": {"delete": {
                "operationId": "cancelTurn",
                "summary": "Cancel a turn (queued or running)",
                "parameters": [{"name": "id", "in": "path", "required": true, "schema": {"type": "string"}}],
                "responses": {"200": ok("Cancelled (or already over)", "TurnCancelled"), "401": err("No or a wrong token"), "404": err("Unknown or expired turn")}
            }},
            "/v1/sessions": {"get": {"operationId": "listSessions", "summary": "Running sessions (on a cluster node: every session of the cluster)",
                "parameters": [{"name": "detail", "in": "query", "required": false, "schema": {"type": "string", "enum": ["full"]},
                    "description": "`full`: every stored session (running or not), each with its record as getSession shows it"}],
                "responses": {"200": ok("The sessions", "SessionList"), "400": err("`invalid_request`: an unknown `detail`"), "401": err("No or a wrong token"),
                    "503": err("`unavailable`: the store or the cluster's database failed")}}},
            "/v1/sessions/{key}": {"get": {
                "operationId": "getSession",
                "summary": "One session (key percent-encoded)",
                "parameters": [{"name": "key", "in": "path", "required": true, "schema": {"type": "string"}}],
                "responses": {"200": ok("Its record, and while it runs its turn", "Session"), "401": err("No or a wrong token"), "404": err("Unknown session")}
            }},
            "/v1/sessions/{key}/turns": {"get": {
                "operationId": "sessionTurns",
                "summary": "The session's recent turns still kept, newest first, with their outcome and final text",
                "parameters": [{"name": "key", "in": "path", "required": true, "schema": {"type": "string"}}],
                "responses": {"200": ok("Its turns (an empty list for a session with none kept)", "TurnList"), "401": err("No or a wrong token"),
                    "503": err("`unavailable`: the turn store failed")}
            }},
            "/v1/sessions/{key}/reset": {"post": {
                "operationId": "resetSession",
                "summary": "Forget that the session was given up",
                "parameters": [{"name": "key", "in": "path", "required": true, "schema": {"type": "string"}}],
                "responses": {"200": ok("Reset", "SessionReset"), "401": err("No or a wrong token"), "404": err("`not_found`: a session never seen")}
            }},
            "/v1/sessions/{key}/recover": {"post": {
                "operationId": "recoverSession",
                "summary": "Unstick the session's running turn: `retry` stops its attempt as failed so it is retried (the conversation kept); `fresh` restarts the session without its stored conversation (the user is told). On a cluster node, the session's owner does it",
                "parameters": [{"name": "key", "in": "path", "required": true, "schema": {"type": "string"}},
                    {"name": "how", "in": "query", "required": true, "schema": {"type": "string", "enum": ["retry", "fresh"]}}],
                "responses": {"200": ok("Done, or nothing was stuck (`recovered: false`)", "SessionRecovered"), "400": err("`invalid_request`: `how` missing or not retry/fresh"),
                    "401": err("No or a wrong token"), "503": err("`node_unreachable`: the session's owner cannot be reached")}
            }},
            "/v1/server": {"get": {"operationId": "serverInfo", "summary": "This server: version, agent, the watchdog's stream timeout, its node, the trace UI",
                "responses": {"200": ok("The server", "ServerInfo"), "401": err("No or a wrong token")}}},
            "/v1/cluster": {"get": {"operationId": "clusterView", "summary": "The cluster's nodes, this node's lease figures and the latest session moves",
                "responses": {"200": ok("The cluster", "ClusterView"), "401": err("No or a wrong token"), "404": err("`not_found`: not a cluster node"),
                    "503": err("`database_unreachable`: the cluster's database cannot be reached")}}},
            "/v1/events": {"get": {"operationId": "lifecycleEvents", "summary": "Every session's lifecycle events",
                "parameters": [{"name": "Last-Event-ID", "in": "header", "required": false, "schema": {"type": "integer"},
                    "description": "Replay the events after this id (the last 1,024 are kept); older, or from an earlier run: a `reset` event first"}],
                "responses": {"200": sse("Lifecycle events"), "400": err("A Last-Event-ID that is not a number")}}},
            "/metrics": {"get": {"operationId": "metrics", "summary": "Prometheus text", "responses": {"200": text("Prometheus text exposition"), "401": err("No or a wrong token")}}},
            "/readyz": {"get": {"operationId": "ready", "summary": "Ready while the supervisor runs and, on a cluster node, the cluster's database answers", "responses": {"200": text("`ok`"), "401": err("No or a wrong token"), "503": err("`not_ready` (the supervisor stopped) or `database_unreachable` (cluster)")}}},
            "/ui": {"get": {"operationId": "console", "summary": "The web console (a page that asks for the token and keeps it in the tab)", "security": [],
                "responses": {"200": {"description": "HTML, with a Content-Security-Policy allowing this origin only", "content": {"text/html": {"schema": {"type": "string"}}}}}}},
            "/healthz": {"get": {"operationId": "health", "summary": "Alive", "security": [], "responses": {"200": text("`ok`")}}},
            "/openapi.json": {"get": {"operationId": "openapi", "summary": "This document", "security": [], "responses": {"200": {"description": "OpenAPI 3.1", "content": {"application/json": {"schema": {"type": "object"}}}}}}}
        }
    })
}
