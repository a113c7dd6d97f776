//! `--server URL`: `warden chat` and `warden sessions` against a running
//! `warden serve` node instead of opening the store (which only one process
//! can hold).

use std::io::Write as _;
use std::path::{Path, PathBuf};

use std::collections::VecDeque;

use futures_util::StreamExt as _;
use serde_json::Value;
use warden_core::store::{TurnEventData, TurnEventKind};
use warden_llm::sse::{Parsed, SseParser};
use warden_serve::api::{NewTurn, Session, SessionList};

use crate::exit::{CliError, Exit};
use crate::paths;

/// A `warden serve` node and its token.
pub(crate) struct Client {
    base: reqwest::Url,
    token: String,
    http: reqwest::Client,
}

impl Client {
    /// The node at `server`; the token from `token_file`, else
    /// `WARDEN_TOKEN`, else `DATA_DIR/token`.
    pub(crate) fn new(
        server: &str,
        token_file: Option<PathBuf>,
        data_dir: Option<PathBuf>,
    ) -> Result<Self, CliError> {
        crate::sources::check_url(server)?;
        let base = reqwest::Url::parse(server.trim_end_matches('/'))
            .map_err(|e| CliError::usage(format!("invalid --server {server:?}: {e}")))?;
        let token = match (token_file, std::env::var("WARDEN_TOKEN")) {
            (Some(file), _) => read_token(&file)?,
            (None, Ok(t)) if !t.trim().is_empty() => t.trim().to_owned(),
            _ => read_token(&paths::data_dir(data_dir)?.join("token"))?,
        };
        let http = reqwest::Client::builder()
            .build()
            .map_err(|e| CliError::failure(e.to_string()))?;
        Ok(Self { base, token, http })
    }

    fn url(&self, segments: &[&str]) -> Result<reqwest::Url, CliError> {
        let mut url = self.base.clone();
        url.path_segments_mut()
            .map_err(|()| CliError::usage("--server cannot take a path"))?
            .extend(segments);
        Ok(url)
    }

    /// Sends `message` to `workspace`'s session and relays the reply:
    /// text to stdout, notices to stderr, the context indicator last.
    /// Ctrl-C cancels the turn on the node. `model`: this turn's model.
    pub(crate) async fn chat(
        &self,
        workspace: &Path,
        message: String,
        model: Option<&str>,
    ) -> Result<Exit, CliError> {
        let workspace = std::fs::canonicalize(workspace)
            .map_err(|e| CliError::usage(format!("workspace {}: {e}", workspace.display())))?;
        let mut body = NewTurn::default();
        body.workspace = Some(workspace.to_string_lossy().into_owned());
        body.message = message;
        body.model = model.map(str::to_owned);
        let body = serde_json::to_string(&body)
            .map_err(|e| CliError::failure(format!("cannot write the turn's body: {e}")))?;
        let response = self
            .http
            .post(self.url(&["v1", "turns"])?)
            .bearer_auth(&self.token)
            .header("accept", "text/event-stream")
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .map_err(|e| unreachable_node(&self.base, &e))?;
        let response = ok_or_error(response).await?;
        let id = response
            .headers()
            .get("x-warden-turn-id")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let relay = relay_events(response);
        tokio::pin!(relay);
        tokio::select! {
            result = &mut relay => result,
            _ = crate::signal::shutdown_signal() => {
                if let Some(id) = id {
                    let _ = self
                        .http
                        .delete(self.url(&["v1", "turns", &id])?)
                        .bearer_auth(&self.token)
                        .send()
                        .await;
                }
                Err(CliError::new(Exit::Cancelled, "turn cancelled"))
            }
        }
    }

    /// Lists the node's sessions: a table, or a JSON array.
    pub(crate) async fn sessions(&self, json: bool) -> Result<Exit, CliError> {
        let list: SessionList = self.typed(&["v1", "sessions"]).await?;
        let mut sessions: Vec<Session> = Vec::new();
        for s in &list.sessions {
            sessions.push(self.typed(&["v1", "sessions", &s.key]).await?);
        }
        if json {
            let text =
                serde_json::to_string(&sessions).map_err(|e| CliError::failure(e.to_string()))?;
            println!("{text}");
            return Ok(Exit::Ok);
        }
        println!(
            "{:<48} {:<8} {:>7} {:>5}  TRACE",
            "SESSION", "STATUS", "PENDING", "CTX"
        );
        for s in &sessions {
            let d = &s.detail;
            let status = d.status.map_or("?", |st| st.as_str());
            println!(
                "{:<48} {:<8} {:>7} {:>5}  {}",
                s.key,
                status,
                d.pending.unwrap_or(0),
                d.context
                    .map_or("-".to_owned(), |c| format!("{}%", c.percent)),
                // The running incarnation's trace: `{jaeger}/trace/{id}`.
                d.trace_id.as_deref().unwrap_or("-"),
            );
        }
        Ok(Exit::Ok)
    }

    /// `GET` of `segments`, read as the contract's type `T`.
    async fn typed<T: serde::de::DeserializeOwned>(
        &self,
        segments: &[&str],
    ) -> Result<T, CliError> {
        let value = self.get(segments).await?;
        serde_json::from_value(value).map_err(|e| {
            CliError::failure(format!("the node answered with an unexpected body: {e}"))
        })
    }

