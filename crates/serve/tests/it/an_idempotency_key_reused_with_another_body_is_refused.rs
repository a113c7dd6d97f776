//! An `Idempotency-Key` names one message: a request repeating it with
//! the same body is a retry (`202`, `Idempotent-Replayed: true`, the same
//! turn), one with another message, model or agent is refused with `422
//! idempotency_key_reused` — the first turn untouched, nothing sent to the
//! agent — while the turn is running, after it ended, and after its log
//! left memory for the turn store. Two `Idempotency-Key` headers are a
//! `400`. A turn stored without a fingerprint (by an older warden) is
//! replayed as before. The agent is an in-process channel source.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt as _;
use futures_util::future::BoxFuture;
use serde_json::Value;
use warden_core::store::{StoredEvent, StoredTurn, TurnStore, TurnStoreError};
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

async fn server(config: ServeConfig) -> Server {
    let (source, ctl) = ChannelSource::new();
    let sup = Supervisor::builder(Arc::new(move |_: &SessionKey| {
        source.clone() as Arc<dyn EventSource>
    }))
    .start()
    .await
    .expect("supervisor");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    let app = warden_serve::router(sup, config);
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Server {
        base,
        ctl,
        client: reqwest::Client::new(),
        _task: task,
    }
}

/// What a `POST /v1/turns` got: its status, headers and JSON body (or
/// `Null` for an event stream).
struct Answer {
    status: u16,
    replayed: bool,
    body: Value,
}

impl Server {
    /// `POST /v1/turns` with `body` and Idempotency-Key `key`.
    async fn post(&self, key: &str, body: &str) -> Answer {
        self.post_with(key, body, false).await
    }

    async fn post_with(&self, key: &str, body: &str, events: bool) -> Answer {
        let mut request = self
            .client
            .post(format!("{}/v1/turns", self.base))
            .bearer_auth(TOKEN)
            .header("content-type", "application/json")
            .header("idempotency-key", key)
            .body(body.to_owned());
        if events {
            request = request.header("accept", "text/event-stream");
        }
        let r = within("an answer", request.send()).await.expect("post");
        let status = r.status().as_u16();
        let replayed = r.headers().get("idempotent-replayed").is_some();
        let is_json = r
            .headers()
            .get("content-type")
            .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
        let body = match is_json {
            true => serde_json::from_slice(&r.bytes().await.expect("body")).expect("JSON"),
            false => Value::Null,
        };
        Answer {
            status,
            replayed,
            body,
        }
    }

    async fn get_json(&self, path: &str) -> Value {
        let r = self
            .client
            .get(format!("{}{path}", self.base))
            .bearer_auth(TOKEN)
            .send()
            .await
            .expect("get");
        serde_json::from_slice(&r.bytes().await.expect("body")).expect("JSON")
    }

    /// The events of turn `id`, to its last.
    async fn events(&self, id: &str) -> Vec<(String, Value)> {
        let r = self
            .client
            .get(format!("{}/v1/turns/{id}/events", self.base))
            .bearer_auth(TOKEN)
            .send()
            .await
            .expect("get");
        let mut body = r.bytes_stream();
        let (mut buf, mut out) = (String::new(), Vec::new());
        while let Some(chunk) = within("an SSE chunk", body.next()).await {
            buf.push_str(std::str::from_utf8(&chunk.expect("chunk")).expect("utf-8"));
            while let Some(end) = buf.find("\n\n") {
                let block: String = buf.drain(..end + 2).collect();
                let mut event = String::new();
                let mut data = Value::Null;
                for line in block.lines() {
                    if let Some(v) = line.strip_prefix("event:") {
                        event = v.trim().to_owned();
                    } else if let Some(v) = line.strip_prefix("data:") {
                        data = serde_json::from_str(v.trim()).expect("JSON data");
                    }
                }
                if event.is_empty() {
                    continue;
                }
                let last = event == "done" || event == "error";
                out.push((event, data));
                if last {
                    return out;
                }
            }
        }
        out
    }

    /// Asserts that no attempt reaches the agent for a while.
    async fn nothing_sent(&self) {
        let next = tokio::time::timeout(Duration::from_millis(300), self.ctl.next_attempt()).await;
        assert!(next.is_err(), "nothing was sent to the agent");
    }
}

