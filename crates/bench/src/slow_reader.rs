//! Section 15, `slow_reader`: what a client that opens a turn's event
//! stream and never reads costs `warden serve`, and that the cost does not
//! grow with the reply (issue 52 item 11b).
//!
//! The real `warden` binary (`WARDEN_BIN`, else the `warden` beside this
//! benchmark in the target directory: `cargo build --release -p warden`
//! first) runs `warden serve` with its sled store in front of the mock,
//! which streams a reply of 8 KiB deltas back to back. A raw TCP client
//! sends `POST /v1/turns` asking for the event stream and never reads a
//! byte of the answer. Each run is a fresh process, so its peak resident
//! memory (`VmHWM`) is that run's alone. Printed: the server's RSS idle
//! (the baseline), its peak with a never-reading client at a small and a
//! ten times larger reply (the ratio should stay near 1: a paused turn
//! holds what was in flight, not the reply), and its peak with a client
//! that reads the small reply whole, for contrast.

use std::io::BufRead;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use tokio::io::AsyncWriteExt;
use warden_mock::{MockConfig, MockServer};

const TOKEN: &str = "bench-slow-reader-token";
/// One delta's text: 8 KiB, as in the hand measurement of
/// docs/performance.md.
const DELTA: usize = 8 * 1024;

/// The `warden` binary to run, or why there is none.
fn warden_bin() -> Result<PathBuf, String> {
    if let Some(bin) = std::env::var_os("WARDEN_BIN").filter(|v| !v.is_empty()) {
        return Ok(PathBuf::from(bin));
    }
    // target/<profile>/deps/watchdog-<hash> → target/<profile>/warden
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let beside = exe
        .parent()
        .and_then(|deps| deps.parent())
        .map(|profile| profile.join("warden"))
        .ok_or("no target directory")?;
    if beside.is_file() {
        Ok(beside)
    } else {
        Err(format!(
            "no warden binary at {} (cargo build --release -p warden, or set WARDEN_BIN)",
            beside.display()
        ))
    }
}

/// A reply of about `bytes` bytes in [`DELTA`]-sized words: the mock
/// sends each word as one delta.
fn reply(bytes: usize) -> String {
    let word = format!("{} ", "x".repeat(DELTA - 1));
    word.repeat(bytes.div_ceil(DELTA))
}

/// A field of `/proc/<pid>/status` in KiB.
fn status_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

/// A `warden serve` in front of `upstream`, killed on drop.
struct Server {
    child: std::process::Child,
    addr: String,
    _dir: tempfile::TempDir,
}

