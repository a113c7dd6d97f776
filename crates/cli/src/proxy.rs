//! `warden proxy`: the watchdog, retries and continuation in front of
//! unmodified clients (`warden-proxy`).

use std::io::Write as _;
use std::net::SocketAddr;
use std::time::Duration;

use warden_proxy::{Proxy, ProxyConfig};

use crate::exit::{CliError, Exit};

use crate::sources::check_url;

/// Arguments of `warden proxy`.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Forwards Anthropic Messages, OpenAI chat-completions / Responses and Gemini
(/v1beta/models/<model>:streamGenerateContent, :generateContent) requests to the real API
and watches every streamed answer: silence past --timeout kills the upstream attempt; a
request nothing of which reached the client yet is retried (retry-after honoured, backoff
shared); a reply broken mid-text is continued and spliced into the same response; where
neither is possible the stream ends with the provider's own retryable error event. A
request without \"stream\": true is sent upstream as a stream and its JSON answer assembled
here: tool input that is not JSON, a reply past --max-reply-bytes and an answer that is
neither a stream nor JSON are errors in the provider's shape (502), never a made-up answer
(Gemini's :generateContent likewise). Other /v1/ and /v1beta/ requests pass through untouched; other paths are answered here (200 for HEAD /, else
404) unless --other-upstream names where they go. Each kill, retry, continuation, give-up
and unreachable upstream is one `warden proxy:` line on stderr (without --json). Headers
(API keys) are forwarded, never logged. The first line on stdout says where it listens.
See docs/proxy.md.

Examples:
  warden proxy &
  ANTHROPIC_BASE_URL=http://127.0.0.1:8787 claude
  OPENAI_BASE_URL=http://127.0.0.1:8787/v1 python my_agent.py
  GOOGLE_GEMINI_BASE_URL=http://127.0.0.1:8787 gemini")]
pub(crate) struct ProxyArgs {
    /// Address to listen on (`127.0.0.1:0` picks a free port).
    #[arg(long, default_value = "127.0.0.1:8787", value_name = "ADDR")]
    listen: SocketAddr,
    /// Allow listening on an address other than loopback.
    #[arg(long)]
    allow_remote: bool,
    /// Where Anthropic requests go (those with an `anthropic-version`
    /// header). Default `https://api.anthropic.com`. An upstream named here
    /// is checked for reachability at start; the defaults are not (an
    /// upstream nobody uses is never probed).
    #[arg(long, value_name = "URL")]
    anthropic_upstream: Option<String>,
    /// Where OpenAI requests go (API requests without `anthropic-version`).
    /// Default `https://api.openai.com`.
    #[arg(long, value_name = "URL")]
    openai_upstream: Option<String>,
    /// Where Gemini requests go (paths under `/v1beta/`). Default
    /// `https://generativelanguage.googleapis.com`.
    #[arg(long, value_name = "URL")]
    gemini_upstream: Option<String>,
    /// Where requests for other paths (not `/v1/…`) go, unwatched. Without
    /// it the proxy answers them itself (200 for `HEAD /`, else 404).
    #[arg(long, value_name = "URL")]
    other_upstream: Option<String>,
    /// Silence allowed on an upstream stream: milliseconds (a bare
    /// number), or a duration with a unit (45s, 2m). Default
    /// WARDEN_STREAM_TIMEOUT (also milliseconds), else 45s. A value under
    /// one second is warned about at start (`--timeout 45` is 45 ms).
    #[arg(long, value_name = "MS", value_parser = crate::units::millis)]
    timeout: Option<Duration>,
    /// Content allowance: an upstream attempt that sends no content (only
    /// pings, comments or empty chunks) for this long is killed and
    /// retried or continued like a silent one: milliseconds, or a duration
    /// with a unit. Default 180s (Claude Code counts pings as life; its
    /// own idle timeout, 300s by default, shortened by
    /// CLAUDE_BYTE_STREAM_IDLE_TIMEOUT_MS to 10s at the least, counts only
    /// silence).
    #[arg(long, value_name = "MS", value_parser = crate::units::millis,
          conflicts_with = "no_progress_timeout")]
    progress_timeout: Option<Duration>,
    /// Turns the content allowance off: pings alone keep a stream alive.
    #[arg(long)]
    no_progress_timeout: bool,
    /// Holds thinking back until it is whole (an Anthropic thinking block,
    /// a Responses reasoning item, a Gemini reply's thought parts before
    /// its text), so a stream that breaks inside it is retried from
    /// scratch unseen instead of ending with an error event (which a
    /// streaming SDK raises). The client gets the thinking at once when it
    /// ends; the text after it is not delayed.
    #[arg(long)]
    hold_thinking: bool,
    /// Consecutive attempts that could not reach an upstream (refused,
    /// reset, DNS, TLS) before new requests to it are answered at once,
    /// naming the cause, until a probe gets an answer. 0 turns it off.
    #[arg(long, value_name = "N", default_value_t = 2)]
    circuit_after: u32,
    /// While an upstream's circuit is open, how often one request goes
    /// through as a probe: milliseconds (a bare number), or a duration
    /// with a unit (5s). Not 0: --circuit-after 0 turns the circuit off.
    #[arg(long, value_name = "MS", default_value = "5s", value_parser = probe_interval)]
    probe_every: Duration,
    /// Wall-clock cap of one request, attempts and backoff included:
    /// milliseconds (a bare number), or a duration with a unit (10m).
    /// Default: none.
    #[arg(long, value_name = "MS", value_parser = crate::units::millis)]
    deadline: Option<Duration>,
    /// On SIGTERM/Ctrl-C, how long open responses may go on before they
    /// are ended with the provider's error event: milliseconds (a bare
    /// number), or a duration with a unit (10s). A second signal exits at
    /// once.
    #[arg(long, value_name = "MS", default_value = "10s", value_parser = crate::units::millis)]
    grace: Duration,
    /// Size cap of a whole answer the proxy holds, in bytes: one it
    /// assembles for a client that asked for no stream (text, thinking and
    /// tool input), or one an upstream gives whole instead of a stream.
    /// Past it nothing more is read and the client gets a 502 naming
    /// EREPLY_TOO_LARGE. Streams pass as they come and are not capped.
    #[arg(long, value_name = "BYTES", default_value_t = DEFAULT_MAX_REPLY_BYTES,
          value_parser = clap::value_parser!(u64).range(1..))]
    max_reply_bytes: u64,
    #[command(flatten)]
    connections: crate::connections::ConnectionArgs,
    /// One JSON access-log line per request on stdout (status, duration,
    /// attempts, kills, continuations, the error code; never headers or
    /// bodies). The `warden proxy:` lines on stderr stay.
    #[arg(long)]
    json: bool,
}

