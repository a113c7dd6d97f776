//! Your own actor using warden's watchdog, retry policy and store, without
//! warden's `WorkspaceSupervisor`, `SessionActor` or `StreamTask`.
//!
//! ```sh
//! cargo run --example custom_supervisor
//! ```
//!
//! `MyAgentActor` is a small ractor actor that answers `Ask` messages by
//! streaming from a real [`AnthropicSource`] pointed at an in-process
//! [`MockServer`]. The mock's first response stalls after a few frames with
//! the socket held open (what a silently dropped NAT mapping looks like);
//! the second is a normal reply. The actor reuses three warden building
//! blocks:
//!
//! - the **watchdog**: one `WatchdogActor` with a 1 s silence allowance. Each
//!   attempt registers (`watch`) *before* the request is sent and stamps its
//!   `Heartbeat` on every frame, keep-alives included. The expiry callback
//!   fires a oneshot that wins a `tokio::select!` against the reader, which
//!   drops the stream and so closes the connection;
//! - the **retry policy**: `RetryPolicy::next_delay` decides whether and
//!   when to retry (retryable error? attempts left? a server `retry-after`?);
//! - the **store**: a `SledStore` on disk (`WARDEN_DATA_DIR`, else a temporary
//!   directory). The message is saved as pending and flushed *before* it is
//!   processed, and cleared once answered, so a crash in between would leave
//!   it on disk for re-delivery.

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use tokio::sync::oneshot;
use warden_core::watchdog::WatchdogHandle;
use warden_core::{
    AgentEvent, Durability, EventSource, Frame, RecordStatus, RetryPolicy, SessionKey,
    SessionRecord, SessionStore, StreamError, TurnRequest, WatchdogActor, WatchdogConfig,
};
use warden_llm::{AnthropicOptions, AnthropicSource};
use warden_mock::{MockConfig, MockServer, Scenario};
use warden_store::SledStore;

/// The user's own actor: one conversation, one question at a time.
struct MyAgentActor;

enum AgentMsg {
    /// Answer a question; the reply carries the answer or why it failed.
    Ask(String, RpcReplyPort<anyhow::Result<String>>),
}

/// What the actor is started with: warden's building blocks.
struct Parts {
    key: SessionKey,
    source: AnthropicSource,
    watchdog: WatchdogHandle,
    store: SledStore,
    policy: RetryPolicy,
    started: Instant,
}

struct State {
    parts: Parts,
    record: SessionRecord,
}

impl Actor for MyAgentActor {
    type Msg = AgentMsg;
    type State = State;
    type Arguments = Parts;

    async fn pre_start(
        &self,
        _myself: ActorRef<AgentMsg>,
        parts: Parts,
    ) -> Result<State, ActorProcessingErr> {
        // Resume the stored record, or start one.
        let mut record = match parts.store.load(&parts.key).await? {
            Some(record) => record,
            None => SessionRecord::new(&parts.key, None),
        };
        if !record.pending.is_empty() {
            // A real actor would re-deliver these now (a previous run crashed).
            println!("{} unanswered message(s) on disk", record.pending.len());
        }
        record.status = RecordStatus::Active;
        parts.store.save(&record, Durability::Buffered).await?;
        Ok(State { parts, record })
    }

    async fn handle(
        &self,
        _myself: ActorRef<AgentMsg>,
        AgentMsg::Ask(question, reply): AgentMsg,
        state: &mut State,
    ) -> Result<(), ActorProcessingErr> {
        let answer = ask(state, question).await;
        let _ = reply.send(answer);
        Ok(())
    }
}

/// One turn: persist, try under the retry policy, clear.
async fn ask(state: &mut State, question: String) -> anyhow::Result<String> {
    let State { parts, record } = state;
    let clock = |t: Instant| t.elapsed().as_secs_f64();

    // 1. Durable before processing: flushed to disk before the first request.
    let id = record.accept(question.clone());
    parts.store.save(record, Durability::Flushed).await?;
    println!("message #{id} stored as pending (flushed)");

    // 2. Attempts from scratch until one succeeds or the policy gives up.
    //    (This sleeps inside `handle`, so the mailbox waits meanwhile; warden's
    //    SessionActor schedules the retry with `send_after` to stay cancellable.)
    let mut attempt = 1;
    let answer = loop {
        let request = TurnRequest::new(parts.key.clone(), id, question.clone());
        println!(
            "[{:4.1}s] attempt {attempt}: request sent",
            clock(parts.started)
        );
        match run_attempt(parts, request).await {
            Ok(text) => break text,
            Err(err) => {
                // `None`: fatal, or out of attempts; the message stays pending
                // on disk.
                let Some(delay) = parts.policy.delay_after(attempt, &err) else {
                    anyhow::bail!("gave up after {attempt} attempt(s): {err}");
                };
                println!("        {}: retry in {} ms", err.code(), delay.as_millis());
                tokio::time::sleep(delay).await;
                attempt += 1;
            }
        }
    };

    // 3. Answered: clear the pending message (flushed too).
    record.answered(id);
    parts.store.save(record, Durability::Flushed).await?;
    let t = clock(parts.started);
    println!("[{t:4.1}s] attempt {attempt} complete; message #{id} cleared from pending");
    Ok(answer)
}

