//! Routing, scenario selection and the response of one request.

use std::convert::Infallible;
use std::sync::Arc;

use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response};
use serde_json::{Value, json};

mod answer;

use crate::body::{MockBody, Tracker};
use crate::continuation::Continue;
use crate::journal::{Endpoint, Journal, Outcome, Selection};
use crate::reply::{self, Reply};
use crate::route::{Route, model_scenario, route};
use crate::script::{self, Extras};
use crate::{MockConfig, Scenario, anthropic, gemini, openai, responses};
use answer::{Answer, Api, bad_request, method_not_allowed, models_json, read_json, request_id};

/// Header that selects a scenario for one request.
pub(crate) const SCENARIO_HEADER: &str = "x-mock-scenario";

/// What every connection task shares.
pub(crate) struct Ctx {
    pub(crate) journal: Arc<Journal>,
    pub(crate) config: MockConfig,
    /// Background responses of the Responses API, by id: their frames.
    pub(crate) background:
        parking_lot::Mutex<std::collections::HashMap<String, (Reply, Vec<Bytes>)>>,
}

/// Returned by the service to make hyper drop the connection without
/// answering (`abrupt-close` on a non-streaming request).
#[derive(Debug, thiserror::Error)]
#[error("warden-mock: abrupt-close scenario")]
pub(crate) struct AbruptClose;

