//! The proxy's request span as a trace backend gets it, captured by a
//! `tracing-subscriber` of the test's own (alone in its process: scoped
//! subscribers of tests running in parallel share tracing's callsite
//! cache, and one could leave the other's spans unrecorded).

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use warden_mock::{MockConfig, Scenario};

/// A log sink the subscriber writes into.
struct Writer(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Writer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("lock").extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A failed request's span carries OpenTelemetry's status `ERROR` (a trace
/// backend shows it failed, not only our `warden.outcome`); a complete one
/// sets none.
#[tokio::test]
async fn a_failed_requests_span_has_the_error_status() {
    for (scenario, failed) in [(Scenario::Overloaded, true), (Scenario::Normal, false)] {
        let logs = Arc::new(Mutex::new(Vec::<u8>::new()));
        let sink = Arc::clone(&logs);
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::INFO)
            .with_ansi(false)
            .with_span_events(tracing_subscriber::fmt::format::FmtSpan::CLOSE)
            .with_writer(move || Writer(Arc::clone(&sink)))
            .finish();
        let _guard = tracing::subscriber::set_default(subscriber);
        let mock = MockConfig::default().with_sequence([scenario]);
        let s = setup(mock, |c| {
            c.with_retry(warden_core::RetryPolicy::default().with_max_attempts(1))
        })
        .await;
        let response = within(
            "the answer",
            s.messages(messages_body("claude-test", "hi")).send(),
        )
        .await
        .expect("answer");
        assert_eq!(response.status() != 200, failed, "{scenario}");
        let _ = within("the body", response.bytes()).await;
        // The request's span closes once its response is written.
        let closed = within("the request span's close", async {
            loop {
                let text = String::from_utf8_lossy(&logs.lock().expect("lock")).into_owned();
                if let Some(line) = text.lines().find(|l| {
                    l.contains("proxy.request{")
                        && !l.contains("proxy.attempt{")
                        && l.contains("close")
                }) {
                    return line.to_owned();
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await;
        assert_eq!(
            closed.contains(r#"otel.status_code="ERROR""#),
            failed,
            "{scenario}: {closed}"
        );
    }
}
