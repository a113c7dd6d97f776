//! Delivery is at least once: after a crash the session re-sends a pending
//! message that may already be answered in the transcript. Such a turn (same
//! id, same message) is replayed from the transcript without calling the
//! API and is not appended again; old transcripts without turn ids still
//! resume.

use futures_util::StreamExt;
use warden_core::store::Role;
use warden_core::{AgentEvent, Continuation, EventSource, Frame, SessionKey, TurnRequest};
use warden_llm::transcript::REPLAYED_STOP_REASON;
use warden_llm::{HttpOptions, OpenAiOptions, OpenAiSource, Transcripts};
use warden_mock::{MockConfig, MockServer};

#[derive(Debug, Default)]
struct Turn {
    session_id: Option<String>,
    text: String,
    stop: Option<String>,
    complete: bool,
}

async fn run(source: &dyn EventSource, turn: u64, message: &str, resume: Option<&str>) -> Turn {
    let mut request = TurnRequest::new(SessionKey::new("repo"), turn, message);
    request.resume_id = resume.map(str::to_owned);
    run_request(source, request).await
}

async fn run_request(source: &dyn EventSource, request: TurnRequest) -> Turn {
    let mut out = Turn::default();
    let mut stream = source.open(request).await.expect("opened");
    while let Some(frame) = stream.next().await {
        match frame.expect("no stream error") {
            Frame::Event(AgentEvent::SessionStarted { session_id, .. }) => {
                out.session_id = Some(session_id)
            }
            Frame::Event(AgentEvent::TextDelta(t)) => out.text.push_str(&t),
            Frame::Event(AgentEvent::Stop { reason }) => out.stop = Some(reason),
            Frame::Event(AgentEvent::TurnComplete { .. }) => out.complete = true,
            _ => {}
        }
    }
    out
}

fn source(mock: &MockServer, transcripts: &Transcripts) -> OpenAiSource {
    OpenAiSource::new(
        OpenAiOptions::default()
            .with_base_url(mock.base_url())
            .with_http(HttpOptions::default().with_transcripts(transcripts.clone())),
    )
    .expect("source")
}

#[tokio::test]
async fn an_answered_turn_sent_again_is_replayed_without_a_request_and_recorded_once() {
    let mock = MockServer::start(MockConfig::default())
        .await
        .expect("mock");
    let dir = tempfile::tempdir().expect("tempdir");
    let transcripts = Transcripts::open(dir.path()).expect("open");
    let source = source(&mock, &transcripts);

    let first = run(&source, 1, "What changed?", None).await;
    let id = first.session_id.clone().expect("named");
    let second = run(&source, 2, "And the tests?", Some(&id)).await;
    assert_eq!(mock.request_count(), 2);

    // Message 2 re-delivered after a crash: its stored answer, no request.
    let again = run(&source, 2, "And the tests?", Some(&id)).await;
    assert_eq!(mock.request_count(), 2, "the API was not called again");
    assert!(again.complete);
    assert_eq!(again.text, second.text);
    assert_eq!(again.stop.as_deref(), Some(REPLAYED_STOP_REASON));
    assert_eq!(again.session_id.as_deref(), Some(id.as_str()));
    let entries = transcripts.load(&id).expect("load");
    assert_eq!(entries.len(), 4, "not appended twice");
    assert_eq!(entries[3].turn, Some(2));

    // The same id with another message (ids reused by a new record) is a
    // new turn, sent and recorded.
    let other = run(&source, 2, "Something else", Some(&id)).await;
    assert_eq!(mock.request_count(), 3);
    assert_ne!(other.stop.as_deref(), Some(REPLAYED_STOP_REASON));
    assert_eq!(transcripts.load(&id).expect("load").len(), 6);
    mock.shutdown().await;
}

/// A turn re-delivered with the whole reply its node held (the upstream
/// had finished it; the node gave the session up in a database outage
/// before it could record it) is recorded as answered without a request;
/// re-delivered again with part of that text, only the rest is replayed.
#[tokio::test]
async fn a_whole_reply_offered_again_is_recorded_without_a_request() {
    let mock = MockServer::start(MockConfig::default())
        .await
        .expect("mock");
    let dir = tempfile::tempdir().expect("tempdir");
    let transcripts = Transcripts::open(dir.path()).expect("open");
    let source = source(&mock, &transcripts);
    let first = run(&source, 1, "What changed?", None).await;
    let id = first.session_id.clone().expect("named");
    assert_eq!(mock.request_count(), 1);

    let whole = "The parser, and its tests.";
    let mut request = TurnRequest::new(SessionKey::new("repo"), 2, "And the tests?");
    request.resume_id = Some(id.clone());
    request.continuation = Some(Continuation::new(whole, 1).with_complete(true));
    let ended = run_request(&source, request).await;
    assert_eq!(mock.request_count(), 1, "the upstream is not asked again");
    assert!(ended.complete);
    assert_eq!(ended.text, "", "nothing after the whole reply");
    assert_eq!(ended.stop.as_deref(), Some(REPLAYED_STOP_REASON));
    let entries = transcripts.load(&id).expect("load");
    assert_eq!(entries.len(), 4);
    assert_eq!(
        (entries[3].turn, entries[3].content.as_str()),
        (Some(2), whole)
    );

    // Answered now: a continuation of part of it gets the rest, replayed.
    let mut request = TurnRequest::new(SessionKey::new("repo"), 2, "And the tests?");
    request.resume_id = Some(id.clone());
    request.continuation = Some(Continuation::new("The parser,", 1));
    let rest = run_request(&source, request).await;
    assert_eq!(mock.request_count(), 1);
    assert_eq!(rest.text, " and its tests.");
    assert_eq!(transcripts.load(&id).expect("load").len(), 4);
    mock.shutdown().await;
}

#[test]
fn appending_a_turn_twice_records_it_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let t = Transcripts::open(dir.path()).expect("open");
    assert!(t.append_turn_once("conv_a", 7, "q", "a").expect("append"));
    assert!(!t.append_turn_once("conv_a", 7, "q", "a2").expect("append"));
    assert!(t.append_turn_once("conv_a", 8, "q", "a").expect("append"));
    let entries = t.load("conv_a").expect("load");
    assert_eq!(entries.len(), 4);
    assert_eq!(entries[1].content, "a", "the first answer stays");
}

#[tokio::test]
async fn a_transcript_written_before_turn_ids_still_resumes() {
    let mock = MockServer::start(MockConfig::default())
        .await
        .expect("mock");
    let dir = tempfile::tempdir().expect("tempdir");
    let transcripts = Transcripts::open(dir.path()).expect("open");
    std::fs::write(
        dir.path().join("conv_old.jsonl"),
        "{\"role\":\"user\",\"content\":\"old question\"}\n{\"role\":\"assistant\",\"content\":\"old answer\"}\n",
    )
    .expect("write");
    let source = source(&mock, &transcripts);
    // Turn 1 with the old question: no id on disk, so it is not a replay.
    let turn = run(&source, 1, "old question", Some("conv_old")).await;
    assert!(turn.complete);
    assert_eq!(mock.request_count(), 1);
    let entries = transcripts.load("conv_old").expect("load");
    assert_eq!(entries.len(), 4);
    assert_eq!((entries[0].role, entries[0].turn), (Role::User, None));
    assert_eq!((entries[2].role, entries[2].turn), (Role::User, Some(1)));
    mock.shutdown().await;
}
