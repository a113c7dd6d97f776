use warden_llm::CONTINUE_ASK;

use super::*;

/// An upstream event of `data` (its `type` as the event name), numbered
/// `seq` as the API numbers them.
fn ev(seq: u64, mut data: Value) -> SseEvent {
    data["sequence_number"] = json!(seq);
    SseEvent {
        event: data["type"].as_str().unwrap_or("message").to_owned(),
        data: data.to_string(),
        id: None,
    }
}

/// The events of one attempt, from `response.created` to its `text`
/// deltas (`item` the message id); `end` adds the rest of a whole reply.
fn attempt(response: &str, item: &str, deltas: &[&str], end: bool) -> Vec<SseEvent> {
    let r = json!({"id": response, "object": "response", "status": "in_progress", "output": []});
    let mut data = vec![
        json!({"type": "response.created", "response": r}),
        json!({"type": "response.in_progress", "response": r}),
        json!({"type": "response.output_item.added", "output_index": 0,
               "item": {"id": item, "type": "message", "status": "in_progress", "role": "assistant", "content": []}}),
        json!({"type": "response.content_part.added", "item_id": item, "output_index": 0,
               "content_index": 0, "part": {"type": "output_text", "text": "", "annotations": []}}),
    ];
    for d in deltas {
        data.push(
            json!({"type": "response.output_text.delta", "item_id": item,
                         "output_index": 0, "content_index": 0, "delta": d}),
        );
    }
    if end {
        let text: String = deltas.concat();
        let part = json!({"type": "output_text", "text": text, "annotations": []});
        let whole = json!({"id": item, "type": "message", "status": "completed", "role": "assistant", "content": [part]});
        data.extend([
            json!({"type": "response.output_text.done", "item_id": item, "output_index": 0,
                   "content_index": 0, "text": text}),
            json!({"type": "response.content_part.done", "item_id": item, "output_index": 0,
                   "content_index": 0, "part": part}),
            json!({"type": "response.output_item.done", "output_index": 0, "item": whole}),
            json!({"type": "response.completed", "response": {"id": response, "object": "response",
                   "status": "completed", "output": [whole],
                   "usage": {"input_tokens": 50, "output_tokens": 10, "total_tokens": 60}}}),
        ]);
    }
    data.into_iter()
        .enumerate()
        .map(|(i, d)| ev(i as u64, d))
        .collect()
}

/// The events the client got: each one's name and data.
fn sent(out: &str) -> Vec<(String, Value)> {
    out.split("\n\n")
        .filter(|b| !b.is_empty())
        .map(|b| {
            let (name, data) = b
                .strip_prefix("event: ")
                .and_then(|b| b.split_once("\ndata: "))
                .unwrap_or_else(|| panic!("not an event: {b:?}"));
            (name.to_owned(), serde_json::from_str(data).expect("json"))
        })
        .collect()
}

fn feed(s: &mut Responses, events: &[SseEvent], out: &mut String) {
    for e in events {
        s.event(e, out).expect("event");
    }
}

const ORIGINAL: &str = r#"{"model": "gpt-test", "stream": true, "store": false,
  "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "count"}]}]}"#;