/// Asserts `answer` is `422 idempotency_key_reused` naming turn `id`.
fn refused(answer: &Answer, id: &str, what: &str) {
    assert_eq!(answer.status, 422, "{what}: {}", answer.body);
    assert!(!answer.replayed, "{what}");
    let error = &answer.body["error"];
    assert_eq!(error["type"], "idempotency_key_reused", "{what}: {error}");
    assert_eq!(error["id"], id, "{what}: {error}");
    assert!(
        error["message"].as_str().is_some_and(|m| m.contains(id)),
        "{what}: {error}"
    );
}

/// Asserts `answer` is the `202` replay of turn `id`.
fn replayed(answer: &Answer, id: &str, what: &str) {
    assert_eq!(answer.status, 202, "{what}: {}", answer.body);
    assert!(answer.replayed, "{what}: Idempotent-Replayed");
    assert_eq!(answer.body["id"], id, "{what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_key_with_another_message_is_refused_and_sends_nothing() {
    let s = server(ServeConfig::new(TOKEN)).await;
    let first = r#"{"key": "orders", "message": "ship order 42"}"#;
    let other = r#"{"key": "orders", "message": "cancel order 42"}"#;
    let created = s.post("order-42", first).await;
    assert_eq!(created.status, 202, "{}", created.body);
    assert!(!created.replayed);
    let id = created.body["id"].as_str().expect("id").to_owned();
    let attempt = within("the stream to open", s.ctl.next_attempt())
        .await
        .expect("opened");
    // While it runs: another message is refused (also when asking for the
    // event stream), the same one is its retry.
    refused(&s.post("order-42", other).await, &id, "running");
    refused(
        &s.post_with("order-42", other, true).await,
        &id,
        "running, SSE",
    );
    replayed(&s.post("order-42", first).await, &id, "running, a retry");
    s.nothing_sent().await;
    attempt.text("shipped");
    attempt.finish();
    let events = s.events(&id).await;
    let (last, data) = events.last().expect("events");
    assert_eq!(last, "done", "{events:?}");
    assert_eq!(data["text"], "shipped", "the first turn, untouched");
    // After it ended: the same.
    refused(&s.post("order-42", other).await, &id, "ended");
    replayed(&s.post("order-42", first).await, &id, "ended, a retry");
    s.nothing_sent().await;
    let listed = s.get_json("/v1/sessions/orders/turns").await;
    assert_eq!(
        listed["turns"].as_array().map(Vec::len),
        Some(1),
        "one turn: {listed}"
    );
    // The other message, with a key of its own, is a turn of its own.
    let second = s.post("order-42-cancel", other).await;
    assert_eq!(second.status, 202, "{}", second.body);
    assert_ne!(second.body["id"], id.as_str());
    let attempt = within("the second turn", s.ctl.next_attempt())
        .await
        .expect("opened");
    attempt.finish();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_model_or_agent_is_another_body() {
    let s = server(ServeConfig::new(TOKEN)).await;
    let first = r#"{"key": "m", "message": "hi", "model": "model-a"}"#;
    let created = s.post("k-model", first).await;
    assert_eq!(created.status, 202, "{}", created.body);
    let id = created.body["id"].as_str().expect("id").to_owned();
    let attempt = within("the stream to open", s.ctl.next_attempt())
        .await
        .expect("opened");
    for (other, what) in [
        (
            r#"{"key": "m", "message": "hi", "model": "model-b"}"#,
            "another model",
        ),
        (r#"{"key": "m", "message": "hi"}"#, "no model"),
        (
            r#"{"key": "m", "message": "hi", "model": "model-a", "agent": "openai"}"#,
            "an agent",
        ),
    ] {
        refused(&s.post("k-model", other).await, &id, what);
    }
    // The same fields in another order, or spaced otherwise: the same body.
    let reordered = r#"{ "model": "model-a",  "message": "hi", "key": "m" }"#;
    replayed(&s.post("k-model", reordered).await, &id, "reordered");
    s.nothing_sent().await;
    attempt.finish();

    // A server that checks the agent: a reused key is reported as such,
    // before the agent is (nothing would be sent either way).
    let s = server(ServeConfig::new(TOKEN).with_agent(warden_serve::Agent::Anthropic)).await;
    let first = r#"{"key": "a", "message": "hi"}"#;
    let created = s.post("k-agent", first).await;
    assert_eq!(created.status, 202, "{}", created.body);
    let id = created.body["id"].as_str().expect("id").to_owned();
    let attempt = within("the stream to open", s.ctl.next_attempt())
        .await
        .expect("opened");
    let other = r#"{"key": "a", "message": "hi", "agent": "openai"}"#;
    refused(&s.post("k-agent", other).await, &id, "another agent");
    let named = r#"{"key": "a", "message": "hi", "agent": "anthropic"}"#;
    refused(
        &s.post("k-agent", named).await,
        &id,
        "an agent the first did not name",
    );
    // A new key with the wrong agent is still that.
    let fresh = s.post("k-agent-2", other).await;
    assert_eq!(fresh.status, 409, "{}", fresh.body);
    assert_eq!(fresh.body["error"]["type"], "agent_mismatch");
    replayed(&s.post("k-agent", first).await, &id, "a retry");
    s.nothing_sent().await;
    attempt.finish();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_idempotency_key_headers_are_refused_and_send_nothing() {
    let s = server(ServeConfig::new(TOKEN)).await;
    for (a, b) in [("k-1", "k-2"), ("k-1", "k-1")] {
        let r = s
            .client
            .post(format!("{}/v1/turns", s.base))
            .bearer_auth(TOKEN)
            .header("content-type", "application/json")
            .header("idempotency-key", a)
            .header("idempotency-key", b)
            .body(r#"{"key": "twice", "message": "hi"}"#)
            .send()
            .await
            .expect("post");
        assert_eq!(r.status(), 400, "{a} {b}");
        let body: Value = serde_json::from_slice(&r.bytes().await.expect("body")).expect("JSON");
        assert_eq!(body["error"]["type"], "invalid_idempotency_key", "{body}");
        let message = body["error"]["message"].as_str().unwrap_or("");
        assert!(message.contains("Idempotency-Key"), "{message}");
    }
    s.nothing_sent().await;
    let r = s
        .client
        .get(format!("{}/v1/sessions/twice", s.base))
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("get");
    assert_eq!(r.status(), 404, "no session was started");
}

/// A turn store in memory, as a cluster's or a single node's keeps turns
/// once their logs left the server's memory; with `forget_fingerprints` it
/// stores none, as an older warden did.
#[derive(Default)]
struct MemTurns {
    forget_fingerprints: bool,
    turns: parking_lot::Mutex<HashMap<String, StoredTurn>>,
    by_message: parking_lot::Mutex<HashMap<(String, u64), String>>,
}

impl TurnStore for MemTurns {
    fn open<'a>(
        &'a self,
        key: &'a SessionKey,
        message_id: u64,
        id: &'a str,
        fingerprint: Option<&'a str>,
        _asked: &'a warden_core::store::TurnAsked,
    ) -> BoxFuture<'a, Result<StoredTurn, TurnStoreError>> {
        let id = self
            .by_message
            .lock()
            .entry((key.as_str().to_owned(), message_id))
            .or_insert_with(|| id.to_owned())
            .clone();
        let fingerprint = fingerprint.filter(|_| !self.forget_fingerprints);
        let turn = self
            .turns
            .lock()
            .entry(id.clone())
            .or_insert_with(|| {
                StoredTurn::new(id, key.clone(), message_id, Vec::new(), false)
                    .with_fingerprint(fingerprint.map(str::to_owned))
            })
            .clone();
        Box::pin(async move { Ok(turn) })
    }

    fn append<'a>(
        &'a self,
        _: &'a SessionKey,
        id: &'a str,
        events: &'a [StoredEvent],
        ended: bool,
    ) -> BoxFuture<'a, Result<(), TurnStoreError>> {
        if let Some(t) = self.turns.lock().get_mut(id) {
            t.events.extend_from_slice(events);
            t.ended |= ended;
        }
        Box::pin(async { Ok(()) })
    }

    fn recent<'a>(
        &'a self,
        key: &'a SessionKey,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<StoredTurn>, TurnStoreError>> {
        let mut turns: Vec<StoredTurn> = self
            .turns
            .lock()
            .values()
            .filter(|t| &t.key == key)
            .cloned()
            .collect();
        turns.sort_by_key(|t| std::cmp::Reverse(t.message_id));
        turns.truncate(limit);
        for t in &mut turns {
            let last = t.events.pop();
            t.events = last.into_iter().collect();
        }
        Box::pin(async move { Ok(turns) })
    }

    fn read<'a>(
        &'a self,
        id: &'a str,
        after: u64,
    ) -> BoxFuture<'a, Result<Option<StoredTurn>, TurnStoreError>> {
        let mut turn = self.turns.lock().get(id).cloned();
        if let Some(t) = &mut turn {
            t.events.retain(|e| e.id > after);
        }
        Box::pin(async move { Ok(turn) })
    }
}

