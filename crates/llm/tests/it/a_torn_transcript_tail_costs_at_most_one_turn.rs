//! A crash in the middle of an append leaves a transcript whose last line
//! is cut off. Resuming it keeps every earlier turn, drops only the turn
//! being written, tells the caller, and repairs the file so the next turn
//! starts on a fresh line. Corruption in the middle is still an error.

use std::sync::{Arc, Mutex};

use futures_util::StreamExt;
use warden_core::store::Role;
use warden_core::{AgentEvent, EventSource, Frame, SessionKey, StreamError, TurnRequest, Usage};
use warden_llm::{AnthropicOptions, AnthropicSource, HttpOptions, TornTail, Transcripts};
use warden_mock::{MockConfig, MockServer};

struct Turn {
    session_id: Option<String>,
    usage: Option<Usage>,
    error: Option<StreamError>,
}

async fn run(source: &dyn EventSource, turn: u64, message: &str, resume: Option<&str>) -> Turn {
    let mut request = TurnRequest::new(SessionKey::new("repo"), turn, message);
    request.resume_id = resume.map(str::to_owned);
    let mut out = Turn {
        session_id: None,
        usage: None,
        error: None,
    };
    let mut stream = match source.open(request).await {
        Ok(s) => s,
        Err(e) => {
            out.error = Some(e);
            return out;
        }
    };
    while let Some(frame) = stream.next().await {
        match frame {
            Ok(Frame::Event(AgentEvent::SessionStarted { session_id, .. })) => {
                out.session_id = Some(session_id)
            }
            Ok(Frame::Event(AgentEvent::Usage(u))) => out.usage = Some(u),
            Ok(_) => {}
            Err(e) => {
                out.error = Some(e);
                break;
            }
        }
    }
    out
}

type Seen = Arc<Mutex<Vec<(String, TornTail)>>>;

fn setup(mock: &MockServer, dir: &std::path::Path) -> (AnthropicSource, Transcripts, Seen) {
    let seen: Seen = Arc::default();
    let log = Arc::clone(&seen);
    let transcripts = Transcripts::open(dir.join("transcripts"))
        .expect("dir")
        .on_torn_tail(move |id, torn| {
            log.lock()
                .expect("lock")
                .push((id.to_owned(), torn.clone()))
        });
    let source = AnthropicSource::new(
        AnthropicOptions::default()
            .with_base_url(mock.base_url())
            .with_http(HttpOptions::default().with_transcripts(transcripts.clone())),
    )
    .expect("source");
    (source, transcripts, seen)
}

/// A three-turn conversation; returns its id.
async fn three_turns(source: &AnthropicSource) -> String {
    let first = run(source, 1, "one", None).await;
    assert!(first.error.is_none(), "{:?}", first.error);
    let id = first.session_id.expect("named");
    for (turn, message) in [(2, "two"), (3, "three")] {
        let t = run(source, turn, message, Some(&id)).await;
        assert!(t.error.is_none(), "{:?}", t.error);
    }
    id
}

fn cut(path: &std::path::Path, bytes: u64) {
    let len = std::fs::metadata(path).expect("meta").len();
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .expect("open");
    file.set_len(len - bytes).expect("truncate");
}

#[tokio::test]
async fn cutting_the_last_reply_loses_that_turn_only_and_the_next_turn_resumes_the_rest() {
    let mock = MockServer::start(MockConfig::default())
        .await
        .expect("mock");
    let dir = tempfile::tempdir().expect("tempdir");
    let (source, transcripts, seen) = setup(&mock, dir.path());
    let id = three_turns(&source).await;
    let path = transcripts.path_of(&id).expect("valid id");
    let intact = std::fs::read(&path).expect("read");
    let two_turns_bytes = intact
        .iter()
        .enumerate()
        .filter(|(_, b)| **b == b'\n')
        .nth(3)
        .map(|(i, _)| i as u64 + 1)
        .expect("four lines");
    cut(&path, 15);

    let read = transcripts.read(&id).expect("a torn tail is not an error");
    assert_eq!(read.entries.len(), 4, "turns one and two are kept");
    let torn = read.torn_tail.expect("reported");
    assert!(torn.lost_turn);
    assert_eq!(torn.kept_bytes, two_turns_bytes);

    // Resuming sends turns one and two, then the new message.
    let alone = run(&source, 1, "four", None).await.usage.expect("usage");
    let next = run(&source, 4, "four", Some(&id)).await;
    assert!(next.error.is_none(), "{:?}", next.error);
    assert_eq!(next.session_id.as_deref(), Some(id.as_str()));
    assert!(
        next.usage.expect("usage").input_tokens > alone.input_tokens,
        "the earlier turns were sent"
    );
    // The caller was told once, with sizes, and the file was repaired: the
    // new turn sits on its own lines after turn two.
    let seen = seen.lock().expect("lock").clone();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].0, id);
    assert!(seen[0].1.lost_turn);
    let entries = transcripts.load(&id).expect("clean now");
    let contents: Vec<(Role, &str)> = entries
        .iter()
        .map(|e| (e.role, e.content.as_str()))
        .filter(|(r, _)| *r == Role::User)
        .collect();
    assert_eq!(
        contents,
        [
            (Role::User, "one"),
            (Role::User, "two"),
            (Role::User, "four")
        ]
    );
    assert!(transcripts.read(&id).expect("read").torn_tail.is_none());
    mock.shutdown().await;
}

