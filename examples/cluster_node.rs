//! A cluster node in a binary of your own: what `warden serve --store
//! postgres://…` does, built from the libraries — a supervisor over the
//! node's fenced store, `warden_pg::cluster::Node` for placement,
//! membership, lease-loss eviction and takeover, and `warden-serve`'s HTTP
//! API in front. Start two of them on one database and a session asked on
//! either runs on exactly one; stop one with Ctrl-C and the other takes its
//! sessions over.
//!
//! ```sh
//! export WARDEN_STORE=postgres://warden@127.0.0.1:5432/warden
//! cargo run --example cluster_node -- node-a 127.0.0.1:8081
//! cargo run --example cluster_node -- node-b 127.0.0.1:8082
//! curl -s -H 'authorization: Bearer example-token' -H 'content-type: application/json' \
//!      -d '{"key":"demo","message":"hello"}' http://127.0.0.1:8081/v1/turns
//! ```
//!
//! The agent is an Anthropic source against the in-process mock LLM server,
//! so it runs offline; give it your own `EventSource` instead.

use std::sync::Arc;
use std::time::Duration;

use warden_core::store::ConversationStore;
use warden_core::{EventSource, SessionKey, Supervisor};
use warden_llm::{AnthropicOptions, AnthropicSource, HttpOptions};
use warden_mock::{MockConfig, MockServer};
use warden_pg::cluster::Node;
use warden_serve::ServeConfig;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let url = std::env::var("WARDEN_STORE")
        .map_err(|_| anyhow::anyhow!("set WARDEN_STORE to a postgres:// URL"))?;
    let mut args = std::env::args().skip(1);
    let id = args.next().unwrap_or_else(|| "node-a".into());
    let listen = args.next().unwrap_or_else(|| "127.0.0.1:8081".into());

    // The node: sessions, leases and turn logs in the database.
    let listener = tokio::net::TcpListener::bind(&listen).await?;
    let advertise = format!("http://{}", listener.local_addr()?);
    let mut node = Node::connect(&url, id, Duration::from_secs(10))
        .await?
        .with_advertise(advertise);
    let mut events = node.events();
    tokio::spawn(async move {
        while let Ok(event) = events.recv().await {
            eprintln!("cluster: {event}");
        }
    });

    // The agent: conversations in the database, so a session taken over by
    // another node resumes its conversation there.
    let mock = MockServer::start(MockConfig::default()).await?;
    let conversations: Arc<dyn ConversationStore> = Arc::new(node.conversations());
    let source: Arc<dyn EventSource> = Arc::new(AnthropicSource::new(
        AnthropicOptions::default()
            .with_base_url(mock.base_url())
            .with_http(HttpOptions::default().with_conversation_store(conversations)),
    )?);

    // The supervisor writes through the node's fence and hands the turns it
    // re-delivers (after a takeover) to the HTTP API under their ids.
    let (recovered_tx, recovered_rx) = tokio::sync::mpsc::unbounded_channel();
    let supervisor = Supervisor::builder(Arc::new(move |_: &SessionKey| source.clone()))
        .store(Arc::new(node.store().clone()))
        .recovered_turns(recovered_tx)
        .start()
        .await?;
    let config = ServeConfig::new("example-token")
        .with_turn_store(Arc::new(node.turns()))
        .with_recovered_turns(recovered_rx)
        .with_placement(node.placement());
    node.join(&supervisor).await?;
    let app = warden_serve::router(supervisor.clone(), config);
    node.take_over(&supervisor).await;

    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;

    // Stop the sessions (their messages stay pending in the database), then
    // hand them to the other nodes now rather than when the leases expire.
    supervisor.shutdown().await;
    node.leave().await;
    Ok(())
}
