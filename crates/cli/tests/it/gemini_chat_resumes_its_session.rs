//! `warden chat --agent gemini`: the real Gemini CLI (`WARDEN_GEMINI_BIN`,
//! installed by `.ci/run`) against the mock's Gemini endpoint. Two
//! invocations, one Gemini session, the context indicator, and the CLI's
//! settings in warden's data directory (`DATA_DIR/gemini/.gemini`), never
//! in the user's `~/.gemini`. Skipped with a printed reason when the
//! binary is not there, unless `WARDEN_REQUIRE_GEMINI=1`.

use crate::common;

use std::path::Path;
use std::time::Duration;

use common::*;
use serde_json::Value;
use warden_mock::{MockConfig, MockServer};

async fn sessions(data: &Path) -> Vec<Value> {
    let out = run(&["sessions", "--json", "--data-dir", arg(data)]).await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    serde_json::from_str(&stdout(&out)).expect("JSON array")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gemini_chats_resume_the_same_session_with_settings_of_their_own() {
    let Some(bin) = std::env::var_os("WARDEN_GEMINI_BIN").filter(|v| !v.is_empty()) else {
        assert_ne!(
            std::env::var("WARDEN_REQUIRE_GEMINI").as_deref(),
            Ok("1"),
            "WARDEN_REQUIRE_GEMINI=1 but WARDEN_GEMINI_BIN is unset"
        );
        eprintln!("skipped: set WARDEN_GEMINI_BIN to the gemini binary to run this test");
        return;
    };
    let server = MockServer::start(MockConfig::default())
        .await
        .expect("mock");
    let dir = tempfile::tempdir().expect("tempdir");
    let (data, workspace, home) = test_dirs(dir.path());
    let base_url = server.base_url();
    let chat = |message: &str| {
        let mut cmd = command(&[
            "chat",
            "--workspace",
            arg(&workspace),
            "--data-dir",
            arg(&data),
            "--agent",
            "gemini",
            "--base-url",
            &base_url,
            message,
        ]);
        cmd.env("WARDEN_GEMINI_BIN", &bin)
            .env("GEMINI_API_KEY", "dummy")
            .env("HOME", &home);
        cmd
    };
    let first = output(chat("Say hello."), Duration::from_secs(120)).await;
    assert_eq!(code(&first), 0, "{}", stderr(&first));
    assert!(
        stdout(&first).contains("Hello from warden-mock."),
        "{}",
        stdout(&first)
    );
    assert!(stdout(&first).contains("[ctx: "), "{}", stdout(&first));
    let id = sessions(&data).await[0]["agent_session_id"]
        .as_str()
        .expect("Gemini's session id")
        .to_owned();

    let second = output(chat("Again."), Duration::from_secs(120)).await;
    assert_eq!(code(&second), 0, "{}", stderr(&second));
    assert_eq!(sessions(&data).await[0]["agent_session_id"], id.as_str());
    assert!(
        !stderr(&second).contains("starting fresh"),
        "{}",
        stderr(&second)
    );
    assert_eq!(
        server.requests_to("/v1beta/models/gemini-2.5-pro:streamGenerateContent"),
        2
    );
    let settings: Value = serde_json::from_slice(
        &std::fs::read(data.join("gemini/.gemini/settings.json")).expect("settings written"),
    )
    .expect("JSON");
    assert_eq!(
        settings["security"]["auth"]["selectedType"],
        "gemini-api-key"
    );
    assert_eq!(settings["privacy"]["usageStatisticsEnabled"], false);
    assert!(
        !home.join(".gemini").exists(),
        "the user's ~/.gemini untouched"
    );
    server.shutdown().await;
}
