//! Unit tests of the turn state machine: one per rule of
//! `docs/runtime-semantics.md` about retries, cancel and escalation.

use super::*;
use crate::continuation::StreamPhase;
use rand::SeedableRng;
use rand::rngs::SmallRng;

fn rng() -> SmallRng {
    SmallRng::seed_from_u64(7)
}

fn timeout() -> StreamError {
    StreamError::InactivityTimeout {
        silent_for: Duration::from_secs(45),
        timeout: Duration::from_secs(45),
    }
}

fn unknown() -> StreamError {
    StreamError::UnknownSession {
        session_id: "old".into(),
        message: "No conversation found with session ID: old".into(),
    }
}

fn policy(attempts: u32) -> RetryPolicy {
    RetryPolicy::default()
        .with_max_attempts(attempts)
        .with_jitter(0.0)
}

fn rules(p: &RetryPolicy) -> Rules<'_> {
    Rules {
        retry: p,
        can_escalate: true,
        continues: false,
        restarts_repeat_tools: true,
    }
}

fn continuing(p: &RetryPolicy) -> Rules<'_> {
    Rules {
        continues: true,
        ..rules(p)
    }
}

fn ended_with(m: &mut TurnMachine, e: StreamError, r: Rules<'_>) -> Option<Decision> {
    let a = AttemptId {
        turn: m.id(),
        attempt: m.attempts(),
    };
    m.ended(a, StreamOutcome::Failed(e), r, &mut rng())
}

fn text(t: &str) -> AgentEvent {
    AgentEvent::TextDelta(t.into())
}

/// Begins an attempt and admits it at once (no limit).
fn start(m: &mut TurnMachine, resume_id: Option<String>) -> AttemptId {
    let a = m.begin_attempt(resume_id);
    assert!(m.admitted(a), "admitted");
    a
}

fn failed(m: &mut TurnMachine, e: StreamError, p: &RetryPolicy) -> Option<Decision> {
    let a = AttemptId {
        turn: m.id(),
        attempt: m.attempts(),
    };
    m.ended(a, StreamOutcome::Failed(e), rules(p), &mut rng())
}

#[test]
fn a_retryable_failure_is_retried_from_scratch_with_the_policys_delay() {
    let p = policy(4);
    let mut m = TurnMachine::new(3);
    start(&mut m, None);
    let d = failed(&mut m, timeout(), &p);
    assert_eq!(
        d,
        Some(Decision::Retry {
            next: AttemptId {
                turn: 3,
                attempt: 2
            },
            delay: Duration::from_millis(500),
            error: timeout(),
        })
    );
    assert_eq!(m.phase(), Phase::BackingOff);
    assert!(m.retry_due(AttemptId {
        turn: 3,
        attempt: 2
    }));
    assert!(!m.retry_due(AttemptId {
        turn: 3,
        attempt: 3
    }));
    assert!(!m.retry_due(AttemptId {
        turn: 4,
        attempt: 2
    }));
}

#[test]
fn a_server_retry_after_sets_the_delay() {
    let p = policy(4);
    let mut m = TurnMachine::new(1);
    start(&mut m, None);
    let e = StreamError::Api {
        status: Some(429),
        kind: "rate_limit_error".into(),
        message: "slow down".into(),
        retryable: true,
        retry_after: Some(Duration::from_secs(2)),
    };
    match failed(&mut m, e, &p) {
        Some(Decision::Retry { delay, .. }) => assert_eq!(delay, Duration::from_secs(2)),
        other => panic!("{other:?}"),
    }
}

#[test]
fn retries_stop_after_the_policys_attempts_with_the_last_error() {
    let p = policy(2);
    let mut m = TurnMachine::new(1);
    start(&mut m, None);
    assert!(matches!(
        failed(&mut m, timeout(), &p),
        Some(Decision::Retry { .. })
    ));
    start(&mut m, None);
    assert_eq!(
        failed(&mut m, timeout(), &p),
        Some(Decision::Finish(Err(TurnError::RetriesExhausted {
            attempts: 2,
            last: timeout()
        })))
    );
}

#[test]
fn a_fatal_error_ends_the_turn_at_once() {
    let p = policy(4);
    let mut m = TurnMachine::new(1);
    start(&mut m, None);
    let e = StreamError::Malformed {
        message: "expected value".into(),
    };
    assert_eq!(
        failed(&mut m, e.clone(), &p),
        Some(Decision::Finish(Err(TurnError::Fatal(e))))
    );
}