#[test]
fn any_cut_inside_the_last_turn_keeps_the_earlier_turns() {
    let dir = tempfile::tempdir().expect("tempdir");
    let t = Transcripts::open(dir.path()).expect("open");
    let id = "conv_cut";
    t.append_turn_once(id, 1, "héllo", "wörld").expect("append");
    t.append_turn_once(id, 2, "ünïcode", "rëply ✓")
        .expect("append");
    let path = t.path_of(id).expect("valid");
    let full = std::fs::read(&path).expect("read");
    let first_turn = full
        .iter()
        .enumerate()
        .filter(|(_, b)| **b == b'\n')
        .nth(1)
        .map(|(i, _)| i + 1)
        .expect("two lines");
    // Every cut inside turn two but before its final newline, including
    // cuts inside multi-byte characters and exactly between its two lines.
    for len in first_turn..full.len() - 1 {
        std::fs::write(&path, &full[..len]).expect("write");
        let read = t.read(id).unwrap_or_else(|e| panic!("cut at {len}: {e}"));
        assert_eq!(read.entries.len(), 2, "cut at {len}");
        assert_eq!(read.entries[1].content, "wörld");
        if len > first_turn {
            let torn = read.torn_tail.expect("torn");
            assert!(torn.lost_turn, "cut at {len}");
            assert_eq!(torn.kept_bytes, first_turn as u64);
        }
        // Repaired, the next append lands on its own lines.
        t.read_and_repair(id).expect("repair");
        t.append_turn_once(id, 3, "next", "ok").expect("append");
        let entries = t.load(id).expect("clean");
        assert_eq!(entries.len(), 4, "cut at {len}");
        assert_eq!(entries[2].content, "next");
    }
}

#[test]
fn a_missing_final_newline_loses_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let t = Transcripts::open(dir.path()).expect("open");
    let id = "conv_nl";
    t.append_turn_once(id, 1, "q", "a").expect("append");
    let path = t.path_of(id).expect("valid");
    let full = std::fs::read(&path).expect("read");
    std::fs::write(&path, &full[..full.len() - 1]).expect("write");
    let read = t.read_and_repair(id).expect("read");
    assert_eq!(read.entries.len(), 2);
    let torn = read.torn_tail.expect("reported");
    assert!(!torn.lost_turn && torn.missing_newline);
    assert_eq!(
        std::fs::read(&path).expect("read"),
        full,
        "newline restored"
    );
}

#[test]
fn an_unreadable_line_in_the_middle_is_still_an_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let t = Transcripts::open(dir.path()).expect("open");
    std::fs::write(
        dir.path().join("conv_mid.jsonl"),
        "{\"role\":\"user\",\"content\":\"a\"}\n{\"role\":\"assi\n{\"role\":\"user\",\"content\":\"b\"}\n{\"role\":\"assistant\",\"content\":\"c\"}\n",
    )
    .expect("write");
    match t.read("conv_mid") {
        Err(StreamError::UnknownSession { message, .. }) => {
            assert!(message.contains("line 2 is unreadable"), "{message}")
        }
        other => panic!("{other:?}"),
    }
    // A complete last line that does not parse is corruption too.
    std::fs::write(dir.path().join("conv_end.jsonl"), "{\"role\":\"user\"\n").expect("write");
    assert!(matches!(
        t.read("conv_end"),
        Err(StreamError::UnknownSession { .. })
    ));
}
