//! `warden serve` killed with -9 right after 30 turns, then its turn
//! log's write-ahead file damaged — a byte flipped in its first and its
//! last record (the newest turn's end), the file cut in half, or the file
//! replaced by a directory — then started again: it says so once at the default log level (the file, the bytes
//! skipped, the turns it cost), keeps the file aside instead of deleting
//! it, replays every intact record after the damage, and every turn a
//! client re-attaches to ends — with its `done`, or, where the damage took
//! its end, with the typed error `ETURN_LOG_DAMAGED` — instead of waiting
//! for ever. `warden sessions` reports it.

use crate::common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use futures_util::StreamExt as _;
use serde_json::Value;
use warden_mock::{MockConfig, MockServer};

const PATIENCE: Duration = Duration::from_secs(30);
const TURNS: usize = 30;

/// The turn's SSE events until its last (`done` or `error`), each as
/// `(event, data)`; panics if it does not end within `PATIENCE`.
async fn events_to_the_end(
    client: &reqwest::Client,
    base: &str,
    token: &str,
    id: &str,
) -> Vec<(String, Value)> {
    let response = client
        .get(format!("{base}/v1/turns/{id}/events"))
        .bearer_auth(token)
        .header("accept", "text/event-stream")
        .send()
        .await
        .expect("get events");
    assert_eq!(response.status(), 200, "turn {id} is known");
    let mut body = response.bytes_stream();
    let mut buf = String::new();
    let mut out = Vec::new();
    loop {
        while let Some(end) = buf.find("\n\n") {
            let block: String = buf.drain(..end + 2).collect();
            let mut event = String::new();
            let mut data = String::new();
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("event:") {
                    event = v.trim().to_owned();
                } else if let Some(v) = line.strip_prefix("data:") {
                    data.push_str(v.trim_start());
                }
            }
            if event.is_empty() {
                continue;
            }
            let last = event == "done" || event == "error";
            out.push((event, serde_json::from_str(&data).expect("JSON data")));
            if last {
                return out;
            }
        }
        let chunk = tokio::time::timeout(PATIENCE, body.next())
            .await
            .unwrap_or_else(|_| panic!("turn {id} did not end within {PATIENCE:?}: {out:?}"))
            .unwrap_or_else(|| panic!("turn {id}'s stream ended without a last event: {out:?}"))
            .expect("chunk");
        buf.push_str(&String::from_utf8_lossy(&chunk));
    }
}

fn log_files(wal: &Path, suffix: &str) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(wal)
        .expect("the turn log's directory")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.to_str().is_some_and(|p| p.ends_with(suffix)))
        .collect();
    files.sort();
    files
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flipped_byte_in_the_turn_log_is_reported_kept_aside_and_ends_every_turn() {
    damage_and_restart(|log| {
        let mut bytes = std::fs::read(log).expect("read");
        assert!(bytes.len() > 64, "{} bytes", bytes.len());
        // The records' starts, from their length fields: `[len][crc][payload]`.
        let mut starts = vec![0];
        loop {
            let at = *starts.last().expect("a start");
            let len = u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes")) as usize;
            if at + 8 + len >= bytes.len() {
                break;
            }
            starts.push(at + 8 + len);
        }
        // A byte inside the first record, and one inside the last (the
        // newest turn's end).
        bytes[9] ^= 0x01;
        bytes[starts[starts.len() - 1] + 9] ^= 0x01;
        std::fs::write(log, &bytes).expect("write");
    })
    .await;
}

