//! The `[ctx: NN%]` indicator: the last usage report's input + cache tokens
//! against the model's window.

use crate::common::*;
use std::sync::Arc;
use warden_core::context::ContextConfig;
use warden_core::testing::{AttemptControl, ChannelSource, ChannelSourceControl};
use warden_core::{AgentEvent, EventSource, Frame, SessionConfig, SessionKey, Supervisor, Usage};

fn usage(input: u64, creation: u64, read: u64, output: u64) -> Frame {
    Frame::Event(AgentEvent::Usage(Usage {
        input_tokens: input,
        cache_creation_input_tokens: creation,
        cache_read_input_tokens: read,
        output_tokens: output,
    }))
}

async fn turn_text(
    sup: &warden_core::Supervisor,
    ctl: &warden_core::testing::ChannelSourceControl,
    script: impl FnOnce(&AttemptControl),
) -> String {
    let t = sup.send("ws", "q").await.expect("send");
    let a = ctl
        .next_attempt()
        .within("the next attempt to open")
        .await
        .expect("attempt");
    script(&a);
    a.finish();
    t.finish().within("the turn to finish").await.expect("ok").0
}

#[tokio::test(start_paused = true)]
async fn indicator_counts_cache_tokens_of_the_last_report_only() {
    let (sup, ctl) = supervisor_with(config()).await;
    // No usage known yet: no indicator.
    assert_eq!(
        turn_text(&sup, &ctl, |a| {
            a.text("first");
        })
        .await,
        "first"
    );
    // Two sub-calls: the per-turn sum would double count cache reads (and
    // exceed the window); only the last report counts. An output-only
    // report (message_delta) does not reset it.
    let text = turn_text(&sup, &ctl, |a| {
        a.send(usage(3, 200, 120_000, 1));
        a.send(usage(5, 300, 123_695, 1));
        a.text("Here.");
        a.send(usage(0, 0, 0, 40));
    })
    .await;
    assert_eq!(text, "Here.\n[ctx: 62%]");
    // A turn without usage keeps showing the last known value.
    assert_eq!(
        turn_text(&sup, &ctl, |a| {
            a.text("ok");
        })
        .await,
        "ok\n[ctx: 62%]"
    );
    sup.shutdown().await;
}

/// A supervisor whose source knows `model`'s window (as `warden-claude`
/// knows Claude Code's `[1m]` models).
async fn supervisor_knowing(model: &str, window: u64) -> (Supervisor, ChannelSourceControl) {
    let (source, control) = ChannelSource::new();
    source.set_context_window(model, window);
    let factory = move |_: &SessionKey| source.clone() as Arc<dyn EventSource>;
    let sup = Supervisor::start(config(), Arc::new(factory))
        .await
        .expect("supervisor starts");
    (sup, control)
}

#[tokio::test(start_paused = true)]
async fn one_million_windows_from_the_source_or_the_agent() {
    let (sup, ctl) = supervisor_knowing("claude-sonnet-4-5[1m]", 1_000_000).await;
    let text = turn_text(&sup, &ctl, |a| {
        a.send(Frame::Event(AgentEvent::SessionStarted {
            session_id: "s".into(),
            model: Some("claude-sonnet-4-5[1m]".into()),
        }));
        a.send(usage(0, 0, 250_000, 0));
        a.text("big");
    })
    .await;
    assert_eq!(text, "big\n[ctx: 25%]");
    sup.shutdown().await;

    let (sup, ctl) = supervisor_with(config()).await;
    let text = turn_text(&sup, &ctl, |a| {
        a.send(usage(0, 0, 250_000, 0));
        a.text("reported");
        a.send(Frame::Event(AgentEvent::TurnComplete {
            context_window: Some(500_000),
            duration: None,
        }));
    })
    .await;
    assert_eq!(text, "reported\n[ctx: 50%]");
    sup.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn configuration_overrides_the_window_disables_the_indicator_and_strips_self_reports() {
    let ctx = ContextConfig::default()
        .with_window(100_000)
        .with_self_report(true);
    let (sup, ctl) =
        supervisor_with(config().with_session(SessionConfig::default().with_context(ctx))).await;
    let mut events = sup.subscribe();
    let t = sup.send("ws", "q").await.expect("send");
    let a = ctl
        .next_attempt()
        .within("the next attempt to open")
        .await
        .expect("attempt");
    assert_eq!(
        a.request.append_system_prompt.as_deref(),
        Some(warden_core::context::SELF_REPORT_INSTRUCTION)
    );
    a.send(usage(10_000, 0, 0, 5));
    a.text("Answer.\n[ctx: ~12%]");
    a.finish();
    let (text, summary) = t.finish().within("the turn to finish").await.expect("ok");
    assert_eq!(text, "Answer.\n[ctx: 10%]");
    let c = summary.context.expect("context");
    assert_eq!((c.percent, c.self_reported), (10, Some(12)));
    let ev = wait_for(&mut events, |e| {
        matches!(e, warden_core::LifecycleEvent::ContextUsage { .. })
    })
    .await;
    assert!(matches!(
        ev,
        warden_core::LifecycleEvent::ContextUsage {
            percent: 10,
            self_reported: Some(12),
            ..
        }
    ));
    sup.shutdown().await;

    let ctx = ContextConfig::default().with_indicator(false);
    let (sup, ctl) =
        supervisor_with(config().with_session(SessionConfig::default().with_context(ctx))).await;
    let text = turn_text(&sup, &ctl, |a| {
        a.send(usage(10_000, 0, 0, 5));
        a.text("plain");
    })
    .await;
    assert_eq!(text, "plain");
    sup.shutdown().await;
}

/// The summary's `text` is the raw answer (to feed another agent); the
/// indicator is a field of its own, appended only by `relay_text`.
#[tokio::test(start_paused = true)]
async fn the_raw_answer_and_the_indicator_are_separate() {
    let (sup, ctl) = supervisor_with(config()).await;
    let t = sup.send("ws", "q").await.expect("send");
    let a = ctl
        .next_attempt()
        .within("the attempt")
        .await
        .expect("attempt");
    a.send(usage(1000, 0, 0, 5));
    a.text("Raw answer.");
    a.finish();
    let (relayed, summary) = t.finish().within("the turn").await.expect("ok");
    assert_eq!(summary.text, "Raw answer.");
    assert_eq!(summary.indicator.as_deref(), Some("[ctx: 1%]"));
    assert_eq!(summary.relay_text(), "Raw answer.\n[ctx: 1%]");
    assert_eq!(relayed, summary.relay_text());
    sup.shutdown().await;

    // Indicator off: no indicator, relay text is the answer.
    let ctx = ContextConfig::default().with_indicator(false);
    let (sup, ctl) =
        supervisor_with(config().with_session(SessionConfig::default().with_context(ctx))).await;
    let t = sup.send("ws", "q").await.expect("send");
    let a = ctl
        .next_attempt()
        .within("the attempt")
        .await
        .expect("attempt");
    a.send(usage(1000, 0, 0, 5));
    a.text("Plain.");
    a.finish();
    let (relayed, summary) = t.finish().within("the turn").await.expect("ok");
    assert_eq!((relayed.as_str(), summary.indicator), ("Plain.", None));
    sup.shutdown().await;
}