#[test]
fn a_completed_attempt_finishes_the_turn() {
    let p = policy(4);
    let mut m = TurnMachine::new(1);
    let a = start(&mut m, None);
    assert_eq!(
        m.ended(a, StreamOutcome::Completed, rules(&p), &mut rng()),
        Some(Decision::Finish(Ok(())))
    );
}

#[test]
fn reports_of_an_attempt_that_is_not_current_are_dropped() {
    let p = policy(4);
    let mut m = TurnMachine::new(1);
    let first = start(&mut m, None);
    assert!(matches!(
        failed(&mut m, timeout(), &p),
        Some(Decision::Retry { .. })
    ));
    // The failed attempt reports again (a late event, a second end).
    assert!(!m.forwards(first));
    assert_eq!(
        m.ended(first, StreamOutcome::Completed, rules(&p), &mut rng()),
        None
    );
    let second = start(&mut m, None);
    assert!(m.forwards(second));
    assert!(!m.forwards(first));
    let other_turn = AttemptId {
        turn: 2,
        attempt: 2,
    };
    assert!(!m.is_current(other_turn));
}

#[test]
fn a_cancel_while_streaming_stops_the_stream_and_no_event_passes_after_it() {
    let mut m = TurnMachine::new(1);
    let a = start(&mut m, None);
    assert!(m.forwards(a));
    assert_eq!(m.cancel(), OnCancel::StopStream);
    assert!(
        !m.forwards(a),
        "no event of a cancelled attempt reaches the user"
    );
    assert_eq!(m.cancel(), OnCancel::AlreadyRequested);
}

#[test]
fn after_a_cancel_every_end_of_the_stream_is_cancelled_and_never_retried() {
    let p = policy(4);
    for outcome in [
        StreamOutcome::Cancelled,
        StreamOutcome::Completed,
        StreamOutcome::Failed(timeout()),
        StreamOutcome::Failed(unknown()),
    ] {
        let mut m = TurnMachine::new(1);
        let a = start(&mut m, Some("old".into()));
        m.cancel();
        assert_eq!(
            m.ended(a, outcome.clone(), rules(&p), &mut rng()),
            Some(Decision::Finish(Err(TurnError::Cancelled))),
            "{outcome:?}"
        );
    }
}

#[test]
fn a_cancel_during_backoff_or_before_the_first_attempt_finishes_now() {
    let p = policy(4);
    let mut m = TurnMachine::new(1);
    assert_eq!(m.cancel(), OnCancel::FinishNow);
    let mut m = TurnMachine::new(1);
    start(&mut m, None);
    failed(&mut m, timeout(), &p);
    assert_eq!(m.cancel(), OnCancel::FinishNow);
}

#[test]
fn a_stream_cancelled_without_a_user_cancel_ends_cancelled() {
    let p = policy(4);
    let mut m = TurnMachine::new(1);
    let a = start(&mut m, None);
    assert_eq!(
        m.ended(a, StreamOutcome::Cancelled, rules(&p), &mut rng()),
        Some(Decision::Finish(Err(TurnError::Cancelled)))
    );
}

#[test]
fn a_resume_failure_of_a_resumed_attempt_escalates_and_is_not_retried() {
    let p = policy(4);
    for (e, cause) in [
        (unknown(), ResumeCause::UnknownSession),
        (
            StreamError::ContextOverflow {
                reason: ResumeCause::PromptTooLong,
                message: "Prompt is too long".into(),
            },
            ResumeCause::PromptTooLong,
        ),
        (
            StreamError::ContextOverflow {
                reason: ResumeCause::BlockingLimit,
                message: "Context limit reached".into(),
            },
            ResumeCause::BlockingLimit,
        ),
    ] {
        let mut m = TurnMachine::new(1);
        start(&mut m, Some("old".into()));
        assert_eq!(
            failed(&mut m, e.clone(), &p),
            Some(Decision::Escalate {
                cause,
                failed_id: "old".into(),
                error: e
            })
        );
    }
}

