//! The console in a real headless Chromium (as in
//! `console_in_a_real_browser.rs`) where ordinary use turned hostile: a
//! `warden serve` restarted under an open page (the page reconnects with
//! an id from the earlier run: it must be told once, fetch the list once,
//! and follow live events — not loop), and names a client chose that are
//! one 4,000-character token or hold a right-to-left override (the page
//! must not grow wider than the window, nor let the name reorder the
//! server's own words).
//!
//! Without chromium and chromedriver a test says why and passes, unless
//! `WARDEN_REQUIRE_BROWSER=1` (CI) makes it fail.

use crate::common;

use std::time::Duration;

use common::console::*;
use common::*;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::{Value, json};
use warden_browser::PATIENCE;
use warden_mock::{MockConfig, MockServer};

/// Counts, in the page, the requests it makes for the whole session
/// list and for the lifecycle stream (the console calls the global
/// `fetch` each time).
const COUNT_FETCHES: &str = "
    window.counted = { full: 0, events: 0 };
    const real = window.fetch;
    window.fetch = (...args) => {
        const url = String(args[0]);
        if (url.includes('detail=full')) window.counted.full += 1;
        if (url.includes('/v1/events')) window.counted.events += 1;
        return real(...args);
    };
    return true;";

async fn counted(browser: &warden_browser::Browser) -> (u64, u64) {
    let c = browser.eval("return window.counted").await;
    (
        c["full"].as_u64().expect("full"),
        c["events"].as_u64().expect("events"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_restart_the_console_is_reset_once_fetches_the_list_once_and_follows_live() {
    let Some(browser) = browser().await else {
        return;
    };
    let mock = MockServer::start(MockConfig::default())
        .await
        .expect("mock");
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let (mut server, base, token) = serve_on(&data, &mock.base_url(), &[], &[]).await;
    let c = &browser.client;
    c.goto(&format!("{base}/ui")).await.expect("open /ui");
    browser.wait_visible("#login").await;
    sign_in(&browser, &token).await;
    browser.wait_visible("#sessions").await;
    // A turn, so the page has followed lifecycle events (and keeps the
    // last one's id to reconnect with).
    post_turn(&base, &token, "before-restart", "hello").await;
    browser
        .text_until(
            "#sessions-table tr[data-key='before-restart']",
            PATIENCE,
            |t| t.contains("active") && t.ends_with(" 0"),
        )
        .await;
    assert_eq!(browser.eval(COUNT_FETCHES).await, json!(true));

    // An ordinary stop and start on the same address: the page's stream
    // ends, and it reconnects with an id of the earlier run.
    let port = base.rsplit(':').next().expect("a port").to_owned();
    let pid = Pid::from_raw(i32::try_from(server.id().expect("pid")).expect("pid"));
    kill(pid, Signal::SIGTERM).expect("SIGTERM");
    let status = tokio::time::timeout(PATIENCE, server.wait())
        .await
        .expect("exits in time")
        .expect("wait");
    assert_eq!(status.code(), Some(0));
    let listen = format!("127.0.0.1:{port}");
    let (mut server, again, _) =
        serve_on(&data, &mock.base_url(), &["--listen", &listen], &[]).await;
    assert_eq!(again, base, "restarted on the same address");

    // Reconnected (it backs off a little after the stream ended).
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while counted(&browser).await.1 == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the page reconnects to the restarted server"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Three seconds on: one reset asked for one fetch of the list (the
    // 15 s refresh may add one); before, the server looped `reset` and the
    // page fetched the list for each, hundreds of times.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (full, events) = counted(&browser).await;
    assert!(
        (1..=2).contains(&full),
        "{full} fetches of the session list after one restart"
    );
    assert!(
        events <= 2,
        "{events} connections to /v1/events: the page reconnected in a loop"
    );
    assert_eq!(
        browser
            .eval("return document.getElementById('live').textContent")
            .await,
        json!("● live")
    );
    // The live stream works: a new session shows up from its events (well
    // before the 15 s refresh would bring it).
    post_turn(&base, &token, "after-restart", "hello").await;
    browser
        .text_until(
            "#sessions-table tr[data-key='after-restart']",
            Duration::from_secs(5),
            |t| t.contains("after-restart"),
        )
        .await;
    assert!(
        browser
            .visible("#sessions-table tr[data-key='before-restart']")
            .await
    );
    let _ = server.start_kill();
    mock.shutdown().await;
}

/// Whether, in `#session-meta`, the server's own word `status` is drawn
/// left to right (its second letter right of its first), whatever the
/// values before it hold.
const STATUS_LABEL_READS_LEFT_TO_RIGHT: &str = "
    const meta = document.getElementById('session-meta');
    const walk = document.createTreeWalker(meta, NodeFilter.SHOW_TEXT);
    for (let node; (node = walk.nextNode()); ) {
        if (node.parentElement.closest('bdi')) continue;
        const at = node.data.indexOf('status');
        if (at < 0) continue;
        const x = (i) => {
            const r = document.createRange();
            r.setStart(node, i);
            r.setEnd(node, i + 1);
            return r.getBoundingClientRect().left;
        };
        return x(at + 1) > x(at);
    }
    return null;";

/// Goes to the session page of `key`, as a link to it would.
async fn open_session(browser: &warden_browser::Browser, key: &str) {
    let key = serde_json::to_string(key).expect("JSON");
    browser
        .eval(&format!(
            "location.hash = '#/session/' + encodeURIComponent({key}); return true"
        ))
        .await;
    browser.wait_visible("#session").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_or_right_to_left_name_neither_widens_the_page_nor_reorders_it() {
    let Some(browser) = browser().await else {
        return;
    };
    let mock = MockServer::start(MockConfig::default())
        .await
        .expect("mock");
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut server, base, token) =
        serve_on(&dir.path().join("data"), &mock.base_url(), &[], &[]).await;
    let c = &browser.client;
    c.set_window_size(1280, 900).await.expect("window size");
    c.goto(&format!("{base}/ui")).await.expect("open /ui");
    browser.wait_visible("#login").await;
    sign_in(&browser, &token).await;
    browser.wait_visible("#sessions").await;

    // A key of 4,000 characters and no space.
    let long = format!("k{}", "x".repeat(3999));
    post_turn(&base, &token, &long, "hello").await;
    open_session(&browser, &long).await;
    browser
        .text_until("#session-meta", PATIENCE, |t| t.contains("status"))
        .await;
    browser
        .text_until("#phase", PATIENCE, |t| t == "done")
        .await;
    let widths = browser
        .eval("return [document.documentElement.scrollWidth, window.innerWidth]")
        .await;
    let (page, window) = (widths[0].as_u64(), widths[1].as_u64());
    assert!(
        page <= window,
        "the session page of a 4,000-character key is {page:?} px wide in a {window:?} px window"
    );
    screenshot(&browser, "session-long-key").await;

    // A workspace with a right-to-left override (U+202E) in its name.
    let workspace = "/srv/evil\u{202E}gnp.exe";
    let response = reqwest::Client::new()
        .post(format!("{base}/v1/turns"))
        .bearer_auth(&token)
        .header("content-type", "application/json")
        .body(json!({"workspace": workspace, "message": "hello"}).to_string())
        .send()
        .await
        .expect("post");
    assert_eq!(response.status(), 202);
    let created: Value =
        serde_json::from_slice(&response.bytes().await.expect("body")).expect("JSON");
    let key = created["key"].as_str().expect("key").to_owned();
    assert!(key.contains('\u{202E}'), "{key}");
    open_session(&browser, &key).await;
    browser
        .text_until("#session-meta", PATIENCE, |t| t.contains("workspace"))
        .await;
    assert_eq!(
        browser.eval(STATUS_LABEL_READS_LEFT_TO_RIGHT).await,
        json!(true),
        "the workspace's override reorders the words after it"
    );
    assert_eq!(
        browser
            .eval("return document.getElementById('session-key').dir")
            .await,
        json!("auto"),
        "the heading's direction is its own text's"
    );
    // And the override itself is shown, so the name cannot pass for
    // another (`evilexe.png`).
    let heading = browser
        .text_until("#session-key", PATIENCE, |t| !t.is_empty())
        .await;
    assert_eq!(heading, "/srv/evil⟨U+202E⟩gnp.exe");
    screenshot(&browser, "session-rtl-workspace").await;
    let _ = server.start_kill();
    mock.shutdown().await;
}
