//! PostgreSQL for the cluster tests: a fresh database on the shared server
//! `WARDEN_PG_URL` names (`.ci/postgres` starts it), an outage of one
//! database, and — for the tests that stop or restart the *server* — a
//! server of the test's own ([`OwnServer`]), so that no other test's
//! database goes down with it while they run side by side in this binary.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

/// The shared server's admin URL, or `None` (with the reason printed) when
/// `WARDEN_PG_URL` is unset and CI does not require it
/// (`WARDEN_REQUIRE_POSTGRES`).
fn shared_admin_url() -> Option<String> {
    let Ok(url) = std::env::var("WARDEN_PG_URL") else {
        assert!(
            std::env::var("WARDEN_REQUIRE_POSTGRES").as_deref() != Ok("1"),
            "WARDEN_REQUIRE_POSTGRES=1 but WARDEN_PG_URL is unset"
        );
        eprintln!("skipped: set WARDEN_PG_URL to a PostgreSQL admin URL to run this test");
        return None;
    };
    Some(url)
}

/// Creates a database named `prefix_<pid>_<nanos>` through `admin_url`
/// and gives its URL.
fn create_db(admin_url: &str, prefix: &str) -> String {
    let name = format!(
        "{prefix}_{}_{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
    );
    sql_on(admin_url, &format!("CREATE DATABASE {name}"));
    let (base, _) = admin_url.rsplit_once('/').expect("a URL with a database");
    format!("{base}/{name}")
}

/// Runs `sql` through `url` with `psql`, failing the test if it fails.
fn sql_on(url: &str, sql: &str) {
    let psql = std::process::Command::new("psql")
        .args([url, "-qAtc", sql])
        .output()
        .expect("psql runs");
    assert!(
        psql.status.success(),
        "{sql}: {}",
        String::from_utf8_lossy(&psql.stderr)
    );
}

/// A fresh database on the shared server (`WARDEN_PG_URL`), or `None`
/// (with the reason printed) when the variable is unset and CI does not
/// require it.
pub(crate) async fn fresh_db(prefix: &str) -> Option<String> {
    let url = shared_admin_url()?;
    Some(create_db(&url, prefix))
}

/// Runs `sql` on the shared server's admin URL, failing the test if it
/// fails.
pub(crate) fn admin_sql(sql: &str) {
    let url = std::env::var("WARDEN_PG_URL").expect("WARDEN_PG_URL");
    sql_on(&url, sql);
}

/// Database `db` goes away as in a restart (new connections refused, the
/// open ones cut), until [`database_back`]. Only `db` goes: the shared
/// server keeps serving every other test.
pub(crate) fn database_away(db: &str) {
    admin_sql(&format!("ALTER DATABASE {db} ALLOW_CONNECTIONS false"));
    admin_sql(&format!(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{db}'"
    ));
}

/// Database `db` takes connections again.
pub(crate) fn database_back(db: &str) {
    admin_sql(&format!("ALTER DATABASE {db} ALLOW_CONNECTIONS true"));
}

/// Database `db` goes away (as [`database_away`]) for `outage`, then takes
/// connections again.
pub(crate) async fn database_away_for(db: &str, outage: Duration) {
    database_away(db);
    tokio::time::sleep(outage).await;
    database_back(db);
}

/// A PostgreSQL server of one test's own, for a test that stops or
/// restarts the whole server: made with the shared server's binaries
/// (found through `WARDEN_PG_CTL`, which `.ci/postgres` exports), as the
/// same user (`initdb` refuses root), in a temp dir, on a free loopback
/// port, without TLS (the tests that need TLS use the shared server).
/// Stopped and removed when dropped. About a second to make.
pub(crate) struct OwnServer {
    /// Its admin URL (the `postgres` database, user `warden`).
    url: String,
    /// Its `pg_ctl` command line, as `WARDEN_PG_CTL` gives the shared
    /// one's: the user it runs as, the binary, `-D` and `-l` given.
    ctl: Vec<String>,
    /// The directory holding its data, socket and log.
    dir: String,
}

