//! A node of the cluster tests: a real `warden serve --store postgres://…`
//! process with a node id and a lease TTL, its data directory and the
//! cluster's token file under the test's directory, serving the Anthropic
//! API of a mock, its stderr read as it comes (a full pipe would stall it).

use std::path::Path;
use std::time::Duration;

use nix::unistd::Pid;
use warden_mock::MockServer;

use super::{arg, command, spawn_listening};

/// The bearer token every node of a cluster test takes (`--token-file`).
pub(crate) const TOKEN: &str = "cluster-test-token";

/// How long a node may take to say where it listens.
const START_LIMIT: Duration = Duration::from_secs(30);

/// What to start: the flags every cluster node gets, and a test's own.
pub(crate) struct NodeSpec<'a> {
    id: &'a str,
    cmd: tokio::process::Command,
}

impl<'a> NodeSpec<'a> {
    /// Node `id` on `store`, its leases lasting `ttl` seconds, its data in
    /// `dir/<id>`, answering on a port the system picks.
    pub(crate) fn new(dir: &Path, id: &'a str, store: &str, ttl: f64) -> Self {
        Self::listening(dir, id, store, ttl, "127.0.0.1:0")
    }

    /// As [`NodeSpec::new`], on `listen` (a node restarted on its port).
    pub(crate) fn listening(dir: &Path, id: &'a str, store: &str, ttl: f64, listen: &str) -> Self {
        let token = dir.join("token");
        std::fs::write(&token, TOKEN).expect("the token file");
        let data = dir.join(id);
        let cmd = command(&[
            "serve",
            "--listen",
            listen,
            "--data-dir",
            arg(&data),
            "--token-file",
            arg(&token),
            "--store",
            store,
            "--node-id",
            id,
            "--lease-ttl",
            &ttl.to_string(),
        ]);
        Self { id, cmd }
    }

    /// Adds flags of the test's own (`--grace 1`, `--rebalance-interval 0`).
    pub(crate) fn args(mut self, args: &[&str]) -> Self {
        self.cmd.args(args);
        self
    }

    /// Serves the Anthropic API of `mock` (`--agent anthropic --base-url`).
    pub(crate) fn upstream(self, mock: &MockServer) -> Self {
        self.args(&["--agent", "anthropic", "--base-url", &mock.base_url()])
    }

    /// Sets a variable in the node's environment.
    pub(crate) fn env(mut self, key: &str, value: &str) -> Self {
        self.cmd.env(key, value);
        self
    }

    /// Runs the node in group `gid` (the least-privilege tests).
    pub(crate) fn gid(mut self, gid: u32) -> Self {
        self.cmd.gid(gid);
        self
    }

    /// The command as built, for a test that reads the node's stderr line
    /// by line while it runs.
    pub(crate) fn into_command(self) -> tokio::process::Command {
        self.cmd
    }

    /// Starts it and waits until it listens.
    pub(crate) async fn start(self) -> Node {
        let id = self.id.to_owned();
        let (mut child, base, _stdout) = spawn_listening(self.cmd, START_LIMIT).await;
        let mut err = child.stderr.take().expect("stderr");
        let stderr = tokio::spawn(async move {
            use tokio::io::AsyncReadExt as _;
            let mut s = String::new();
            let _ = err.read_to_string(&mut s).await;
            s
        });
        Node {
            id,
            child,
            base,
            stderr,
        }
    }
}

/// A running node.
pub(crate) struct Node {
    /// Its node id.
    pub(crate) id: String,
    pub(crate) child: tokio::process::Child,
    /// Its base URL (`http://127.0.0.1:<port>`).
    pub(crate) base: String,
    /// Everything it logged, once it has exited.
    pub(crate) stderr: tokio::task::JoinHandle<String>,
}

impl Node {
    /// Its process id, for signals.
    pub(crate) fn pid(&self) -> Pid {
        Pid::from_raw(self.child.id().expect("a running node") as i32)
    }
}

/// `GET {base}/v1/turns/{id}/events` from after event `last`, as a client
/// re-attaches to a turn whose stream ended early: the stream when `base`
/// answers `200`, `None` (after a 100 ms pause, so a caller trying node
/// after node does not spin) when it answers otherwise or not within
/// `limit` — the database still away, or the turn between nodes.
pub(crate) async fn reattach(
    http: &reqwest::Client,
    base: &str,
    id: &str,
    last: u64,
    limit: Duration,
) -> Option<reqwest::Response> {
    let asked = http
        .get(format!("{base}/v1/turns/{id}/events"))
        .bearer_auth(TOKEN)
        .header("last-event-id", last.to_string())
        .timeout(limit)
        .send()
        .await;
    match asked {
        Ok(r) if r.status() == 200 => Some(r),
        _ => {
            tokio::time::sleep(Duration::from_millis(100)).await;
            None
        }
    }
}
