//! The Aider parser on what `aider --message … --no-pretty` 0.86.2 printed
//! against `warden mock` (`../shared/reference/agents.md`).

use warden_core::{AgentEvent, Frame, ResumeCause, StreamError, Usage};

use super::AiderParser;
use crate::cli::{ExitInfo, Step, TurnParser};

const ID: &str = "aider-18f0-1-0";

const BANNER: [&str; 8] = [
    "Analytics have been permanently disabled.",
    "",
    "Aider v0.86.2",
    "Model: openai/mock-model with whole edit format",
    "Git repo: none",
    "Repo-map: disabled",
    "Restored previous conversation history.",
    "",
];

fn parser() -> AiderParser {
    AiderParser::new(Some(ID.to_owned()), Some("openai/mock-model".to_owned()))
}

fn text(p: &mut AiderParser, line: &str) -> Step {
    p.text(line).expect("every line is Aider's")
}

/// The frames of `lines` after the banner, and how the last line ended.
fn run(p: &mut AiderParser, lines: &[&str]) -> (Vec<Frame>, Step) {
    let mut frames = Vec::new();
    for line in BANNER {
        match text(p, line) {
            Step::Frames(more) => frames.extend(more),
            other => panic!("the banner ended the turn: {other:?}"),
        }
    }
    let (last, body) = lines.split_last().expect("lines");
    for line in body {
        match text(p, line) {
            Step::Frames(more) => frames.extend(more),
            other => panic!("{line:?} ended the turn: {other:?}"),
        }
    }
    let end = text(p, last);
    (frames, end)
}

fn texts(frames: &[Frame]) -> String {
    frames
        .iter()
        .filter_map(|f| match f {
            Frame::Event(AgentEvent::TextDelta(t)) => Some(t.as_str()),
            _ => None,
        })
        .collect()
}

fn failure(p: &mut AiderParser, lines: &[&str]) -> StreamError {
    match run(p, lines).1 {
        Step::Fail(e) => e,
        other => panic!("expected a failure, got {other:?}"),
    }
}

#[test]
fn a_turn_announces_its_conversation_then_the_reply_lines_and_ends_at_its_tokens_line() {
    let mut p = parser();
    let (frames, end) = run(
        &mut p,
        &[
            "Hello from warden-mock.",
            "",
            "Second paragraph.",
            "",
            "Tokens: 1.2k sent, 15 received. Cost: $0.00 message, $0.00 session.",
        ],
    );
    assert_eq!(
        frames[0],
        Frame::Event(AgentEvent::SessionStarted {
            session_id: ID.to_owned(),
            model: Some("openai/mock-model".to_owned()),
        })
    );
    assert_eq!(
        texts(&frames),
        "Hello from warden-mock.\n\nSecond paragraph.",
        "banner, restore notice and trailing blank lines are not the reply"
    );
    assert_eq!(
        end,
        Step::Complete(vec![
            Frame::Event(AgentEvent::Usage(Usage {
                input_tokens: 1200,
                ..Usage::default()
            })),
            Frame::Event(AgentEvent::TurnComplete {
                context_window: None,
                duration: None,
            }),
        ])
    );
    assert_eq!(p.session_id(), Some(ID));
}

#[test]
fn a_request_error_fails_the_turn_at_once_even_after_partial_text_on_the_same_line() {
    let cut = failure(
        &mut parser(),
        &[
            "Hello from warden-mock. Your last message had 863 characters.litellm.APIConnectionError: APIConnectionError: OpenAIException - peer closed connection without sending complete message body (incomplete chunked read)",
        ],
    );
    assert!(
        matches!(cut, StreamError::Api { retryable: true, ref kind, .. } if kind == "APIConnectionError"),
        "{cut:?}"
    );
    let overloaded = failure(
        &mut parser(),
        &[
            "litellm.InternalServerError: InternalServerError: OpenAIException - Internal server error",
        ],
    );
    assert!(
        matches!(
            overloaded,
            StreamError::Api {
                retryable: true,
                ..
            }
        ),
        "{overloaded:?}"
    );
    let overflow = failure(
        &mut parser(),
        &[
            "litellm.BadRequestError: OpenAIException - prompt is too long: 210000 tokens > 200000 maximum",
        ],
    );
    assert!(
        matches!(
            overflow,
            StreamError::ContextOverflow {
                reason: ResumeCause::PromptTooLong,
                ..
            }
        ),
        "{overflow:?}"
    );
    let bad = failure(
        &mut parser(),
        &["litellm.BadRequestError: OpenAIException - unknown parameter"],
    );
    assert!(
        matches!(
            bad,
            StreamError::Api {
                retryable: false,
                ..
            }
        ),
        "{bad:?}"
    );
    let key = failure(
        &mut parser(),
        &["litellm.AuthenticationError: AuthenticationError: OpenAIException - bad key"],
    );
    assert!(matches!(key, StreamError::Unauthorized { .. }), "{key:?}");
    let retry = failure(&mut parser(), &["Partial", "Retrying in 0.2 seconds..."]);
    assert!(matches!(retry, StreamError::Truncated { .. }), "{retry:?}");
}

#[test]
fn reply_text_about_litellm_or_tokens_mid_line_is_text() {
    let (frames, end) = run(
        &mut parser(),
        &[
            "Use litellm.completion() and catch litellm.exceptions.",
            "It printed Tokens: 3 sent, 4 received. before.",
            "Tokens: 9 sent, 2 received.",
        ],
    );
    assert!(matches!(end, Step::Complete(_)), "{end:?}");
    assert_eq!(
        texts(&frames),
        "Use litellm.completion() and catch litellm.exceptions.\nIt printed Tokens: 3 sent, 4 received. before."
    );
}

#[test]
fn a_run_that_ends_without_its_tokens_line_is_not_a_reply() {
    let mut p = parser();
    let (_, step) = run(&mut p, &["Hello from warden"]);
    assert!(matches!(step, Step::Frames(_)));
    assert!(matches!(
        p.ended_early(ExitInfo::Code(0), &[], true),
        StreamError::Truncated { .. }
    ));
    let mut silent = parser();
    assert!(matches!(
        silent.ended_early(ExitInfo::Code(0), &[], false),
        StreamError::Connection { .. }
    ));
}
