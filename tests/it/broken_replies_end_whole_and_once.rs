//! Property, on the paused clock: for random replies (thinking, text, a
//! tool call, more text) broken by a stall at a random event, the consumer
//! ends with the intended text exactly once, and no tool call is delivered
//! twice — continued where the text broke (by prefill or by a
//! continuation turn whose repeat is trimmed), restarted where nothing or
//! only thinking was shown, refused where a restart would repeat a
//! delivered tool call.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use futures_util::future::BoxFuture;
use futures_util::{StreamExt as _, stream};
use proptest::prelude::*;

use crate::common::config;
use warden_core::continuation::{StreamPhase, stitch};
use warden_core::{
    AgentEvent, EventSource, EventStream, Frame, SessionKey, StreamError, Supervisor, TurnError,
    TurnEvent, TurnRequest,
};

/// The provider: streams `events`; the first attempt stops after `kill`
/// of them and goes silent. A continuation gets the rest of the reply —
/// exactly (prefill) or after the partial text's last words repeated
/// (continuation turn), trimmed as a source does.
struct Provider {
    events: Vec<AgentEvent>,
    kill: usize,
    repeat_words: bool,
    opens: AtomicU32,
}

fn complete() -> AgentEvent {
    AgentEvent::TurnComplete {
        context_window: None,
        duration: None,
    }
}

impl Provider {
    /// What follows `partial` (the text of `events[..kill]`): the events
    /// after the kill point, the first text run prefixed by the repeat.
    fn continuation(&self, partial: &str) -> Vec<AgentEvent> {
        let mut rest: Vec<AgentEvent> = self.events[self.kill..].to_vec();
        if !self.repeat_words {
            return rest;
        }
        // The model repeats the last two words (or the whole partial text).
        let starts: Vec<usize> = partial
            .char_indices()
            .filter(|&(i, c)| !c.is_whitespace() && (i == 0 || partial[..i].ends_with(' ')))
            .map(|(i, _)| i)
            .collect();
        let from = starts.len().checked_sub(2).map_or(0, |k| starts[k]);
        let repeated = &partial[from..];
        // Said at once, merged with the text that follows right away.
        let mut text = repeated.to_owned();
        if let Some(AgentEvent::TextDelta(t)) = rest.first() {
            text.push_str(t);
            rest.remove(0);
        }
        let drop = stitch(partial, &text).expect("a continuation, not a restart");
        rest.insert(0, AgentEvent::TextDelta(text[drop..].to_owned()));
        rest
    }
}

impl EventSource for Provider {
    fn open(&self, request: TurnRequest) -> BoxFuture<'static, Result<EventStream, StreamError>> {
        let n = self.opens.fetch_add(1, Ordering::SeqCst) + 1;
        let frames: Vec<AgentEvent> = match (&request.continuation, n) {
            (_, 1) => self.events[..self.kill].to_vec(),
            (Some(c), _) => self.continuation(&c.partial_text),
            (None, _) => self.events.clone(),
        };
        let stall = n == 1;
        Box::pin(async move {
            let head = stream::iter(frames.into_iter().map(|e| Ok(Frame::Event(e))));
            let s: EventStream = if stall {
                Box::pin(head.chain(stream::pending()))
            } else {
                Box::pin(head)
            };
            Ok(s)
        })
    }

    fn provider(&self) -> &str {
        "property"
    }

    fn continues(&self) -> bool {
        true
    }
}

fn words(n: std::ops::Range<usize>, tag: &'static str) -> impl Strategy<Value = Vec<String>> {
    prop::collection::vec("[a-z]{1,7}", n).prop_map(move |ws| {
        ws.into_iter()
            .enumerate()
            .map(|(i, w)| format!("{w}{tag}{i} "))
            .collect()
    })
}

