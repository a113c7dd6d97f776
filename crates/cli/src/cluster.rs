//! `warden serve --store postgres://…` (a node of a cluster) and `warden
//! cluster status`.

use tokio_util::task::AbortOnDropHandle;
use warden_pg::PgStore;
use warden_pg::cluster::Node;

use crate::exit::{CliError, Exit};

/// Connects to the cluster's database (creating or migrating its schema).
pub(crate) async fn connect(url: &str) -> Result<PgStore, CliError> {
    if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
        return Err(CliError::usage(format!(
            "--store: only postgres:// URLs are supported (got {:?}); without --store the \
             sessions live in the data directory's sled database",
            redact(url)
        )));
    }
    PgStore::connect(url)
        .await
        .map_err(|e| CliError::failure(format!("--store {}: {e}", redact(url))))
}

/// `url` without its password.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => {
            let creds = &url[s + 3..at];
            match creds.find(':') {
                Some(c) => format!("{}{}:***{}", &url[..s + 3], &creds[..c], &url[at..]),
                None => url.to_owned(),
            }
        }
        _ => url.to_owned(),
    }
}

/// The node's id: `--node-id`, else the host name and the process id.
pub(crate) fn node_id(flag: Option<String>) -> String {
    flag.unwrap_or_else(|| {
        let host = std::fs::read_to_string("/etc/hostname")
            .ok()
            .map(|h| h.trim().to_owned())
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "node".to_owned());
        format!("{host}-{}", std::process::id())
    })
}

/// Prints what `node` reports on stderr, as `warden: …` lines, until the
/// node goes away.
pub(crate) fn print_events(node: &Node) -> AbortOnDropHandle<()> {
    let mut events = node.events();
    AbortOnDropHandle::new(tokio::spawn(async move {
        loop {
            match events.recv().await {
                Ok(event) => eprintln!("warden: {event}"),
                Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                    eprintln!("warden: {n} cluster events not shown (too many at once)");
                }
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
            }
        }
    }))
}

/// Arguments of `warden cluster`.
#[derive(Debug, clap::Args)]
pub(crate) struct ClusterArgs {
    #[command(subcommand)]
    command: ClusterCommand,
}

#[derive(Debug, clap::Subcommand)]
enum ClusterCommand {
    /// The nodes (alive or dead, heartbeat age, sessions held) and every
    /// session's lease. A node that stopped beating for an hour is removed
    /// by the live nodes; `forget` removes a dead one now.
    Status {
        /// The cluster's database. Default WARDEN_STORE.
        #[arg(long, env = "WARDEN_STORE", value_name = "URL")]
        store: String,
        /// One JSON object instead of tables.
        #[arg(long)]
        json: bool,
        /// A node is dead when its last heartbeat is older than this (nodes
        /// beat at a third of their lease TTL; keep it above the TTL).
        #[arg(long, value_name = "SECONDS", default_value = "30", value_parser = crate::units::seconds)]
        dead_after: std::time::Duration,
    },
    /// Removes a dead node from the membership now. Its sessions are
    /// unaffected: their leases expire and live nodes take them over. A
    /// node that still beats is refused (it would register again).
    Forget {
        /// The node's id.
        node: String,
        /// The cluster's database. Default WARDEN_STORE.
        #[arg(long, env = "WARDEN_STORE", value_name = "URL")]
        store: String,
        /// How long it must have been silent.
        #[arg(long, value_name = "SECONDS", default_value = "30", value_parser = crate::units::seconds)]
        dead_after: std::time::Duration,
    },
}

/// Runs `warden cluster …`.
pub(crate) async fn run(args: ClusterArgs) -> Result<Exit, CliError> {
    let (store, json, dead_after) = match args.command {
        ClusterCommand::Status {
            store,
            json,
            dead_after,
        } => (store, json, dead_after),
        ClusterCommand::Forget {
            node,
            store,
            dead_after,
        } => {
            let pg = connect(&store).await?;
            let forgotten = pg
                .forget_node(&node, dead_after)
                .await
                .map_err(|e| CliError::failure(e.to_string()))?;
            if !forgotten {
                let nodes = pg
                    .nodes()
                    .await
                    .map_err(|e| CliError::failure(e.to_string()))?;
                return Err(match nodes.iter().find(|n| n.node_id == node) {
                    Some(n) => CliError::failure(format!(
                        "node {node} beat {:.1}s ago: it is alive (stop it first, or wait {:.0}s)",
                        n.heartbeat_age_secs,
                        dead_after.as_secs_f64()
                    )),
                    None => CliError::failure(format!("no node {node} in the cluster")),
                });
            }
            println!("forgot node {node}");
            return Ok(Exit::Ok);
        }
    };
    let alive = |age: f64| age <= dead_after.as_secs_f64();
    let pg = connect(&store).await?;
    let failed = |e: warden_core::StoreError| CliError::failure(e.to_string());
    let nodes = pg.nodes().await.map_err(failed)?;
    let leases = pg.leases().await.map_err(failed)?;
    if json {
        let value = serde_json::json!({
            "nodes": nodes.iter().map(|n| serde_json::json!({
                "node_id": n.node_id,
                "alive": alive(n.heartbeat_age_secs),
                "advertise": n.advertise,
                "heartbeat_age_secs": n.heartbeat_age_secs,
                "sessions": n.sessions,
            })).collect::<Vec<_>>(),
            "sessions": leases.iter().map(|(k, l)| serde_json::json!({
                "key": k,
                "owner": l.owner,
                "epoch": l.epoch,
                "lease_remaining_secs": l.remaining_secs,
            })).collect::<Vec<_>>(),
        });
        println!("{value}");
        return Ok(Exit::Ok);
    }
    println!(
        "{:<24} {:<6} {:<28} {:>10} {:>8}",
        "NODE", "STATE", "ADVERTISE", "HEARTBEAT", "SESSIONS"
    );
    for n in &nodes {
        let state = if alive(n.heartbeat_age_secs) {
            "alive"
        } else {
            "dead"
        };
        println!(
            "{:<24} {:<6} {:<28} {:>9.1}s {:>8}",
            n.node_id, state, n.advertise, n.heartbeat_age_secs, n.sessions
        );
    }
    println!();
    println!(
        "{:<32} {:<24} {:>6} {:>12}",
        "SESSION", "OWNER", "EPOCH", "LEASE LEFT"
    );
    for (key, l) in &leases {
        let left = match l.remaining_secs {
            Some(s) if s >= 0.0 => format!("{s:.1}s"),
            Some(_) => "expired".to_owned(),
            None => "-".to_owned(),
        };
        println!(
            "{:<32} {:<24} {:>6} {:>12}",
            key,
            l.owner.as_deref().unwrap_or("-"),
            l.epoch,
            left
        );
    }
    Ok(Exit::Ok)
}