impl Server {
    fn start(bin: &PathBuf, upstream: &str) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let token = dir.path().join("token");
        std::fs::write(&token, TOKEN).expect("token file");
        let mut child = std::process::Command::new(bin)
            .args(["serve", "--listen", "127.0.0.1:0", "--agent", "anthropic"])
            .arg("--base-url")
            .arg(upstream)
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .arg("--token-file")
            .arg(&token)
            .env("ANTHROPIC_API_KEY", "dummy")
            .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("warden serve");
        let stdout = child.stdout.take().expect("stdout");
        let mut line = String::new();
        std::io::BufReader::new(stdout)
            .read_line(&mut line)
            .expect("warden serve's address");
        let addr = line
            .trim()
            .strip_prefix("listening on http://")
            .unwrap_or_else(|| panic!("warden serve printed {line:?}, not its address"))
            .to_owned();
        Self {
            child,
            addr,
            _dir: dir,
        }
    }

    fn rss_kib(&self) -> u64 {
        status_kib(self.child.id(), "VmRSS:")
    }

    fn peak_kib(&self) -> u64 {
        status_kib(self.child.id(), "VmHWM:")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A turn asked for with its event stream on a raw connection, returned
/// unread.
async fn open_turn(addr: &str, key: &str) -> tokio::net::TcpStream {
    let body = serde_json::json!({"key": key, "message": "a long reply, please"}).to_string();
    let request = format!(
        "POST /v1/turns HTTP/1.1\r\nhost: {addr}\r\nauthorization: Bearer {TOKEN}\r\n\
         accept: text/event-stream\r\ncontent-type: application/json\r\n\
         content-length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut tcp = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connect to warden serve");
    tcp.write_all(request.as_bytes())
        .await
        .expect("send the turn");
    tcp
}

/// One run: a fresh server, a turn of `bytes`, a client that reads it
/// whole or never reads for `hold`; the server's idle RSS and peak (KiB),
/// and whether the reader saw the turn's `done`.
async fn run(bin: &PathBuf, bytes: usize, reads: bool, hold: Duration) -> (u64, u64, bool) {
    let mock = MockServer::start(
        MockConfig::default()
            .with_reply(reply(bytes))
            .with_frame_interval(Duration::ZERO),
    )
    .await
    .expect("mock");
    let server = Server::start(bin, &mock.base_url());
    tokio::time::sleep(Duration::from_millis(500)).await;
    let idle = server.rss_kib();
    let mut tcp = open_turn(&server.addr, "slow-reader").await;
    let mut done = false;
    if reads {
        // Read to the end of the turn (its `done` event), bounded.
        let until = Instant::now() + Duration::from_secs(120);
        let mut buf = vec![0u8; 64 * 1024];
        let mut tail = Vec::new();
        while Instant::now() < until {
            use tokio::io::AsyncReadExt;
            match tokio::time::timeout(Duration::from_secs(30), tcp.read(&mut buf)).await {
                Ok(Ok(n)) if n > 0 => {
                    // The marker may straddle two reads: keep a few bytes.
                    tail.extend_from_slice(&buf[..n]);
                    if tail.windows(11).any(|w| w == b"event: done") {
                        done = true;
                        break;
                    }
                    let keep = tail.len().saturating_sub(16);
                    tail.drain(..keep);
                }
                _ => break,
            }
        }
    } else {
        tokio::time::sleep(hold).await;
    }
    let peak = server.peak_kib();
    drop(tcp);
    drop(server);
    mock.shutdown().await;
    (idle, peak, done)
}

pub async fn bench_slow_reader(quick: bool) {
    println!(
        "\n## 15. slow_reader: a client that never reads a turn's event stream (warden serve)"
    );
    let bin = match warden_bin() {
        Ok(bin) => bin,
        Err(why) => {
            println!("slow_reader: skipped, {why}");
            return;
        }
    };
    let (small, large, hold) = if quick {
        (5 << 20, 50 << 20, Duration::from_secs(4))
    } else {
        (5 << 20, 50 << 20, Duration::from_secs(10))
    };
    let mb = |kib: u64| kib as f64 / 1024.0;
    let (idle, small_peak, _) = run(&bin, small, false, hold).await;
    let (_, large_peak, _) = run(&bin, large, false, hold).await;
    let started = Instant::now();
    let (_, read_peak, done) = run(&bin, small, true, hold).await;
    let read_in = started.elapsed();
    println!("warden serve idle (baseline): {:.1} MB RSS", mb(idle));
    println!(
        "never-reading client, {} MB reply, held {:?}: peak {:.1} MB ({:+.1} MB over idle)",
        small >> 20,
        hold,
        mb(small_peak),
        mb(small_peak.saturating_sub(idle))
    );
    println!(
        "never-reading client, {} MB reply, held {:?}: peak {:.1} MB ({:+.1} MB over idle)",
        large >> 20,
        hold,
        mb(large_peak),
        mb(large_peak.saturating_sub(idle))
    );
    println!(
        "a client that reads the {} MB reply whole: peak {:.1} MB ({:+.1} MB over idle; {} in {:.1?})",
        small >> 20,
        mb(read_peak),
        mb(read_peak.saturating_sub(idle)),
        if done { "the turn done" } else { "NOT done" },
        read_in
    );
    println!(
        "ratio never-reading peak {} MB / {} MB reply: {:.2}x (a 10x reply; ~1 means the cost does not grow with it)",
        large >> 20,
        small >> 20,
        large_peak as f64 / small_peak.max(1) as f64
    );
    println!(
        "ratio never-reading peak / idle: {:.2}x; never-reading / reading ({} MB): {:.2}x",
        large_peak as f64 / idle.max(1) as f64,
        small >> 20,
        small_peak as f64 / read_peak.max(1) as f64
    );
}
