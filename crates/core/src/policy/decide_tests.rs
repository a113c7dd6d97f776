//! The decision table, one test per rule of `docs/runtime-semantics.md`
//! ("What follows a broken attempt").

use std::time::Duration;

use rand::SeedableRng;
use rand::rngs::SmallRng;

use super::*;

fn rng() -> SmallRng {
    SmallRng::seed_from_u64(7)
}

fn policy() -> RetryPolicy {
    RetryPolicy::default().with_max_attempts(3).with_jitter(0.0)
}

fn timeout() -> StreamError {
    StreamError::InactivityTimeout {
        silent_for: Duration::from_secs(45),
        timeout: Duration::from_secs(45),
    }
}

fn api(status: u16, retry_after: Option<Duration>) -> StreamError {
    StreamError::Api {
        status: Some(status),
        kind: "overloaded_error".into(),
        message: "Overloaded".into(),
        retryable: status != 400,
        retry_after,
    }
}

/// A broken first attempt that showed nothing, in a session.
fn broken(error: &StreamError) -> Broken<'_> {
    Broken {
        error,
        attempts: 1,
        shown: Shown::Nothing,
        can_continue: true,
        can_restart_shown: true,
        completed_tools: 0,
        restarts_repeat_tools: true,
        resumed_and_escalates: true,
    }
}

fn next(b: &Broken<'_>) -> Next {
    decide(&policy(), b, &mut rng()).next
}

#[test]
fn nothing_shown_is_tried_again_from_scratch_after_the_backoff() {
    let e = timeout();
    let delay = policy().initial_backoff;
    assert_eq!(next(&broken(&e)), Next::Retry { delay });
}

#[test]
fn text_shown_is_continued_where_the_source_can_continue() {
    let e = timeout();
    let b = Broken {
        shown: Shown::Text,
        ..broken(&e)
    };
    assert!(matches!(next(&b), Next::Continue { .. }), "{:?}", next(&b));
    let cannot = Broken {
        can_continue: false,
        ..b
    };
    assert!(matches!(next(&cannot), Next::Retry { .. }));
}

#[test]
fn what_cannot_be_taken_back_ends_a_stream_that_cannot_restart() {
    let e = timeout();
    for shown in [Shown::Other, Shown::Text] {
        let b = Broken {
            shown,
            can_continue: false,
            can_restart_shown: false,
            ..broken(&e)
        };
        assert_eq!(next(&b), Next::GiveUp(GiveUp::CannotRestart), "{shown:?}");
    }
    // A session's caller is told to drop it: the reply starts again.
    let session = Broken {
        shown: Shown::Other,
        ..broken(&e)
    };
    assert!(matches!(next(&session), Next::Retry { .. }));
}

#[test]
fn completed_tool_calls_are_never_issued_again_unless_the_policy_allows() {
    let e = timeout();
    let b = Broken {
        completed_tools: 2,
        ..broken(&e)
    };
    assert_eq!(
        next(&b),
        Next::GiveUp(GiveUp::ToolCallsWouldRepeat { completed: 2 })
    );
    let agent = Broken {
        restarts_repeat_tools: false,
        ..b
    };
    assert!(matches!(next(&agent), Next::Retry { .. }));
    let allowed = decide(&policy().with_repeat_tool_calls(true), &b, &mut rng());
    assert!(matches!(allowed.next, Next::Retry { .. }));
}

#[test]
fn a_resume_failure_escalates_and_is_never_retried() {
    let e = StreamError::UnknownSession {
        session_id: "old".into(),
        message: "No conversation found with session ID: old".into(),
    };
    assert_eq!(
        next(&broken(&e)),
        Next::Escalate(ResumeCause::UnknownSession)
    );
    // Without a supervisor (or a resume), it is what the policy says.
    let alone = Broken {
        resumed_and_escalates: false,
        ..broken(&e)
    };
    assert!(
        matches!(next(&alone), Next::GiveUp(_)),
        "{:?}",
        next(&alone)
    );
}

#[test]
fn spent_attempts_and_final_errors_give_up_with_their_reason() {
    let e = timeout();
    let spent = Broken {
        attempts: 3,
        ..broken(&e)
    };
    assert_eq!(next(&spent), Next::GiveUp(GiveUp::Exhausted));
    let bad = api(400, None);
    assert_eq!(next(&broken(&bad)), Next::GiveUp(GiveUp::Fatal));
}

#[test]
fn any_retry_after_holds_the_pool_capped_and_sets_the_delay() {
    let p = policy();
    // Not only a 429: an overloaded 529 with retry-after holds too.
    for status in [429, 529, 503] {
        let e = api(status, Some(Duration::from_secs(7)));
        let v = decide(&p, &broken(&e), &mut rng());
        assert_eq!(v.hold, Some(Duration::from_secs(7)), "{status}");
        assert_eq!(
            v.next,
            Next::Retry {
                delay: Duration::from_secs(7)
            }
        );
    }
    let far = api(429, Some(Duration::from_secs(3600)));
    let v = decide(&p, &broken(&far), &mut rng());
    assert_eq!(v.hold, Some(p.max_retry_after));
    // No retry-after: no hold, even when the attempt is retried.
    let v = decide(&p, &broken(&api(529, None)), &mut rng());
    assert_eq!(v.hold, None);
    assert!(matches!(v.next, Next::Retry { .. }));
    // A hold even when this request gives up: the others still wait.
    let last = Broken {
        attempts: 3,
        ..broken(&far)
    };
    let v = decide(&p, &last, &mut rng());
    assert_eq!(v.hold, Some(p.max_retry_after));
    assert_eq!(v.next, Next::GiveUp(GiveUp::Exhausted));
}

#[test]
fn an_outage_a_layer_below_already_retried_ends_the_turn_at_once_as_its_last_error() {
    let last = api(503, Some(Duration::from_secs(2)));
    let e = StreamError::RetriedBelow {
        attempts: 4,
        last: Box::new(last.clone()),
    };
    // The first attempt of the turn: the layer below spent the policy's
    // attempts already, so the session does not run it again.
    let v = decide(&policy(), &broken(&e), &mut rng());
    assert_eq!(v.next, Next::GiveUp(GiveUp::Fatal));
    assert_eq!(v.hold, Some(Duration::from_secs(2)), "last's retry-after");
    assert!(!e.is_retryable());
    assert_eq!(e.code(), last.code(), "no new code for clients");
    assert_eq!(e.retry_after(), last.retry_after());
    let turn = crate::TurnError::Fatal(e.clone());
    assert_eq!(
        crate::ExitClass::of(&turn),
        crate::ExitClass::Unavailable,
        "an outage: exit 5, as the last error's class"
    );
    assert_eq!(crate::ExitClass::of(&turn).code(), 5);
    let said = e.to_string();
    assert!(
        said.contains("HTTP 503") && said.contains("made 4 attempt(s)"),
        "{said}"
    );
}