/// One attempt: watch, open, beat on every frame; the watchdog may end it.
async fn run_attempt(parts: &Parts, request: TurnRequest) -> Result<String, StreamError> {
    // Register before sending the request so connecting and the time to the
    // first byte count against the allowance. The callback runs on the
    // watchdog's task and must not block: it only fires the oneshot.
    let (kill_tx, kill_rx) = oneshot::channel();
    let guard = parts
        .watchdog
        .watch(None, move |expiry| {
            let _ = kill_tx.send(expiry);
        })
        .map_err(|e| StreamError::Internal {
            message: e.to_string(),
        })?;
    let heartbeat = guard.heartbeat();

    let mut text = String::new();
    let read = async {
        let mut stream = parts.source.open(request).await?;
        heartbeat.beat(); // response headers arrived: alive
        while let Some(frame) = stream.next().await {
            heartbeat.beat(); // every frame, `Frame::KeepAlive` included
            if let Frame::Event(AgentEvent::TextDelta(delta)) = frame? {
                text.push_str(&delta);
            }
        }
        Ok(())
    };

    // Whichever ends first. When the kill wins, `read` is dropped right here,
    // and with it the stream and its HTTP connection.
    let outcome = tokio::select! {
        done = read => done,
        expiry = kill_rx => Err(match expiry {
            Ok(expiry) => expiry.into(), // ESTREAM_TIMEOUT
            Err(_) => StreamError::Internal {
                message: "watchdog stopped".into(),
            },
        }),
    };
    drop(guard); // unwatch (leaving this function any other way would too)
    if let Err(StreamError::InactivityTimeout { silent_for, .. }) = &outcome {
        let secs = silent_for.as_secs_f64();
        println!("        killed by the watchdog after {secs:.2} s of silence");
        println!("        partial text discarded: {text:?}");
    }
    outcome.map(|()| text)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // A fake Anthropic API: the first request stalls, the next ones answer.
    let config = MockConfig::default().with_sequence([Scenario::Stall, Scenario::Normal]);
    let mock = MockServer::start(config).await?;
    let source = AnthropicSource::new(
        AnthropicOptions::default()
            .with_base_url(mock.base_url())
            .with_api_key("mock-key"),
    )?;

    // The store: WARDEN_DATA_DIR, else a temporary directory removed at exit.
    let temp = tempfile::tempdir()?;
    let data_dir = std::env::var_os("WARDEN_DATA_DIR")
        .map_or_else(|| temp.path().to_path_buf(), std::path::PathBuf::from);
    let store = SledStore::open(data_dir.join("custom-supervisor"))?;

    // The watchdog: 1 s of silence kills a stream (warden's default is 45 s).
    let config = WatchdogConfig::default().with_default_timeout(Duration::from_secs(1))?;
    let (watchdog, watchdog_done) = WatchdogActor::spawn(config).await?;

    // The policy: short backoff for the demo, four attempts in all.
    let policy = RetryPolicy::default()
        .with_backoff(Duration::from_millis(200), Duration::from_secs(2))
        .with_max_attempts(4);

    let key = SessionKey::new("my-agent");
    let parts = Parts {
        key: key.clone(),
        source,
        watchdog: watchdog.clone(),
        store: store.clone(),
        policy,
        started: Instant::now(),
    };
    let (agent, agent_done) = Actor::spawn(None, MyAgentActor, parts).await?;

    let question = "What does the watchdog do?".to_owned();
    let answer = ractor::call_t!(agent, AgentMsg::Ask, 30_000, question)??;
    println!("answer: {answer}");

    // What is left on disk and what the server saw.
    let record = store.load(&key).await?;
    let record = record.ok_or_else(|| anyhow::anyhow!("no record for {key}"))?;
    let (status, pending) = (&record.status, record.pending.len());
    println!("record \"{key}\" on disk: {status:?}, {pending} pending message(s)");
    let (requests, closed) = (mock.request_count(), mock.closed_by_client());
    println!("server: {requests} requests, {closed} closed by the client (the stall)");

    // Orderly shutdown: our actor, the watchdog, then the mock server.
    agent.stop(None);
    agent_done.await?;
    watchdog.actor().stop(None);
    watchdog_done.await?;
    mock.shutdown().await;
    Ok(())
}
