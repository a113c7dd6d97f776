//! With transcripts, an HTTP source keeps conversations like an agent CLI:
//! it names each conversation, resumes it by id with the whole history
//! (so the context grows), leaves it untouched when an attempt fails, and
//! answers an unknown id with `UnknownSession` before sending anything.

use futures_util::StreamExt;
use warden_core::store::Role;
use warden_core::{AgentEvent, EventSource, Frame, SessionKey, StreamError, TurnRequest, Usage};
use warden_llm::{
    AnthropicOptions, AnthropicSource, HttpOptions, OpenAiOptions, OpenAiSource, Transcripts,
};
use warden_mock::{MockConfig, MockServer, Scenario};

struct Turn {
    session_id: Option<String>,
    usage: Option<Usage>,
    text: String,
    error: Option<StreamError>,
}

async fn run(source: &dyn EventSource, message: &str, resume: Option<&str>) -> Turn {
    let mut request = TurnRequest::new(SessionKey::new("repo"), 1, message);
    request.resume_id = resume.map(str::to_owned);
    let mut turn = Turn {
        session_id: None,
        usage: None,
        text: String::new(),
        error: None,
    };
    let mut stream = match source.open(request).await {
        Ok(s) => s,
        Err(e) => {
            turn.error = Some(e);
            return turn;
        }
    };
    while let Some(frame) = stream.next().await {
        match frame {
            Ok(Frame::Event(AgentEvent::SessionStarted { session_id, .. })) => {
                turn.session_id = Some(session_id)
            }
            Ok(Frame::Event(AgentEvent::Usage(u))) => turn.usage = Some(u),
            Ok(Frame::Event(AgentEvent::TextDelta(t))) => turn.text.push_str(&t),
            Ok(_) => {}
            Err(e) => {
                turn.error = Some(e);
                break;
            }
        }
    }
    turn
}

fn http(dir: &std::path::Path) -> (HttpOptions, Transcripts) {
    let transcripts = Transcripts::open(dir.join("transcripts")).expect("transcripts dir");
    (
        HttpOptions::default().with_transcripts(transcripts.clone()),
        transcripts,
    )
}

fn anthropic(mock: &MockServer, http: HttpOptions) -> AnthropicSource {
    AnthropicSource::new(
        AnthropicOptions::default()
            .with_base_url(mock.base_url())
            .with_http(http),
    )
    .expect("source")
}

fn openai(mock: &MockServer, http: HttpOptions) -> OpenAiSource {
    OpenAiSource::new(
        OpenAiOptions::default()
            .with_base_url(mock.base_url())
            .with_http(http),
    )
    .expect("source")
}

#[tokio::test]
async fn anthropic_conversations_grow_resume_and_survive_failed_attempts() {
    let mock = MockServer::start(MockConfig::default().with_sequence([
        Scenario::Normal,
        Scenario::Normal,
        Scenario::AbruptClose,
        Scenario::Normal,
    ]))
    .await
    .expect("mock");
    let dir = tempfile::tempdir().expect("tempdir");
    let (http, transcripts) = http(dir.path());
    let source = anthropic(&mock, http);

    let first = run(&source, "What changed?", None).await;
    assert!(first.error.is_none(), "{:?}", first.error);
    let id = first.session_id.expect("the conversation is named");
    assert!(id.starts_with("conv_"), "{id}");
    let entries = transcripts.load(&id).expect("transcript written");
    assert_eq!(entries.len(), 2);
    assert_eq!(
        (entries[0].role, entries[0].content.as_str()),
        (Role::User, "What changed?")
    );
    assert_eq!(entries[1].role, Role::Assistant);
    assert_eq!(entries[1].content, first.text);

    // Resumed: same id, the history is sent, so the prompt is larger.
    let second = run(&source, "And now?", Some(&id)).await;
    assert!(second.error.is_none(), "{:?}", second.error);
    assert_eq!(second.session_id.as_deref(), Some(id.as_str()));
    let (a, b) = (
        first.usage.expect("usage").input_tokens,
        second.usage.expect("usage").input_tokens,
    );
    assert!(b > a, "resumed prompt {b} tokens vs first {a}");
    assert_eq!(transcripts.load(&id).expect("load").len(), 4);

    // A failed attempt (connection closed mid-stream) appends nothing ...
    let failed = run(&source, "Third?", Some(&id)).await;
    assert!(
        failed.error.as_ref().is_some_and(StreamError::is_retryable),
        "{:?}",
        failed.error
    );
    assert_eq!(transcripts.load(&id).expect("load").len(), 4);
    // ... and the retry sends the same history and appends once.
    let retry = run(&source, "Third?", Some(&id)).await;
    assert!(retry.error.is_none(), "{:?}", retry.error);
    assert_eq!(
        retry.usage.expect("usage").input_tokens,
        failed
            .usage
            .expect("the failed attempt saw message_start")
            .input_tokens,
        "the retry sends exactly the history the failed attempt sent"
    );
    assert_eq!(transcripts.load(&id).expect("load").len(), 6);
    mock.shutdown().await;
}