#[test]
fn a_resume_failure_without_a_resumed_id_or_a_supervisor_is_fatal() {
    let p = policy(4);
    // Already fresh: no fallback.
    let mut m = TurnMachine::new(1);
    start(&mut m, None);
    assert_eq!(
        failed(&mut m, unknown(), &p),
        Some(Decision::Finish(Err(TurnError::Fatal(unknown()))))
    );
    // No supervisor to take it.
    let mut m = TurnMachine::new(1);
    let a = start(&mut m, Some("old".into()));
    let alone = Rules {
        retry: &p,
        can_escalate: false,
        continues: false,
        restarts_repeat_tools: true,
    };
    assert_eq!(
        m.ended(a, StreamOutcome::Failed(unknown()), alone, &mut rng()),
        Some(Decision::Finish(Err(TurnError::Fatal(unknown()))))
    );
}

#[test]
fn a_fresh_start_recovers_on_success_and_gives_up_on_any_failure_but_a_cancel() {
    let fresh = StartMode::FreshFallback {
        cause: ResumeCause::UnknownSession,
        error: "no conversation".into(),
    };
    assert_eq!(fresh.after_turn(&Ok(())), FreshVerdict::Recovered);
    assert_eq!(
        fresh.after_turn(&Err(TurnError::Cancelled)),
        FreshVerdict::Unchanged
    );
    let e = TurnError::Fatal(StreamError::Unauthorized {
        message: "bad key".into(),
    });
    assert_eq!(
        fresh.after_turn(&Err(e.clone())),
        FreshVerdict::GiveUp {
            first_cause: "unknown_session: no conversation".into(),
            error: e.clone(),
        }
    );
    assert_eq!(
        StartMode::Resume.after_turn(&Err(e)),
        FreshVerdict::Unchanged
    );
}

#[test]
fn an_idle_check_reaps_only_an_untouched_empty_session() {
    assert!(reap_due(4, 4, false, 0));
    assert!(
        !reap_due(3, 4, false, 0),
        "activity since the check was armed"
    );
    assert!(!reap_due(4, 4, true, 0), "a turn runs");
    assert!(!reap_due(4, 4, false, 1), "a message waits");
}

#[test]
fn a_retry_hook_overrides_the_built_in_classification_within_max_attempts() {
    use crate::policy::RetryVerdict;
    let malformed = StreamError::Malformed {
        message: "bad".into(),
    };
    // Fatal by default, retried by the hook.
    let p = policy(2).with_hook(|e, _| match e {
        StreamError::Malformed { .. } => RetryVerdict::Retry,
        StreamError::InactivityTimeout { .. } => RetryVerdict::Fatal,
        _ => RetryVerdict::Default,
    });
    let mut m = TurnMachine::new(1);
    start(&mut m, None);
    assert!(matches!(
        failed(&mut m, malformed.clone(), &p),
        Some(Decision::Retry { delay, .. }) if delay == Duration::from_millis(500)
    ));
    // max_attempts still bounds it.
    start(&mut m, None);
    assert_eq!(
        failed(&mut m, malformed.clone(), &p),
        Some(Decision::Finish(Err(TurnError::RetriesExhausted {
            attempts: 2,
            last: malformed
        })))
    );
    // Retryable by default, fatal by the hook.
    let mut m = TurnMachine::new(1);
    start(&mut m, None);
    assert_eq!(
        failed(&mut m, timeout(), &p),
        Some(Decision::Finish(Err(TurnError::Fatal(timeout()))))
    );
    // The hook's wait wins, and sees the attempt count.
    let p = policy(4).with_hook(|_, attempt| {
        RetryVerdict::RetryAfter(Duration::from_secs(u64::from(attempt) * 3))
    });
    let mut m = TurnMachine::new(1);
    start(&mut m, None);
    start(&mut m, None);
    match failed(&mut m, timeout(), &p) {
        Some(Decision::Retry { delay, .. }) => assert_eq!(delay, Duration::from_secs(6)),
        other => panic!("{other:?}"),
    }
    // A resume failure goes to the supervisor whatever the hook says.
    let p = policy(4).with_hook(|_, _| RetryVerdict::Retry);
    let mut m = TurnMachine::new(1);
    start(&mut m, Some("old".into()));
    assert!(matches!(
        failed(&mut m, unknown(), &p),
        Some(Decision::Escalate { .. })
    ));
}

