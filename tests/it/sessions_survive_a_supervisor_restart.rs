//! The sled store on disk: a whole-supervisor restart resumes sessions with
//! their stored ids; corrupt and newer-schema records are per-key errors
//! that are never overwritten; the files are private; one owner at a time.

use std::sync::Arc;

use crate::common::*;
use warden_core::{
    AgentEvent, Durability, Frame, SessionKey, SessionRecord, SessionStore, StoreError,
    SupervisorError, Usage,
};
use warden_store::SledStore;

#[tokio::test]
async fn a_restarted_supervisor_resumes_sessions_with_their_stored_ids() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("sessions.db");
    {
        let store = Arc::new(SledStore::open(&db).expect("open"));
        let (sup, _src, ctl, _n) = supervisor_with_store(config(), store.clone()).await;
        for (key, id) in [("a", "id-a"), ("b", "id-b")] {
            let turn = sup.send(key, "hello").await.expect("send");
            let at = ctl
                .next_attempt()
                .patiently("the next attempt to open")
                .await
                .expect("attempt");
            assert_eq!(at.request.resume_id, None);
            at.send(Frame::Event(AgentEvent::SessionStarted {
                session_id: id.into(),
                model: Some("claude-x".into()),
            }));
            at.send(Frame::Event(AgentEvent::Usage(Usage {
                input_tokens: 10,
                cache_creation_input_tokens: 0,
                cache_read_input_tokens: 39_990,
                output_tokens: 5,
            })));
            at.text("hi");
            at.finish();
            turn.finish()
                .patiently("the turn to finish")
                .await
                .expect("ok");
        }
        sup.shutdown().await;
    }
    // A new process would open the same directory; the old handles are gone.
    let store = Arc::new(SledStore::open(&db).expect("reopen"));
    let (sup, _src, ctl, _n) = supervisor_with_store(config(), store.clone()).await;
    for (key, id) in [("a", "id-a"), ("b", "id-b")] {
        let turn = sup.send(key, "again").await.expect("send");
        let at = ctl
            .next_attempt()
            .patiently("the next attempt to open")
            .await
            .expect("attempt");
        assert_eq!(at.request.resume_id.as_deref(), Some(id), "{key}");
        at.finish();
        turn.finish()
            .patiently("the turn to finish")
            .await
            .expect("ok");
        let r = store
            .load(&SessionKey::new(key))
            .await
            .expect("load")
            .expect("some");
        assert_eq!(r.model.as_deref(), Some("claude-x"));
        assert_eq!(r.usage.expect("usage").context_percent, 20);
    }
    sup.shutdown().await;
}

#[tokio::test]
async fn corrupt_and_newer_records_are_per_key_errors_never_overwritten() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Arc::new(SledStore::open(dir.path().join("db")).expect("open"));
    store.put_raw("bad", b"\x00\x01garbage").expect("raw");
    let mut newer = vec![0xff, 0xfe];
    newer.extend_from_slice(b"from the future");
    store.put_raw("newer", &newer).expect("raw");
    let good = SessionRecord::new(&SessionKey::new("good"), None);
    store.save(&good, Durability::Flushed).await.expect("save");

    let (sup, _src, ctl, _n) = supervisor_with_store(config(), store.clone()).await;
    match sup.send("bad", "hi").await {
        Err(SupervisorError::Store {
            error: StoreError::Corrupt { key, .. },
            ..
        }) => assert_eq!(key, "bad"),
        other => panic!("unexpected {other:?}"),
    }
    match sup.session("newer").await {
        Err(SupervisorError::Store {
            error: StoreError::NewerSchema { found: 0xfffe, .. },
            ..
        }) => {}
        other => panic!("unexpected {other:?}"),
    }
    // The supervisor is fine and serves other keys.
    let turn = sup.send("good", "hi").await.expect("send");
    ctl.next_attempt()
        .patiently("the next attempt to open")
        .await
        .expect("attempt")
        .finish();
    turn.finish()
        .patiently("the turn to finish")
        .await
        .expect("ok");
    // Listing reports each slot.
    let listed = sup.stored_sessions().await.expect("list");
    assert_eq!(listed.len(), 3);
    assert_eq!(listed.iter().filter(|r| r.is_ok()).count(), 1);
    sup.shutdown().await;
    drop(sup);
    // The bad bytes are untouched.
    let reopened = {
        drop(store);
        SledStore::open(dir.path().join("db")).expect("reopen")
    };
    assert!(matches!(
        reopened.load(&SessionKey::new("bad")).await,
        Err(StoreError::Corrupt { .. })
    ));
    assert!(matches!(
        reopened.load(&SessionKey::new("newer")).await,
        Err(StoreError::NewerSchema { .. })
    ));
}

#[tokio::test]
async fn a_held_database_is_a_clear_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("db");
    let _held = SledStore::open(&path).expect("open");
    match SledStore::open(&path) {
        Err(e @ StoreError::Locked { .. }) => {
            assert!(e.to_string().contains("in use by another process"), "{e}")
        }
        other => panic!("unexpected {other:?}"),
    }
}

#[cfg(unix)]
#[tokio::test]
async fn database_files_are_private_to_the_user() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("nested").join("db");
    let store = SledStore::open(&path).expect("open");
    store
        .save(
            &SessionRecord::new(&SessionKey::new("k"), None),
            Durability::Flushed,
        )
        .await
        .expect("save");
    let mode =
        |p: &std::path::Path| std::fs::metadata(p).expect("meta").permissions().mode() & 0o777;
    assert_eq!(mode(&path), 0o700);
    let mut files = 0;
    for entry in std::fs::read_dir(&path).expect("read_dir").flatten() {
        if entry.path().is_file() {
            files += 1;
            assert_eq!(mode(&entry.path()), 0o600, "{}", entry.path().display());
        }
    }
    assert!(files > 0);
}
