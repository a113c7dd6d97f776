//! How [`GeminiOptions`] starts `gemini`: arguments, environment, the
//! settings file it writes and what fails before anything starts.

use std::ffi::OsString;
use std::path::PathBuf;

use super::*;

fn text(args: &[OsString]) -> Vec<String> {
    args.iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect()
}

fn spawn<'a>(resume: Option<&'a str>, message: &'a str) -> SpawnRequest<'a> {
    SpawnRequest {
        resume_id: resume,
        model: None,
        system_prompt: None,
        workspace: None,
        message: Some(message),
    }
}

#[test]
fn a_turn_is_stream_json_with_the_model_and_the_prompt_as_one_argument() {
    let o = GeminiOptions::default().with_arg("--x");
    let args = text(&o.args(None, None, "-hi there"));
    assert_eq!(
        args[..5],
        [
            "--output-format",
            "stream-json",
            "--skip-trust",
            "-m",
            GEMINI_DEFAULT_MODEL
        ]
    );
    assert!(
        !args
            .iter()
            .any(|a| a == "--resume" || a == "--approval-mode")
    );
    assert_eq!(args[args.len() - 2..], ["--x", "--prompt=-hi there"]);
    let o = o.with_approval(GeminiApproval::Yolo);
    let args = text(&o.args(Some("abc"), Some("gemini-x"), "m"));
    assert!(args.windows(2).any(|w| w == ["-m", "gemini-x"]));
    assert!(args.windows(2).any(|w| w == ["--resume", "abc"]));
    assert!(args.windows(2).any(|w| w == ["--approval-mode", "yolo"]));
}

#[test]
fn the_command_sets_no_relaunch_its_home_and_base_url_and_writes_the_settings() {
    let dir = tempfile::tempdir().expect("tempdir");
    let settings = dir.path().join(".gemini/settings.json");
    std::fs::create_dir_all(settings.parent().expect("parent")).expect("mkdir");
    // A key of the user's own is kept.
    std::fs::write(
        &settings,
        r#"{"ui":{"theme":"x"},"general":{"maxAttempts":10}}"#,
    )
    .expect("write");
    let o = GeminiOptions::default()
        .with_gemini_home(dir.path())
        .with_base_url("http://127.0.0.1:9")
        .with_env("GEMINI_API_KEY", "k");
    let c = o.command(&spawn(None, "hi")).expect("a command");
    let env: Vec<(String, String)> = c
        .env
        .iter()
        .map(|(k, v)| (k.to_string_lossy().into(), v.to_string_lossy().into()))
        .collect();
    for (k, v) in [
        ("GEMINI_CLI_NO_RELAUNCH", "true"),
        ("GEMINI_CLI_HOME", &*dir.path().to_string_lossy()),
        ("GOOGLE_GEMINI_BASE_URL", "http://127.0.0.1:9"),
        ("GEMINI_API_KEY", "k"),
    ] {
        assert!(env.contains(&(k.into(), v.into())), "{k} in {env:?}");
    }
    let written: Value =
        serde_json::from_slice(&std::fs::read(&settings).expect("read")).expect("json");
    assert_eq!(
        written["security"]["auth"]["selectedType"],
        "gemini-api-key"
    );
    assert_eq!(written["privacy"]["usageStatisticsEnabled"], false);
    assert_eq!(written["general"]["maxAttempts"], 1);
    assert_eq!(written["ui"]["theme"], "x");
    assert_eq!(o.gemini_dir(), Some(dir.path().join(".gemini")));
}

#[test]
fn latest_is_no_session_id_and_an_over_long_message_fails_before_anything_starts() {
    // A resume id that is not a UUID fails in the source before `command`.
    assert!(!<super::GeminiParser as crate::cli::TurnParser>::is_session_id("latest"));
    assert!(!<super::GeminiParser as crate::cli::TurnParser>::is_session_id("3"));
    let o = GeminiOptions::default();
    let long = "x".repeat(GEMINI_MAX_PROMPT_BYTES + 1);
    let e = o.command(&spawn(None, &long)).err();
    assert!(
        matches!(e, Some(StreamError::Api { retryable: false, ref kind, .. }) if kind == "message_too_long"),
        "{e:?}"
    );
}

#[test]
fn without_its_own_home_the_gemini_dir_is_under_home_from_the_child_env() {
    let o = GeminiOptions::default().with_env("HOME", "/h");
    assert_eq!(o.gemini_dir(), Some(PathBuf::from("/h/.gemini")));
    let o = o.with_env("GEMINI_CLI_HOME", "/g");
    assert_eq!(o.gemini_dir(), Some(PathBuf::from("/g/.gemini")));
    assert!(
        o.write_settings().is_ok(),
        "no home of its own: nothing written"
    );
}
