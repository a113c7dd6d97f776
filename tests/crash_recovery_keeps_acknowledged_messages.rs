//! A supervisor process SIGKILLed mid-write loses nothing it acknowledged.
//!
//! The test re-runs its own binary as a child that drives a supervisor with
//! many sessions over a sled store, printing a line for every acknowledged
//! message and every stored agent id. The parent kills it with SIGKILL (no
//! clean shutdown) while it is writing, then checks the database: every
//! acknowledged message is pending, every acknowledged id is stored, and a
//! new supervisor re-delivers the pending messages.
//!
//! A binary of its own, not a module of `tests/it`: the child re-runs this
//! binary by test name and is SIGKILLed, so the binary holds this test alone.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use warden_core::{AgentEvent, Frame, LifecycleEvent, Notice, SessionKey, SessionStore};
use warden_store::SledStore;

const CHILD_ENV: &str = "WARDEN_CRASH_CHILD_DB";
const SESSIONS: usize = 16;
const KILL_AFTER_ACKS: usize = 300;

#[test]
fn a_sigkilled_supervisor_loses_no_acknowledged_message_or_id() {
    if let Some(db) = std::env::var_os(CHILD_ENV) {
        child(db.into());
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("db");
    let mut child = Command::new(std::env::current_exe().expect("exe"))
        .args([
            "a_sigkilled_supervisor_loses_no_acknowledged_message_or_id",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, &db)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn child");
    let stdout = child.stdout.take().expect("stdout");
    let mut acked: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut ids: BTreeMap<String, String> = BTreeMap::new();
    let mut n = 0;
    for line in BufReader::new(stdout).lines() {
        let line = line.expect("line");
        // libtest may print "test <name> ... " before the first line.
        let start = ["ACK ", "ID "]
            .iter()
            .filter_map(|tag| line.find(tag))
            .min()
            .unwrap_or(0);
        let parts: Vec<_> = line[start..].split(' ').collect();
        match parts.as_slice() {
            ["ACK", key, text] => {
                acked.entry((*key).into()).or_default().push((*text).into());
                n += 1;
                if n == KILL_AFTER_ACKS {
                    child.kill().expect("SIGKILL"); // mid-write: the child keeps writing
                    break;
                }
            }
            ["ID", key, id] => {
                ids.insert((*key).into(), (*id).into());
            }
            _ => {}
        }
    }
    let status = child.wait().expect("wait");
    assert!(!status.success(), "the child must have been killed");
    assert!(n >= KILL_AFTER_ACKS, "child produced only {n} acks");

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let store = Arc::new(SledStore::open(&db).expect("reopen after crash"));
        for (key, texts) in &acked {
            let r = store
                .load(&SessionKey::new(key))
                .await
                .expect("readable")
                .expect("record of an acknowledged message");
            let pending: BTreeSet<_> = r.pending.iter().map(|m| m.text.as_str()).collect();
            for t in texts {
                assert!(pending.contains(t.as_str()), "{key}: acknowledged {t} lost");
            }
        }
        for (key, id) in &ids {
            let r = store
                .load(&SessionKey::new(key))
                .await
                .expect("ok")
                .expect("some");
            assert_eq!(r.agent_session_id.as_deref(), Some(id.as_str()), "{key}");
        }
        assert!(
            !ids.is_empty(),
            "no agent id was acknowledged before the kill"
        );

        // A new supervisor re-delivers what is pending, resuming the stored id.
        let (sup, _src, ctl, mut notices) = supervisor_with_store(config(), store.clone()).await;
        let (key, texts) = acked.iter().next().expect("some session");
        sup.session(key.as_str()).await.expect("session");
        let a = ctl
            .next_attempt()
            .patiently("the next attempt to open")
            .await
            .expect("re-delivered");
        assert_eq!(&a.request.message, &texts[0]);
        assert_eq!(
            a.request.resume_id.as_deref(),
            ids.get(key).map(String::as_str)
        );
        a.text("late answer");
        a.finish();
        let (k, notice) = notices
            .recv()
            .patiently("the next event")
            .await
            .expect("notice");
        assert_eq!(k.as_str(), key);
        assert!(
            matches!(notice, Notice::RecoveredReply { result: Ok(ref t), .. } if t == "late answer")
        );
        sup.shutdown().await;
    });
}

/// The child: many sessions, messages submitted as fast as they are
/// acknowledged, streams that never finish (so everything stays pending).
fn child(db: std::path::PathBuf) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        let store = Arc::new(SledStore::open(&db).expect("open"));
        let (sup, _src, ctl, _n) = supervisor_with_store(config(), store).await;
        let mut events = sup.subscribe();
        tokio::spawn(async move {
            while let Ok(ev) = events.recv().await {
                if let LifecycleEvent::AgentSessionId { key, session_id } = ev {
                    println!("ID {key} {session_id}");
                }
            }
        });
        tokio::spawn(async move {
            let mut open = Vec::new();
            while let Some(a) = ctl.next_attempt().await {
                a.send(Frame::Event(AgentEvent::SessionStarted {
                    session_id: format!("agent-{}", a.request.session_key),
                    model: None,
                }));
                open.push(a); // never finished
            }
        });
        let mut turns = Vec::new();
        for i in 0.. {
            let key = format!("s{}", i % SESSIONS);
            let text = format!("msg-{i}");
            let t = sup.send(key.as_str(), text.clone()).await.expect("send");
            println!("ACK {key} {text}");
            turns.push(t);
            if i % 64 == 0 {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
    });
}
