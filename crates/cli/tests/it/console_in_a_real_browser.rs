//! The console at `/ui`, driven in a real headless Chromium (Debian's
//! `chromium` and `chromium-driver`, through WebDriver) against a real
//! `warden serve` on the mock: a wrong token is refused; signed in, a
//! session appears, its turn streams, a stall's kill and continuation show
//! on the timeline within the watchdog's allowance plus a second, a turn is
//! cancelled with the button; on a cluster the nodes and a failover show.
//! The screenshots in docs/console.md are taken here (`WARDEN_BLESS=1`
//! writes them to docs/console/; every run writes them to
//! target/console-screenshots/).
//!
//! Without chromium and chromedriver a test says why and passes, unless
//! `WARDEN_REQUIRE_BROWSER=1` (CI) makes it fail.

use crate::common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::cluster::{NodeSpec, TOKEN};
use common::console::*;
use common::*;
use serde_json::{Value, json};
use warden_browser::{Locator, PATIENCE};
use warden_mock::{MockConfig, MockServer, Scenario};

/// The watchdog's allowance the single node here runs with.
const STREAM_TIMEOUT: Duration = Duration::from_secs(3);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_signs_in_and_shows_a_turn_live_with_its_kill_continuation_and_cancel() {
    let Some(browser) = browser().await else {
        return;
    };
    // The first reply stalls mid-text (killed, then continued); the fifth
    // request stalls too, and its turn is cancelled from the page.
    let mock = MockServer::start(
        MockConfig::default()
            .with_sequence([
                Scenario::Stall,
                Scenario::Normal,
                Scenario::Normal,
                Scenario::Normal,
                Scenario::Stall,
            ])
            .with_frame_interval(Duration::from_millis(60)),
    )
    .await
    .expect("mock");
    let dir = tempfile::tempdir().expect("tempdir");
    let timeout_ms = STREAM_TIMEOUT.as_millis().to_string();
    let (mut server, base, token) = serve_on(
        &dir.path().join("data"),
        &mock.base_url(),
        // Two agents: each session's row shows its own.
        &[
            "--jaeger-url",
            "http://jaeger.example:16686",
            "--agent",
            "anthropic,openai",
        ],
        &[("WARDEN_STREAM_TIMEOUT", &timeout_ms)],
    )
    .await;
    let c = &browser.client;

    // The page, its policy: this origin only.
    let page = reqwest::get(format!("{base}/ui")).await.expect("get /ui");
    assert_eq!(page.status(), 200);
    let csp = page.headers()["content-security-policy"]
        .to_str()
        .expect("ascii")
        .to_owned();
    assert!(
        csp.contains("default-src 'none'") && csp.contains("connect-src 'self'"),
        "{csp}"
    );

    c.goto(&format!("{base}/ui")).await.expect("open /ui");
    browser.wait_visible("#login").await;
    // A wrong token is refused, and nothing else is shown.
    sign_in(&browser, "not-the-token").await;
    let refused = browser
        .text_until("#login-error", PATIENCE, |t| !t.is_empty())
        .await;
    assert!(refused.contains("Refused"), "{refused}");
    assert!(!browser.visible("#sessions").await);
    assert_eq!(
        browser
            .eval("return sessionStorage.getItem('warden-token')")
            .await,
        Value::Null,
        "a refused token is not kept"
    );

    sign_in(&browser, &token).await;
    browser.wait_visible("#sessions").await;
    assert!(
        !c.current_url()
            .await
            .expect("url")
            .as_str()
            .contains(&token),
        "the token is never in a URL"
    );
    assert_eq!(
        browser
            .eval("return sessionStorage.getItem('warden-token')")
            .await,
        json!(token)
    );

    // A turn sent by an orchestrator: its session appears, live.
    let first = post_turn(&base, &token, "console-demo", "Show me the stall").await;
    let row = "#sessions-table tr[data-key='console-demo']";
    browser
        .text_until(row, PATIENCE, |t| t.contains("console-demo"))
        .await;

    // Its turn, live: text streams, then stops (the stall); the watchdog
    // kills the attempt within its allowance, and the reply is continued.
    browser.click(row).await;
    browser.wait_visible("#session").await;
    browser
        .text_until("#turn-id", PATIENCE, |t| t == first)
        .await;
    let mut last_change = Instant::now();
    let mut reply = String::new();
    let deadline = Instant::now() + PATIENCE;
    let mut saw_allowance = false;
    let killed_at = loop {
        assert!(
            Instant::now() < deadline,
            "the kill shows on the timeline in time"
        );
        let now_reply = c
            .find(Locator::Id("reply"))
            .await
            .expect("reply")
            .text()
            .await
            .expect("text");
        if now_reply != reply {
            reply = now_reply;
            last_change = Instant::now();
        }
        let allowance = browser
            .eval("return document.getElementById('allowance').textContent")
            .await;
        saw_allowance |= allowance
            .as_str()
            .is_some_and(|a| a.starts_with("watchdog "));
        if browser.visible("#timeline li[data-kind='killed']").await {
            break Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(!reply.is_empty(), "text streamed before the stall");
    assert!(saw_allowance, "the watchdog's allowance was counted down");
    let silent = killed_at - last_change;
    assert!(
        silent <= STREAM_TIMEOUT + Duration::from_secs(1),
        "the kill showed {silent:?} after the last text (allowance {STREAM_TIMEOUT:?} + 1 s)"
    );
    browser
        .text_until("#timeline", STREAM_TIMEOUT + Duration::from_secs(1), |t| {
            t.contains("continuing") || t.contains("retrying")
        })
        .await;
    browser
        .text_until("#phase", PATIENCE, |t| t == "done")
        .await;
    let expected = "Hello from warden-mock. Your last message had 17 characters.";
    let shown = c
        .find(Locator::Id("reply"))
        .await
        .expect("reply")
        .text()
        .await
        .expect("text");
    assert_eq!(shown, expected, "the reply, whole and once");
    let timeline = browser.text_until("#timeline", PATIENCE, |_| true).await;
    for kind in ["started", "killed", "done"] {
        assert!(timeline.contains(kind), "{kind} in {timeline}");
    }
    // The trace link points at the configured Jaeger only.
    let trace = c.find(Locator::Id("trace")).await.expect("trace link");
    if trace.is_displayed().await.unwrap_or(false) {
        let href = trace.attr("href").await.expect("href").unwrap_or_default();
        assert!(
            href.starts_with("http://jaeger.example:16686/trace/"),
            "{href}"
        );
    }
    screenshot(&browser, "turn").await;

    // Nothing left the page for anywhere but this node: every request it
    // made was to the node, and one to another origin (the mock, which
    // would answer) is blocked by the page's policy before it is sent.
    let origins = browser
        .eval("return performance.getEntriesByType('resource').map(e => new URL(e.name).origin)")
        .await;
    let origins = origins.as_array().expect("a list");
    assert!(!origins.is_empty());
    assert!(
        origins.iter().all(|o| o.as_str() == Some(base.as_str())),
        "{origins:?}"
    );
    let probe = browser
        .eval(&format!(
            "return fetch('{}/csp-probe', {{method: 'POST', body: 'x'}}).then(() => 'sent', e => 'blocked: ' + e)",
            mock.base_url()
        ))
        .await;
    assert!(
        probe.as_str().is_some_and(|p| p.starts_with("blocked")),
        "{probe}"
    );
    assert_eq!(
        mock.requests_to("/csp-probe"),
        0,
        "the probe never reached the other origin"
    );

    // Back to the table, two more sessions appear live (the screenshot of
    // it); then a turn that stalls, cancelled from the page, which follows
    // the session's new turn by itself.
    c.goto(&format!("{base}/ui#/sessions"))
        .await
        .expect("sessions");
    browser.wait_visible("#sessions").await;
    for (key, agent) in [("billing-bot", "anthropic"), ("docs-agent", "openai")] {
        post_turn_as(&base, &token, key, "hello", agent).await;
        browser
            .text_until(
                &format!("#sessions-table tr[data-key='{key}']"),
                PATIENCE,
                |t| {
                    // Answered by its agent: live, nothing running or
                    // waiting.
                    t.contains(key)
                        && t.contains(agent)
                        && t.contains("active")
                        && t.ends_with(" 0")
                },
            )
            .await;
    }
    let agents = browser
        .eval("return [...document.querySelectorAll('#sessions-table tbody tr')].map(r => r.dataset.key + ' ' + r.cells[1].textContent).sort()")
        .await;
    assert!(
        agents
            .as_array()
            .is_some_and(|rows| rows.contains(&json!("docs-agent openai"))
                && rows.contains(&json!("billing-bot anthropic"))),
        "{agents}"
    );
    // Sorted by a click on a column's head.
    browser.click("#sessions-table th[data-col='key']").await;
    let first_row = browser
        .eval("return document.querySelector('#sessions-table tbody tr').dataset.key")
        .await;
    assert_eq!(
        first_row,
        json!("billing-bot"),
        "sorted by session, ascending"
    );
    // Filtered.
    c.find(Locator::Id("filter"))
        .await
        .expect("filter")
        .send_keys("docs")
        .await
        .expect("type");
    let shown_rows = browser
        .eval("return [...document.querySelectorAll('#sessions-table tbody tr')].filter(r => !r.hidden).map(r => r.dataset.key)")
        .await;
    assert_eq!(shown_rows, json!(["docs-agent"]));
    c.find(Locator::Id("filter"))
        .await
        .expect("filter")
        .clear()
        .await
        .expect("clear");
    browser
        .eval("document.getElementById('filter').dispatchEvent(new Event('input'))")
        .await;
    screenshot(&browser, "sessions").await;
    browser.click(row).await;
    browser.wait_visible("#session").await;
    browser
        .text_until("#phase", PATIENCE, |t| t == "done")
        .await;
    let third = post_turn(&base, &token, "console-demo", "cancel me").await;
    browser
        .text_until("#turn-id", PATIENCE, |t| t == third)
        .await;
    browser
        .text_until("#reply", PATIENCE, |t| !t.is_empty())
        .await;
    browser.click("#cancel").await;
    browser
        .text_until("#action-result", PATIENCE, |t| t.contains("cancelled"))
        .await;
    // Cancelled, not failed.
    browser
        .text_until("#phase", PATIENCE, |t| t == "cancelled")
        .await;
    let timeline = browser
        .text_until("#timeline li[data-kind='cancelled']", PATIENCE, |t| {
            t.contains("ECANCELLED")
        })
        .await;
    assert!(timeline.contains("exit 130"), "{timeline}");

    // Signed out, the token is gone from the tab.
    browser.click("#signout").await;
    browser.wait_visible("#login").await;
    assert_eq!(
        browser
            .eval("return sessionStorage.getItem('warden-token')")
            .await,
        Value::Null
    );
    browser.close().await;
    let _ = server.start_kill();
}

/// A cluster node: `warden serve --store <db> --node-id <id>`; the child
/// and its base URL.
async fn node(
    dir: &Path,
    id: &str,
    db: &str,
    mock: &MockServer,
) -> (tokio::process::Child, String) {
    let node = NodeSpec::new(dir, id, db, 2.0)
        .args(&["--grace", "1"])
        .upstream(mock)
        // The stalled stream is held, not killed: the node dies with it.
        .env("WARDEN_STREAM_TIMEOUT", "120000")
        .start()
        .await;
    (node.child, node.base)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_shows_the_clusters_nodes_leases_and_a_failover() {
    let Some(db) = fresh_db("warden_ui").await else {
        return;
    };
    let Some(browser) = browser().await else {
        return;
    };
    let mock = MockServer::start(
        MockConfig::default()
            .with_sequence([Scenario::Stall, Scenario::Normal])
            .with_frame_interval(Duration::from_millis(20)),
    )
    .await
    .expect("mock");
    let dir = tempfile::tempdir().expect("tempdir");
    let token = TOKEN;
    let (mut a, a_base) = node(dir.path(), "node-a", &db, &mock).await;
    let (mut b, b_base) = node(dir.path(), "node-b", &db, &mock).await;
    // B runs a turn that stalls, and holds it.
    post_turn(&b_base, token, "moving", "fail me over").await;
    let deadline = Instant::now() + PATIENCE;
    while mock.request_count() < 1 {
        assert!(Instant::now() < deadline, "B's turn reaches the upstream");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    post_turn(&a_base, token, "staying", "hello").await;

    let c = &browser.client;
    c.goto(&format!("{a_base}/ui#/cluster"))
        .await
        .expect("open /ui");
    browser.wait_visible("#login").await;
    sign_in(&browser, token).await;
    browser.wait_visible("#cluster").await;
    let nodes = browser
        .text_until("#nodes-table tbody", PATIENCE, |t| {
            t.contains("node-a (here)") && t.contains("node-b")
        })
        .await;
    assert!(nodes.contains(&b_base), "B's address: {nodes}");
    browser
        .text_until("#leases-table tbody", PATIENCE, |t| {
            t.lines()
                .any(|l| l.contains("moving") && l.contains("node-b"))
        })
        .await;

    // B dies mid-turn: A takes the session over once B's lease ran out,
    // and the page shows the failover.
    b.start_kill().expect("SIGKILL");
    let _ = b.wait().await;
    let moves = browser
        .text_until("#moves-table tbody", PATIENCE, |t| {
            t.lines()
                .any(|l| l.contains("moving") && l.contains("failover"))
        })
        .await;
    assert!(moves.contains("node-b → node-a"), "{moves}");
    browser
        .text_until("#leases-table tbody", PATIENCE, |t| {
            t.lines()
                .any(|l| l.contains("moving") && l.contains("node-a"))
        })
        .await;
    // B is dead in the members' table, and the story says where its
    // sessions went.
    browser
        .text_until("#nodes-table tbody", PATIENCE, |t| {
            t.lines()
                .any(|l| l.contains("node-b") && l.contains("dead"))
        })
        .await;
    let story = browser
        .text_until("#cluster-story", PATIENCE, |t| t.contains("node-b died"))
        .await;
    assert!(story.contains("1 session taken by node-a"), "{story}");
    // The cluster's own figures, read from the database: one failover.
    let wide = browser
        .text_until("#cluster-wide", PATIENCE, |t| t.contains("1 failover"))
        .await;
    assert!(
        wide.contains("1 failover (node-b → node-a 1) · 0 handovers"),
        "{wide}"
    );
    screenshot(&browser, "cluster").await;

    // The database goes away: a plain banner, and the live mark no longer
    // says live; it comes back: the banner goes.
    let name = db.rsplit('/').next().expect("a database name");
    database_away(name);
    browser.wait_visible("#db-banner").await;
    browser
        .text_until("#live", PATIENCE, |t| t.contains("database unreachable"))
        .await;
    screenshot(&browser, "cluster-database-unreachable").await;
    // A page opened now, during the outage, says the same from its first
    // load: the banner and the mark, no failed request in their place.
    c.refresh().await.expect("reload /ui");
    browser.wait_visible("#db-banner").await;
    browser
        .text_until("#live", PATIENCE, |t| t.contains("database unreachable"))
        .await;
    assert!(
        browser.visible("#cluster").await,
        "the cluster view, not sign-in"
    );
    // The cluster view still fills in: what the node knows, marked as
    // last read (`GET /v1/cluster` answers `stale`), its outage counted.
    browser
        .text_until("#cluster-wide", PATIENCE, |t| {
            t.contains("1 failover") && t.contains("as last read")
        })
        .await;
    browser
        .text_until("#cluster-figures", PATIENCE, |t| {
            t.contains("database outages 1")
        })
        .await;
    // Its requests refused meanwhile (every 2 s) are not shown raw.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let figures = browser
        .eval("return document.getElementById('cluster-figures').textContent")
        .await;
    assert!(
        !figures.to_string().contains("503"),
        "no raw 503 under the banner: {figures}"
    );
    database_back(name);
    browser
        .text_until("#live", PATIENCE, |t| t == "● live")
        .await;
    assert!(!browser.visible("#db-banner").await, "the banner is gone");
    // The sessions table names each session's node and epoch (2 from the
    // failover; 3 if the outage outlasted node-a's lease, which it then
    // gave up and took back).
    c.goto(&format!("{a_base}/ui#/sessions"))
        .await
        .expect("sessions");
    browser
        .text_until("#sessions-table tr[data-key='moving']", PATIENCE, |t| {
            t.contains("node-a · 2") || t.contains("node-a · 3")
        })
        .await;
    browser.close().await;
    let _ = a.start_kill();
}