#[tokio::test]
async fn a_new_conversation_whose_first_attempt_failed_can_be_resumed() {
    // The id is announced before the attempt fails, so the session stores
    // it and its retry resumes it: that must not be an unknown session.
    let mock = MockServer::start(
        MockConfig::default().with_sequence([Scenario::AbruptClose, Scenario::Normal]),
    )
    .await
    .expect("mock");
    let dir = tempfile::tempdir().expect("tempdir");
    let (http, transcripts) = http(dir.path());
    let source = anthropic(&mock, http);
    let failed = run(&source, "hello", None).await;
    assert!(failed.error.is_some());
    let id = failed.session_id.expect("announced before the failure");
    assert_eq!(transcripts.load(&id).expect("empty but there"), vec![]);
    let retry = run(&source, "hello", Some(&id)).await;
    assert!(retry.error.is_none(), "{:?}", retry.error);
    assert_eq!(retry.session_id.as_deref(), Some(id.as_str()));
    assert_eq!(transcripts.load(&id).expect("load").len(), 2);
    mock.shutdown().await;
}

#[tokio::test]
async fn an_unknown_conversation_is_refused_before_any_request() {
    let mock = MockServer::start(MockConfig::default())
        .await
        .expect("mock");
    let dir = tempfile::tempdir().expect("tempdir");
    let (http, _) = http(dir.path());
    let source = openai(&mock, http);
    for id in ["conv_0123456789abcdef0123456789abcdef", "../../etc/passwd"] {
        let turn = run(&source, "hello", Some(id)).await;
        match turn.error {
            Some(StreamError::UnknownSession {
                session_id,
                message,
            }) => {
                assert_eq!(session_id, id);
                assert_eq!(
                    message,
                    format!("No conversation found with session ID: {id}")
                );
            }
            other => panic!("{id}: {other:?}"),
        }
    }
    assert_eq!(mock.request_count(), 0);
    mock.shutdown().await;
}

#[tokio::test]
async fn openai_history_goes_between_system_and_the_new_message() {
    let mock = MockServer::start(MockConfig::default())
        .await
        .expect("mock");
    let dir = tempfile::tempdir().expect("tempdir");
    let (http, transcripts) = http(dir.path());
    let source = openai(&mock, http);
    let first = run(&source, "one", None).await;
    let id = first.session_id.expect("named");
    let second = run(&source, "two", Some(&id)).await;
    assert!(second.error.is_none(), "{:?}", second.error);
    assert!(second.usage.expect("usage").input_tokens > first.usage.expect("usage").input_tokens);
    let contents: Vec<String> = transcripts
        .load(&id)
        .expect("load")
        .into_iter()
        .map(|e| e.content)
        .collect();
    assert_eq!(contents[0], "one");
    assert_eq!(contents[2], "two");
    mock.shutdown().await;
}
