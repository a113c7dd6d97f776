//! The console's tests' shared steps: a headless Chromium (or the reason
//! there is none), screenshots, signing in, a turn posted as an
//! orchestrator would.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use warden_browser::Browser;

/// A headless Chromium, or `None` (with the reason printed) where there is
/// none and CI does not require one.
pub(crate) async fn browser() -> Option<Browser> {
    if let Err(why) = warden_browser::programs() {
        assert!(
            std::env::var("WARDEN_REQUIRE_BROWSER").as_deref() != Ok("1"),
            "WARDEN_REQUIRE_BROWSER=1 but {why}"
        );
        eprintln!("skipped: {why}");
        return None;
    }
    Some(Browser::start().await.expect("a headless Chromium"))
}

/// Where screenshots go: target/console-screenshots/, and docs/console/
/// with `WARDEN_BLESS=1`.
pub(crate) fn screenshot_dirs() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut dirs = vec![root.join("target/console-screenshots")];
    if std::env::var_os("WARDEN_BLESS").is_some() {
        dirs.push(root.join("docs/console"));
    }
    dirs
}

pub(crate) async fn screenshot(browser: &Browser, name: &str) {
    let dirs = screenshot_dirs();
    let dirs: Vec<&Path> = dirs.iter().map(PathBuf::as_path).collect();
    browser.screenshot(name, &dirs).await;
}

pub(crate) async fn sign_in(browser: &Browser, token: &str) {
    browser.type_into("#token", token).await;
    browser.click("#login-button").await;
}

pub(crate) async fn post_turn(base: &str, token: &str, key: &str, message: &str) -> String {
    post_body(base, token, json!({"key": key, "message": message})).await
}

/// [`post_turn`] naming the session's `agent`.
pub(crate) async fn post_turn_as(
    base: &str,
    token: &str,
    key: &str,
    message: &str,
    agent: &str,
) -> String {
    post_body(
        base,
        token,
        json!({"key": key, "message": message, "agent": agent}),
    )
    .await
}

/// `POST /v1/turns` with `body`: its turn's id (202 expected).
async fn post_body(base: &str, token: &str, body: Value) -> String {
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
