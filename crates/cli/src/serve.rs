//! `warden serve`: the workspace sessions as an HTTP + SSE service
//! (`warden-serve`), for orchestrators in any language.

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use warden_core::{Supervisor, SupervisorConfig};
use warden_serve::ServeConfig;
use warden_serve::api::ErrorType;

use crate::chat::Agent;
use crate::exit::{CliError, Exit};
use crate::paths;
use crate::serve_agents::{AgentSettings, Agents};
use crate::sources::check_url;

/// Arguments of `warden serve`.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Serves the workspace sessions over HTTP: POST /v1/turns {\"workspace\": DIR | \"key\": NAME,
\"message\": TEXT} runs a turn (202 with its id, or its events as SSE with Accept:
text/event-stream); GET /v1/turns/ID/events re-attaches (Last-Event-ID honoured); DELETE
/v1/turns/ID cancels; GET /v1/sessions, /healthz, /readyz. Every route but the probes
(/healthz, /readyz) and --public-metrics' /metrics needs Authorization: Bearer TOKEN, the token in --token-file (created 0600 with a random token on
first start). The first line on stdout says where it listens. SIGTERM or Ctrl-C: stop
accepting, let running turns finish for --grace seconds, then stop them; their messages stay
pending and the next start re-sends them. See docs/serve.md.

Examples:
  warden serve
  warden serve --listen 127.0.0.1:0 --agent anthropic --base-url http://127.0.0.1:8080
  warden serve --agent claude-code --agent codex")]
