//! `warden serve --store postgres://…` (a node of a cluster) and `warden
//! cluster status`.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use tokio_util::task::AbortOnDropHandle;
use warden_core::cluster::{Elsewhere, Placement, SessionPlace};
use warden_core::store::TurnStore;
use warden_core::{SessionKey, Supervisor};
use warden_pg::{NodeStore, PgStore};

use crate::exit::{CliError, Exit};

/// Default lease TTL of a cluster node.
pub(crate) const DEFAULT_LEASE_TTL_SECS: f64 = 10.0;

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

/// Runs a session here only while this node holds its lease.
struct LeasePlacement {
    node: NodeStore,
}

impl LeasePlacement {
    /// A session held under `info` by another node: that node, where it is
    /// reached, and the time left on its lease.
    async fn held_by(&self, info: warden_pg::LeaseInfo) -> Elsewhere {
        let advertise = match &info.owner {
            Some(owner) => self.advertise_of(owner).await,
            None => None,
        };
        let left = info.remaining_secs.unwrap_or(1.0).max(0.0);
        Elsewhere::new(info.owner, advertise, Duration::from_secs_f64(left))
    }
}

impl Placement for LeasePlacement {
    fn place<'a>(&'a self, key: &'a SessionKey) -> BoxFuture<'a, Result<(), Elsewhere>> {
        Box::pin(async move {
            if self.node.held().iter().any(|l| l.key == key.as_str()) {
                return Ok(()); // ours (the fence still guards every write)
            }
            let unknown = || Elsewhere::new(None, None, Duration::from_secs(1));
            // A session bound to a directory this node lacks is not taken
            // here: asked while its owner lives, the request is forwarded;
            // once the owner is gone, the client is told why it waits.
            if let Some(ws) = self.node.missing_workspace(key).await {
                let info = self
                    .node
                    .pg()
                    .lease_info(key)
                    .await
                    .map_err(|_| unknown())?;
                if info.remaining_secs.unwrap_or(0.0) <= 0.0 {
                    return Err(Elsewhere::workspace_missing(
                        info.owner,
                        ws,
                        self.node.scan_interval().max(Duration::from_secs(1)),
                    ));
                }
                return Err(self.held_by(info).await);
            }
            match self.node.claim(key).await {
                Ok(Some(_)) => Ok(()),
                Ok(None) => {
                    let info = self
                        .node
                        .pg()
                        .lease_info(key)
                        .await
                        .map_err(|_| unknown())?;
                    Err(self.held_by(info).await)
                }
                Err(_) => Err(unknown()),
            }
        })
    }

    fn node(&self) -> Option<&str> {
        Some(self.node.node())
    }

    fn advertise_of<'a>(&'a self, node: &'a str) -> BoxFuture<'a, Option<String>> {
        Box::pin(async move {
            let nodes = self.node.pg().nodes().await.ok()?;
            nodes
                .into_iter()
                .find(|n| n.node_id == node)
                .map(|n| n.advertise)
        })
    }

    fn sessions(&self) -> BoxFuture<'_, Option<Result<Vec<SessionPlace>, String>>> {
        Box::pin(async move {
            let pg = self.node.pg();
            let all = async {
                let leases = pg.leases().await.map_err(|e| e.to_string())?;
                let nodes = pg.nodes().await.map_err(|e| e.to_string())?;
                Ok(leases
                    .into_iter()
                    .map(|(key, info)| {
                        let advertise = info.owner.as_ref().and_then(|o| {
                            nodes
                                .iter()
                                .find(|n| n.node_id == *o)
                                .map(|n| n.advertise.clone())
                        });
                        SessionPlace::new(
                            key,
                            info.owner,
                            advertise,
                            info.epoch,
                            info.remaining_secs,
                        )
                    })
                    .collect())
            };
            Some(all.await)
        })
    }
}

/// The turn store of `warden serve` on this node.
pub(crate) fn turn_store(node: &NodeStore) -> Arc<dyn TurnStore> {
    Arc::new(node.turns())
}

/// A node's background work: lease renewal, heartbeats, evicting the
/// sessions whose lease it lost, taking over the orphans of dead nodes.
/// Stops when dropped.
pub(crate) struct Membership {
    _tasks: Vec<AbortOnDropHandle<()>>,
}

/// The placement for `warden serve` and the node's background work.
pub(crate) fn placement(node: &NodeStore) -> Arc<dyn Placement> {
    Arc::new(LeasePlacement { node: node.clone() })
}

