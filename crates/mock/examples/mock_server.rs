//! Runs a mock server until killed and prints its events (never prompts).
//!
//! ```text
//! cargo run -p warden-mock --example mock_server -- [SCENARIO[,SCENARIO…]] [PORT]
//! ANTHROPIC_BASE_URL=http://127.0.0.1:PORT ANTHROPIC_API_KEY=dummy claude -p hi
//! ```
//!
//! A comma-separated list is a sequence: `stall,normal` stalls the first
//! request and answers the others normally. A stand-in for the future CLI.

use warden_mock::{MockConfig, MockServer, Scenario};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    if let Some(first) = args.next()
        && (first == "-h" || first == "--help")
    {
        eprintln!("usage: mock_server [SCENARIO[,SCENARIO...]] [PORT]\n\nscenarios:");
        for s in Scenario::all() {
            eprintln!("  {:<16} {}", s.name(), s.description());
        }
        return Ok(());
    }
    let mut args = std::env::args().skip(1);
    let sequence = match args.next() {
        Some(list) => list
            .split(',')
            .map(str::parse)
            .collect::<Result<Vec<Scenario>, _>>()?,
        None => vec![Scenario::Normal],
    };
    let mut config = MockConfig::default().with_sequence(sequence);
    if let Some(port) = args.next() {
        config = config.with_port(port.parse()?);
    }
    let server = MockServer::start(config).await?;
    println!("{}", server.base_url());
    let mut events = server.subscribe();
    while let Ok(event) = events.recv().await {
        eprintln!("{event:?}");
    }
    Ok(())
}