/// A server with turn store `store` that forgets a turn's log 50 ms after
/// it ends: a retry then finds it in the store only.
async fn stored_server(store: Arc<MemTurns>) -> Server {
    server(
        ServeConfig::new(TOKEN)
            .with_turn_store(store)
            .with_keep_finished(Duration::from_millis(50)),
    )
    .await
}

/// Runs a keyed turn to its end and waits until its log left memory.
async fn a_finished_keyed_turn(s: &Server, key: &str, body: &str) -> String {
    let created = s.post(key, body).await;
    assert_eq!(created.status, 202, "{}", created.body);
    let id = created.body["id"].as_str().expect("id").to_owned();
    let attempt = within("the stream to open", s.ctl.next_attempt())
        .await
        .expect("opened");
    attempt.text("done once");
    attempt.finish();
    let events = s.events(&id).await;
    assert_eq!(events.last().map(|e| e.0.as_str()), Some("done"));
    tokio::time::sleep(Duration::from_millis(400)).await;
    id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stored_turn_is_compared_by_the_fingerprint_stored_with_it() {
    let store = Arc::new(MemTurns::default());
    let s = stored_server(Arc::clone(&store)).await;
    let first = r#"{"key": "kept", "message": "first"}"#;
    let id = a_finished_keyed_turn(&s, "k-stored", first).await;
    let stored = store.turns.lock().get(&id).cloned().expect("stored");
    assert!(stored.fingerprint.is_some(), "kept with the turn");
    let other = r#"{"key": "kept", "message": "second"}"#;
    refused(&s.post("k-stored", other).await, &id, "from the store");
    replayed(
        &s.post("k-stored", first).await,
        &id,
        "a retry, from the store",
    );
    // Its events, from the store, with the replay's event stream.
    let r = s
        .client
        .post(format!("{}/v1/turns", s.base))
        .bearer_auth(TOKEN)
        .header("content-type", "application/json")
        .header("accept", "text/event-stream")
        .header("idempotency-key", "k-stored")
        .body(first)
        .send()
        .await
        .expect("post");
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["idempotent-replayed"], "true");
    s.nothing_sent().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_stored_without_a_fingerprint_is_replayed_as_before() {
    let store = Arc::new(MemTurns {
        forget_fingerprints: true,
        ..MemTurns::default()
    });
    let s = stored_server(Arc::clone(&store)).await;
    let first = r#"{"key": "old", "message": "first"}"#;
    let id = a_finished_keyed_turn(&s, "k-old", first).await;
    assert_eq!(store.turns.lock()[&id].fingerprint, None);
    // Unknown: which body sent it cannot be told, so its turn is the answer.
    let other = r#"{"key": "old", "message": "second"}"#;
    replayed(&s.post("k-old", other).await, &id, "unknown fingerprint");
    s.nothing_sent().await;
}

/// A message accepted before a restart whose turn was not relayed yet (the
/// crash came between storing it and opening its log) is compared by the
/// message and model stored with it: another is refused, the same one is
/// told to ask again (`409 turn_recovering`), as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_waiting_since_a_restart_is_compared_by_its_stored_message_and_model() {
    use warden_core::SessionStore as _;
    let store = Arc::new(warden_core::MemoryStore::new());
    let key = SessionKey::new("waiting");
    let mut record = warden_core::SessionRecord::new(&key, None);
    let options = warden_core::SendOptions::default()
        .with_model("model-a")
        .with_idempotency_key("k-waiting");
    record.accept_with("hello", options);
    store
        .save(&record, warden_core::Durability::Flushed)
        .await
        .expect("save");
    let (source, ctl) = ChannelSource::new();
    let sup = Supervisor::builder(Arc::new(move |_: &SessionKey| {
        source.clone() as Arc<dyn EventSource>
    }))
    .store(store)
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
        _task: tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        }),
    };
    for (other, what) in [
        (
            r#"{"key": "waiting", "message": "goodbye", "model": "model-a"}"#,
            "another message",
        ),
        (
            r#"{"key": "waiting", "message": "hello", "model": "model-b"}"#,
            "another model",
        ),
        (r#"{"key": "waiting", "message": "hello"}"#, "no model"),
    ] {
        let answer = s.post("k-waiting", other).await;
        assert_eq!(answer.status, 422, "{what}: {}", answer.body);
        assert_eq!(
            answer.body["error"]["type"], "idempotency_key_reused",
            "{what}"
        );
    }
    let same = r#"{"key": "waiting", "message": "hello", "model": "model-a"}"#;
    let answer = s.post("k-waiting", same).await;
    assert_eq!(answer.status, 409, "{}", answer.body);
    assert_eq!(answer.body["error"]["type"], "turn_recovering");
    s.nothing_sent().await;
}