/// `--max-reply-bytes`: 16 MiB, as `warden serve`'s.
const DEFAULT_MAX_REPLY_BYTES: u64 = warden_proxy::DEFAULT_MAX_REPLY_BYTES as u64;

/// Runs `warden proxy` until SIGTERM or Ctrl-C.
pub(crate) async fn run(args: ProxyArgs) -> Result<Exit, CliError> {
    if !args.listen.ip().is_loopback() && !args.allow_remote {
        return Err(CliError::usage(format!(
            "refusing to listen on {} (not loopback) without --allow-remote: the proxy forwards \
             whatever API key its clients send",
            args.listen
        )));
    }
    let anthropic = args
        .anthropic_upstream
        .clone()
        .unwrap_or_else(|| warden_proxy::ANTHROPIC_API.to_owned());
    let openai = args
        .openai_upstream
        .clone()
        .unwrap_or_else(|| warden_proxy::OPENAI_API.to_owned());
    let gemini = args
        .gemini_upstream
        .clone()
        .unwrap_or_else(|| warden_proxy::GEMINI_API.to_owned());
    check_url(&anthropic)?;
    check_url(&openai)?;
    check_url(&gemini)?;
    if let Some(url) = &args.other_upstream {
        check_url(url)?;
    }
    // `--timeout` wins; without it a bad WARDEN_STREAM_TIMEOUT is refused
    // rather than replaced by the default.
    let base = match args.timeout {
        Some(t) => ProxyConfig::default().with_timeout(t),
        None => ProxyConfig::from_env().map_err(|e| CliError::usage(e.to_string()))?,
    };
    let mut config = base
        .with_anthropic_upstream(&anthropic)
        .with_openai_upstream(&openai)
        .with_gemini_upstream(&gemini)
        .with_max_reply_bytes(usize::try_from(args.max_reply_bytes).unwrap_or(usize::MAX));
    if let Some(url) = &args.other_upstream {
        config = config.with_other_upstream(url);
    }
    if let Some(p) = args.progress_timeout {
        config = config.with_progress_timeout(p);
    }
    if args.no_progress_timeout {
        config = config.without_progress_timeout();
    }
    config = config.with_hold_thinking(args.hold_thinking);
    config = config.with_circuit((args.circuit_after > 0).then(|| {
        warden_proxy::CircuitConfig::default()
            .after(args.circuit_after)
            .probe_every(args.probe_every)
    }));
    // A bare number is milliseconds, for every duration flag: `--timeout
    // 45` is 45 ms, which kills every real stream. Said once, at start.
    for (flag, value) in [
        ("--timeout", Some(config.timeout)),
        ("--progress-timeout", args.progress_timeout),
        ("--probe-every", Some(args.probe_every)),
        ("--deadline", args.deadline),
        ("--grace", Some(args.grace)),
    ] {
        if let Some(d) = value.filter(|d| *d < Duration::from_secs(1)) {
            eprintln!(
                "warden proxy: warning: {flag} is {} ms (a bare number is milliseconds; write e.g. 45s for seconds)",
                d.as_millis()
            );
        }
    }
    config = config.with_connection_limits(
        args.connections.header_timeout,
        args.connections.max_connections(),
    );
    if let Some(d) = args.deadline {
        config = config.with_deadline(d);
    }
    // One line per kill, retry, continuation, give-up, unreachable
    // upstream and circuit change: what the proxy did is visible with or
    // without the access log.
    // Each line says when (RFC 3339, UTC) and, for a request's, which
    // request (`#7`, its access record's `id`).
    config = config.with_recovery_log(|recovery| {
        eprintln!("warden proxy: {} {recovery}", now());
    });
    if args.json {
        config = config.with_access_log(|record| {
            let line = AccessLine {
                at: now().to_string(),
                record,
            };
            if let Ok(line) = serde_json::to_string(&line) {
                let mut out = std::io::stdout().lock();
                let _ = writeln!(out, "{line}");
                let _ = out.flush();
            }
        });
    }
    let config_summary = Summary {
        timeout: config.timeout,
        progress: config.progress_timeout,
    };
    let proxy = Proxy::start(config)
        .await
        .map_err(|e| CliError::usage(e.to_string()))?;
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| CliError::failure(format!("cannot listen on {}: {e}", args.listen)))?;
    let addr = listener
        .local_addr()
        .map_err(|e| CliError::failure(e.to_string()))?;
    println!("listening on http://{addr}");
    let _ = std::io::stdout().flush();
    // Where it listens and how it judges streams, in one line.
    let secs = |d: Duration| format!("{}s", d.as_secs_f64());
    eprintln!(
        "warden proxy: listening on http://{addr}; anthropic -> {anthropic}, openai -> {openai}, gemini -> {gemini}{}; timeout {}, progress allowance {}, circuit {}",
        args.other_upstream
            .as_deref()
            .map(|u| format!(", other paths -> {u}"))
            .unwrap_or_default(),
        secs(config_summary.timeout),
        config_summary
            .progress
            .map_or_else(|| "off".to_owned(), secs),
        if args.circuit_after > 0 {
            format!(
                "after {} unreachable attempt(s), probe every {}",
                args.circuit_after,
                secs(args.probe_every)
            )
        } else {
            "off".to_owned()
        },
    );
    // An upstream the user named that cannot be reached now is said at
    // once, not at the first request. The defaults are not probed: an
    // upstream nobody uses is nobody's concern.
    let mut upstreams = Vec::new();
    if let Some(url) = &args.anthropic_upstream {
        upstreams.push(("Anthropic", url.clone()));
    }
    if let Some(url) = &args.openai_upstream {
        upstreams.push(("OpenAI", url.clone()));
    }
    if let Some(url) = &args.gemini_upstream {
        upstreams.push(("Gemini", url.clone()));
    }
    if let Some(url) = &args.other_upstream {
        upstreams.push(("other", url.clone()));
    }
    let _probes = tokio_util::task::AbortOnDropHandle::new(tokio::spawn(async move {
        for (name, url) in upstreams {
            if let Err(why) = reachable(&url).await {
                eprintln!(
                    "warden proxy: warning: the {name} upstream {url} cannot be reached ({why}); \
                     requests to it fail until it can"
                );
            }
        }
    }));
    // A signal stops accepting at once; open responses get the grace
    // period, then are ended with the provider's error event; whatever is
    // left (a pass-through body) gets one more second. A second signal
    // exits at once.
    let server = tokio::spawn({
        let proxy = proxy.clone();
        async move {
            proxy
                .serve(listener, async {
                    let _ = crate::signal::shutdown_signal().await;
                })
                .await
        }
    });
    let mut server = server;
    tokio::select! {
        ended = &mut server => {
            // The server stopped on its own, before any signal.
            proxy.stop();
            return match ended {
                Ok(Ok(())) => Ok(Exit::Ok),
                Ok(Err(e)) => Err(CliError::failure(format!("the proxy stopped: {e}"))),
                Err(e) => Err(CliError::failure(format!("the proxy stopped: {e}"))),
            };
        }
        _ = crate::signal::shutdown_signal() => {}
    }
    let grace = args.grace;
    eprintln!(
        "warden proxy: stopping: no new requests; open responses have {:.1}s (a second signal exits now)",
        grace.as_secs_f64()
    );
    let insist = crate::signal::second_signal();
    tokio::pin!(insist);
    let finished = tokio::select! {
        r = tokio::time::timeout(grace, &mut server) => r.ok(),
        () = &mut insist => return Ok(crate::signal::received().map_or(Exit::Ok, |s| s.exit())),
    };
    if finished.is_none() {
        eprintln!("warden proxy: ending the responses still open");
        proxy.end_open_responses();
        tokio::select! {
            _ = tokio::time::timeout(Duration::from_secs(1), &mut server) => {}
            () = &mut insist => {}
        }
    }
    proxy.stop();
    Ok(Exit::Ok)
}