#[test]
fn a_reply_broken_mid_text_is_continued_into_one_well_formed_response() {
    let original: Value = serde_json::from_str(ORIGINAL).expect("json");
    let mut s = Responses::default();
    let mut out = String::new();
    feed(
        &mut s,
        &attempt("resp_a", "msg_a", &["one two ", "three four"], false),
        &mut out,
    );
    let Resume::Continue(request) = s.resume(&original) else {
        panic!("continued")
    };
    let input = request["input"].as_array().expect("input");
    assert_eq!(input.len(), 3, "{input:?}");
    assert_eq!(input[0], original["input"][0]);
    assert_eq!(
        input[1],
        json!({"type": "message", "role": "assistant",
               "content": [{"type": "output_text", "text": "one two three four"}]})
    );
    assert_eq!(input[2]["content"][0]["text"], CONTINUE_ASK);
    let more = "two three four five six seven eight nine";
    feed(
        &mut s,
        &attempt(
            "resp_b",
            "msg_b",
            &["two three four ", "five six seven eight nine"],
            true,
        ),
        &mut out,
    );
    assert!(s.done());

    let events = sent(&out);
    for (i, (name, data)) in events.iter().enumerate() {
        assert_eq!(data["sequence_number"], json!(i), "numbered on: {events:?}");
        assert_eq!(data["type"].as_str(), Some(name.as_str()));
        if let Some(item) = data.get("item_id") {
            assert_eq!(item, "msg_a", "one item: {data}");
        }
        if let Some(index) = data.get("output_index") {
            assert_eq!(index, 0, "{data}");
        }
    }
    let count = |kind: &str| events.iter().filter(|(n, _)| n == kind).count();
    assert_eq!(count("response.created"), 1);
    assert_eq!(count("response.output_item.added"), 1);
    assert_eq!(count("response.content_part.added"), 1);
    let text: String = events
        .iter()
        .filter(|(n, _)| n == "response.output_text.delta")
        .filter_map(|(_, d)| d["delta"].as_str())
        .collect();
    let whole = format!("one {more}");
    assert_eq!(text, whole);
    let last = |kind: &str| &events.iter().rfind(|(n, _)| n == kind).expect(kind).1;
    assert_eq!(last("response.output_text.done")["text"], whole);
    assert_eq!(last("response.content_part.done")["part"]["text"], whole);
    let item = &last("response.output_item.done")["item"];
    assert_eq!(item["id"], "msg_a");
    assert_eq!(item["content"][0]["text"], whole);
    let completed = &last("response.completed")["response"];
    assert_eq!(completed["id"], "resp_a", "the first attempt's id");
    assert_eq!(completed["output"], json!([item]));
    assert!(
        completed["usage"]["output_tokens"].as_u64() > Some(10),
        "the broken attempt's tokens count: {completed}"
    );
    assert_eq!(
        events.last().map(|(n, _)| n.as_str()),
        Some("response.completed")
    );
}

#[test]
fn a_reply_broken_before_its_text_is_sent_again_and_its_second_start_dropped() {
    let original: Value = serde_json::from_str(ORIGINAL).expect("json");
    for shown in [2, 4] {
        let mut s = Responses::default();
        let mut out = String::new();
        let first = attempt("resp_a", "msg_a", &[], false);
        feed(&mut s, &first[..shown], &mut out);
        assert!(
            matches!(s.resume(&original), Resume::Again),
            "after {shown} events"
        );
        feed(
            &mut s,
            &attempt("resp_b", "msg_b", &["all of it"], true),
            &mut out,
        );
        let events = sent(&out);
        for (i, (_, data)) in events.iter().enumerate() {
            assert_eq!(data["sequence_number"], json!(i), "{events:?}");
        }
        let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.completed"
            ],
            "after {shown} events"
        );
        let ids: std::collections::BTreeSet<&str> = events
            .iter()
            .filter_map(|(_, d)| d["item_id"].as_str())
            .collect();
        assert_eq!(ids.len(), 1, "{ids:?}");
        assert_eq!(events[8].1["response"]["id"], "resp_a");
    }
}

#[test]
fn a_tool_call_or_reasoning_cannot_be_continued() {
    let original: Value = serde_json::from_str(ORIGINAL).expect("json");
    for kind in ["function_call", "reasoning"] {
        let mut s = Responses::default();
        let mut out = String::new();
        let mut events = attempt("resp_a", "x", &[], false);
        events.truncate(2);
        events.push(ev(
            2,
            json!({"type": "response.output_item.added", "output_index": 0,
                                 "item": {"id": "fc_1", "type": kind}}),
        ));
        feed(&mut s, &events, &mut out);
        assert!(matches!(s.resume(&original), Resume::GiveUp), "{kind}");
        let error = sent(&s.error_event("gave up"));
        assert_eq!(error[0].0, "error");
        assert_eq!(error[0].1["sequence_number"], 3, "numbered after the last");
    }
}

