//! Non-2xx responses: `x-should-retry` wins, else 408/409/429/≥500 are
//! retryable; `retry-after-ms`, then `retry-after` (seconds or HTTP date),
//! capped; 401/403 are `Unauthorized`; 400 "prompt is too long" is a
//! `ContextOverflow`.

use std::time::{Duration, SystemTime};

use crate::support::*;
use warden_core::{EventSource, ResumeCause, StreamError};

const OVERLOADED: &str =
    r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#;
const RATE_LIMITED: &str =
    r#"{"type":"error","error":{"type":"rate_limit_error","message":"Slow down"}}"#;
const API_ERROR: &str = r#"{"type":"error","error":{"type":"api_error","message":"Internal"}}"#;

async fn open_error_with(
    reply: Reply,
    f: impl FnOnce(warden_llm::AnthropicOptions) -> warden_llm::AnthropicOptions,
) -> StreamError {
    let server = Server::start(vec![reply]).await;
    match anthropic_with(&server, f).open(turn("hi")).await {
        Ok(_) => panic!("an error status must fail the open"),
        Err(e) => e,
    }
}

async fn open_error(reply: Reply) -> StreamError {
    open_error_with(reply, |o| o).await
}

#[tokio::test]
async fn a_429_with_retry_after_seconds_is_retryable_with_the_wait() {
    let e = open_error(Reply::error(429, RATE_LIMITED).header("retry-after", "3")).await;
    assert_eq!(
        e,
        StreamError::Api {
            status: Some(429),
            kind: "rate_limit_error".into(),
            message: "Slow down".into(),
            retryable: true,
            retry_after: Some(Duration::from_secs(3)),
        }
    );
}

#[tokio::test]
async fn retry_after_ms_wins_over_retry_after() {
    let e = open_error(
        Reply::error(429, RATE_LIMITED)
            .header("retry-after", "9")
            .header("retry-after-ms", "250"),
    )
    .await;
    assert!(e.is_retryable());
    assert_eq!(e.retry_after(), Some(Duration::from_millis(250)));
}

#[tokio::test]
async fn retry_after_as_an_http_date_is_the_time_until_then() {
    let at = httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(5));
    let e = open_error(Reply::error(503, OVERLOADED).header("retry-after", &at)).await;
    let wait = e.retry_after().expect("a wait");
    assert!(
        wait > Duration::from_secs(2) && wait <= Duration::from_secs(5),
        "{wait:?}"
    );
}

#[tokio::test]
async fn retry_after_is_capped() {
    let e = open_error(Reply::error(503, OVERLOADED).header("retry-after", "3600")).await;
    assert_eq!(
        e.retry_after(),
        Some(Duration::from_secs(60)),
        "default cap"
    );
    let e = open_error_with(
        Reply::error(503, OVERLOADED).header("retry-after-ms", "600000"),
        |o| o.with_max_retry_after(Duration::from_secs(30)),
    )
    .await;
    assert_eq!(e.retry_after(), Some(Duration::from_secs(30)));
}

#[tokio::test]
async fn x_should_retry_false_makes_a_500_fatal() {
    let e = open_error(Reply::error(500, API_ERROR).header("x-should-retry", "false")).await;
    assert!(
        matches!(&e, StreamError::Api { status: Some(500), retryable: false, kind, .. } if kind == "api_error"),
        "{e:?}"
    );
    assert!(!e.is_retryable());
    // Without the header the same 500 is retryable.
    let e = open_error(Reply::error(500, API_ERROR)).await;
    assert!(e.is_retryable(), "{e:?}");
}

#[tokio::test]
async fn x_should_retry_true_makes_a_400_retryable() {
    let body = r#"{"type":"error","error":{"type":"invalid_request_error","message":"try again"}}"#;
    let e = open_error(Reply::error(400, body).header("x-should-retry", "true")).await;
    assert!(
        matches!(
            &e,
            StreamError::Api {
                status: Some(400),
                retryable: true,
                ..
            }
        ),
        "{e:?}"
    );
}