#[test]
fn an_attempt_waiting_for_admission_is_not_streaming_and_cancels_at_once() {
    let p = policy(4);
    let mut m = TurnMachine::new(1);
    let a = m.begin_attempt(None);
    assert_eq!(m.phase(), Phase::Admitting);
    assert!(!m.is_current(a), "no stream yet: no report can be current");
    assert_eq!(
        m.ended(a, StreamOutcome::Completed, rules(&p), &mut rng()),
        None,
        "an end report before admission is stale"
    );
    assert_eq!(
        m.cancel(),
        OnCancel::FinishNow,
        "nothing to stop: finish now"
    );
    assert!(
        !m.admitted(a),
        "a cancelled turn's admission starts nothing"
    );
}

#[test]
fn only_the_current_attempt_is_admitted() {
    let mut m = TurnMachine::new(1);
    let a = m.begin_attempt(None);
    let stale = AttemptId {
        turn: 1,
        attempt: a.attempt + 1,
    };
    assert!(!m.admitted(stale));
    assert!(m.admitted(a));
    assert!(m.is_current(a));
    assert!(!m.admitted(a), "admitted once");
}

#[test]
fn a_turn_past_its_deadline_ends_with_the_deadline_whatever_the_stream_reports() {
    let p = policy(4);
    let mut m = TurnMachine::new(1);
    let a = start(&mut m, None);
    let after = Duration::from_secs(600);
    assert_eq!(
        m.stop(TurnError::DeadlineExceeded { after }),
        OnCancel::StopStream
    );
    assert_eq!(
        m.cancel(),
        OnCancel::AlreadyRequested,
        "the first stop wins"
    );
    assert_eq!(
        m.ended(a, StreamOutcome::Cancelled, rules(&p), &mut rng()),
        Some(Decision::Finish(Err(TurnError::DeadlineExceeded { after })))
    );
}

#[test]
fn a_deadline_while_backing_off_finishes_now_and_is_never_retried() {
    let p = policy(4);
    let mut m = TurnMachine::new(1);
    start(&mut m, None);
    assert!(matches!(
        failed(&mut m, timeout(), &p),
        Some(Decision::Retry { .. })
    ));
    let after = Duration::from_secs(1);
    assert_eq!(
        m.stop(TurnError::DeadlineExceeded { after }),
        OnCancel::FinishNow
    );
}

#[test]
fn a_reply_broken_mid_text_is_continued_when_the_source_can() {
    let p = policy(4);
    let mut m = TurnMachine::new(1);
    start(&mut m, None);
    m.saw(&text("Hello wor"));
    assert_eq!(m.stream_phase(), StreamPhase::Text);
    assert!(matches!(
        ended_with(&mut m, timeout(), continuing(&p)),
        Some(Decision::Continue { next, .. }) if next.attempt == 2
    ));
    let a2 = start(&mut m, None);
    assert!(m.continuing(), "the next attempt continues");
    assert_eq!(m.stream_phase(), StreamPhase::BeforeContent);
    // It breaks before adding anything: the consumer still has the text.
    assert!(matches!(
        ended_with(&mut m, timeout(), continuing(&p)),
        Some(Decision::Continue { .. })
    ));
    assert_eq!(m.continuations(), 2);
    let _ = a2;
}

#[test]
fn without_a_continuing_source_a_mid_text_break_restarts() {
    let p = policy(4);
    let mut m = TurnMachine::new(1);
    start(&mut m, None);
    m.saw(&text("Hello"));
    assert!(matches!(
        ended_with(&mut m, timeout(), rules(&p)),
        Some(Decision::Retry { .. })
    ));
    start(&mut m, None);
    assert!(!m.continuing());
}

#[test]
fn nothing_shown_mid_thinking_or_mid_tool_call_restarts() {
    let p = policy(8);
    let tool = AgentEvent::ToolUseStarted {
        id: "t".into(),
        name: "Bash".into(),
    };
    for seen in [
        vec![],
        vec![AgentEvent::ThinkingDelta("hmm".into())],
        vec![text("Let me run it."), tool.clone()],
        vec![text("a"), AgentEvent::ThinkingDelta("hmm".into())],
    ] {
        let mut m = TurnMachine::new(1);
        start(&mut m, None);
        for e in &seen {
            m.saw(e);
        }
        assert!(
            matches!(
                ended_with(&mut m, timeout(), continuing(&p)),
                Some(Decision::Retry { .. })
            ),
            "after {seen:?}"
        );
        start(&mut m, None);
        assert!(!m.continuing(), "after {seen:?}");
        // A restart discards the text: breaking before content again
        // restarts again.
        assert!(matches!(
            ended_with(&mut m, timeout(), continuing(&p)),
            Some(Decision::Retry { .. })
        ));
    }
}