/// A reply: optional thinking, text, an optional tool call, optional text,
/// each text streamed a few words per delta.
fn reply() -> impl Strategy<Value = Vec<AgentEvent>> {
    (
        prop::option::of(words(1..4, "t")),
        words(1..12, "a"),
        any::<bool>(),
        prop::option::of(words(1..8, "b")),
        1usize..4,
    )
        .prop_map(|(thinking, text1, tool, text2, per_delta)| {
            let mut ev = Vec::new();
            for t in thinking.into_iter().flatten() {
                ev.push(AgentEvent::ThinkingDelta(t));
            }
            for chunk in text1.chunks(per_delta) {
                ev.push(AgentEvent::TextDelta(chunk.concat()));
            }
            if tool {
                ev.push(AgentEvent::ToolUseStarted {
                    id: "tool-1".into(),
                    name: "Bash".into(),
                });
                ev.push(AgentEvent::ToolInputDelta {
                    id: "tool-1".into(),
                    partial_json: "{\"cmd\":".into(),
                });
                ev.push(AgentEvent::ToolInputDelta {
                    id: "tool-1".into(),
                    partial_json: "\"ls\"}".into(),
                });
                ev.push(AgentEvent::ToolUseFinished {
                    id: "tool-1".into(),
                });
            }
            for chunk in text2
                .into_iter()
                .flatten()
                .collect::<Vec<_>>()
                .chunks(per_delta)
            {
                ev.push(AgentEvent::TextDelta(chunk.concat()));
            }
            ev.push(complete());
            ev
        })
}

fn text_of(events: &[AgentEvent]) -> String {
    events
        .iter()
        .filter_map(|e| match e {
            AgentEvent::TextDelta(t) => Some(t.as_str()),
            _ => None,
        })
        .collect()
}

/// What the consumer ended with: its text (discarding on `Retrying`),
/// tool calls it ran (on each `ToolUseFinished`), the result.
async fn run(provider: Arc<Provider>) -> (String, HashMap<String, u32>, Result<String, TurnError>) {
    let sup = Supervisor::start(
        config(),
        Arc::new(move |_: &SessionKey| provider.clone() as Arc<dyn EventSource>),
    )
    .await
    .expect("supervisor");
    let mut turn = sup.send("ws", "go").await.expect("send");
    let mut shown = String::new();
    let mut ran: HashMap<String, u32> = HashMap::new();
    let result = loop {
        match turn.recv().await.expect("the turn's events") {
            TurnEvent::Event(AgentEvent::TextDelta(t)) => shown.push_str(&t),
            TurnEvent::Event(AgentEvent::ToolUseFinished { id }) => {
                *ran.entry(id).or_default() += 1
            }
            TurnEvent::Retrying { .. } => shown.clear(),
            TurnEvent::Finished(r) => break r.map(|s| s.text),
            _ => {}
        }
    };
    sup.shutdown().await;
    (shown, ran, result)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    #[test]
    fn every_broken_reply_ends_whole_once_or_refused(
        events in reply(),
        kill_at in 0.0f64..1.0,
        repeat_words in any::<bool>(),
    ) {
        // Never after the terminal event: the first attempt always breaks.
        let kill = ((events.len() - 1) as f64 * kill_at) as usize;
        let phase = events[..kill]
            .iter()
            .fold(StreamPhase::BeforeContent, |p, e| p.after(e));
        let delivered_tool = events[..kill]
            .iter()
            .any(|e| matches!(e, AgentEvent::ToolUseFinished { .. }));
        let tools = events.iter().filter(|e| matches!(e, AgentEvent::ToolUseFinished { .. })).count();
        let intended = text_of(&events);
        let provider = Arc::new(Provider {
            events,
            kill,
            repeat_words,
            opens: AtomicU32::new(0),
        });
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .expect("runtime");
        let (shown, ran, result) = rt.block_on(async {
            tokio::time::timeout(std::time::Duration::from_secs(3600), run(provider.clone()))
                .await
                .expect("the turn ends")
        });
        prop_assert!(ran.values().all(|n| *n == 1), "a tool call ran twice: {ran:?}");
        let continued = phase == StreamPhase::Text;
        if delivered_tool && !continued {
            prop_assert!(
                matches!(result, Err(TurnError::ToolCallsWouldRepeat { completed: 1, .. })),
                "{result:?}"
            );
        } else {
            let text = result.expect("answered");
            prop_assert_eq!(&text, &intended);
            prop_assert_eq!(&shown, &intended);
            prop_assert_eq!(ran.len(), tools);
        }
        prop_assert_eq!(provider.opens.load(Ordering::SeqCst), if delivered_tool && !continued { 1 } else { 2 });
    }
}
