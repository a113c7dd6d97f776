//! Before a resume and on a resume failure the source knows where the
//! transcript should be (`projects/<key>/<id>.jsonl` under the config dir)
//! and its size.

use std::path::Path;

use crate::common::*;
use warden_claude::{ClaudeSource, transcript};
use warden_core::EventSource;

fn write_transcript(config: &Path, cwd: &Path, id: &str, bytes: usize) -> std::path::PathBuf {
    let path = transcript::transcript_path(config, &real(cwd), id);
    std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
    std::fs::write(&path, vec![b'x'; bytes]).expect("write");
    path
}

#[tokio::test]
async fn diagnostics_find_the_transcript_under_home_by_the_project_key() {
    let fx = Fixture::new();
    let source = ClaudeSource::new(fx.options(echo_script()));
    let config = fx.home.join(".claude");
    let d = source.diagnostics("abc", Some(&fx.workspace));
    let expected = config
        .join("projects")
        .join(transcript::project_key(&fx.workspace))
        .join("abc.jsonl");
    assert_eq!(d.transcript_path.as_deref(), Some(expected.as_path()));
    assert_eq!(d.transcript_bytes, None, "missing");
    // The key: every character outside [a-zA-Z0-9] is a dash.
    let key = transcript::project_key(&fx.workspace);
    assert!(key.ends_with("-work-space-1"), "{key}");
    assert!(key.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'));

    let path = write_transcript(&config, &fx.workspace, "abc", 1234);
    let d = source.diagnostics("abc", Some(&fx.workspace));
    assert_eq!(d.transcript_path, Some(path));
    assert_eq!(d.transcript_bytes, Some(1234));
    assert_eq!(d.stderr_tail, None, "no process ran yet");
}

#[tokio::test]
async fn claude_config_dir_wins_over_home_and_symlinks_are_resolved() {
    let fx = Fixture::new();
    let config = fx.dir.path().join("cfg");
    let link = fx.dir.path().join("link-to-ws");
    std::os::unix::fs::symlink(&fx.workspace, &link).expect("symlink");
    let source = ClaudeSource::new(
        fx.options(echo_script())
            .with_env("CLAUDE_CONFIG_DIR", &config),
    );
    let path = write_transcript(&config, &fx.workspace, "s-2", 10);
    let d = source.diagnostics("s-2", Some(&link));
    assert_eq!(d.transcript_path, Some(path));
    assert_eq!(d.transcript_bytes, Some(10));
}
