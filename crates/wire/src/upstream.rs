//! Where the wire sends a CLI's requests on: what the CLI would reach
//! without warden (one rule per API, for the binary's flags and the
//! library's adapter options alike).

/// The Anthropic API a Claude Code session would reach without warden:
/// `configured` (a `--base-url`, the options' `ANTHROPIC_BASE_URL`) when
/// given, else this process's `ANTHROPIC_BASE_URL`, else the provider's.
pub fn anthropic_upstream(configured: Option<&str>) -> String {
    configured
        .map(str::to_owned)
        .or_else(|| env("ANTHROPIC_BASE_URL"))
        .unwrap_or_else(|| warden_proxy::ANTHROPIC_API.to_owned())
}

/// The Gemini API a Gemini CLI session would reach without warden:
/// `configured` (its `GOOGLE_GEMINI_BASE_URL`) when given, else this
/// process's `GOOGLE_GEMINI_BASE_URL`, else Google's.
pub fn gemini_upstream(configured: Option<&str>) -> String {
    configured
        .map(str::to_owned)
        .or_else(|| env("GOOGLE_GEMINI_BASE_URL"))
        .map(|url| url.trim_end_matches('/').to_owned())
        .unwrap_or_else(|| warden_proxy::GEMINI_API.to_owned())
}

/// The OpenAI API a Codex session would reach without warden, as the
/// engine's base (its requests' paths start with `/v1`): `configured`
/// when given (with or without its `/v1`), else `OPENAI_BASE_URL` (which
/// ends in `/v1`), else the provider's.
pub fn openai_upstream(configured: Option<&str>) -> String {
    configured
        .map(str::to_owned)
        .or_else(|| env("OPENAI_BASE_URL"))
        .map(|url| {
            let url = url.trim_end_matches('/');
            url.strip_suffix("/v1").unwrap_or(url).to_owned()
        })
        .unwrap_or_else(|| warden_proxy::OPENAI_API.to_owned())
}

/// A variable of this process's environment, when set and not blank.
fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}