/// Serves one request.
pub(crate) async fn handle(
    ctx: Arc<Ctx>,
    req: Request<Incoming>,
) -> Result<Response<MockBody>, AbruptClose> {
    let journal = &*ctx.journal;
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let Route {
        session,
        chosen: path_choice,
        endpoint,
    } = route(&path);
    let id = journal.begin(method.as_str(), &path, req.uri().query(), endpoint);
    let mut tracker = Tracker::new(ctx.journal.clone(), id);
    let answer = Answer {
        journal,
        id,
        head: method == Method::HEAD,
    };
    let get_like = method == Method::GET || method == Method::HEAD;

    if let Some(Err(err)) = &path_choice {
        journal.started(id, None, false, None);
        return Ok(answer.error(
            &mut tracker,
            Api::Anthropic,
            404,
            "not_found_error",
            &format!("warden-mock: {err}"),
            &[],
        ));
    }
    match endpoint {
        Endpoint::AnthropicMessages
        | Endpoint::OpenAiChatCompletions
        | Endpoint::OpenAiResponses
        | Endpoint::GeminiGenerateContent => {}
        Endpoint::OpenAiResponse if get_like => {
            journal.started(id, None, false, None);
            return Ok(reattach(&ctx, &answer, tracker, &path, req.uri().query()));
        }
        Endpoint::Root if get_like => {
            journal.started(id, None, false, None);
            return Ok(answer.full(
                &mut tracker,
                200,
                "text/plain; charset=utf-8",
                Bytes::from_static(b"warden-mock\n"),
                &[],
            ));
        }
        Endpoint::Models if get_like => {
            journal.started(id, None, false, None);
            return Ok(answer.json(&mut tracker, 200, &models_json(), &[]));
        }
        Endpoint::AnthropicCountTokens if method == Method::POST => {
            let size = match read_json(req).await {
                Ok((_, size)) => size,
                Err(message) => {
                    journal.started(id, None, false, None);
                    return Ok(bad_request(&answer, &mut tracker, Api::Anthropic, &message));
                }
            };
            journal.started(id, None, false, None);
            let tokens = ctx
                .config
                .usage
                .input_tokens
                .unwrap_or((size as u64).div_ceil(4).max(1));
            return Ok(answer.json(&mut tracker, 200, &json!({ "input_tokens": tokens }), &[]));
        }
        Endpoint::Unknown => {
            journal.started(id, None, false, None);
            return Ok(answer.error(
                &mut tracker,
                Api::Anthropic,
                404,
                "not_found_error",
                &format!("warden-mock: no route for {method} {path}"),
                &[],
            ));
        }
        _ => {
            journal.started(id, None, false, None);
            return Ok(method_not_allowed(&answer, &mut tracker, &method, &path));
        }
    }

    // The streaming APIs.
    let api = match endpoint {
        Endpoint::AnthropicMessages => Api::Anthropic,
        Endpoint::OpenAiResponses => Api::Responses,
        Endpoint::GeminiGenerateContent => Api::Gemini,
        _ => Api::OpenAi,
    };
    if method != Method::POST {
        journal.started(id, None, false, None);
        return Ok(method_not_allowed(&answer, &mut tracker, &method, &path));
    }
    let header_choice = req.headers().get(SCENARIO_HEADER).map(|v| {
        let name = String::from_utf8_lossy(v.as_bytes()).into_owned();
        name.parse::<Scenario>()
    });
    let (request, size) = match read_json(req).await {
        Ok(parsed) => parsed,
        Err(message) => {
            journal.started(id, None, false, None);
            return Ok(bad_request(&answer, &mut tracker, api, &message));
        }
    };
    // Gemini names the model and streaming in the path.
    let gemini_path = gemini::model_and_stream(&path).filter(|_| api == Api::Gemini);
    let (request, stream) = match &gemini_path {
        Some((model, stream)) => (gemini::normalized(&request, model), *stream),
        None => {
            let stream = request.get("stream").and_then(Value::as_bool);
            (request, stream.unwrap_or(false))
        }
    };
    let model = request
        .get("model")
        .and_then(Value::as_str)
        .map(str::to_owned);

    let chosen = match header_choice {
        Some(Ok(s)) => (s, Selection::Header),
        Some(Err(err)) => {
            journal.started(id, model, stream, None);
            let message = format!("warden-mock: {SCENARIO_HEADER}: {err}");
            return Ok(bad_request(&answer, &mut tracker, api, &message));
        }
        None => match (model.as_deref().and_then(model_scenario), path_choice) {
            (Some(s), _) => (s, Selection::Model),
            (None, Some(Ok(s))) => (s, Selection::Path),
            _ if let Some((key, script)) = session
                .as_ref()
                .and_then(|k| ctx.config.scripts.get_key_value(k))
                .filter(|(_, script)| !script.is_empty()) =>
            {
                let slot = journal.next_scripted_for(key).min(script.len() - 1);
                (script[slot], Selection::Session(slot))
            }
            _ if !ctx.config.sequence.is_empty() => {
                let seq = &ctx.config.sequence;
                let slot = journal.next_scripted().min(seq.len() - 1);
                (seq[slot], Selection::Sequence(slot))
            }
            _ => (ctx.config.default_scenario, Selection::Default),
        },
    };
    let scenario = chosen.0;
    journal.started(id, model, stream, Some(chosen));
    tracing::debug!(
        target: "warden_mock",
        id,
        %method,
        %path,
        %scenario,
        stream,
        "mock request"
    );

    // A continuation is validated before anything is played, as the API
    // does (see `continuation`).
    let cont = match api {
        Api::Anthropic => Continue::of(&request),
        // Gemini has no prefill either: its `contents` are read as
        // messages, a `model` turn as the assistant's.
        Api::OpenAi | Api::Responses | Api::Gemini => Ok(Continue::turn_of(&request)),
    };
    let cont = match cont {
        Ok(c) => c,
        Err(message) => {
            return Ok(answer.error(
                &mut tracker,
                api,
                400,
                "invalid_request_error",
                message,
                &[],
            ));
        }
    };

    let config = &ctx.config;
    match scenario {
        Scenario::ServerError => {
            return Ok(answer.error(
                &mut tracker,
                api,
                500,
                "api_error",
                "Internal server error",
                &[],
            ));
        }
        Scenario::Overloaded => return Ok(answer.overloaded(&mut tracker, api)),
        Scenario::Unavailable => {
            return Ok(answer.error(
                &mut tracker,
                api,
                503,
                "api_error",
                "The service is temporarily unavailable.",
                &[],
            ));
        }
        Scenario::RateLimited => {
            let wait = config.retry_after;
            let secs = wait.as_millis().div_ceil(1000);
            let headers = [
                ("retry-after", secs.to_string()),
                ("retry-after-ms", wait.as_millis().to_string()),
            ];
            return Ok(answer.error(
                &mut tracker,
                api,
                429,
                "rate_limit_error",
                "This request would exceed the rate limit for your organization. Please try again later.",
                &headers,
            ));
        }
        Scenario::PromptTooLong => {
            return Ok(answer.error(
                &mut tracker,
                api,
                400,
                "invalid_request_error",
                "prompt is too long: 210000 tokens > 200000 maximum",
                &[],
            ));
        }
        _ => {}
    }

    let message_id = match api {
        Api::Anthropic => reply::anthropic_message_id(id),
        Api::OpenAi => reply::openai_completion_id(id),
        Api::Responses => responses::response_id(id),
        Api::Gemini => format!("gemini-mock{id:014}"),
    };
    let mut reply = Reply::new(
        config,
        message_id,
        &request,
        size,
        cont.as_ref().map_or(0, Continue::answered_from_end),
    );
    if let Some(c) = &cont {
        reply.text = c.text(&reply.text);
        reply.output_tokens = reply::estimate_tokens(reply.text.len());
    }
    journal.generated(id, cont.as_ref().map(Continue::kind), reply.output_tokens);
    let answered = reply::last_user_text(
        &request,
        cont.as_ref().map_or(0, Continue::answered_from_end),
    );
    journal.answers(id, answered.as_deref().map(reply::prompt_digest));

    if stream {
        let include_usage = request
            .pointer("/stream_options/include_usage")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        let oversized = |f: &dyn Fn() -> Bytes| {
            if scenario == Scenario::Oversized {
                f()
            } else {
                Bytes::new()
            }
        };
        let (frames, extras, id_header) = match api {
            Api::Anthropic => (
                anthropic::frames(&reply),
                Extras {
                    ping: anthropic::ping(),
                    error: anthropic::midstream_error(),
                    malformed: anthropic::malformed(),
                    oversized: oversized(&|| anthropic::oversized(config.oversized_bytes)),
                },
                "request-id",
            ),
            Api::Responses => (
                responses::frames(&reply),
                Extras {
                    ping: openai::ping(),
                    error: responses::midstream_error(),
                    malformed: responses::malformed(),
                    oversized: oversized(&|| responses::oversized(config.oversized_bytes)),
                },
                "x-request-id",
            ),
            Api::Gemini => (
                gemini::frames(&reply),
                Extras {
                    ping: openai::ping(),
                    error: gemini::midstream_error(),
                    malformed: gemini::malformed(),
                    oversized: oversized(&|| gemini::oversized(&reply, config.oversized_bytes)),
                },
                "x-request-id",
            ),
            Api::OpenAi => (
                openai::frames(&reply, include_usage),
                Extras {
                    ping: openai::ping(),
                    error: openai::midstream_error(),
                    malformed: openai::malformed(),
                    oversized: oversized(&|| {
                        openai::oversized(&reply, config.oversized_bytes, include_usage)
                    }),
                },
                "x-request-id",
            ),
        };
        // A background response is kept whole, whatever this connection
        // plays: a client can re-attach to it.
        if api == Api::Responses && request.get("background").and_then(Value::as_bool) == Some(true)
        {
            crate::util_lock(&ctx.background)
                .insert(reply.id.clone(), (reply.clone(), frames.frames.clone()));
        }
        let in_phase = matches!(
            scenario,
            Scenario::StallInThinking | Scenario::StallInToolInput
        );
        let steps = if in_phase && api == Api::Anthropic {
            let before =
                anthropic::frames_until_phase_stall(&reply, scenario == Scenario::StallInToolInput);
            script::held(before, config.frame_interval)
        } else if scenario == Scenario::StallInThinking && api == Api::Gemini {
            let before = gemini::frames_until_thinking_stall(&reply);
            script::held(before, config.frame_interval)
        } else if scenario == Scenario::StallInThinking && api == Api::Responses {
            let before = responses::frames_until_reasoning_stall(&reply);
            script::held(before, config.frame_interval)
        } else if scenario == Scenario::StallStreamed {
            // The stream's start, none of the reply, then silence.
            let start = frames.pause_at.min(frames.text_at);
            script::held(
                frames.frames.into_iter().take(start).collect(),
                config.frame_interval,
            )
        } else if in_phase {
            script::stream_steps(Scenario::Stall, frames, extras, config)
        } else {
            script::stream_steps(scenario, frames, extras, config)
        };
        let headers = [
            ("content-type", "text/event-stream".to_owned()),
            ("cache-control", "no-cache".to_owned()),
            (id_header, request_id(id)),
        ];
        return Ok(answer.response(200, MockBody::stream(steps, tracker), &headers));
    }

    // Non-streaming answers.
    match scenario {
        Scenario::Stall => {
            // Never answer: hold the request (and the socket) open. The
            // tracker reports ClientClosed when hyper drops this future.
            tracker.stalled();
            let never: Infallible = std::future::pending().await;
            match never {}
        }
        Scenario::AbruptClose | Scenario::EarlyEnd => {
            tracker.finish(Outcome::ServerClosed);
            return Err(AbruptClose);
        }
        // Without a stream to break, the overloaded error is the answer.
        Scenario::MidstreamError => return Ok(answer.overloaded(&mut tracker, api)),
        Scenario::Malformed => {
            let body = Bytes::from_static(
                b"{\"type\":\"message\",\"content\":[{\"type\":\"text\",\"text\":\"unterminated",
            );
            return Ok(answer.full(&mut tracker, 200, "application/json", body, &[]));
        }
        Scenario::ThinkingPings => tokio::time::sleep(config.thinking_pause).await,
        Scenario::Oversized => {
            reply.text = "x".repeat(config.oversized_bytes) + &reply.text;
        }
        _ => {}
    }
    let value = match api {
        Api::Anthropic => anthropic::message_json(&reply),
        Api::OpenAi => openai::completion_json(&reply),
        Api::Responses => responses::response_json(&reply),
        Api::Gemini => gemini::response_json(&reply),
    };
    let id_header = match api {
        Api::Anthropic => "request-id",
        Api::OpenAi | Api::Responses | Api::Gemini => "x-request-id",
    };
    Ok(answer.json(&mut tracker, 200, &value, &[(id_header, request_id(id))]))
}