    async fn get(&self, segments: &[&str]) -> Result<Value, CliError> {
        let response = self
            .http
            .get(self.url(segments)?)
            .bearer_auth(&self.token)
            .send()
            .await
            .map_err(|e| unreachable_node(&self.base, &e))?;
        let response = ok_or_error(response).await?;
        let text = response
            .text()
            .await
            .map_err(|e| CliError::failure(e.to_string()))?;
        serde_json::from_str(&text)
            .map_err(|e| CliError::failure(format!("the node answered with bad JSON: {e}")))
    }
}

fn read_token(file: &Path) -> Result<String, CliError> {
    std::fs::read_to_string(file)
        .map(|t| t.trim().to_owned())
        .map_err(|e| {
            CliError::usage(format!(
                "cannot read the token file {}: {e} (pass --token-file or set WARDEN_TOKEN)",
                file.display()
            ))
        })
}

fn unreachable_node(base: &reqwest::Url, e: &reqwest::Error) -> CliError {
    CliError::new(
        Exit::Unavailable,
        format!("cannot reach the warden node at {base}: {e}"),
    )
}

/// The answer if 2xx, else its `{"error": ..}` as the command's error.
async fn ok_or_error(response: reqwest::Response) -> Result<reqwest::Response, CliError> {
    let status = response.status();
    if status.is_success() {
        return Ok(response);
    }
    let text = response.text().await.unwrap_or_default();
    let message = serde_json::from_str::<Value>(&text)
        .ok()
        .and_then(|v| v["error"]["message"].as_str().map(str::to_owned))
        .unwrap_or(text);
    let exit = match status.as_u16() {
        400 | 413 | 415 | 422 => Exit::Usage,
        503 => Exit::Unavailable,
        _ => Exit::Failure,
    };
    Err(CliError::new(
        exit,
        format!("the node answered {status}: {message}"),
    ))
}

/// Largest event a node may send (its events are small: a text delta, a
/// lifecycle notice); anything larger is a broken node, not a turn.
const MAX_EVENT_BYTES: usize = 1024 * 1024;

/// Relays a turn's SSE events until its last.
async fn relay_events(response: reqwest::Response) -> Result<Exit, CliError> {
    let mut body = response.bytes_stream();
    let mut parser = SseParser::new(MAX_EVENT_BYTES);
    let mut parsed = VecDeque::new();
    let mut stdout = std::io::stdout();
    let terminal = std::io::IsTerminal::is_terminal(&stdout);
    let mut line_open = false;
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| {
            CliError::new(Exit::Unavailable, format!("the node's stream broke: {e}"))
        })?;
        parser.feed(&chunk, &mut parsed).map_err(|e| {
            CliError::new(
                Exit::Unavailable,
                format!("the node sent a bad event stream: {e}"),
            )
        })?;
        while let Some(frame) = parsed.pop_front() {
            let Parsed::Event(event) = frame else {
                continue; // a keep-alive
            };
            // Kinds this client does not know (a newer node) are skipped.
            let Ok(kind) = event.event.parse::<TurnEventKind>() else {
                continue;
            };
            let data: Value = serde_json::from_str(&event.data).map_err(|e| {
                CliError::new(
                    Exit::Unavailable,
                    format!("the node sent a `{kind}` event that is not JSON: {e}"),
                )
            })?;
            let (data, _) = TurnEventData::from_value(kind, data).map_err(|e| {
                CliError::new(
                    Exit::Unavailable,
                    format!("the node sent a `{kind}` event this client cannot read: {e}"),
                )
            })?;
            match data {
                // On a terminal the text as it streams; through a pipe
                // the answer once, whole, at the end (as `warden chat`
                // without --server writes it).
                TurnEventData::Text(delta) if terminal => {
                    let shown = crate::terminal::inert(&delta.text);
                    let _ = stdout
                        .write_all(shown.as_bytes())
                        .and_then(|()| stdout.flush());
                    if !delta.text.is_empty() {
                        line_open = !delta.text.ends_with('\n');
                    }
                }
                TurnEventData::Retrying(failed) | TurnEventData::Continuing(failed) => {
                    if line_open {
                        eprintln!();
                    }
                    if failed.code == "ESTREAM_TIMEOUT" {
                        eprintln!("Connection lost during streaming. Retrying...");
                    } else {
                        eprintln!(
                            "warden: {}; retrying in {:.1}s",
                            failed.code,
                            failed.delay_ms as f64 / 1000.0
                        );
                    }
                    if kind == TurnEventKind::Continuing {
                        eprintln!("warden: continuing the reply where it stopped");
                    }
                }
                TurnEventData::Restarting(restarting) => {
                    eprintln!("warden: {}", restarting.notice);
                }
                TurnEventData::Done(done) => {
                    if !terminal {
                        let _ = stdout
                            .write_all(done.text.as_bytes())
                            .and_then(|()| stdout.flush());
                        line_open = !done.text.is_empty() && !done.text.ends_with('\n');
                    }
                    if line_open {
                        println!();
                    }
                    if let Some(context) = done.context {
                        println!("[ctx: {}%]", context.percent);
                    }
                    return Ok(Exit::Ok);
                }
                TurnEventData::Error(failed) => {
                    if line_open {
                        println!();
                    }
                    let exit = u64::try_from(failed.exit)
                        .ok()
                        .and_then(warden_core::ExitClass::from_code)
                        .map_or(Exit::Failure, Exit::from);
                    return Err(CliError::new(exit, failed.message));
                }
                _ => {}
            }
        }
    }
    Err(CliError::new(
        Exit::Unavailable,
        "the node closed the stream before the turn ended",
    ))
}