pub(crate) struct ServeArgs {
    /// Address to listen on (`127.0.0.1:0` picks a free port).
    #[arg(
        long,
        env = "WARDEN_LISTEN",
        default_value = "127.0.0.1:8700",
        value_name = "ADDR"
    )]
    listen: SocketAddr,
    /// Allow listening on an address other than loopback.
    #[arg(long, env = "WARDEN_ALLOW_REMOTE")]
    allow_remote: bool,
    /// Where sessions, transcripts and the token are kept. Default: the
    /// user's data directory.
    #[arg(long, env = "WARDEN_DATA_DIR", value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// The bearer token's file. Default DATA_DIR/token (created if missing).
    #[arg(long, env = "WARDEN_TOKEN_FILE", value_name = "FILE")]
    token_file: Option<PathBuf>,
    /// The agent of the sessions. Repeat it (or give a comma list:
    /// WARDEN_AGENT=claude-code,codex) to run several: a session runs the
    /// one its first turn names, else the first, and keeps it (a turn
    /// asking another is 409 agent_mismatch). Several need the local store.
    #[arg(long, env = "WARDEN_AGENT", value_enum, value_delimiter = ',', default_values_t = [Agent::Anthropic])]
    agent: Vec<Agent>,
    /// The API's base URL (for claude-code: its ANTHROPIC_BASE_URL).
    #[arg(long, env = "WARDEN_BASE_URL", value_name = "URL")]
    base_url: Option<String>,
    /// The model.
    #[arg(long, env = "WARDEN_MODEL")]
    model: Option<String>,
    /// The Claude Code binary. Default: `claude` on PATH.
    #[arg(long, env = "WARDEN_CLAUDE_BIN", value_name = "PATH")]
    claude_bin: Option<PathBuf>,
    /// Let Claude Code, Codex and Gemini CLI reach their APIs directly,
    /// without warden's wire layer (by default their model streams go
    /// through warden's watched engine in this process; see `warden chat`).
    #[arg(long, env = "WARDEN_NO_WIRE_WATCH")]
    no_wire_watch: bool,
    /// How long running turns may take to finish after SIGTERM: seconds,
    /// or a duration with a unit (30s, 2m).
    #[arg(long, env = "WARDEN_GRACE", default_value = "10", value_name = "SECONDS", value_parser = crate::units::seconds)]
    grace: Duration,
    /// How long a finished turn's events stay available for re-attach:
    /// seconds, or a duration with a unit.
    #[arg(long, env = "WARDEN_KEEP_EVENTS", default_value = "600", value_name = "SECONDS", value_parser = crate::units::seconds)]
    keep_events: Duration,
    /// A Jaeger's base URL, its UI and query API (e.g.
    /// http://localhost:16686): the console (/ui) links each session to its
    /// trace there and draws each turn's trace, which the server reads from
    /// Jaeger's query API (GET /v1/turns/{id}/trace).
    #[arg(long, env = "WARDEN_JAEGER_URL", value_name = "URL", value_parser = jaeger_url)]
    jaeger_url: Option<String>,
    /// Serve GET /metrics without the token (for a scraper that cannot
    /// send one); /healthz and /readyz never need it.
    #[arg(long, env = "WARDEN_PUBLIC_METRICS")]
    public_metrics: bool,
    /// Keep the sessions in PostgreSQL, shared with the other nodes of a
    /// cluster (`postgres://USER@HOST:PORT/DB`; the schema is created or
    /// migrated on start). Default: sled in the data directory, this
    /// process alone.
    #[arg(long, env = "WARDEN_STORE", value_name = "URL")]
    store: Option<String>,
    /// This node's id in the cluster. Default: host name and process id.
    #[arg(long, env = "WARDEN_NODE_ID", value_name = "NAME", requires = "store")]
    node_id: Option<String>,
    /// Where the other nodes and clients reach this one. Default: the
    /// listen address.
    #[arg(long, env = "WARDEN_ADVERTISE", value_name = "URL", requires = "store")]
    advertise: Option<String>,
    /// How long a session's lease lasts without renewal (renewed at a
    /// third of it): how long a dead node's sessions wait for a takeover.
    /// Seconds, or a duration with a unit; at least 0.3 s.
    #[arg(long, env = "WARDEN_LEASE_TTL", value_name = "SECONDS", requires = "store", default_value = "10", value_parser = crate::units::seconds)]
    lease_ttl: Duration,
    /// After a database outage, how long the other nodes leave a session
    /// to the node that gave it up (it takes its sessions back first, once
    /// it can reach the database and 3 s after it gave them up): seconds,
    /// or a duration with a unit. Shorter than about 3.5 s, sessions may
    /// all go to the first node back.
    #[arg(long, env = "WARDEN_RETURN_GRACE", value_name = "SECONDS", requires = "store", default_value = "5", value_parser = crate::units::seconds)]
    return_grace: Duration,
    /// How often each node compares the sessions it holds with the other
    /// live nodes' and, holding more than its share, hands sessions to the
    /// nodes below the mean — idle ones at once, busy ones at their next
    /// turn boundary (their new turns wait for the turn in flight, at most
    /// 3 s, then go to the new node; no turn is moved while it runs):
    /// seconds, or a duration with a unit; 0 never gives (sessions handed
    /// to it are still taken).
    #[arg(long, env = "WARDEN_REBALANCE_INTERVAL", value_name = "SECONDS", requires = "store", default_value = "10", value_parser = crate::units::seconds)]
    rebalance_interval: Duration,
    /// Most sessions a node hands to others per --rebalance-interval.
    #[arg(
        long,
        env = "WARDEN_REBALANCE_LIMIT",
        value_name = "N",
        requires = "store",
        default_value_t = 50
    )]
    rebalance_limit: usize,
    /// How far apart the most and the least loaded live nodes may be before
    /// the nodes above the mean give sessions away: a fraction of the
    /// mean (0.1) or a percentage (10%); at least one session.
    #[arg(long, env = "WARDEN_REBALANCE_THRESHOLD", value_name = "FRACTION", requires = "store", default_value = "10%", value_parser = fraction)]
    rebalance_threshold: f64,
    /// Live sessions at most: past it a new session stops the least
    /// recently used idle one (its record kept; it resumes when asked for),
    /// and when every one is busy the request gets `503
    /// too_many_sessions` with Retry-After.
    #[arg(long, env = "WARDEN_MAX_SESSIONS", value_name = "N", default_value_t = 4096,
          value_parser = clap::value_parser!(u32).range(1..))]
    max_sessions: u32,
    /// How long a session may stay idle before it is stopped (its record
    /// kept; the next message resumes it): seconds, or a duration with a
    /// unit; 0 never.
    #[arg(long, env = "WARDEN_IDLE_TIMEOUT", value_name = "SECONDS", default_value = "15m", value_parser = crate::units::seconds)]
    idle_timeout: Duration,
    /// Size cap of one turn's reply (text, thinking and tool input, every
    /// attempt counted), in bytes: past it the turn is stopped and ends
    /// with `EREPLY_TOO_LARGE`. The largest real replies are well under
    /// 1 MiB.
    #[arg(long, env = "WARDEN_MAX_REPLY_BYTES", value_name = "BYTES", default_value_t = DEFAULT_MAX_REPLY_BYTES,
          value_parser = clap::value_parser!(u64).range(1..))]
    max_reply_bytes: u64,
    /// Largest request body accepted (a turn's message and its fields), in
    /// bytes: a larger one gets `413` naming this flag.
    #[arg(long, env = "WARDEN_MAX_BODY_BYTES", value_name = "BYTES", default_value_t = warden_serve::DEFAULT_MAX_BODY_BYTES,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    max_body_bytes: usize,
    #[command(flatten)]
    connections: crate::connections::ConnectionArgs,
}

