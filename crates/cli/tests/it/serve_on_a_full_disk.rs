//! `warden serve` whose data directory's disk fills up (a real tmpfs this
//! test mounts and fills): a turn it cannot store is refused with a typed
//! `503` — never acknowledged with `202` and then lost, never a `500` or a
//! hang — the server keeps running, and once space returns every
//! acknowledged message is there after a restart.
//!
//! Needs root and `mount`. Without them the test prints why and passes,
//! unless `WARDEN_REQUIRE_TMPFS=1` (for CI) makes that a failure.

use crate::common;

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::*;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use warden_mock::{MockConfig, MockServer};

const PATIENCE: Duration = Duration::from_secs(30);

/// A tmpfs mounted for the test, unmounted when dropped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(at: &Path, size: &str) -> Result<Self, String> {
        std::fs::create_dir_all(at).map_err(|e| e.to_string())?;
        let out = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0700"),
                "tmpfs",
            ])
            .arg(at)
            .output()
            .map_err(|e| format!("mount: {e}"))?;
        if out.status.success() {
            Ok(Self(at.to_path_buf()))
        } else {
            Err(format!(
                "mount -t tmpfs failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Fills the file system holding `path` to the last page.
fn fill(path: &Path) {
    let mut file = std::fs::File::create(path).expect("create the filler");
    for chunk in [64 * 1024, 4096, 512] {
        let bytes = vec![0u8; chunk];
        // At most the whole disk, so this ends even if ENOSPC never comes.
        for _ in 0..(16 << 20) / chunk + 1 {
            if file.write_all(&bytes).is_err() {
                break;
            }
        }
    }
}

struct Node {
    child: tokio::process::Child,
    base: String,
    token: String,
}

async fn start(data: &Path, mock: &MockServer) -> Node {
    let (child, base, token) = serve_on(
        data,
        &mock.base_url(),
        &["--grace", "1"],
        &[("WARDEN_STREAM_TIMEOUT", "60000")],
    )
    .await;
    Node { child, base, token }
}

impl Node {
    /// Posts a message to session `key`: the status and the body.
    async fn post(&self, key: &str, message: &str) -> (u16, serde_json::Value) {
        let response = tokio::time::timeout(
            PATIENCE,
            reqwest::Client::new()
                .post(format!("{}/v1/turns", self.base))
                .bearer_auth(&self.token)
                .header("content-type", "application/json")
                .body(serde_json::json!({"key": key, "message": message}).to_string())
                .send(),
        )
        .await
        .expect("an answer in time, not a hang")
        .expect("the server answers");
        let status = response.status().as_u16();
        let body = tokio::time::timeout(PATIENCE, response.bytes())
            .await
            .expect("a body in time")
            .expect("a body");
        let body = serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null);
        (status, body)
    }

    /// `GET /v1/sessions/{key}`: the status and the body.
    async fn session(&self, key: &str) -> (u16, serde_json::Value) {
        let response = tokio::time::timeout(
            PATIENCE,
            reqwest::Client::new()
                .get(format!("{}/v1/sessions/{key}", self.base))
                .bearer_auth(&self.token)
                .send(),
        )
        .await
        .expect("in time")
        .expect("get");
        let status = response.status().as_u16();
        let body = response.bytes().await.expect("a body");
        (status, serde_json::from_slice(&body).unwrap_or_default())
    }

    async fn sessions(&self) -> serde_json::Value {
        tokio::time::timeout(
            PATIENCE,
            reqwest::Client::new()
                .get(format!("{}/v1/sessions", self.base))
                .bearer_auth(&self.token)
                .send(),
        )
        .await
        .expect("in time")
        .expect("get")
        .bytes()
        .await
        .map(|b| serde_json::from_slice(&b).expect("JSON"))
        .expect("a body")
    }

    async fn stop(mut self) {
        let pid = Pid::from_raw(i32::try_from(self.child.id().expect("pid")).expect("pid"));
        kill(pid, Signal::SIGTERM).expect("SIGTERM");
        let status = tokio::time::timeout(PATIENCE, self.child.wait())
            .await
            .expect("exits in time")
            .expect("wait");
        assert_eq!(status.code(), Some(0), "a graceful stop exits 0");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_that_cannot_be_stored_is_refused_and_acknowledged_ones_survive() {
    let base = tempfile::tempdir().expect("tempdir");
    let disk = match Tmpfs::mount(&base.path().join("disk"), "8m") {
        Ok(disk) => disk,
        Err(why) => {
            assert!(
                std::env::var("WARDEN_REQUIRE_TMPFS").as_deref() != Ok("1"),
                "WARDEN_REQUIRE_TMPFS=1 but {why}"
            );
            println!("SKIPPED: {why}");
            return;
        }
    };
    let data = disk.0.join("data");
    let filler = disk.0.join("filler");
    let mock = MockServer::start(MockConfig::default())
        .await
        .expect("mock");
    let node = start(&data, &mock).await;
    let (status, _) = node.post("before", "hello").await;
    assert_eq!(status, 202);

    // The disk fills up. Every message is either acknowledged (stored)
    // or refused with a typed 503 — which, once the disk is full, must be
    // all of them soon.
    fill(&filler);
    let mut acknowledged = vec!["before".to_owned()];
    let mut refused = None;
    for i in 0..200 {
        let key = format!("full-{i}");
        let (status, body) = node.post(&key, &"x".repeat(4000)).await;
        match status {
            202 => acknowledged.push(key),
            503 => {
                refused = Some(body);
                break;
            }
            other => panic!("message {i}: {other} {body}"),
        }
    }
    let refused = refused.expect("a message refused once the disk is full");
    assert_eq!(refused["error"]["type"], "unavailable", "{refused}");
    let message = refused["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.to_lowercase().contains("space"),
        "the error says the disk is full: {message}"
    );
    // Still serving.
    assert!(node.sessions().await["sessions"].is_array());

    // Space returns; after a restart every acknowledged message is there.
    std::fs::remove_file(&filler).expect("free the disk");
    node.stop().await;
    let again = start(&data, &mock).await;
    for key in &acknowledged {
        let (status, body) = again.session(key).await;
        assert_eq!(status, 200, "acknowledged session {key} is kept: {body}");
        assert_eq!(body["key"], key.as_str(), "{body}");
    }
    again.stop().await;
    drop(disk);
}
