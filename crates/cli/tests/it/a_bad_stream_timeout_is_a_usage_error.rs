//! A `WARDEN_STREAM_TIMEOUT` that is not a whole number of milliseconds in
//! range is refused with exit 2 by every command that reads it, before
//! anything listens or runs: a typo never silently becomes the 45 s default.

use crate::common;

use common::*;

const BAD: [&str; 3] = ["45x", "0", "not-a-number"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_refuses_a_bad_stream_timeout_unless_timeout_is_given() {
    for value in BAD {
        let mut cmd = command(&["proxy", "--listen", "127.0.0.1:0"]);
        cmd.env("WARDEN_STREAM_TIMEOUT", value);
        let out = output(cmd, std::time::Duration::from_secs(30)).await;
        assert_eq!(code(&out), 2, "{value:?}: {}", stderr(&out));
        assert_one_line_error(&out, "WARDEN_STREAM_TIMEOUT");
        assert!(
            stdout(&out).is_empty(),
            "nothing listened: {}",
            stdout(&out)
        );
    }
    // `--timeout` wins over the environment: the proxy starts.
    let mut cmd = command(&["proxy", "--listen", "127.0.0.1:0", "--timeout", "5000"]);
    cmd.env("WARDEN_STREAM_TIMEOUT", "not-a-number");
    let (mut child, base, _lines) = spawn_listening(cmd, std::time::Duration::from_secs(30)).await;
    assert!(base.starts_with("http://127.0.0.1:"), "{base}");
    child.kill().await.expect("stop the proxy");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_refuses_a_bad_stream_timeout() {
    let dir = tempfile::tempdir().expect("tempdir");
    for value in BAD {
        let mut cmd = command(&[
            "chat",
            "--workspace",
            arg(dir.path()),
            "--data-dir",
            arg(&dir.path().join("data")),
            "--base-url",
            "http://127.0.0.1:9/",
            "hi",
        ]);
        cmd.env("WARDEN_STREAM_TIMEOUT", value)
            .env("ANTHROPIC_API_KEY", "sk-test");
        let out = output(cmd, std::time::Duration::from_secs(30)).await;
        assert_eq!(code(&out), 2, "{value:?}: {}", stderr(&out));
        assert_one_line_error(&out, "WARDEN_STREAM_TIMEOUT");
    }
}

/// Durations read one way everywhere: a unit suffix works in the variable
/// and in every flag, a bare number keeps the flag's unit, and an unknown
/// unit is a usage error that lists the known ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn durations_take_a_unit_the_same_way_everywhere() {
    let mut cmd = command(&["proxy", "--listen", "127.0.0.1:0", "--grace", "1.5s"]);
    cmd.env("WARDEN_STREAM_TIMEOUT", "45s");
    let (mut child, _base, _lines) = spawn_listening(cmd, std::time::Duration::from_secs(30)).await;
    child.kill().await.expect("stop the proxy");
    let cmd = command(&["proxy", "--listen", "127.0.0.1:0", "--timeout", "2m"]);
    let (mut child, _base, _lines) = spawn_listening(cmd, std::time::Duration::from_secs(30)).await;
    child.kill().await.expect("stop the proxy");
    for args in [
        vec!["proxy", "--listen", "127.0.0.1:0", "--timeout", "45x"],
        vec!["stream", "http://127.0.0.1:9/", "--timeout", "45x"],
        vec!["mock", "--retry-after", "45x"],
    ] {
        let out = output(command(&args), std::time::Duration::from_secs(30)).await;
        assert_eq!(code(&out), 2, "{args:?}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("unknown unit"),
            "{args:?}: {}",
            stderr(&out)
        );
    }
}