/// `--rebalance-threshold`: a fraction (`0.1`) or a percentage (`10%`),
/// not negative.
fn fraction(s: &str) -> Result<f64, String> {
    let (number, scale) = match s.trim().strip_suffix('%') {
        Some(p) => (p, 100.0),
        None => (s.trim(), 1.0),
    };
    match number.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v / scale),
        _ => Err(format!(
            "{s:?} is not a fraction (0.1) or a percentage (10%)"
        )),
    }
}

/// `--max-reply-bytes`: 16 MiB.
const DEFAULT_MAX_REPLY_BYTES: u64 = 16 * 1024 * 1024;

/// The token in `path`, or a new random one written there (0600).
fn token(path: &Path) -> Result<String, CliError> {
    match std::fs::read_to_string(path) {
        Ok(t) if !t.trim().is_empty() => return Ok(t.trim().to_owned()),
        Ok(_) => {
            return Err(CliError::usage(format!(
                "the token file {} is empty",
                path.display()
            )));
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            return Err(CliError::failure(format!(
                "cannot read the token file {}: {e}",
                path.display()
            )));
        }
    }
    let token = format!("{:032x}", rand::random::<u128>());
    let write = || -> std::io::Result<()> {
        use std::os::unix::fs::OpenOptionsExt as _;
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)?;
        f.write_all(token.as_bytes())?;
        f.write_all(b"\n")
    };
    write().map_err(|e| {
        CliError::failure(format!(
            "cannot write the token file {}: {e}",
            path.display()
        ))
    })?;
    eprintln!(
        "warden: created the API token in {} (send it as Authorization: Bearer <token>)",
        path.display()
    );
    Ok(token)
}

/// Starts every stored session that has pending messages (it re-sends
/// them as it starts); how many. A record that cannot be read is left
/// alone (`warden sessions` shows it).
async fn resume_pending(supervisor: &Supervisor) -> usize {
    let Ok(records) = supervisor.stored_sessions().await else {
        return 0;
    };
    let mut started = 0;
    for record in records.into_iter().flatten() {
        if record.pending.is_empty() {
            continue;
        }
        match supervisor.session(record.key.as_str()).await {
            Ok(_) => started += 1,
            Err(e) => eprintln!("warden: session {}: {e}", record.key),
        }
    }
    started
}

/// Removes the turn logs that ended more than `keep` ago, every minute
/// (and once at start), until the handle is dropped.
fn expire_turns(
    turns: warden_store::SledTurns,
    keep: Duration,
) -> tokio_util::task::AbortOnDropHandle<()> {
    tokio_util::task::AbortOnDropHandle::new(tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(60));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let t = turns.clone();
            match tokio::task::spawn_blocking(move || t.expire(keep)).await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => eprintln!("warden: warning: cannot expire finished turn logs: {e}"),
                Err(e) => eprintln!("warden: warning: the turn log expiry failed: {e}"),
            }
        }
    }))
}

