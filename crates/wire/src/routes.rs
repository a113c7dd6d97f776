//! A session's route on the wire layer (`warden serve`): its CLI's base
//! URL with `/s/<id>` after it, which the wire strips before its engine
//! sees the request, and what the wire saw on each route — the model
//! requests it carried and the chunks of their streams it sent, the
//! liveness of that session alone.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt as _;
use parking_lot::Mutex;
use tokio::sync::watch;
use warden_claude::CliCommand;
use warden_core::{SessionKey, StreamError};
use warden_proxy::{ClientPath, RecoveryEvent};

/// `text` with `route` after each `url` in it (a URL with a longer port
/// is not `url`); `None` when it names no `url`.
fn on_route(text: &str, url: &str, route: &str) -> Option<String> {
    let (mut out, mut rest, mut changed) = (String::new(), text, false);
    while let Some(at) = rest.find(url) {
        let end = at + url.len();
        out.push_str(&rest[..end]);
        rest = &rest[end..];
        if !rest.starts_with(|c: char| c.is_ascii_digit()) {
            out.push_str(route);
            changed = true;
        }
    }
    out.push_str(rest);
    changed.then_some(out)
}

/// How a session's route starts: `/s/<id>` ahead of the API's path.
const ROUTE_PREFIX: &str = "/s/";

/// The model traffic of one route: a session's CLI (`warden serve`), or
/// what comes without a route (`warden chat`'s one session).
#[derive(Debug)]
pub(super) struct Route {
    /// Whose route; `None` for the traffic without one.
    pub(super) session: Option<SessionKey>,
    /// What the wire saw of its model requests.
    pub(super) seen: Mutex<Seen>,
    /// Counts the chunks of model streams sent on it.
    pub(super) sent: watch::Sender<u64>,
    /// The request of the current run the wire spent the retry policy's
    /// attempts on, if any: reset when a run starts
    /// ([`Live`](crate::live::Live)), which ends on it.
    pub(super) spent: watch::Sender<Option<Spent>>,
}

impl Route {
    fn new(session: Option<SessionKey>) -> Arc<Self> {
        Arc::new(Self {
            session,
            seen: Mutex::new(Seen::default()),
            sent: watch::Sender::new(0),
            spent: watch::Sender::new(None),
        })
    }

    /// Notes `recovery` when it hands a request back to the CLI after the
    /// wire made `policy_attempts` or more attempts at it (each failed
    /// before any byte reached the CLI; the last answered a status the
    /// CLI would retry: 429, 5xx, or the 502 of an upstream it could not
    /// reach): the outage outlasted the retry policy, and the CLI's own
    /// retries, then the session's runs, would only multiply it.
    pub(super) fn note_spent(&self, recovery: &RecoveryEvent, policy_attempts: u32) {
        if let RecoveryEvent::HandedBack {
            request,
            attempts,
            status,
            code,
            ..
        } = recovery
            && *attempts >= policy_attempts
        {
            self.spent.send_replace(Some(Spent {
                request: *request,
                attempts: *attempts,
                status: *status,
                code,
            }));
        }
    }
}

/// A model request the wire gave up on after the retry policy's attempts,
/// handed back to the CLI with a status it would retry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Spent {
    /// The request's id (the `#N` of the wire's lines).
    request: u64,
    /// The wire's attempts at it.
    attempts: u32,
    /// The status the CLI was handed.
    status: u16,
    /// The last attempt's error code.
    code: &'static str,
}

impl Spent {
    /// The error that ends the session's run: the wire's attempts are the
    /// turn's, `took` the run's time so far. No prompt text: ids, counts,
    /// a status and a code.
    pub(super) fn error(&self, took: Duration) -> StreamError {
        StreamError::RetriedBelow {
            attempts: self.attempts,
            last: Box::new(StreamError::Api {
                status: Some(self.status),
                kind: "wire_layer".to_owned(),
                message: format!(
                    "the wire layer made {} attempts at model request #{} ({}), each \
                     failed before any byte, the last handed back as HTTP {}; {:.1}s into \
                     the run",
                    self.attempts,
                    self.request,
                    self.code,
                    self.status,
                    took.as_secs_f64()
                ),
                retryable: true,
                retry_after: None,
            }),
        }
    }
}

