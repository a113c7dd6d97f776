//! The console's turn view from the server's own times, in a real headless
//! Chromium (as in `console_in_a_real_browser.rs`) against a real `warden
//! serve` on the mock: a turn that stalls, is killed by the watchdog and
//! goes on, reopened after it finished (the page reloaded), shows its real
//! times — the stall's silence as long as it was, not `+0.0 s` for every
//! step — and draws each attempt as a bar with its phases; it shows its
//! prompt, model, start and duration. The sign-in page names the running
//! server's token file (from the server's 401), the send box sends a
//! message and its reply appears, a cancelled turn is shown as cancelled
//! (not as a failure), and a context past its window is said with its
//! numbers.
//!
//! Without chromium and chromedriver a test says why and passes, unless
//! `WARDEN_REQUIRE_BROWSER=1` (CI) makes it fail.

use crate::common;

use std::time::{Duration, Instant};

use common::console::*;
use common::*;
use serde_json::{Value, json};
use warden_browser::PATIENCE;
use warden_mock::{MockConfig, MockServer, Scenario, TokenUsage};

/// The watchdog's allowance the node here runs with: the stall lasts it.
const STREAM_TIMEOUT: Duration = Duration::from_secs(2);

/// `POST /v1/turns` with `body`; the new turn's id.
async fn post(base: &str, token: &str, body: Value) -> String {
    let response = reqwest::Client::new()
        .post(format!("{base}/v1/turns"))
        .bearer_auth(token)
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .expect("post");
    assert_eq!(response.status(), 202);
    let body: Value = serde_json::from_slice(&response.bytes().await.expect("body")).expect("JSON");
    body["id"].as_str().expect("id").to_owned()
}

/// A finished turn's events as the server keeps them: (event, data).
async fn turn_events(base: &str, token: &str, id: &str) -> Vec<(String, Value)> {
    let response = reqwest::Client::new()
        .get(format!("{base}/v1/turns/{id}/events"))
        .bearer_auth(token)
        .header("accept", "text/event-stream")
        .send();
    let body = tokio::time::timeout(PATIENCE, async {
        response.await.expect("events").text().await.expect("body")
    })
    .await
    .expect("a finished turn's events end in time");
    let mut events = Vec::new();
    for block in body.split("\n\n") {
        let mut name = "message";
        let mut data = None;
        for line in block.lines() {
            if let Some(v) = line.strip_prefix("event:") {
                name = v.trim();
            } else if let Some(v) = line.strip_prefix("data:") {
                data = serde_json::from_str(v.trim()).ok();
            }
        }
        if let Some(data) = data {
            events.push((name.to_owned(), data));
        }
    }
    events
}

/// An event's `at`, in Unix milliseconds.
fn at_ms(data: &Value) -> f64 {
    time_ms(&data["at"])
}

/// A time the server wrote (RFC 3339), in Unix milliseconds.
fn time_ms(at: &Value) -> f64 {
    let at = at.as_str().unwrap_or_else(|| panic!("a time, not {at}"));
    let t = humantime::parse_rfc3339(at).expect("RFC 3339");
    t.duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs_f64()
        * 1000.0
}

