//! What a killed `warden chat` leaves behind does not cost the conversation
//! or duplicate it: a torn last transcript line loses only that turn (and
//! the user is told), and a pending message that was in fact answered before
//! the crash is not answered a second time.

use crate::common;

use std::path::Path;

use common::*;
use serde_json::Value;
use warden_core::{Durability, PendingMessage, SessionKey, SessionStore};
use warden_mock::{MockConfig, MockServer};

fn chat<'a>(workspace: &'a Path, data: &'a Path, base: &'a str, message: &'a str) -> Vec<&'a str> {
    vec![
        "chat",
        "--workspace",
        arg(workspace),
        "--agent",
        "anthropic",
        "--base-url",
        base,
        "--data-dir",
        arg(data),
        message,
    ]
}

async fn session(data: &Path) -> Value {
    let out = run(&["sessions", "--json", "--data-dir", arg(data)]).await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let all: Vec<Value> = serde_json::from_str(&stdout(&out)).expect("JSON array");
    assert_eq!(all.len(), 1, "{all:?}");
    all[0].clone()
}

fn transcript_lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .expect("transcript")
        .lines()
        .map(|l| serde_json::from_str(l).expect("every line is whole"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_torn_transcript_tail_costs_one_turn_and_the_user_is_told() {
    let server = MockServer::start(MockConfig::default())
        .await
        .expect("mock");
    let base = server.base_url();
    let dir = tempfile::tempdir().expect("tempdir");
    let (data, workspace) = (dir.path().join("data"), dir.path().join("repo"));
    std::fs::create_dir(&workspace).expect("mkdir");
    for message in ["one", "two", "three"] {
        let out = run(&chat(&workspace, &data, &base, message)).await;
        assert_eq!(code(&out), 0, "{}", stderr(&out));
    }
    let id = session(&data).await["agent_session_id"]
        .as_str()
        .expect("conversation")
        .to_owned();
    let path = data.join("transcripts").join(format!("{id}.jsonl"));
    // A crash in the middle of writing turn three.
    let len = std::fs::metadata(&path).expect("meta").len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .expect("open")
        .set_len(len - 15)
        .expect("cut");

    let out = run(&chat(&workspace, &data, &base, "four")).await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(
        stderr(&out).contains(&format!(
            "the last turn of conversation {id} was cut off by a crash and is lost"
        )),
        "{}",
        stderr(&out)
    );
    assert!(!stderr(&out).contains("starting fresh"), "{}", stderr(&out));
    // Same conversation, turns one and two kept, four appended cleanly.
    assert_eq!(session(&data).await["agent_session_id"], id.as_str());
    let users: Vec<String> = transcript_lines(&path)
        .iter()
        .filter(|l| l["role"] == "user")
        .map(|l| l["content"].as_str().expect("text").to_owned())
        .collect();
    assert_eq!(users, ["one", "two", "four"]);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pending_message_answered_before_the_crash_is_not_answered_twice() {
    let server = MockServer::start(MockConfig::default())
        .await
        .expect("mock");
    let base = server.base_url();
    let dir = tempfile::tempdir().expect("tempdir");
    let (data, workspace) = (dir.path().join("data"), dir.path().join("repo"));
    std::fs::create_dir(&workspace).expect("mkdir");
    let first = run(&chat(&workspace, &data, &base, "What changed?")).await;
    assert_eq!(code(&first), 0, "{}", stderr(&first));
    let stored = session(&data).await;
    let id = stored["agent_session_id"].as_str().expect("id").to_owned();
    let key = stored["key"].as_str().expect("key").to_owned();

    // The state a kill -9 leaves between "the reply is in the transcript"
    // and "the message is marked answered": message 1 still pending.
    {
        let store = warden_store::SledStore::open(data.join("sessions.db")).expect("open");
        let mut record = store
            .load(&SessionKey::new(&key))
            .await
            .expect("load")
            .expect("record");
        record.pending.push(PendingMessage {
            id: 1,
            text: "What changed?".into(),
            accepted_at_ms: record.last_active_ms,
            model: None,
            idempotency_key: None,
        });
        store
            .save(&record, Durability::Flushed)
            .await
            .expect("save");
    }

    let next = run(&chat(&workspace, &data, &base, "And now?")).await;
    assert_eq!(code(&next), 0, "{}", stderr(&next));
    assert!(
        stderr(&next).contains("re-sent pending message #1"),
        "{}",
        stderr(&next)
    );
    assert!(
        stdout(&next).contains("had 8 characters"),
        "{}",
        stdout(&next)
    );
    assert_eq!(
        server.requests_to("/v1/messages"),
        2,
        "the re-sent message was not sent to the API again"
    );
    let path = data.join("transcripts").join(format!("{id}.jsonl"));
    let lines = transcript_lines(&path);
    let users: Vec<&str> = lines
        .iter()
        .filter(|l| l["role"] == "user")
        .map(|l| l["content"].as_str().expect("text"))
        .collect();
    assert_eq!(users, ["What changed?", "And now?"], "no duplicate turn");
    assert_eq!(lines[0]["turn"], 1);
    assert_eq!(lines[2]["turn"], 2);
    assert_eq!(session(&data).await["pending_messages"], 0);
    server.shutdown().await;
}
