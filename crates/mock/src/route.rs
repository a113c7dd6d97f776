//! Where a request goes: its path's optional `/session/KEY/` and
//! `/scenario/NAME/` prefixes and its endpoint, and the scenario a model
//! name selects.

use crate::journal::Endpoint;
use crate::{ParseScenarioError, Scenario};

/// Where a request goes, from its path.
pub(crate) struct Route {
    /// The session of a `/session/KEY/` prefix (its script).
    pub(crate) session: Option<String>,
    /// The scenario of a `/scenario/NAME/` prefix.
    pub(crate) chosen: Option<Result<Scenario, ParseScenarioError>>,
    /// The endpoint of the rest.
    pub(crate) endpoint: Endpoint,
}

/// Splits an optional `/session/KEY` prefix, then an optional
/// `/scenario/NAME` prefix, off `path` and names the endpoint of the rest.
pub(crate) fn route(path: &str) -> Route {
    let (session, path) = match path.strip_prefix("/session/") {
        Some(r) => {
            let (key, rest) = r.split_once('/').unwrap_or((r, ""));
            (Some(key.to_owned()), format!("/{rest}"))
        }
        None => (None, path.to_owned()),
    };
    let (chosen, rest) = match path.strip_prefix("/scenario/") {
        Some(r) => {
            let (name, rest) = r.split_once('/').unwrap_or((r, ""));
            (Some(name.parse()), format!("/{rest}"))
        }
        None => (None, path.clone()),
    };
    let rest = rest.trim_end_matches('/');
    let endpoint = if rest.ends_with("/v1/messages/count_tokens") {
        Endpoint::AnthropicCountTokens
    } else if rest.ends_with("/v1/messages") {
        Endpoint::AnthropicMessages
    } else if rest.ends_with("/chat/completions") {
        Endpoint::OpenAiChatCompletions
    } else if rest.ends_with("/v1/responses") {
        Endpoint::OpenAiResponses
    } else if rest
        .rsplit_once("/v1/responses/")
        .is_some_and(|(_, id)| !id.is_empty() && !id.contains('/'))
    {
        Endpoint::OpenAiResponse
    } else if crate::gemini::model_and_stream(rest).is_some() {
        Endpoint::GeminiGenerateContent
    } else if rest.ends_with("/v1/models") || rest == "/models" {
        Endpoint::Models
    } else if rest.is_empty() {
        Endpoint::Root
    } else {
        Endpoint::Unknown
    };
    Route {
        session,
        chosen,
        endpoint,
    }
}

/// The scenario named by a model: `mock-NAME`, or `…:NAME` after the last
/// colon. Other models select nothing.
pub(crate) fn model_scenario(model: &str) -> Option<Scenario> {
    if let Some(name) = model.strip_prefix("mock-")
        && let Ok(s) = name.parse()
    {
        return Some(s);
    }
    model
        .rsplit_once(':')
        .and_then(|(_, name)| name.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_ignore_prefixes_and_queries_are_not_in_the_path() {
        assert_eq!(route("/v1/messages").endpoint, Endpoint::AnthropicMessages);
        assert_eq!(
            route("/proxy/v1/messages").endpoint,
            Endpoint::AnthropicMessages
        );
        assert_eq!(
            route("/v1/messages/count_tokens").endpoint,
            Endpoint::AnthropicCountTokens
        );
        assert_eq!(
            route("/v1/chat/completions").endpoint,
            Endpoint::OpenAiChatCompletions
        );
        assert_eq!(
            route("/chat/completions").endpoint,
            Endpoint::OpenAiChatCompletions
        );
        assert_eq!(route("/v1/models").endpoint, Endpoint::Models);
        assert_eq!(
            route("/v1beta/models/gemini-2.5-pro:streamGenerateContent").endpoint,
            Endpoint::GeminiGenerateContent
        );
        assert_eq!(route("/").endpoint, Endpoint::Root);
        assert_eq!(route("/v1/other").endpoint, Endpoint::Unknown);
        let r = route("/scenario/stall/v1/messages");
        assert_eq!(r.chosen, Some(Ok(Scenario::Stall)));
        assert_eq!(r.endpoint, Endpoint::AnthropicMessages);
        assert!(matches!(
            route("/scenario/nope/v1/messages").chosen,
            Some(Err(_))
        ));
        let r = route("/session/worker-1/scenario/stall/v1/messages");
        assert_eq!(r.session.as_deref(), Some("worker-1"));
        assert_eq!(r.chosen, Some(Ok(Scenario::Stall)));
        assert_eq!(r.endpoint, Endpoint::AnthropicMessages);
        let r = route("/session/planner/v1/messages");
        assert_eq!(r.session.as_deref(), Some("planner"));
        assert_eq!((r.chosen, r.endpoint), (None, Endpoint::AnthropicMessages));
    }

    #[test]
    fn models_name_scenarios_by_prefix_or_colon_suffix() {
        assert_eq!(model_scenario("mock-stall"), Some(Scenario::Stall));
        assert_eq!(
            model_scenario("claude-x:abrupt-close"),
            Some(Scenario::AbruptClose)
        );
        assert_eq!(model_scenario("mock-unknown"), None);
        assert_eq!(model_scenario("claude-sonnet-4-5"), None);
    }
}
