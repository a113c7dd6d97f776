//! A real headless Chromium for the console's tests and benchmark:
//! `chromedriver` (Debian's `chromium-driver`) started on a free port, a
//! WebDriver session on Debian's `chromium`, and the few waits the tests
//! need — each bounded, failing with what it last saw.
//!
//! Nothing is downloaded: both programs must be on `PATH`
//! (`apt-get install chromium chromium-driver`); [`Browser::start`] says
//! which is missing.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

pub use fantoccini::{Client, Locator};
use serde_json::{Value, json};
use tokio::io::AsyncBufReadExt as _;

/// How long a browser or an element may take.
pub const PATIENCE: Duration = Duration::from_secs(30);

/// Where `chromium` and `chromedriver` are on `PATH`, or what is missing.
pub fn programs() -> Result<(PathBuf, PathBuf), String> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let find = |names: &[&str]| {
        names.iter().find_map(|n| {
            std::env::split_paths(&path)
                .map(|d| d.join(n))
                .find(|p| p.is_file())
        })
    };
    match (
        find(&["chromium", "chromium-browser"]),
        find(&["chromedriver"]),
    ) {
        (Some(b), Some(d)) => Ok((b, d)),
        (b, _) => Err(format!(
            "{} not on PATH (apt-get install chromium chromium-driver)",
            if b.is_none() {
                "chromium"
            } else {
                "chromedriver"
            }
        )),
    }
}

/// A headless Chromium driven over WebDriver; chromedriver and every
/// browser process it started are killed when this is dropped.
pub struct Browser {
    /// The WebDriver session.
    pub client: Client,
    _driver: tokio::process::Child,
    /// chromedriver's process group, which the browser it starts joins.
    group: Option<nix::unistd::Pid>,
}

impl Drop for Browser {
    /// Kills chromedriver's whole process group: killing chromedriver
    /// alone (its `kill_on_drop`) left Chromium running, re-parented to
    /// init, after a test that ended without closing its session (a
    /// failed assertion, a panic).
    fn drop(&mut self) {
        if let Some(group) = self.group {
            let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
        }
    }
}

impl Browser {
    /// Starts chromedriver and a headless Chromium with a 1360×900 window.
    pub async fn start() -> Result<Self, String> {
        let (chromium, chromedriver) = programs()?;
        let mut driver = tokio::process::Command::new(chromedriver)
            .arg("--port=0")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            // A group of its own, which Chromium joins: ended as one.
            .process_group(0)
            .spawn()
            .map_err(|e| format!("chromedriver: {e}"))?;
        let group = driver
            .id()
            .and_then(|pid| i32::try_from(pid).ok())
            .map(nix::unistd::Pid::from_raw);
        let stdout = driver.stdout.take().ok_or("chromedriver's stdout")?;
        let mut lines = tokio::io::BufReader::new(stdout).lines();
        let port = tokio::time::timeout(PATIENCE, async {
            while let Ok(Some(line)) = lines.next_line().await {
                if let Some(rest) = line.split("started successfully on port ").nth(1) {
                    return rest.trim_end_matches('.').parse::<u16>().ok();
                }
            }
            None
        })
        .await
        .map_err(|_| "chromedriver did not listen within 30 s".to_owned())?
        .ok_or("chromedriver ended before it listened")?;
        // Keep draining its output so it never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        let mut caps = serde_json::Map::new();
        caps.insert(
            "goog:chromeOptions".into(),
            json!({
                "binary": chromium,
                // --no-sandbox: CI runs as root, where Chromium's sandbox
                // refuses to start.
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                         "--window-size=1360,900", "--no-first-run", "--disable-extensions"],
            }),
        );
        let connector = hyper_util::client::legacy::connect::HttpConnector::new();
        let client = tokio::time::timeout(
            PATIENCE,
            fantoccini::ClientBuilder::new(connector)
                .capabilities(caps)
                .connect(&format!("http://127.0.0.1:{port}")),
        )
        .await
        .map_err(|_| "no browser session within 30 s".to_owned())?
        .map_err(|e| format!("a browser session: {e}"))?;
        Ok(Self {
            client,
            _driver: driver,
            group,
        })
    }

    /// chromedriver's process group (its pid), which the browser's
    /// processes join.
    pub fn group(&self) -> Option<u32> {
        self.group.and_then(|g| u32::try_from(g.as_raw()).ok())
    }

    /// Ends the WebDriver session (the browser closes its windows), then
    /// the browser's processes (see [`Drop`](#impl-Drop-for-Browser)).
    pub async fn close(self) {
        let _ = tokio::time::timeout(PATIENCE, self.client.clone().close()).await;
    }

    /// The text of the element `css` once `ok` accepts it, within `limit`;
    /// panics with the last text seen.
    pub async fn text_until(
        &self,
        css: &str,
        limit: Duration,
        ok: impl Fn(&str) -> bool,
    ) -> String {
        let deadline = Instant::now() + limit;
        let mut last = String::new();
        while Instant::now() < deadline {
            if let Ok(el) = self.client.find(Locator::Css(css)).await
                && let Ok(text) = el.text().await
            {
                if ok(&text) {
                    return text;
                }
                last = text;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("{css} never showed what was expected within {limit:?}; last: {last:?}");
    }

    /// Whether `css` matches a displayed element now.
    pub async fn visible(&self, css: &str) -> bool {
        match self.client.find(Locator::Css(css)).await {
            Ok(el) => el.is_displayed().await.unwrap_or(false),
            Err(_) => false,
        }
    }

    /// Waits (at most [`PATIENCE`]) until `css` is displayed.
    pub async fn wait_visible(&self, css: &str) {
        let deadline = Instant::now() + PATIENCE;
        while !self.visible(css).await {
            assert!(Instant::now() < deadline, "{css} never became visible");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Clicks the element `css`.
    pub async fn click(&self, css: &str) {
        self.client
            .find(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("{css}: {e}"))
            .click()
            .await
            .unwrap_or_else(|e| panic!("click {css}: {e}"));
    }

    /// Types `text` into the element `css`.
    pub async fn type_into(&self, css: &str, text: &str) {
        self.client
            .find(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("{css}: {e}"))
            .send_keys(text)
            .await
            .unwrap_or_else(|e| panic!("type into {css}: {e}"));
    }

    /// Runs `script` (a function body; `return` gives its value, a promise
    /// is awaited) in the page.
    pub async fn eval(&self, script: &str) -> Value {
        self.client
            .execute(script, Vec::new())
            .await
            .unwrap_or_else(|e| panic!("{script}: {e}"))
    }

    /// A PNG of the window, written to `dir/name.png` for each of `dirs`.
    pub async fn screenshot(&self, name: &str, dirs: &[&Path]) {
        let png = self.client.screenshot().await.expect("a screenshot");
        assert!(png.starts_with(b"\x89PNG"), "a PNG");
        for dir in dirs {
            std::fs::create_dir_all(dir).expect("mkdir");
            std::fs::write(dir.join(format!("{name}.png")), &png).expect("write the screenshot");
        }
    }
}
