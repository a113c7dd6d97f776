//! `warden chat --agent <cli>` against `warden mock` in a scratch
//! directory (a workspace `repo`, a `home` for the CLI, the data directory
//! `data`): the fixture the chat tests of the chat-completions CLIs share.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::Output;
use std::time::Duration;

use warden_mock::{MockConfig, MockServer};

use super::{arg, check_no_panic, code, command, output, stderr, stdout};

/// One CLI's chats: its `--agent` name and the variable naming its binary.
pub(crate) struct AgentChat {
    pub(crate) agent: &'static str,
    pub(crate) bin_env: &'static str,
    pub(crate) bin: OsString,
    pub(crate) mock: MockServer,
    pub(crate) dir: tempfile::TempDir,
}

impl AgentChat {
    /// A fresh mock and scratch directory for `agent`, run from `bin`.
    pub(crate) async fn new(agent: &'static str, bin_env: &'static str, bin: OsString) -> Self {
        let mock = MockServer::start(MockConfig::default())
            .await
            .expect("mock");
        let dir = tempfile::tempdir().expect("tempdir");
        for d in ["repo", "home"] {
            std::fs::create_dir_all(dir.path().join(d)).expect("mkdir");
        }
        Self {
            agent,
            bin_env,
            bin,
            mock,
            dir,
        }
    }

    /// `name` under the scratch directory.
    pub(crate) fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// One `warden chat` turn with `extra` arguments before the message and
    /// `env` set: it exits 0, no panic, the mock's reply once and the
    /// context indicator on stdout.
    pub(crate) async fn chat(&self, message: &str, extra: &[&str], env: &[(&str, &str)]) -> Output {
        let (workspace, data) = (self.path("repo"), self.path("data"));
        let base_url = self.mock.base_url();
        let mut args = vec![
            "chat",
            "--workspace",
            arg(&workspace),
            "--data-dir",
            arg(&data),
            "--agent",
            self.agent,
            "--base-url",
            &base_url,
        ];
        args.extend_from_slice(extra);
        args.push(message);
        let mut cmd = command(&args);
        cmd.env(self.bin_env, &self.bin)
            .env("HOME", self.path("home"));
        for (k, v) in env {
            cmd.env(k, v);
        }
        let out = output(cmd, Duration::from_secs(120)).await;
        check_no_panic(&out);
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        let reply = stdout(&out);
        assert_eq!(
            reply.matches("Hello from warden-mock.").count(),
            1,
            "the reply, once: {reply}"
        );
        assert!(reply.contains("[ctx: "), "{reply}");
        out
    }
}