#[test]
fn a_continuation_that_fails_to_stitch_restarts_and_is_not_tried_again() {
    let p = policy(8);
    let mut m = TurnMachine::new(1);
    start(&mut m, None);
    m.saw(&text("Once upon"));
    assert!(matches!(
        ended_with(&mut m, timeout(), continuing(&p)),
        Some(Decision::Continue { .. })
    ));
    start(&mut m, None);
    let failed = StreamError::ContinuationFailed {
        message: "the continuation starts the reply over".into(),
    };
    assert!(matches!(
        ended_with(&mut m, failed, continuing(&p)),
        Some(Decision::Retry { .. })
    ));
    start(&mut m, None);
    assert!(!m.continuing());
    m.saw(&text("Once upon a time"));
    assert!(
        matches!(
            ended_with(&mut m, timeout(), continuing(&p)),
            Some(Decision::Retry { .. })
        ),
        "no second try at continuing this turn"
    );
}

#[test]
fn continuations_count_against_max_attempts() {
    let p = policy(2);
    let mut m = TurnMachine::new(1);
    start(&mut m, None);
    m.saw(&text("a"));
    assert!(matches!(
        ended_with(&mut m, timeout(), continuing(&p)),
        Some(Decision::Continue { .. })
    ));
    start(&mut m, None);
    m.saw(&text("b"));
    assert!(matches!(
        ended_with(&mut m, timeout(), continuing(&p)),
        Some(Decision::Finish(Err(TurnError::RetriesExhausted {
            attempts: 2,
            ..
        })))
    ));
}

fn tool_call(m: &mut TurnMachine) {
    m.saw(&AgentEvent::ToolUseStarted {
        id: "t1".into(),
        name: "Bash".into(),
    });
    m.saw(&AgentEvent::ToolInputDelta {
        id: "t1".into(),
        partial_json: "{}".into(),
    });
    m.saw(&AgentEvent::ToolUseFinished { id: "t1".into() });
}

#[test]
fn a_restart_never_silently_repeats_a_delivered_tool_call() {
    let p = policy(4);
    let mut m = TurnMachine::new(1);
    start(&mut m, None);
    m.saw(&text("Running it."));
    tool_call(&mut m);
    m.saw(&text("Done, now"));
    // Mid-text, but a continuing source would continue (no repeat)...
    assert!(matches!(
        ended_with(&mut m.clone(), timeout(), continuing(&p)),
        Some(Decision::Continue { .. })
    ));
    // ...a restart would issue the tool call again: the turn ends.
    assert_eq!(
        ended_with(&mut m, timeout(), rules(&p)),
        Some(Decision::Finish(Err(TurnError::ToolCallsWouldRepeat {
            completed: 1,
            last: timeout(),
        })))
    );
}

#[test]
fn repeats_are_allowed_by_the_policy_or_by_a_source_that_keeps_tool_results() {
    let allowed = policy(4).with_repeat_tool_calls(true);
    let p = policy(4);
    let keeps = Rules {
        restarts_repeat_tools: false,
        ..rules(&p)
    };
    for r in [rules(&allowed), keeps] {
        let mut m = TurnMachine::new(1);
        start(&mut m, None);
        tool_call(&mut m);
        assert!(matches!(
            ended_with(&mut m, timeout(), r),
            Some(Decision::Retry { .. })
        ));
    }
    // A tool call in an earlier, restarted attempt does not count.
    let mut m = TurnMachine::new(1);
    start(&mut m, None);
    start_again_after_failure(&mut m, &allowed);
    assert!(matches!(
        ended_with(&mut m, timeout(), rules(&p)),
        Some(Decision::Retry { .. })
    ));
}

fn start_again_after_failure(m: &mut TurnMachine, p: &RetryPolicy) {
    tool_call(m);
    assert!(matches!(
        ended_with(m, timeout(), rules(p)),
        Some(Decision::Retry { .. })
    ));
    start(m, None);
}