/// `--probe-every`: a duration as every flag reads one, more than zero (a
/// probe on every request is no circuit; turning it off has its flag).
fn probe_interval(value: &str) -> Result<Duration, String> {
    let every = crate::units::millis(value)?;
    if every.is_zero() {
        return Err(
            "a probe interval of 0 is no circuit; to turn the circuit off, use --circuit-after 0"
                .to_owned(),
        );
    }
    Ok(every)
}

/// The time now, as the proxy's lines give it: RFC 3339, UTC, in
/// milliseconds (as `warden serve`'s events' `at`).
fn now() -> humantime::Rfc3339Timestamp {
    humantime::format_rfc3339_millis(std::time::SystemTime::now())
}

/// One `--json` access-log line: when it was written, then the record.
#[derive(serde::Serialize)]
struct AccessLine<'a> {
    at: String,
    #[serde(flatten)]
    record: &'a warden_proxy::AccessRecord,
}

/// What the start line says of the configuration.
struct Summary {
    timeout: Duration,
    progress: Option<Duration>,
}

/// Whether a TCP connection to `url`'s host and port opens within 3 s.
async fn reachable(url: &str) -> Result<(), String> {
    let parsed = reqwest::Url::parse(url).map_err(|e| e.to_string())?;
    let host = parsed.host_str().ok_or("no host")?.to_owned();
    let port = parsed.port_or_known_default().ok_or("no port")?;
    let connect = tokio::net::TcpStream::connect((host.as_str(), port));
    match tokio::time::timeout(Duration::from_secs(3), connect).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("no answer within 3 s".to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use super::*;

    #[derive(clap::Parser)]
    struct Command {
        #[command(flatten)]
        args: ProxyArgs,
    }

    #[test]
    fn the_reply_cap_is_serves_and_zero_is_refused() {
        let parsed = Command::try_parse_from(["proxy"]).expect("defaults");
        assert_eq!(parsed.args.max_reply_bytes, 16 * 1024 * 1024);
        let parsed =
            Command::try_parse_from(["proxy", "--max-reply-bytes", "65536"]).expect("a cap");
        assert_eq!(parsed.args.max_reply_bytes, 65_536);
        assert!(Command::try_parse_from(["proxy", "--max-reply-bytes", "0"]).is_err());
        assert!(Command::try_parse_from(["proxy", "--max-reply-bytes", "16MiB"]).is_err());
    }

    #[test]
    fn every_duration_flag_reads_a_bare_number_as_milliseconds() {
        let parsed = Command::try_parse_from(["proxy"]).expect("defaults");
        assert_eq!(parsed.args.probe_every, Duration::from_secs(5));
        assert_eq!(parsed.args.grace, Duration::from_secs(10));
        let parsed = Command::try_parse_from([
            "proxy",
            "--timeout",
            "1500",
            "--progress-timeout",
            "1500",
            "--probe-every",
            "1500",
            "--deadline",
            "1500",
            "--grace",
            "1500",
        ])
        .expect("bare numbers");
        let ms = Duration::from_millis(1500);
        let a = parsed.args;
        assert_eq!(
            [
                a.timeout,
                a.progress_timeout,
                Some(a.probe_every),
                a.deadline,
                Some(a.grace)
            ],
            [Some(ms); 5]
        );
    }

    #[test]
    fn a_probe_interval_of_zero_is_refused_naming_the_flag_that_turns_the_circuit_off() {
        for zero in ["0", "0s", "0ms"] {
            let error = Command::try_parse_from(["proxy", "--probe-every", zero])
                .err()
                .expect("refused");
            assert_eq!(error.kind(), clap::error::ErrorKind::ValueValidation);
            assert!(error.to_string().contains("--circuit-after 0"), "{error}");
        }
    }
}
