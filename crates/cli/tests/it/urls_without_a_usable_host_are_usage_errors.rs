//! A URL with no usable host (empty, `http://`, `http:///v1/messages`,
//! port 0) is a usage error before anything runs: it never falls back to the
//! provider's real endpoint (which would get the API key) and never
//! connects to a host parsed out of the path.

use crate::common;

use common::*;

const BAD_URLS: [&str; 6] = [
    "",
    "http://",
    "https://",
    "http:///v1/messages",
    "http://127.0.0.1:0/v1/messages",
    "http://:8080/v1/messages",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_refuses_a_url_without_a_usable_host_with_exit_2() {
    for url in BAD_URLS {
        let mut cmd = command(&["stream", url, "--retries", "0"]);
        // Were the URL taken, this key would go to whatever it names.
        cmd.env("ANTHROPIC_API_KEY", "sk-must-not-leave");
        let out = output(cmd, std::time::Duration::from_secs(30)).await;
        assert_eq!(code(&out), 2, "{url:?}: {}", stderr(&out));
        assert_one_line_error(&out, "invalid URL");
        assert!(!stderr(&out).contains("sk-must-not-leave"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_refuses_an_empty_or_hostless_base_url_with_exit_2() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    for agent in ["anthropic", "openai", "claude-code"] {
        for url in BAD_URLS {
            let mut cmd = command(&[
                "chat",
                "--workspace",
                arg(dir.path()),
                "--data-dir",
                arg(&data),
                "--agent",
                agent,
                "--base-url",
                url,
                "--claude-bin",
                arg(&dir.path().join("no-claude-here")),
                "hi",
            ]);
            cmd.env("ANTHROPIC_API_KEY", "sk-must-not-leave")
                .env("OPENAI_API_KEY", "sk-must-not-leave");
            let out = output(cmd, std::time::Duration::from_secs(30)).await;
            assert_eq!(code(&out), 2, "{agent} {url:?}: {}", stderr(&out));
            assert_one_line_error(&out, "invalid URL");
        }
    }
    // Nothing ran: no store was created.
    assert!(!data.join("sessions.db").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_with_claude_code_takes_a_base_url() {
    // Accepted (it reaches the child as ANTHROPIC_BASE_URL, see the unit
    // test in chat.rs): what fails here is only the missing binary.
    let dir = tempfile::tempdir().expect("tempdir");
    let out = run(&[
        "chat",
        "--workspace",
        arg(dir.path()),
        "--data-dir",
        arg(&dir.path().join("data")),
        "--agent",
        "claude-code",
        "--base-url",
        "http://127.0.0.1:9",
        "--claude-bin",
        arg(&dir.path().join("no-claude-here")),
        "hi",
    ])
    .await;
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert_one_line_error(&out, "Claude Code CLI");
}

/// A URL without a scheme, or a plain-HTTP one without a port (a forgotten
/// port, not port 80), is a usage error that names the fix, for every
/// command that takes one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_url_without_a_scheme_or_port_names_the_fix() {
    for (url, fix) in [
        ("127.0.0.1:8080", "write http://127.0.0.1:8080 or https://"),
        (
            "localhost:8080/v1/messages",
            "write http://localhost:8080/v1/messages",
        ),
        (
            "http://localhost/v1/messages",
            "write http://localhost:PORT",
        ),
    ] {
        let out = run(&["stream", url, "--retries", "0"]).await;
        assert_eq!(code(&out), 2, "{url}: {}", stderr(&out));
        assert_one_line_error(&out, fix);
        let out = run(&[
            "proxy",
            "--listen",
            "127.0.0.1:0",
            "--anthropic-upstream",
            url,
        ])
        .await;
        assert_eq!(code(&out), 2, "{url}: {}", stderr(&out));
        assert_one_line_error(&out, fix);
    }
    // Port 80 said out loud, and HTTPS's default port, are fine: `stream`
    // gets as far as connecting (and fails there, exit 5, not 2).
    let out = run(&[
        "stream",
        "http://127.0.0.1:80/v1/messages",
        "--retries",
        "0",
    ])
    .await;
    assert_ne!(code(&out), 2, "{}", stderr(&out));
}

/// `OTEL_EXPORTER_OTLP_ENDPOINT=localhost:4317`, a common spelling without
/// a scheme, is taken as `http://localhost:4317` (it panicked with exit 101:
/// the exporter's runtime was dropped on an async thread); a scheme that is
/// neither `http` nor `https` is a usage error naming the fix, and so is an
/// exporter that cannot be built (this build's exporter has no TLS: an
/// `https://` endpoint), never a panic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_otlp_endpoint_without_a_scheme_is_http_and_a_foreign_scheme_is_exit_2() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (endpoint, exit) in [
        ("localhost:1", 0),
        ("ftp://localhost:1", 2),
        ("https://localhost:1", 2),
    ] {
        let mut cmd = command(&["sessions", "--data-dir", arg(dir.path())]);
        cmd.env("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint);
        let out = output(cmd, std::time::Duration::from_secs(30)).await;
        check_no_panic(&out);
        assert_eq!(code(&out), exit, "{endpoint}: {}", stderr(&out));
        if endpoint.starts_with("ftp") {
            assert_one_line_error(&out, "http://127.0.0.1:4317");
        }
    }
}
