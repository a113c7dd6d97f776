//! `warden serve --store postgres://…` (a node of a cluster) and `warden
//! cluster status`.

use std::fmt::Write as _;
use std::time::Duration;

use tokio_util::task::AbortOnDropHandle;
use warden_pg::cluster::{Node, NodeState, Spread};
use warden_pg::low_level::PgStore;

use crate::exit::{CliError, Exit};

/// The node `id` of the cluster whose database is at `url` (its schema
/// created or migrated), its session leases lasting `lease_ttl`.
pub(crate) async fn node(url: &str, id: String, lease_ttl: Duration) -> Result<Node, CliError> {
    postgres_url(url)?;
    Node::connect(url, id, lease_ttl)
        .await
        .map_err(|e| CliError::failure(format!("--store {}: {e}", redact(url))))
}

/// Connects to the cluster's database (creating or migrating its schema),
/// for `warden cluster`'s reading and forgetting of members.
pub(crate) async fn connect(url: &str) -> Result<PgStore, CliError> {
    postgres_url(url)?;
    PgStore::connect(url)
        .await
        .map_err(|e| CliError::failure(format!("--store {}: {e}", redact(url))))
}

/// A usage error unless `url` is a PostgreSQL URL.
fn postgres_url(url: &str) -> Result<(), CliError> {
    if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
        return Err(CliError::usage(format!(
            "--store: only postgres:// URLs are supported (got {:?}); without --store the \
             sessions live in the data directory's sled database",
            redact(url)
        )));
    }
    Ok(())
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
    /// The nodes (alive, dead or left; heartbeat age, lease TTL, sessions
    /// held), the balance (sessions per live node: mean, spread, farthest
    /// from the mean) and every session's lease. A node is dead once its last
    /// heartbeat is older than its own lease TTL, and left once it stopped
    /// cleanly (SIGTERM). A node silent for an hour is removed by the live
    /// nodes; `forget` removes the dead and the left now.
    Status {
        /// The cluster's database. Default WARDEN_STORE.
        #[arg(long, env = "WARDEN_STORE", value_name = "URL")]
        store: String,
        /// One JSON object instead of tables.
        #[arg(long)]
        json: bool,
        /// Call a node dead when its last heartbeat is older than this,
        /// instead of its own lease TTL.
        #[arg(long, value_name = "SECONDS", value_parser = crate::units::seconds)]
        dead_after: Option<std::time::Duration>,
    },
    /// Removes nodes from the membership now: the one named, and with
    /// --dead every dead one, with --left every one that left (both in one
    /// command). Their sessions are unaffected: their leases expire (or
    /// were given back) and live nodes take them over. A node that still
    /// beats is refused (it would register again).
    Forget {
        /// The node's id (or none, with --dead or --left).
        #[arg(required_unless_present_any = ["dead", "left"])]
        node: Option<String>,
        /// Every dead node (silent for longer than its lease TTL).
        #[arg(long)]
        dead: bool,
        /// Every node that left (stopped cleanly).
        #[arg(long)]
        left: bool,
        /// The cluster's database. Default WARDEN_STORE.
        #[arg(long, env = "WARDEN_STORE", value_name = "URL")]
        store: String,
        /// Call the named node dead when silent for longer than this,
        /// instead of its own lease TTL.
        #[arg(long, value_name = "SECONDS", value_parser = crate::units::seconds)]
        dead_after: Option<std::time::Duration>,
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
            dead,
            left,
            store,
            dead_after,
        } => return forget(&store, node, dead, left, dead_after).await,
    };
    // The database's verdict (each node's own TTL), unless the operator
    // set --dead-after.
    let state = |n: &warden_pg::cluster::NodeInfo| match (n.state, dead_after) {
        (NodeState::Left, _) => NodeState::Left,
        (_, Some(after)) if n.heartbeat_age_secs > after.as_secs_f64() => NodeState::Dead,
        (_, Some(_)) => NodeState::Alive,
        (s, None) => s,
    };
    let pg = connect(&store).await?;
    let failed = |e: warden_core::StoreError| CliError::failure(e.to_string());
    let nodes = pg.nodes().await.map_err(failed)?;
    let leases = pg.leases().await.map_err(failed)?;
    // The balance: sessions per live node, against their mean.
    let live: Vec<u64> = nodes
        .iter()
        .filter(|n| state(n) == NodeState::Alive)
        .map(|n| n.sessions)
        .collect();
    let spread = Spread::of(&live);
    if json {
        let value = serde_json::json!({
            "nodes": nodes.iter().map(|n| serde_json::json!({
                "node_id": n.node_id,
                "alive": state(n) == NodeState::Alive,
                "state": state(n).as_str(),
                "lease_ttl_secs": n.ttl.map(|t| t.as_secs_f64()),
                "advertise": n.advertise,
                "heartbeat_age_secs": n.heartbeat_age_secs,
                "sessions": n.sessions,
            })).collect::<Vec<_>>(),
            "balance": {
                "live_nodes": spread.nodes,
                "sessions": spread.sessions,
                "mean": spread.mean,
                "spread": spread.spread,
                "max_deviation": spread.deviation,
            },
            "sessions": leases.iter().map(|(k, l)| serde_json::json!({
                "key": k,
                "owner": l.owner,
                "epoch": l.epoch,
                "lease_remaining_secs": l.remaining_secs,
            })).collect::<Vec<_>>(),
        });
        return emit(&format!("{value}\n"));
    }
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<24} {:<6} {:<28} {:>10} {:>8}",
        "NODE", "STATE", "ADVERTISE", "HEARTBEAT", "SESSIONS"
    );
    for n in &nodes {
        let state = state(n).as_str();
        let _ = writeln!(
            out,
            "{:<24} {:<6} {:<28} {:>9.1}s {:>8}",
            n.node_id, state, n.advertise, n.heartbeat_age_secs, n.sessions
        );
    }
    let _ = writeln!(
        out,
        "\nBALANCE: {} sessions on {} live nodes, mean {:.1}, spread {} (most less fewest), \
         farthest {:.0}% from the mean\n",
        spread.sessions,
        spread.nodes,
        spread.mean,
        spread.spread,
        spread.deviation * 100.0
    );
    let _ = writeln!(
        out,
        "{:<32} {:<24} {:>6} {:>12}",
        "SESSION", "OWNER", "EPOCH", "LEASE LEFT"
    );
    for (key, l) in &leases {
        let left = match l.remaining_secs {
            Some(s) if s >= 0.0 => format!("{s:.1}s"),
            Some(_) => "expired".to_owned(),
            None => "-".to_owned(),
        };
        let _ = writeln!(
            out,
            "{:<32} {:<24} {:>6} {:>12}",
            key,
            l.owner.as_deref().unwrap_or("-"),
            l.epoch,
            left
        );
    }
    emit(&out)
}