/// The phases drawn for attempt `n`: `[(phase, duration ms)]`.
async fn bars(browser: &warden_browser::Browser, n: u64) -> Vec<(String, f64)> {
    let found = browser
        .eval(&format!(
            "return [...document.querySelectorAll('#bars [data-attempt=\"{n}\"] [data-phase]')]
                .map(e => [e.dataset.phase, Number(e.dataset.ms)])"
        ))
        .await;
    found
        .as_array()
        .expect("a list")
        .iter()
        .map(|p| {
            (
                p[0].as_str().expect("a phase").to_owned(),
                p[1].as_f64().expect("a duration"),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reopened_turn_shows_its_real_times_and_draws_the_watchdogs_kill() {
    let Some(browser) = browser().await else {
        return;
    };
    // The first reply stalls mid-text (the watchdog kills it, the next
    // attempt goes on); then normal replies.
    let mock = MockServer::start(
        MockConfig::default()
            .with_sequence([Scenario::Stall, Scenario::Normal])
            .with_frame_interval(Duration::from_millis(60)),
    )
    .await
    .expect("mock");
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let timeout_ms = STREAM_TIMEOUT.as_millis().to_string();
    let (mut server, base, token) = serve_on(
        &data,
        &mock.base_url(),
        &[],
        &[("WARDEN_STREAM_TIMEOUT", &timeout_ms)],
    )
    .await;
    let c = &browser.client;

    // Signed out, the page names this server's token file, as the server
    // says it (its 401).
    c.goto(&format!("{base}/ui")).await.expect("open /ui");
    browser.wait_visible("#login").await;
    let token_file = data.join("token");
    let token_file = token_file.to_str().expect("a UTF-8 path");
    browser
        .text_until("#login-hint", PATIENCE, |t| t.contains(token_file))
        .await;
    sign_in(&browser, &token).await;
    browser.wait_visible("#sessions").await;

    // A turn that stalls and is killed, run to its end.
    let prompt = "Tell me the story of the stall, with <b>tags</b> & all";
    let model = "claude-console-model";
    let key = "watchdog-story";
    let first = post(
        &base,
        &token,
        json!({"key": key, "message": prompt, "model": model}),
    )
    .await;
    let deadline = Instant::now() + PATIENCE;
    let events = loop {
        let events = turn_events(&base, &token, &first).await;
        if events.last().is_some_and(|(e, _)| e == "done") {
            break events;
        }
        assert!(Instant::now() < deadline, "the turn ends: {events:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    // The server's own story: the silence between the last text before
    // the kill and the kill.
    let broke = events
        .iter()
        .position(|(e, _)| e == "continuing" || e == "retrying")
        .expect("the stalled attempt failed");
    let last_text = events[..broke]
        .iter()
        .rev()
        .find(|(e, _)| e == "text")
        .expect("text before the stall");
    let silence = at_ms(&events[broke].1) - at_ms(&last_text.1);
    assert!(
        silence >= STREAM_TIMEOUT.as_millis() as f64 - 100.0,
        "the server's times: silent {silence} ms"
    );
    let first_started = at_ms(&events[0].1);

    // Reopened after it finished, the page reloaded: nothing of it was
    // seen live.
    c.goto(&format!("{base}/ui#/session/{key}/{first}"))
        .await
        .expect("open the turn");
    c.refresh().await.expect("reload");
    browser.wait_visible("#session").await;
    browser
        .text_until("#turn-id", PATIENCE, |t| t == first)
        .await;
    browser
        .text_until("#phase", PATIENCE, |t| t == "done")
        .await;

    // The list's times are the server's: the kill comes the stall's
    // length after the last text, not `+0.0 s` after everything.
    let timeline = browser.text_until("#timeline", PATIENCE, |_| true).await;
    let shown_times = browser
        .eval(
            "return [...document.querySelectorAll('#timeline li .t')]
                .map(t => t.textContent.split(' +')[1])",
        )
        .await;
    let mut distinct: Vec<&str> = shown_times
        .as_array()
        .expect("a list")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    distinct.dedup();
    assert!(
        distinct.len() >= 4,
        "started, killed, started again and done at their own times: {timeline}"
    );
    let offsets = browser
        .eval(
            "return [...document.querySelectorAll('#timeline li')]
                .map(li => [li.dataset.kind, Number(li.dataset.offsetMs)])",
        )
        .await;
    let offsets: Vec<(String, f64)> = offsets
        .as_array()
        .expect("a list")
        .iter()
        .map(|p| {
            (
                p[0].as_str().expect("kind").to_owned(),
                p[1].as_f64().expect("ms"),
            )
        })
        .collect();
    let offset = |kind: &str| {
        offsets
            .iter()
            .find(|(k, _)| k == kind)
            .unwrap_or_else(|| panic!("{kind} in {timeline}"))
            .1
    };
    let killed_expected = at_ms(&events[broke].1) - first_started;
    assert!(
        (offset("killed") - killed_expected).abs() <= 1.0,
        "killed at +{} ms, the server says +{killed_expected} ms: {timeline}",
        offset("killed")
    );
    assert!(
        offset("killed") >= STREAM_TIMEOUT.as_millis() as f64,
        "{timeline}"
    );
    assert!(
        offset("done") > offset("killed"),
        "done after the kill: {timeline}"
    );
    // The kill's line says how long it was silent (to a tenth, rounded).
    let said: f64 = timeline
        .split("silent ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("the kill says how long it was silent: {timeline}"));
    assert!(
        (said * 1000.0 - silence).abs() <= 51.0,
        "silent {said} s shown, {silence} ms by the server's times: {timeline}"
    );

    // Drawn: attempt 1 streamed, fell silent for as long as it did, was
    // killed, waited its backoff; attempt 2 went on (or started over).
    let one = bars(&browser, 1).await;
    let phases: Vec<&str> = one.iter().map(|(p, _)| p.as_str()).collect();
    let delay = events[broke].1["delay_ms"].as_f64().expect("delay_ms");
    let mut expected = vec!["streaming", "silent", "killed"];
    if delay > 0.0 {
        expected.push("backoff");
    }
    assert_eq!(phases, expected, "attempt 1: {one:?}");
    let drawn_silence = one[1].1;
    assert!(
        (drawn_silence - silence).abs() <= 1.0,
        "the silent bar is {drawn_silence} ms, the server's gap {silence} ms"
    );
    if delay > 0.0 {
        assert!(
            (one[3].1 - delay).abs() <= 1.0,
            "backoff {one:?}, delay {delay}"
        );
    }
    let two = bars(&browser, 2).await;
    let went_on = if events[broke].0 == "continuing" {
        "continued"
    } else {
        "streaming"
    };
    assert!(
        two.first().is_some_and(|(p, ms)| p == went_on && *ms > 0.0),
        "attempt 2: {two:?}"
    );
    // On one time axis: attempt 2's bar starts after attempt 1's ends.
    let starts = browser
        .eval(
            "return [...document.querySelectorAll('#bars [data-attempt]')]
                .map(a => Number(a.dataset.startMs))",
        )
        .await;
    let starts: Vec<f64> = starts
        .as_array()
        .expect("a list")
        .iter()
        .map(|s| s.as_f64().expect("ms"))
        .collect();
    assert_eq!(starts.len(), 2, "two attempts drawn: {starts:?}");
    assert!(
        starts[1] >= starts[0] + drawn_silence,
        "attempt 2 starts after attempt 1's silence: {starts:?}"
    );

    // The turn's prompt (as text, not markup), model, start and duration.
    let shown_prompt = browser
        .text_until("#prompt", PATIENCE, |t| !t.is_empty())
        .await;
    assert_eq!(shown_prompt, prompt);
    assert_eq!(
        browser
            .eval("return document.querySelectorAll('#prompt b').length")
            .await,
        json!(0),
        "the prompt's tags are text"
    );
    let meta = browser
        .text_until("#turn-meta", PATIENCE, |t| t.contains(model))
        .await;
    // The turn's own start and end (it opens before its first attempt
    // starts), as the server reports them.
    let turn = reqwest::Client::new()
        .get(format!("{base}/v1/turns/{first}"))
        .bearer_auth(&token)
        .send()
        .await
        .expect("the turn")
        .bytes()
        .await
        .expect("its body");
    let turn: Value = serde_json::from_slice(&turn).expect("JSON");
    let took = time_ms(&turn["ended_at"]) - time_ms(&turn["started_at"]);
    assert!(meta.contains("started "), "{meta}");
    assert!(
        meta.contains(&format!("took {:.1} s", took / 1000.0))
            || meta.contains(&format!("took {:.1} s", (took + 50.0) / 1000.0))
            || meta.contains(&format!("took {:.1} s", (took - 50.0) / 1000.0)),
        "about {took} ms: {meta}"
    );
    screenshot(&browser, "turn-reopened").await;

    // The send box: a message to this session, its reply shown.
    let message = "Hello from the console's send box";
    browser.type_into("#send-message", message).await;
    browser.click("#send-button").await;
    let sent = browser
        .text_until("#turn-id", PATIENCE, |t| {
            t != first && t.starts_with("turn")
        })
        .await;
    browser
        .text_until("#phase", PATIENCE, |t| t == "done")
        .await;
    let expected_reply = format!(
        "Hello from warden-mock. Your last message had {} characters.",
        message.chars().count()
    );
    browser
        .text_until("#reply", PATIENCE, |t| t == expected_reply)
        .await;
    let kept = turn_events(&base, &token, &sent).await;
    assert!(
        kept.last()
            .is_some_and(|(e, d)| e == "done" && d["text"] == expected_reply),
        "the server answered the page's message: {kept:?}"
    );
    browser
        .text_until("#prompt", PATIENCE, |t| t == message)
        .await;

    // A turn that stalls for good, cancelled from the page: cancelled,
    // not a failure — live, and reopened.
    let stuck = post(
        &base,
        &token,
        json!({"key": key, "message": "cancel me", "model": "mock-stall"}),
    )
    .await;
    browser
        .text_until("#turn-id", PATIENCE, |t| t == stuck)
        .await;
    browser
        .text_until("#reply", PATIENCE, |t| !t.is_empty())
        .await;
    browser.click("#cancel").await;
    for reopened in [false, true] {
        if reopened {
            // The session's page (its latest turn), loaded afresh.
            c.goto(&format!("{base}/ui#/session/{key}"))
                .await
                .expect("the session");
            c.refresh().await.expect("reload");
            browser
                .text_until("#turn-id", PATIENCE, |t| t == stuck)
                .await;
        }
        browser
            .text_until("#phase", PATIENCE, |t| t == "cancelled")
            .await;
        let classes = browser
            .eval("return document.getElementById('phase').className")
            .await;
        assert!(
            !classes.as_str().unwrap_or("").contains("error"),
            "{classes}"
        );
        let entry = browser
            .text_until("#timeline li[data-kind='cancelled']", PATIENCE, |t| {
                t.contains("exit 130")
            })
            .await;
        assert!(!entry.contains("error"), "{entry}");
        assert_eq!(
            browser
                .eval("return document.querySelectorAll('#timeline li.error').length")
                .await,
            json!(0),
            "nothing red: reopened {reopened}"
        );
        let row = browser
            .text_until("#turns-table tbody tr:first-child", PATIENCE, |t| {
                t.contains(&stuck)
            })
            .await;
        assert!(row.contains("cancelled"), "{row}");
    }
    screenshot(&browser, "turn-cancelled").await;
    browser.close().await;
    let _ = server.start_kill();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_context_past_its_window_is_shown_as_over_the_window_with_its_numbers() {
    let Some(browser) = browser().await else {
        return;
    };
    // Every reply reports 250,000 tokens in context: past the default
    // 200,000-token window.
    let mock = MockServer::start(MockConfig::default().with_usage(TokenUsage::new(250_000, 0, 0)))
        .await
        .expect("mock");
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut server, base, token) =
        serve_on(&dir.path().join("data"), &mock.base_url(), &[], &[]).await;
    let c = &browser.client;
    c.goto(&format!("{base}/ui")).await.expect("open /ui");
    browser.wait_visible("#login").await;
    sign_in(&browser, &token).await;
    browser.wait_visible("#sessions").await;
    post_turn(&base, &token, "overfull", "hello").await;
    let row = "#sessions-table tr[data-key='overfull']";
    let cell = browser
        .text_until(&format!("{row} td:nth-child(5)"), PATIENCE, |t| {
            t.contains("over")
        })
        .await;
    assert!(cell.contains("over the window"), "{cell}");
    assert!(cell.contains("250,000 / 200,000"), "{cell}");
    browser.click(row).await;
    let meta = browser
        .text_until("#session-meta", PATIENCE, |t| t.contains("context"))
        .await;
    assert!(
        meta.contains("over the window") && meta.contains("250,000 / 200,000 tokens"),
        "{meta}"
    );
    browser.close().await;
    let _ = server.start_kill();
}