/// `GET …/v1/responses/{id}`: a kept (background) response, as JSON, or
/// with `stream=true` its events after `starting_after` (a re-attach; no
/// token is generated again). An unknown id is a 404.
fn reattach(
    ctx: &Ctx,
    answer: &Answer<'_>,
    mut tracker: Tracker,
    path: &str,
    query: Option<&str>,
) -> Response<MockBody> {
    let rid = path.rsplit('/').next().unwrap_or("");
    let kept = crate::util_lock(&ctx.background).get(rid).cloned();
    let Some((reply, frames)) = kept else {
        return answer.error(
            &mut tracker,
            Api::Responses,
            404,
            "invalid_request_error",
            &format!("Response with id '{rid}' not found."),
            &[],
        );
    };
    let param = |name: &str| {
        query?
            .split('&')
            .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
            .map(str::to_owned)
    };
    if param("stream").as_deref() != Some("true") {
        return answer.json(&mut tracker, 200, &responses::response_json(&reply), &[]);
    }
    let after = param("starting_after").and_then(|n| n.parse::<usize>().ok());
    let rest = responses::after(&frames, after);
    let steps = script::paced_frames(rest, ctx.config.frame_interval);
    ctx.journal.generated(answer.id, Some("reattach"), 0);
    let headers = [
        ("content-type", "text/event-stream".to_owned()),
        ("cache-control", "no-cache".to_owned()),
    ];
    answer.response(200, MockBody::stream(steps, tracker), &headers)
}