#[tokio::test]
async fn retryable_statuses_are_408_409_429_and_5xx() {
    for status in [408u16, 409, 429, 500, 502, 503, 529] {
        let e = open_error(Reply::error(status, OVERLOADED)).await;
        assert!(
            matches!(&e, StreamError::Api { status: Some(s), retryable: true, .. } if *s == status),
            "{status}: {e:?}"
        );
    }
    for status in [404u16, 413, 422] {
        let e = open_error(Reply::error(status, OVERLOADED)).await;
        assert!(
            matches!(&e, StreamError::Api { status: Some(s), retryable: false, .. } if *s == status),
            "{status}: {e:?}"
        );
    }
}

#[tokio::test]
async fn a_401_or_403_is_unauthorized_and_fatal() {
    let body =
        r#"{"type":"error","error":{"type":"authentication_error","message":"invalid x-api-key"}}"#;
    let e = open_error(Reply::error(401, body)).await;
    assert_eq!(
        e,
        StreamError::Unauthorized {
            message: "invalid x-api-key".into()
        }
    );
    assert!(!e.is_retryable());
    let e = open_error(Reply::error(403, "not json")).await;
    assert!(matches!(e, StreamError::Unauthorized { .. }), "{e:?}");
}

#[tokio::test]
async fn a_400_prompt_too_long_is_a_context_overflow() {
    let body = r#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 210000 tokens > 200000 maximum"}}"#;
    let e = open_error(Reply::error(400, body)).await;
    assert_eq!(
        e,
        StreamError::ContextOverflow {
            reason: ResumeCause::PromptTooLong,
            message: "prompt is too long: 210000 tokens > 200000 maximum".into(),
        }
    );
    assert_eq!(e.resume_failure_cause(), Some(ResumeCause::PromptTooLong));
    assert!(!e.is_retryable());
}

#[tokio::test]
async fn another_400_is_a_fatal_api_error() {
    let body = r#"{"type":"error","error":{"type":"invalid_request_error","message":"max_tokens: must be positive"}}"#;
    let e = open_error(Reply::error(400, body)).await;
    assert_eq!(
        e,
        StreamError::Api {
            status: Some(400),
            kind: "invalid_request_error".into(),
            message: "max_tokens: must be positive".into(),
            retryable: false,
            retry_after: None,
        }
    );
}

#[tokio::test]
async fn openai_error_bodies_are_read_too() {
    let server = Server::start(vec![Reply::error(
        400,
        r#"{"error":{"message":"This model's maximum context length is 128000 tokens.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}"#,
    )])
    .await;
    let e = match openai(&server).open(turn("hi")).await {
        Ok(_) => panic!("must fail"),
        Err(e) => e,
    };
    assert_eq!(
        e.resume_failure_cause(),
        Some(ResumeCause::PromptTooLong),
        "{e:?}"
    );

    let server = Server::start(vec![Reply::error(
        429,
        r#"{"error":{"message":"Rate limit reached","type":"requests","code":"rate_limit_exceeded"}}"#,
    )
    .header("retry-after-ms", "1500")])
    .await;
    let e = match openai(&server).open(turn("hi")).await {
        Ok(_) => panic!("must fail"),
        Err(e) => e,
    };
    assert_eq!(
        e,
        StreamError::Api {
            status: Some(429),
            kind: "requests".into(),
            message: "Rate limit reached".into(),
            retryable: true,
            retry_after: Some(Duration::from_millis(1500)),
        }
    );
}

#[tokio::test]
async fn a_refused_connection_is_a_retryable_connection_error() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    drop(listener);
    let source = warden_llm::AnthropicSource::new(
        warden_llm::AnthropicOptions::default()
            .with_base_url(format!("http://{addr}"))
            .with_api_key(KEY),
    )
    .expect("valid");
    let e = match source.open(turn("hi")).await {
        Ok(_) => panic!("nothing listens there"),
        Err(e) => e,
    };
    assert!(matches!(e, StreamError::Connection { .. }), "{e:?}");
    assert!(e.is_retryable());
    assert!(!e.to_string().contains(KEY));
}