#[test]
fn a_continuation_that_does_not_go_on_with_the_message_fails_the_attempt() {
    let original: Value = serde_json::from_str(ORIGINAL).expect("json");
    let mut s = Responses::default();
    let mut out = String::new();
    feed(
        &mut s,
        &attempt("resp_a", "msg_a", &["one two "], false),
        &mut out,
    );
    assert!(matches!(s.resume(&original), Resume::Continue(_)));
    let mut events = attempt("resp_b", "x", &[], false);
    events.truncate(2);
    events.push(ev(
        2,
        json!({"type": "response.output_item.added", "output_index": 0,
                             "item": {"id": "fc_1", "type": "function_call"}}),
    ));
    feed(&mut s, &events[..2], &mut out);
    let e = s.event(&events[2], &mut out).expect_err("not the message");
    assert!(matches!(e, StreamError::ContinuationFailed { .. }), "{e:?}");
    assert!(
        matches!(s.resume(&original), Resume::Continue(_)),
        "asked again"
    );
}

#[test]
fn error_events_follow_the_shared_retry_rule() {
    let mut s = Responses::default();
    let mut out = String::new();
    let overloaded = ev(
        0,
        json!({"type": "error", "code": "server_is_overloaded", "message": "busy"}),
    );
    let e = s.event(&overloaded, &mut out).expect_err("retryable");
    assert!(e.is_retryable(), "{e:?}");
    assert!(out.is_empty());
    let invalid = ev(
        0,
        json!({"type": "error", "code": "invalid_prompt", "message": "no"}),
    );
    s.event(&invalid, &mut out).expect("passed on");
    assert!(s.done());
    assert_eq!(out, format!("event: error\ndata: {}\n\n", invalid.data));
}

/// A reasoning item's events from `at` (its output index 0): added, one
/// summary delta, and with `whole` its end.
fn reasoning(at: u64, item: &str, whole: bool) -> Vec<SseEvent> {
    let mut data = vec![
        json!({"type": "response.output_item.added", "output_index": 0,
               "item": {"id": item, "type": "reasoning", "summary": []}}),
        json!({"type": "response.reasoning_summary_text.delta", "item_id": item,
               "output_index": 0, "summary_index": 0, "delta": "Looking"}),
    ];
    if whole {
        data.push(
            json!({"type": "response.output_item.done", "output_index": 0,
                         "item": {"id": item, "type": "reasoning", "summary": []}}),
        );
    }
    data.into_iter().zip(at..).map(|(d, i)| ev(i, d)).collect()
}

#[test]
fn a_held_reasoning_item_broken_inside_is_sent_again_unseen() {
    let original: Value = serde_json::from_str(ORIGINAL).expect("json");
    let mut s = Responses::new(true);
    let mut out = String::new();
    feed(
        &mut s,
        &attempt("resp_a", "msg_a", &[], false)[..2],
        &mut out,
    );
    feed(&mut s, &reasoning(2, "rs_a", false), &mut out);
    assert!(
        out.ends_with("\n\n:\n\n:\n\n"),
        "a comment per held event: {out:?}"
    );
    assert!(matches!(s.resume(&original), Resume::Again));
    feed(
        &mut s,
        &attempt("resp_b", "msg_b", &[], false)[..2],
        &mut out,
    );
    feed(&mut s, &reasoning(2, "rs_b", true), &mut out);
    let events: Vec<(String, Value)> = sent(&out.replace(":\n\n", ""));
    let numbers: Vec<u64> = events
        .iter()
        .filter_map(|(_, d)| d["sequence_number"].as_u64())
        .collect();
    assert_eq!(numbers, [0, 1, 2, 3, 4], "{events:?}");
    assert_eq!(
        events[2].1["item"]["id"], "rs_b",
        "only the retry's reasoning"
    );
    assert_eq!(events[2].1["output_index"], 0);
    // Without the hold, shown reasoning cannot be taken back.
    let mut s = Responses::new(false);
    feed(
        &mut s,
        &attempt("resp_a", "msg_a", &[], false)[..2],
        &mut out,
    );
    feed(&mut s, &reasoning(2, "rs_a", false), &mut out);
    assert!(matches!(s.resume(&original), Resume::GiveUp));
}
