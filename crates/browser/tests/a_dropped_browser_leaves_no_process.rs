//! A `Browser` dropped without closing its session (a test that failed
//! half-way) ends chromedriver and every Chromium process it started: none
//! is left running, re-parented to init.
//!
//! Needs `chromium` and `chromedriver` on `PATH`; without them the test
//! says why and passes, unless `WARDEN_REQUIRE_BROWSER=1` (CI, where
//! `.ci/run` installs them) makes it fail.

use std::time::{Duration, Instant};

/// The processes whose command line names Debian's Chromium binary
/// directory and which belong to process group `group`.
fn chromium_in(group: u32) -> Vec<u32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // pid (comm) state ppid pgrp …: the fields after the last ')'.
        let Some(after) = stat.rsplit_once(')').map(|(_, a)| a) else {
            continue;
        };
        let pgrp: Option<u32> = after.split_whitespace().nth(2).and_then(|s| s.parse().ok());
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if pgrp == Some(group) && String::from_utf8_lossy(&cmdline).contains("chrom") {
            found.push(pid);
        }
    }
    found
}

#[tokio::test]
async fn a_browser_dropped_without_closing_leaves_no_chromium_running() {
    if let Err(why) = warden_browser::programs() {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI needs a browser: {why}"
        );
        eprintln!("skipped: {why}");
        return;
    }
    let browser = warden_browser::Browser::start().await.expect("a browser");
    browser.client.goto("about:blank").await.expect("a page");
    let group = browser.group().expect("chromedriver's process group");
    let running = chromium_in(group);
    assert!(
        running.len() >= 2,
        "chromedriver and Chromium in the group: {running:?}"
    );
    drop(browser);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        // Killed processes linger as zombies until reaped; a zombie has no
        // command line, so it no longer counts.
        let left = chromium_in(group);
        if left.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "still running 10 s after the drop: {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