/// Writes `text` to stdout. A reader that went away (`warden cluster
/// status | head`) is not an error: the command ends quietly, as `ls |
/// head` does.
fn emit(text: &str) -> Result<Exit, CliError> {
    use std::io::Write as _;
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Ok(()) => Ok(Exit::Ok),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(Exit::Ok),
        Err(e) => Err(CliError::failure(format!("cannot write to stdout: {e}"))),
    }
}

/// `warden cluster forget [NODE] [--dead] [--left]`.
async fn forget(
    store: &str,
    node: Option<String>,
    dead: bool,
    left: bool,
    dead_after: Option<std::time::Duration>,
) -> Result<Exit, CliError> {
    let pg = connect(store).await?;
    let failed = |e: warden_core::StoreError| CliError::failure(e.to_string());
    if dead || left {
        for gone in pg.forget_nodes(dead, left).await.map_err(failed)? {
            println!("forgot node {gone}");
        }
    }
    let Some(node) = node else {
        return Ok(Exit::Ok);
    };
    if pg.forget_node(&node, dead_after).await.map_err(failed)? {
        println!("forgot node {node}");
        return Ok(Exit::Ok);
    }
    let nodes = pg.nodes().await.map_err(failed)?;
    Err(match nodes.iter().find(|n| n.node_id == node) {
        Some(n) => CliError::failure(format!(
            "node {node} beat {:.1}s ago: it is alive (stop it first, or wait {:.1}s)",
            n.heartbeat_age_secs,
            dead_after.or(n.ttl).map_or(30.0, |d| d.as_secs_f64())
        )),
        // Named and also forgotten by --dead/--left just now: done.
        None if dead || left => return Ok(Exit::Ok),
        None => CliError::failure(format!("no node {node} in the cluster")),
    })
}