/// Registers the node and starts its background work.
pub(crate) async fn join(
    node: &NodeStore,
    advertise: &str,
    supervisor: &Supervisor,
    ttl: Duration,
    keep_turns: Duration,
) -> Result<Membership, CliError> {
    node.pg()
        .register_node(node.node(), advertise)
        .await
        .map_err(|e| CliError::failure(format!("cannot register node {}: {e}", node.node())))?;
    let mut tasks = vec![node.spawn_renewer()];

    let beat = node.clone();
    tasks.push(AbortOnDropHandle::new(tokio::spawn(async move {
        let mut tick = tokio::time::interval(ttl / 3);
        loop {
            tick.tick().await;
            if let Err(e) = beat.pg().heartbeat(beat.node()).await {
                eprintln!("warden: cannot beat node {}'s heartbeat: {e}", beat.node());
            }
        }
    })));

    // Turn event logs are kept as long as a node keeps a finished turn's.
    let pg = node.pg().clone();
    tasks.push(AbortOnDropHandle::new(tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(60));
        loop {
            tick.tick().await;
            if let Err(e) = pg.expire_turns(keep_turns).await {
                eprintln!("warden: cannot expire old turn logs: {e}");
            }
        }
    })));

    // A lease lost (a renewal or a write refused): stop the copy here now.
    let mut lost = node.lost();
    let sup = supervisor.clone();
    tasks.push(AbortOnDropHandle::new(tokio::spawn(async move {
        loop {
            match lost.recv().await {
                Ok(lease) => {
                    let key = SessionKey::new(&lease.key);
                    let _ = sup.evict(key).await;
                    eprintln!(
                        "warden: session {} moved to another node (lease epoch {} lost); stopped here",
                        lease.key, lease.epoch
                    );
                }
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
            }
        }
    })));

    // Orphans: sessions with pending messages whose owner's lease ran out.
    let scan = node.clone();
    let sup = supervisor.clone();
    tasks.push(AbortOnDropHandle::new(tokio::spawn(async move {
        let mut tick = tokio::time::interval(scan.scan_interval());
        loop {
            tick.tick().await;
            take_over(&scan, &sup).await;
        }
    })));
    Ok(Membership { _tasks: tasks })
}

/// Takes over every orphan it can and starts it (see
/// [`NodeStore::take_over`](warden_pg::NodeStore::take_over)), saying so on
/// stderr; how many.
pub(crate) async fn take_over(node: &NodeStore, supervisor: &Supervisor) -> usize {
    let done = node.take_over(supervisor).await;
    for (key, epoch) in &done.taken {
        eprintln!(
            "warden: took over session {} (epoch {epoch}); re-sending its pending messages",
            key.as_str()
        );
    }
    for (key, why) in &done.released {
        eprintln!(
            "warden: session {} cannot start here ({why}); its lease is released",
            key.as_str()
        );
    }
    done.taken.len()
}

/// Arguments of `warden cluster`.
#[derive(Debug, clap::Args)]
pub(crate) struct ClusterArgs {
    #[command(subcommand)]
    command: ClusterCommand,
}

#[derive(Debug, clap::Subcommand)]
enum ClusterCommand {
    /// The nodes (heartbeat age, sessions held) and every session's lease.
    Status {
        /// The cluster's database. Default WARDEN_STORE.
        #[arg(long, env = "WARDEN_STORE", value_name = "URL")]
        store: String,
        /// One JSON object instead of tables.
        #[arg(long)]
        json: bool,
    },
}

/// Runs `warden cluster …`.
pub(crate) async fn run(args: ClusterArgs) -> Result<Exit, CliError> {
    let ClusterCommand::Status { store, json } = args.command;
    let pg = connect(&store).await?;
    let failed = |e: warden_core::StoreError| CliError::failure(e.to_string());
    let nodes = pg.nodes().await.map_err(failed)?;
    let leases = pg.leases().await.map_err(failed)?;
    if json {
        let value = serde_json::json!({
            "nodes": nodes.iter().map(|n| serde_json::json!({
                "node_id": n.node_id,
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
        "{:<24} {:<28} {:>10} {:>8}",
        "NODE", "ADVERTISE", "HEARTBEAT", "SESSIONS"
    );
    for n in &nodes {
        println!(
            "{:<24} {:<28} {:>9.1}s {:>8}",
            n.node_id, n.advertise, n.heartbeat_age_secs, n.sessions
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