/// A wire's routes: each session's, made when its first source or process
/// needs it and removed when the last source held for it
/// ([`Routes::hold`]) is dropped, and the root.
#[derive(Debug)]
pub(super) struct Routes {
    /// The traffic without a route.
    pub(super) root: Arc<Route>,
    /// The sessions' routes.
    sessions: Mutex<Table>,
}

/// The sessions' routes, by id and by session.
#[derive(Debug, Default)]
struct Table {
    /// The routes by id.
    by_id: HashMap<usize, Arc<Route>>,
    /// Each session's route's id, and how many of its sources hold it.
    by_key: HashMap<SessionKey, (usize, usize)>,
    /// The last id given: ids are never given twice, so a process started
    /// on a removed route never reaches another session's.
    last: usize,
}

/// Session `key`'s route held by one of its sources: the route is removed
/// when the last hold is dropped, after `end` ended the session's CLI.
pub(super) struct RouteHold {
    routes: Arc<Routes>,
    key: SessionKey,
    route: Arc<Route>,
    end: Arc<dyn Fn(&SessionKey) + Send + Sync>,
}

impl RouteHold {
    /// The held route.
    pub(super) fn route(&self) -> &Arc<Route> {
        &self.route
    }
}

impl Drop for RouteHold {
    fn drop(&mut self) {
        let last = {
            let mut sessions = self.routes.sessions.lock();
            match sessions.by_key.get_mut(&self.key) {
                Some((_, holders)) => {
                    *holders = holders.saturating_sub(1);
                    *holders == 0
                }
                None => false,
            }
        };
        if !last {
            return;
        }
        // Its process first, so none keeps the route it is removing.
        (self.end)(&self.key);
        let mut sessions = self.routes.sessions.lock();
        let Table { by_id, by_key, .. } = &mut *sessions;
        if let Some((id, 0)) = by_key.get(&self.key).copied() {
            by_key.remove(&self.key);
            by_id.remove(&id);
        }
    }
}

impl Default for Routes {
    fn default() -> Self {
        Self {
            root: Route::new(None),
            sessions: Mutex::default(),
        }
    }
}

impl Routes {
    /// Session `key`'s route and its id, made on first use.
    pub(super) fn of_session(&self, key: &SessionKey) -> (usize, Arc<Route>) {
        self.of_session_held(key, 0)
    }

    /// [`of_session`](Self::of_session), with `holds` more holders.
    fn of_session_held(&self, key: &SessionKey, holds: usize) -> (usize, Arc<Route>) {
        let mut sessions = self.sessions.lock();
        let Table {
            by_id,
            by_key,
            last,
        } = &mut *sessions;
        let (id, holders) = by_key.entry(key.clone()).or_insert_with(|| {
            *last += 1;
            by_id.insert(*last, Route::new(Some(key.clone())));
            (*last, 0)
        });
        *holders += holds;
        let route = by_id.get(id).map_or_else(|| Route::new(None), Arc::clone);
        (*id, route)
    }

    /// Session `key`'s route, held until the hold is dropped; `end` is
    /// called with `key` when the last hold goes, before the route is
    /// removed.
    pub(super) fn hold(
        self: &Arc<Self>,
        key: &SessionKey,
        end: Arc<dyn Fn(&SessionKey) + Send + Sync>,
    ) -> RouteHold {
        let route = self.of_session_held(key, 1).1;
        RouteHold {
            routes: Arc::clone(self),
            key: key.clone(),
            route,
            end,
        }
    }

    /// How many sessions have a route.
    pub(super) fn len(&self) -> usize {
        self.sessions.lock().by_id.len()
    }

