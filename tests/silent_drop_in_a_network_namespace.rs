//! A kernel-level silent death, as in the original bug report's firewall
//! test: server and client run inside a network namespace this test
//! creates; mid-stream an nftables rule drops every packet of the
//! connection, so no FIN or RST ever arrives. The watchdog must surface
//! `ESTREAM_TIMEOUT` within the allowance plus the documented bound, and the
//! retry must go through once the rule is removed.
//!
//! Needs root, `ip` (iproute2) and `nft` (nftables). Without them the test
//! prints why and passes, unless `WARDEN_REQUIRE_NETNS=1` (set by `.ci/run`,
//! which installs both) makes that a failure.
//!
//! A binary of its own, not a module of `tests/it`: it enters a network
//! namespace and changes the firewall, which the whole process would share.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use warden_core::{LifecycleEvent, RetryPolicy};
use warden_mock::{MockConfig, MockServer, Scenario};

const CHILD_ENV: &str = "WARDEN_NETNS_CHILD";
const TEST: &str = "a_silently_dropped_connection_is_killed_and_the_retry_succeeds";
const ALLOWANCE: Duration = Duration::from_millis(1500);
/// The documented late-kill bound on a lightly loaded watchdog, with slack
/// for a debug build on a busy 2-core CI machine.
const BOUND: Duration = Duration::from_millis(500);

fn run(cmd: &str, args: &[&str]) -> Result<(), String> {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .map_err(|e| format!("{cmd}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{cmd} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn missing_prerequisite() -> Option<String> {
    let root = Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false);
    if !root {
        return Some("needs root".into());
    }
    for tool in ["ip", "nft"] {
        if Command::new(tool).arg("-V").output().is_err() {
            return Some(format!("`{tool}` is not installed"));
        }
    }
    None
}

#[test]
fn a_silently_dropped_connection_is_killed_and_the_retry_succeeds() {
    if std::env::var_os(CHILD_ENV).is_some() {
        child();
        return;
    }
    if let Some(why) = missing_prerequisite() {
        assert!(
            std::env::var("WARDEN_REQUIRE_NETNS").as_deref() != Ok("1"),
            "WARDEN_REQUIRE_NETNS=1 but {why}"
        );
        println!("SKIPPED {TEST}: {why}");
        return;
    }
    let ns = format!("warden-test-{}", std::process::id());
    run("ip", &["netns", "add", &ns]).expect("create the namespace");
    let result = (|| {
        run("ip", &["-n", &ns, "link", "set", "lo", "up"])?;
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let exe = exe.to_string_lossy().into_owned();
        let out = Command::new("ip")
            .args(["netns", "exec", &ns, &exe, TEST, "--exact", "--nocapture"])
            .env(CHILD_ENV, "1")
            .output()
            .map_err(|e| e.to_string())?;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        if !out.status.success() || !stdout.contains("NETNS-CHILD-OK") {
            return Err(format!(
                "child failed ({}):\n{stdout}\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Ok(stdout)
    })();
    let _ = run("ip", &["netns", "del", &ns]);
    let stdout = result.expect("the scenario inside the namespace");
    println!("{stdout}");
}

/// Runs inside the namespace: mock server and warden on the namespace's
/// loopback; the firewall rule cuts the first connection mid-stream.
fn child() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        // First request: a long thinking pause with pings (a live stream);
        // the retry gets a normal reply.
        let mock = MockServer::start(
            MockConfig::default()
                .with_sequence([Scenario::ThinkingPings, Scenario::Normal])
                .with_thinking_pause(Duration::from_secs(60))
                .with_ping_interval(Duration::from_millis(100)),
        )
        .await
        .expect("mock");
        let port = mock.addr().port().to_string();
        let sup = common::anthropic_supervisor(
            mock.base_url(),
            ALLOWANCE,
            RetryPolicy::default()
                .with_jitter(0.0)
                .with_backoff(Duration::from_millis(300), Duration::from_millis(300)),
        )
        .await;
        let mut events = sup.subscribe();
        let turn = sup.send("ws", "hello").await.expect("send");

        // Let a few pings through, then drop every packet on the port.
        tokio::time::sleep(Duration::from_millis(500)).await;
        run("nft", &["add", "table", "inet", "warden_test"]).expect("nft table");
        run(
            "nft",
            &[
                "add",
                "chain",
                "inet",
                "warden_test",
                "out",
                "{ type filter hook output priority 0 ; }",
            ],
        )
        .expect("nft chain");
        for dir in ["sport", "dport"] {
            run(
                "nft",
                &[
                    "add",
                    "rule",
                    "inet",
                    "warden_test",
                    "out",
                    "tcp",
                    dir,
                    &port,
                    "drop",
                ],
            )
            .expect("nft rule");
        }
        let dropped_at = Instant::now();

        // The watchdog must notice: no FIN or RST will ever come.
        let silent_for = loop {
            match tokio::time::timeout(Duration::from_secs(30), events.recv()).await {
                Ok(Ok(LifecycleEvent::StreamTimedOut { silent_for, .. })) => break silent_for,
                Ok(Ok(_)) => continue,
                other => panic!("no watchdog kill: {other:?}"),
            }
        };
        let detected = dropped_at.elapsed();
        println!("kill after {detected:?} of drop, silence {silent_for:?}");
        assert!(silent_for >= ALLOWANCE, "killed early: {silent_for:?}");
        assert!(
            detected <= ALLOWANCE + Duration::from_millis(200) + BOUND,
            "killed late: {detected:?} after the drop"
        );
        // Lift the rule: the retry (after a 300 ms backoff) connects.
        run("nft", &["delete", "table", "inet", "warden_test"]).expect("nft delete");
        let (text, summary) = tokio::time::timeout(Duration::from_secs(30), turn.finish())
            .await
            .expect("the retry finishes")
            .expect("the retry succeeds");
        assert_eq!(summary.attempts, 2);
        assert!(!text.is_empty());
        sup.shutdown().await;
        mock.shutdown().await;
        println!("NETNS-CHILD-OK");
    });
}
