//! A server of several agents: a session runs the agent its first turn
//! named (else the server's default, the first listed) and keeps it; a
//! later turn asking for another is `409 agent_mismatch` naming both, and
//! nothing is sent; an agent the server does not run is refused before
//! anything is bound; the session views and `/v1/server` say which agent
//! is which. Each agent is an in-process channel source the test drives, so
//! which one answered is seen directly.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use parking_lot::Mutex;
use serde_json::Value;
use warden_core::testing::{ChannelSource, ChannelSourceControl};
use warden_core::{EventSource, SessionKey, StoreError, Supervisor};
use warden_serve::{Agent, ServeConfig, SessionAgents};

const TOKEN: &str = "test-token-0123456789";
const PATIENCE: Duration = Duration::from_secs(20);

async fn within<T>(what: &str, fut: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(PATIENCE, fut)
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}

/// The bindings, in memory.
#[derive(Default)]
struct Book(Mutex<HashMap<String, Agent>>);

impl SessionAgents for Book {
    fn get(&self, key: &SessionKey) -> Result<Option<Agent>, StoreError> {
        Ok(self.0.lock().get(key.as_str()).copied())
    }

    fn bind<'a>(
        &'a self,
        key: &'a SessionKey,
        agent: Agent,
    ) -> BoxFuture<'a, Result<Agent, StoreError>> {
        let bound = *self
            .0
            .lock()
            .entry(key.as_str().to_owned())
            .or_insert(agent);
        Box::pin(async move { Ok(bound) })
    }
}

struct Server {
    base: String,
    anthropic: ChannelSourceControl,
    openai: ChannelSourceControl,
    book: Arc<Book>,
    client: reqwest::Client,
    _task: tokio::task::JoinHandle<()>,
}

/// A server of `anthropic` (the default) and `openai`, each session's
/// source picked by its binding, as `warden serve` does.
async fn server() -> Server {
    let (anthropic_source, anthropic) = ChannelSource::new();
    let (openai_source, openai) = ChannelSource::new();
    let book = Arc::new(Book::default());
    let bindings = Arc::clone(&book);
    let factory = move |key: &SessionKey| -> Arc<dyn EventSource> {
        match bindings.get(key).ok().flatten() {
            Some(Agent::Openai) => openai_source.clone(),
            _ => anthropic_source.clone(),
        }
    };
    let sup = Supervisor::builder(Arc::new(factory))
        .start()
        .await
        .expect("supervisor");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    let config = ServeConfig::new(TOKEN).with_agents(
        vec![Agent::Anthropic, Agent::Openai],
        Arc::clone(&book) as Arc<dyn SessionAgents>,
    );
    let app = warden_serve::router(sup, config);
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Server {
        base,
        anthropic,
        openai,
        book,
        client: reqwest::Client::new(),
        _task: task,
    }
}

impl Server {
    /// `POST /v1/turns` with `body`: the status and the JSON answer.
    async fn post(&self, body: &str) -> (u16, Value) {
        let response = self
            .client
            .post(format!("{}/v1/turns", self.base))
            .bearer_auth(TOKEN)
            .header("content-type", "application/json")
            .body(body.to_owned())
            .send()
            .await
            .expect("post");
        let status = response.status().as_u16();
        let text = response.text().await.expect("body");
        (status, serde_json::from_str(&text).expect("JSON body"))
    }

    async fn get(&self, path: &str) -> Value {
        let response = self
            .client
            .get(format!("{}{path}", self.base))
            .bearer_auth(TOKEN)
            .send()
            .await
            .expect("get");
        serde_json::from_str(&response.text().await.expect("body")).expect("JSON body")
    }

    /// A turn on `key` answered by the source `ctl` drives (it must be the
    /// one asked).
    async fn turn(&self, body: &str, ctl: &ChannelSourceControl, who: &str) {
        let (status, created) = self.post(body).await;
        assert_eq!(status, 202, "{body}: {created}");
        let attempt = within(who, ctl.next_attempt()).await.expect("an attempt");
        attempt.text("ok");
        attempt.finish();
    }

    /// No attempt reaches either agent for a while.
    async fn nothing_sent(&self, what: &str) {
        for ctl in [&self.anthropic, &self.openai] {
            let next = tokio::time::timeout(Duration::from_millis(300), ctl.next_attempt()).await;
            assert!(next.is_err(), "{what}: nothing was sent to an agent");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_session_runs_the_agent_it_started_with_and_refuses_another() {
    let s = server().await;
    // No agent named: the default. Named: that one.
    s.turn(
        r#"{"key": "plain", "message": "hi"}"#,
        &s.anthropic,
        "the default agent",
    )
    .await;
    s.turn(
        r#"{"key": "second", "message": "hi", "agent": "openai"}"#,
        &s.openai,
        "the agent named",
    )
    .await;
    // Its later turns run it too, named or not.
    s.turn(
        r#"{"key": "second", "message": "again"}"#,
        &s.openai,
        "the session's agent",
    )
    .await;

    // Another agent on a session that has one: 409 naming both.
    let (status, refused) = s
        .post(r#"{"key": "second", "message": "switch", "agent": "anthropic"}"#)
        .await;
    assert_eq!(status, 409, "{refused}");
    let error = &refused["error"];
    assert_eq!(error["type"], "agent_mismatch", "{refused}");
    assert_eq!(error["agent"], "openai", "{refused}");
    assert_eq!(error["requested"], "anthropic", "{refused}");
    let message = error["message"].as_str().expect("message");
    assert!(
        message.contains("openai") && message.contains("anthropic"),
        "{message}"
    );
    s.nothing_sent("a mismatched turn").await;

    // An agent this server does not run: refused, nothing bound.
    let (status, refused) = s
        .post(r#"{"key": "third", "message": "hi", "agent": "codex"}"#)
        .await;
    assert_eq!(status, 409, "{refused}");
    assert_eq!(refused["error"]["requested"], "codex", "{refused}");
    assert!(
        refused["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("anthropic and openai")),
        "{refused}"
    );
    assert_eq!(s.book.get(&SessionKey::new("third")).expect("get"), None);
    s.nothing_sent("an agent not run here").await;

    // An agent name that is no agent at all: the body is invalid.
    let (status, refused) = s
        .post(r#"{"key": "fourth", "message": "hi", "agent": "cursor"}"#)
        .await;
    assert_eq!(status, 422, "{refused}");

    // The views say which agent each session runs.
    let list = s.get("/v1/sessions?detail=full").await;
    let agent_of = |key: &str| {
        list["sessions"]
            .as_array()
            .expect("sessions")
            .iter()
            .find(|v| v["key"] == key)
            .map(|v| v["agent"].clone())
    };
    assert_eq!(agent_of("plain"), Some("anthropic".into()), "{list}");
    assert_eq!(agent_of("second"), Some("openai".into()), "{list}");
    let one = s.get("/v1/sessions/second").await;
    assert_eq!(one["agent"], "openai", "{one}");
    let info = s.get("/v1/server").await;
    assert_eq!(info["agent"], "anthropic", "{info}");
    assert_eq!(
        info["agents"],
        serde_json::json!(["anthropic", "openai"]),
        "{info}"
    );
}
