//! Two spellings of one directory reach one SessionActor.

use crate::common::*;
use warden_core::LifecycleEvent;

#[tokio::test(start_paused = true)]
async fn symlink_trailing_slash_and_dotdot_spellings_reach_one_session() {
    let dir = tempfile::tempdir().expect("tempdir");
    let real = dir.path().join("real.project");
    std::fs::create_dir_all(real.join("sub")).expect("mkdir");
    let link = dir.path().join("link");
    std::os::unix::fs::symlink(&real, &link).expect("symlink");

    let (sup, ctl) = supervisor_with(config()).await;
    let mut events = sup.subscribe();
    let canonical = sup.workspace(&real).await.expect("session");
    let spellings = [
        format!("{}/", real.display()),
        format!("{}//", real.display()),
        format!("{}/./sub/..", real.display()),
        link.display().to_string(),
        format!("{}/", link.display()),
        format!("{}/sub/../", link.display()),
    ];
    for s in &spellings {
        let h = sup.workspace(s).await.expect("session");
        assert_eq!(h.actor().get_id(), canonical.actor().get_id(), "{s}");
        // `key_for` says which key a spelling maps to, without a session.
        assert_eq!(&sup.key_for(s).expect("key"), canonical.key(), "{s}");
    }
    assert_eq!(
        sup.key_for(&real).expect("key").as_str(),
        std::fs::canonicalize(&real)
            .expect("canonical")
            .to_string_lossy()
    );
    assert_eq!(sup.sessions().await.expect("alive").len(), 1);
    let ev = wait_for(&mut events, |e| {
        matches!(e, LifecycleEvent::WorkspaceNormalized { .. })
    })
    .await;
    assert!(matches!(ev, LifecycleEvent::WorkspaceNormalized { .. }));

    // Bindings normalize too, and the agent runs in the normalized cwd.
    let bound = sup
        .bind("#general", format!("{}/", link.display()))
        .expect("bind");
    assert_eq!(bound, std::fs::canonicalize(&real).expect("canonical"));
    let turn = sup.send_bound("#general", "hi").await.expect("send");
    let a = ctl
        .next_attempt()
        .within("the next attempt to open")
        .await
        .expect("attempt");
    assert_eq!(a.request.workspace.as_deref(), Some(bound.as_path()));
    a.finish();
    turn.finish()
        .within("the turn to finish")
        .await
        .expect("ok");
    assert_eq!(sup.sessions().await.expect("alive").len(), 1);
    sup.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_missing_directory_falls_back_to_the_cleaned_path_through_a_symlinked_parent() {
    let dir = tempfile::tempdir().expect("tempdir");
    let real = dir.path().join("real");
    std::fs::create_dir_all(&real).expect("mkdir");
    let link = dir.path().join("link");
    std::os::unix::fs::symlink(&real, &link).expect("symlink");
    let (sup, _ctl) = supervisor_with(config()).await;
    let a = sup.workspace(real.join("not-yet")).await.expect("session");
    let b = sup
        .workspace(format!("{}/./not-yet/", link.display()))
        .await
        .expect("session");
    assert_eq!(a.actor().get_id(), b.actor().get_id());
    assert!(matches!(
        sup.send_bound("nobody", "hi").await,
        Err(warden_core::SupervisorError::Unbound(_))
    ));
    sup.shutdown().await;
}