/// Runs `warden serve`.
pub(crate) async fn run(args: ServeArgs) -> Result<Exit, CliError> {
    if !args.listen.ip().is_loopback() && !args.allow_remote {
        return Err(CliError::usage(format!(
            "refusing to listen on {} (not loopback) without --allow-remote",
            args.listen
        )));
    }
    if let Some(url) = &args.base_url {
        check_url(url)?;
    }
    let mut config = SupervisorConfig::from_env().map_err(|e| CliError::usage(e.to_string()))?;
    config.session = config
        .session
        .with_max_reply_bytes(usize::try_from(args.max_reply_bytes).unwrap_or(usize::MAX))
        .with_idle_timeout(args.idle_timeout);
    config = config.with_max_sessions(usize::try_from(args.max_sessions).unwrap_or(usize::MAX));
    let data_dir = paths::data_dir(args.data_dir.clone())?;
    let token_file = args
        .token_file
        .clone()
        .unwrap_or_else(|| data_dir.join("token"));
    let token = token(&token_file)?;
    let lease_ttl = Some(args.lease_ttl)
        .filter(|t| *t >= Duration::from_millis(300))
        .ok_or_else(|| CliError::usage("--lease-ttl must be at least 0.3 seconds"))?;
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| CliError::failure(format!("cannot listen on {}: {e}", args.listen)))?;
    let addr = listener
        .local_addr()
        .map_err(|e| CliError::failure(e.to_string()))?;
    let mut cluster = match &args.store {
        Some(url) => {
            let id = crate::cluster::node_id(args.node_id.clone());
            let advertise = args
                .advertise
                .clone()
                .unwrap_or_else(|| format!("http://{addr}"));
            let balance = warden_pg::cluster::Balance::default()
                .with_interval(args.rebalance_interval)
                .with_limit(args.rebalance_limit)
                .with_threshold(args.rebalance_threshold);
            Some(
                crate::cluster::node(url, id, lease_ttl)
                    .await?
                    .with_advertise(advertise)
                    .with_return_grace(args.return_grace)
                    .with_keep_turns(args.keep_events)
                    .with_balance(balance),
            )
        }
        None => None,
    };
    let _printing = cluster.as_ref().map(crate::cluster::print_events);
    // A cluster keeps the HTTP agents' conversations in its database, so a
    // session taken over by another node resumes its conversation there.
    let conversations = cluster.as_ref().map(|node| {
        Arc::new(node.conversations()) as Arc<dyn warden_core::store::ConversationStore>
    });
    // One machine: the sessions and the turns' event logs in sled.
    let mut local_turns = None;
    let mut local_store = None;
    let store: Arc<dyn warden_core::SessionStore> = match &cluster {
        Some(node) => Arc::new(node.store().clone()),
        None => {
            let sled = paths::open_store_to_serve(&data_dir)?;
            local_turns = Some(sled.turns().map_err(|e| {
                CliError::failure(format!(
                    "cannot open the turn logs in {}: {e}",
                    data_dir.display()
                ))
            })?);
            local_store = Some(sled.clone());
            Arc::new(sled)
        }
    };
    // The agent CLIs' model traffic through the wire layer, which then
    // reaches what --base-url (or the CLI's own setting) names.
    let wire = crate::wire::Wire::for_agents(
        &args.agent,
        args.base_url.as_deref(),
        args.no_wire_watch,
        config.watchdog.default_timeout,
    )
    .await?;
    let settings = AgentSettings {
        wire: wire.as_ref(),
        base_url: args.base_url.clone(),
        model: args.model.clone(),
        claude_bin: args.claude_bin.clone(),
        data_dir: &data_dir,
        conversations,
    };
    let agents = Agents::new(&args.agent, settings, local_store.as_ref())?;
    let factory = agents.factory();
    let mut builder = Supervisor::builder(Arc::new(factory))
        .config(config)
        .store(store);
    let mut serve_config = ServeConfig::new(token)
        .with_token_file(std::path::absolute(&token_file).unwrap_or(token_file))
        .with_keep_finished(args.keep_events)
        .with_max_body_bytes(args.max_body_bytes);
    serve_config = agents.configure(serve_config);
    serve_config = serve_config.with_public_metrics(args.public_metrics);
    if let Some(url) = &args.jaeger_url {
        serve_config = serve_config.with_jaeger_url(url);
    }
    if let Some(node) = &cluster {
        // A node stores its turns' events in the database before sending
        // them, and relays the turns it re-delivers under their ids: a
        // client re-attaches to a turn on any node, whichever runs it.
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        builder = builder.recovered_turns(tx);
        serve_config = serve_config
            .with_turn_store(Arc::new(node.turns()))
            .with_recovered_turns(rx);
    }
    // One machine: the same, in its own database, so a turn survives a
    // restart (SIGTERM or kill -9) under its id; finished logs expire.
    let mut _expiring = None;
    if let Some(turns) = local_turns {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        builder = builder.recovered_turns(tx);
        serve_config = serve_config
            .with_turn_store(Arc::new(turns.clone()))
            .with_recovered_turns(rx);
        _expiring = Some(expire_turns(turns, args.keep_events));
    }
    let supervisor = builder.start().await?;
    match &mut cluster {
        Some(node) => {
            serve_config = serve_config.with_placement(node.placement());
            node.join(&supervisor).await.map_err(|e| {
                CliError::failure(format!("cannot register node {}: {e}", node.store().node()))
            })?;
        }
        None => {
            // Messages a previous run left pending (stopped mid-turn, or a
            // crash) are re-sent now, not when a client next talks to
            // their session.
            let resumed = resume_pending(&supervisor).await;
            if resumed > 0 {
                eprintln!("warden: re-sending the pending messages of {resumed} session(s)");
            }
        }
    }
    let app = warden_serve::router(supervisor.clone(), serve_config);
    if let Some(node) = &cluster {
        // Sessions of dead nodes (and this node's previous life) whose
        // leases ran out are taken over now, once the router relays their
        // re-delivered turns; the rest as they expire.
        node.take_over(&supervisor).await;
    }
    println!("listening on http://{addr}");
    let _ = std::io::stdout().flush();

    // On a signal: stop accepting; running turns get the grace period,
    // then the sessions stop (their messages stay pending for the next
    // start) and the open event streams end with them.
    let grace = args.grace;
    let (stopping_tx, mut stopping) = tokio::sync::watch::channel(false);
    // The answers made before any routing, in the API's error shape.
    let busy = warden_serve::api::Error::new(
        ErrorType::TooManyConnections,
        "warden serve: too many connections open; retry shortly",
    );
    let stalled = warden_serve::api::Error::new(
        ErrorType::RequestTimeout,
        "warden serve: the request body sent nothing for --header-timeout; send it again",
    );
    let limits = args.connections.limits(&busy.to_json(), &stalled.to_json());
    let server = warden_http::serve(listener, app, limits, async move {
        let _ = crate::signal::shutdown_signal().await;
        let _ = stopping_tx.send(true);
    });
    let server = tokio::spawn(server);
    let _ = stopping.wait_for(|s| *s).await;
    eprintln!(
        "warden: stopping: no new requests; running turns have {:.1}s to finish",
        grace.as_secs_f64()
    );
    let drained = tokio::time::timeout(grace, async {
        loop {
            let busy = match supervisor.stuck(Duration::ZERO).await {
                Ok(running) => !running.is_empty(),
                Err(_) => false,
            };
            if !busy {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    if drained.is_err() {
        eprintln!("warden: stopping the turns still running; their messages stay pending");
    }
    supervisor.shutdown().await;
    agents.shutdown().await;
    drop(wire);
    if let Some(node) = cluster {
        // The sessions stopped here (their messages pending in the
        // database) go to the other nodes now, not when the leases expire.
        node.leave().await;
    }
    // The event streams end with their turns; a client still connected
    // gets no more than a second.
    let _ = tokio::time::timeout(Duration::from_secs(1), server).await;
    Ok(Exit::Ok)
}

/// `--jaeger-url`: an `http://` or `https://` URL with a host (the console
/// makes links of it; anything else would be a link to nowhere, or a
/// `javascript:` one).
fn jaeger_url(value: &str) -> Result<String, String> {
    let url = reqwest::Url::parse(value).map_err(|e| format!("{value:?} is not a URL: {e}"))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        return Err(format!(
            "{value:?}: give an http:// or https:// URL with a host"
        ));
    }
    Ok(value.trim_end_matches('/').to_owned())
}