/// Cut in half, what is left ends like a record a crash tore as it was
/// written; but the half cut off was acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_log_cut_in_half_is_reported_kept_aside_and_ends_every_turn() {
    damage_and_restart(|log| {
        let bytes = std::fs::read(log).expect("read");
        std::fs::write(log, &bytes[..bytes.len() / 2]).expect("cut");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_log_replaced_by_a_directory_is_reported_kept_aside_and_ends_every_turn() {
    damage_and_restart(|log| {
        std::fs::remove_file(log).expect("rm");
        std::fs::create_dir(log).expect("a directory in its place");
    })
    .await;
}

/// Runs 30 turns, kills the server, applies `damage` to its turn log's
/// first file, starts it again and checks the damage is told and every
/// turn ends.
async fn damage_and_restart(damage: impl FnOnce(&Path)) {
    let mock =
        MockServer::start(MockConfig::default().with_frame_interval(Duration::from_millis(1)))
            .await
            .expect("mock");
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let (mut server, base, token) = serve_on(&data, &mock.base_url(), &[], &[]).await;
    let client = reqwest::Client::new();
    let mut ids = Vec::new();
    for i in 0..TURNS {
        let response = client
            .post(format!("{base}/v1/turns"))
            .bearer_auth(&token)
            .header("content-type", "application/json")
            .body(format!(
                r#"{{"key": "ws-{}", "message": "hello {i}"}}"#,
                i % 5
            ))
            .send()
            .await
            .expect("post");
        assert_eq!(response.status(), 202);
        let created: Value =
            serde_json::from_slice(&response.bytes().await.expect("body")).expect("JSON");
        ids.push(created["id"].as_str().expect("id").to_owned());
    }
    for id in &ids {
        let events = events_to_the_end(&client, &base, &token, id).await;
        assert_eq!(events.last().map(|e| e.0.as_str()), Some("done"));
    }
    // kill -9 at once: the last batches are in the write-ahead log, and
    // maybe not yet in sled's own files.
    server.start_kill().expect("SIGKILL");
    let _ = server.wait().await;
    let wal = data.join("sessions.db").join("turns.wal");
    let logs = log_files(&wal, ".log");
    assert!(!logs.is_empty(), "kill -9 leaves the turn log's file");
    damage(&logs[0]);

    let (mut server, base, token, logged) = serve_logged(&data, &mock.base_url(), &[], &[]).await;
    // Every turn ends: its `done`, or the typed error of a lost end.
    let mut lost = 0;
    for id in &ids {
        let events = events_to_the_end(&client, &base, &token, id).await;
        let (last, data) = events.last().expect("a last event");
        match last.as_str() {
            "done" => {}
            "error" => {
                assert_eq!(data["code"], "ETURN_LOG_DAMAGED", "{data}");
                assert_eq!(data["exit"], 1);
                lost += 1;
            }
            other => panic!("turn {id} ended with {other}"),
        }
    }
    // Said once, at the default level, naming the file kept aside.
    let kept = format!("{}.damaged", logs[0].display());
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let warning = loop {
        let found = logged
            .lock()
            .iter()
            .filter(|l| l.contains("the turn log was damaged"))
            .cloned()
            .collect::<Vec<_>>();
        if !found.is_empty() {
            assert_eq!(found.len(), 1, "{found:?}");
            break found[0].clone();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no warning of the damage: {:?}",
            logged.lock()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(warning.contains("WARN"), "{warning}");
    assert!(warning.contains(&kept), "{warning}");
    assert!(warning.contains("skipped_bytes="), "{warning}");
    assert!(
        warning.contains(&format!("{lost} turn(s) whose end was lost")),
        "{lost} turns ended with ETURN_LOG_DAMAGED; {warning}"
    );
    // Kept aside, never deleted; not replayed again.
    assert!(Path::new(&kept).exists(), "{kept} is kept");
    assert!(!logs[0].exists(), "the damaged file is no longer replayed");
    let _ = server.start_kill();
    let _ = server.wait().await;

    // `warden sessions` tells of it.
    let out = run(&["sessions", "--data-dir", arg(&data)]).await;
    let said = stderr(&out);
    assert!(
        said.contains("damaged turn log") && said.contains(&kept),
        "{said}"
    );
    assert!(
        said.contains(&format!("{lost} turn(s) ended with ETURN_LOG_DAMAGED")),
        "{said}"
    );
    eprintln!("{lost} of {TURNS} turns had lost their end");
    mock.shutdown().await;
}