impl OwnServer {
    /// Makes and starts one, or `None` (with the reason printed) when
    /// `WARDEN_PG_CTL` is unset and CI does not require PostgreSQL.
    pub(crate) async fn start() -> Option<Self> {
        let Ok(shared) = std::env::var("WARDEN_PG_CTL") else {
            assert!(
                std::env::var("WARDEN_REQUIRE_POSTGRES").as_deref() != Ok("1"),
                "WARDEN_REQUIRE_POSTGRES=1 but WARDEN_PG_CTL is unset (.ci/postgres exports it)"
            );
            eprintln!("skipped: set WARDEN_PG_CTL to the server's pg_ctl (source .ci/postgres)");
            return None;
        };
        let shared: Vec<String> = shared.split_whitespace().map(str::to_owned).collect();
        let at = shared
            .iter()
            .position(|a| a.ends_with("/pg_ctl") || a == "pg_ctl")
            .expect("WARDEN_PG_CTL names pg_ctl");
        // `runuser -u warden-pg --` when the tests run as root, else empty.
        let as_user = shared[..at].to_vec();
        let bin = Path::new(&shared[at])
            .parent()
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_default();
        let tool = move |name: &str| {
            if bin.is_empty() {
                name.to_owned()
            } else {
                format!("{bin}/{name}")
            }
        };
        tokio::task::spawn_blocking(move || {
            // As the server's user (`as_user`, a `runuser … --` prefix or
            // empty): the directory is made by it, so it may write there.
            let by_user = |program: &str| [as_user.as_slice(), &[program.to_owned()]].concat();
            let made = run(&by_user("mktemp"), &["-d", "/tmp/warden-pg-own.XXXXXX"]);
            let dir = String::from_utf8_lossy(&made.stdout).trim().to_owned();
            let data = format!("{dir}/data");
            run(
                &by_user(&tool("initdb")),
                &[
                    "-D",
                    &data,
                    "-U",
                    "warden",
                    "--auth=trust",
                    "-E",
                    "UTF8",
                    "--no-sync",
                ],
            );
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .expect("a free port")
                .port();
            let mut ctl = as_user.clone();
            ctl.extend([
                tool("pg_ctl"),
                "-D".into(),
                data,
                "-l".into(),
                format!("{dir}/log"),
            ]);
            let opts =
                format!("-p {port} -k {dir} -c listen_addresses=127.0.0.1 -c max_connections=300");
            run(&ctl, &["-w", "-t", "30", "-o", &opts, "start"]);
            Self {
                url: format!("postgres://warden@127.0.0.1:{port}/postgres"),
                ctl,
                dir,
            }
        })
        .await
        .map(Some)
        .expect("making a server of the test's own")
    }

    /// A fresh database on this server.
    pub(crate) fn fresh_db(&self, prefix: &str) -> String {
        create_db(&self.url, prefix)
    }

    /// Its `pg_ctl` command line, for [`server_down_for`] and restarts.
    pub(crate) fn ctl(&self) -> &[String] {
        &self.ctl
    }
}

impl Drop for OwnServer {
    fn drop(&mut self) {
        let _ = std::process::Command::new(&self.ctl[0])
            .args(&self.ctl[1..])
            .args(["-m", "immediate", "-w", "stop"])
            .stdin(Stdio::null())
            .output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Runs command line `line` (a program and its first arguments: a
/// `runuser … --` prefix, `pg_ctl -D … -l …`) with `args`, failing the
/// test if it fails; its output.
fn run(line: &[String], args: &[&str]) -> std::process::Output {
    let out = std::process::Command::new(&line[0])
        .args(&line[1..])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{line:?} runs: {e}"));
    assert!(
        out.status.success(),
        "{line:?} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Restarts the server `ctl` runs as an operator does (`pg_ctl restart -m
/// fast`); how long it took.
pub(crate) fn restart(ctl: &[String]) -> Duration {
    let t0 = std::time::Instant::now();
    run(ctl, &["-m", "fast", "-w", "-t", "30", "restart"]);
    t0.elapsed()
}

/// Stops the whole database server as an operator does (`pg_ctl stop -m
/// fast`: connections cut, new ones refused), keeps it down for `down`,
/// then starts it again with the options it ran with (its
/// `postmaster.opts`: `pg_ctl start` does not reuse them as `restart`
/// does).
pub(crate) async fn server_down_for(ctl: &[String], down: Duration) {
    let data = ctl
        .iter()
        .position(|a| a == "-D")
        .and_then(|i| ctl.get(i + 1))
        .expect("the pg_ctl command line names the data directory (-D)");
    let opts = std::fs::read_to_string(Path::new(data).join("postmaster.opts"))
        .expect("the server's postmaster.opts");
    // The server's binary, then its arguments, each quoted.
    let args = opts
        .trim()
        .split_once(' ')
        .map(|(_, rest)| rest.to_owned())
        .unwrap_or_default();
    let (stop, start) = (ctl.to_vec(), ctl.to_vec());
    tokio::task::spawn_blocking(move || run(&stop, &["-m", "fast", "-w", "stop"]))
        .await
        .expect("pg_ctl stop");
    tokio::time::sleep(down).await;
    tokio::task::spawn_blocking(move || run(&start, &["-w", "-t", "30", "-o", &args, "start"]))
        .await
        .expect("pg_ctl start");
}