    /// `command` of session `key` reaching the wire at `url` on the
    /// session's route.
    pub(super) fn put_on_route(&self, url: &str, key: &SessionKey, command: &mut CliCommand) {
        let route = format!("{ROUTE_PREFIX}{}", self.of_session(key).0);
        let values = command
            .args
            .iter_mut()
            .chain(command.env.iter_mut().map(|(_, v)| v));
        for value in values {
            if let Some(routed) = value.to_str().and_then(|v| on_route(v, url, &route)) {
                *value = routed.into();
            }
        }
    }

    /// The line the wire prints of `recovery` on `route`: the session's
    /// key first when it is a session's.
    pub(super) fn line(route: &Route, recovery: &RecoveryEvent) -> String {
        match &route.session {
            Some(key) => format!("warden: wire layer: session {key}: {recovery}"),
            None => format!("warden: wire layer: {recovery}"),
        }
    }

    /// The route `path` is on and the path after its prefix; the root and
    /// `None` when it is on none of them.
    pub(super) fn of_path<'p>(&self, path: &'p str) -> (Arc<Route>, Option<&'p str>) {
        let on_route = path.strip_prefix(ROUTE_PREFIX).and_then(|rest| {
            let (id, _) = rest.split_once('/')?;
            let n = id.parse::<usize>().ok()?;
            let route = self.sessions.lock().by_id.get(&n).cloned()?;
            Some((route, &rest[id.len()..]))
        });
        match on_route {
            Some((route, rest)) => (route, Some(rest)),
            None => (Arc::clone(&self.root), None),
        }
    }
}

/// A request to the wire, taken off the route its path starts with (the
/// engine sees the API's path; its logs, the client's: [`ClientPath`]),
/// and its response, each chunk of which is counted as sent on that route
/// — unless an attempt on it went silent since its last whole reply: a
/// stream the wire is recovering is not live, so the process layer's
/// clock runs (a turn whose every stream stalls still ends on time).
pub(super) async fn routed(
    axum::extract::State(routes): axum::extract::State<Arc<Routes>>,
    mut request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let path = request.uri().path().to_owned();
    let (route, rest) = routes.of_path(&path);
    if let Some(rest) = rest {
        let rest = match request.uri().query() {
            Some(query) => format!("{rest}?{query}"),
            None => rest.to_owned(),
        };
        let mut uri = request.uri().clone().into_parts();
        uri.path_and_query = rest.parse().ok();
        if let Ok(uri) = axum::http::Uri::from_parts(uri) {
            *request.uri_mut() = uri;
            request.extensions_mut().insert(ClientPath(path));
        }
    }
    let (parts, body) = next.run(request).await.into_parts();
    let body = body.into_data_stream().inspect(move |_| {
        if !route.seen.lock().stalling {
            route.sent.send_modify(|n| *n = n.wrapping_add(1));
        }
    });
    axum::response::Response::from_parts(parts, axum::body::Body::from_stream(body))
}

/// What the wire layer saw of the model requests it carried.
#[derive(Debug, Default)]
pub(super) struct Seen {
    /// Requests with an attempt killed for silence.
    pub(super) stalled: HashSet<u64>,
    /// Attempts killed for silence.
    pub(super) kills: u32,
    /// Requests whose reply was whole.
    pub(super) completed: u32,
    /// An attempt went silent since the last whole reply.
    pub(super) stalling: bool,
}

impl Seen {
    pub(super) fn every_request_stalled(&self, allowance: Duration) -> Option<String> {
        (self.completed == 0 && !self.stalled.is_empty()).then(|| {
            format!(
                "wire layer: the model stream stalled on every request of this turn: {} \
                 request(s), {} attempt(s) silent for {:.1}s, each killed and retried or \
                 continued, none completed",
                self.stalled.len(),
                self.kills,
                allowance.as_secs_f64()
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_session_reaches_the_wire_on_a_route_of_its_own_which_the_wire_strips() {
        let routes = Routes::default();
        let (a, b) = (SessionKey::new("/work/a"), SessionKey::new("/work/b"));
        let url = "http://127.0.0.1:4000";
        let mut command = CliCommand::new("claude")
            .args([
                "-c",
                "model_providers.warden={base_url=\"http://127.0.0.1:4000/v1\"}",
            ])
            .env("ANTHROPIC_BASE_URL", url)
            .env("OTHER", "http://127.0.0.1:40001/v1");
        routes.put_on_route(url, &a, &mut command);
        let mut other = CliCommand::new("claude").env("ANTHROPIC_BASE_URL", url);
        routes.put_on_route(url, &b, &mut other);
        assert_eq!(
            command.args[1],
            "model_providers.warden={base_url=\"http://127.0.0.1:4000/s/1/v1\"}"
        );
        assert_eq!(command.env[0].1, "http://127.0.0.1:4000/s/1");
        assert_eq!(
            command.env[1].1, "http://127.0.0.1:40001/v1",
            "another port is not the wire"
        );
        assert_eq!(other.env[0].1, "http://127.0.0.1:4000/s/2");
        assert_eq!(routes.of_session(&a).0, 1, "a session keeps its route");

        let (route, rest) = routes.of_path("/s/2/v1beta/models/m:streamGenerateContent");
        assert_eq!(route.session.as_ref(), Some(&b));
        assert_eq!(rest, Some("/v1beta/models/m:streamGenerateContent"));
        for (path, why) in [
            ("/v1/messages", "no route: the root (warden chat)"),
            ("/s/9/v1/messages", "no such route"),
            ("/s/0/v1/messages", "ids start at 1"),
            ("/s/1", "no path after it"),
        ] {
            let (route, rest) = routes.of_path(path);
            assert!(route.session.is_none() && rest.is_none(), "{path}: {why}");
        }
    }

    #[test]
    fn a_recovery_line_names_the_session_whose_route_it_came_on() {
        let routes = Routes::default();
        let key = SessionKey::new("/work/a");
        routes.of_session(&key);
        let killed = RecoveryEvent::Killed {
            upstream: "anthropic",
            path: "/s/1/v1/messages".to_owned(),
            request: 7,
            attempt: 1,
        };
        let route = routes.of_path("/s/1/v1/messages").0;
        assert_eq!(
            Routes::line(&route, &killed),
            "warden: wire layer: session /work/a: anthropic /s/1/v1/messages #7: attempt 1 went silent; killed it"
        );
        assert!(Routes::line(&routes.root, &killed).starts_with("warden: wire layer: anthropic"));
    }

    #[test]
    fn a_sessions_route_is_removed_when_its_last_source_goes_its_process_ended_first() {
        let routes = Arc::new(Routes::default());
        let key = SessionKey::new("/work/a");
        let ended = Arc::new(Mutex::new(Vec::new()));
        let end: Arc<dyn Fn(&SessionKey) + Send + Sync> = {
            let (ended, routes) = (Arc::clone(&ended), Arc::clone(&routes));
            Arc::new(move |key: &SessionKey| {
                // Called while the route is still there.
                ended.lock().push((key.clone(), routes.len()));
            })
        };
        let first = routes.hold(&key, Arc::clone(&end));
        let id = routes.of_session(&key).0;
        let second = routes.hold(&key, Arc::clone(&end));
        assert_eq!(routes.of_session(&key).0, id, "one route per session");
        drop(first);
        assert_eq!(routes.len(), 1, "a source of the session still holds it");
        assert!(ended.lock().is_empty(), "its process is not ended yet");
        drop(second);
        assert_eq!(
            routes.len(),
            0,
            "the route went with the session's last source"
        );
        assert_eq!(
            *ended.lock(),
            vec![(key.clone(), 1)],
            "its process ended first"
        );
        let path = format!("/s/{id}/v1/messages");
        let (route, rest) = routes.of_path(&path);
        assert!(
            route.session.is_none() && rest.is_none(),
            "the old route is gone"
        );
        let again = routes.hold(&key, end);
        assert_ne!(
            routes.of_session(&key).0,
            id,
            "a new route, never the old id"
        );
        drop(again);
        assert_eq!(routes.len(), 0);
    }
}
