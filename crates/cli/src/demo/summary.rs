//! The end of the demo: what must have happened, checked against what the
//! log, the drivers and the store say, with each recovery's timing.

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};
use warden_core::{SessionRecord, names};

use super::view::{Transition, View};
use super::{Plan, REPLY, Timings, TurnOutcome};
use crate::paths;

/// One expectation of the demo.
#[derive(Debug)]
pub(super) struct Check {
    pub(super) name: &'static str,
    pub(super) ok: bool,
    pub(super) detail: String,
    pub(super) metrics: Value,
}

/// Everything the summary is computed from.
pub(super) struct Report<'a> {
    pub(super) timings: Timings,
    pub(super) plans: &'a [Plan],
    pub(super) log: &'a [Transition],
    pub(super) outcomes: &'a HashMap<&'static str, Vec<TurnOutcome>>,
    pub(super) records: &'a HashMap<String, SessionRecord>,
    pub(super) pings: &'a HashMap<&'static str, u64>,
    pub(super) kills_total: Option<u64>,
    pub(super) closed_by_client: usize,
    pub(super) took: Duration,
}

fn s(d: Duration) -> f64 {
    d.as_secs_f64()
}

fn ms(v: &Value, field: &str) -> Option<u64> {
    v.get(field).and_then(Value::as_u64)
}

impl Report<'_> {
    fn events<'b>(
        &'b self,
        workspace: &'b str,
        kind: &'b str,
    ) -> impl Iterator<Item = &'b Transition> {
        self.log
            .iter()
            .filter(move |t| t.workspace == workspace && t.kind == kind)
    }

    fn turns(&self, workspace: &str) -> &[TurnOutcome] {
        self.outcomes.get(workspace).map_or(&[], Vec::as_slice)
    }

    fn all_answered(&self, workspace: &str) -> bool {
        let expected = self
            .plans
            .iter()
            .find(|p| p.name == workspace)
            .map_or(0, |p| p.messages.len());
        let turns = self.turns(workspace);
        turns.len() == expected && turns.iter().all(|t| t.result.is_ok())
    }

    fn attempts(&self, workspace: &str, turn: usize) -> Option<u32> {
        self.turns(workspace)
            .get(turn)
            .and_then(|t| t.result.as_ref().ok())
            .map(|s| s.attempts)
    }

    fn ctx(&self, workspace: &str) -> Vec<u32> {
        self.turns(workspace)
            .iter()
            .filter_map(|t| t.result.as_ref().ok()?.context.map(|c| c.percent))
            .collect()
    }

    fn first_finish(&self, workspace: &str) -> Option<Duration> {
        self.turns(workspace).first().map(|t| t.finished_at)
    }

    /// Every expectation, in order.
    pub(super) fn checks(&self) -> Vec<Check> {
        let t = &self.timings;
        let mut checks = Vec::new();

        // The stall, and the reply continued.
        let kills: Vec<&Transition> = self.events("api-server", names::STREAM_TIMED_OUT).collect();
        let kept = self
            .events("api-server", "continue_scheduled")
            .next()
            .and_then(|c| c.fields.get("kept_bytes").and_then(Value::as_u64));
        let generated = self
            .turns("api-server")
            .first()
            .and_then(|o| o.result.as_ref().ok())
            .and_then(|s| s.usage)
            .map(|u| u.output_tokens);
        let (detail, metrics) = match (kills.first(), self.first_finish("api-server")) {
            (Some(kill), Some(done)) => {
                let silent = Duration::from_millis(ms(&kill.fields, "silent_ms").unwrap_or(0));
                let late = silent.saturating_sub(t.timeout);
                let recovery = done.saturating_sub(kill.at);
                // Tokens as the mock counts them (four bytes a token): the
                // broken attempt's text, then what the next one generated;
                // a restart would have generated the whole reply again.
                let broken = kept.unwrap_or(0).div_ceil(4);
                let continued = generated.map(|g| broken + g);
                let restart = broken + (REPLY.len() as u64).div_ceil(4);
                (
                    format!(
                        "stall: killed after {:.2}s of silence ({} ms past the deadline), reply continued and answered {:.2}s after the kill; tokens generated {} (a restart: {restart})",
                        s(silent),
                        late.as_millis(),
                        s(recovery),
                        continued.map_or("?".to_owned(), |c| c.to_string()),
                    ),
                    json!({ "silent_ms": silent.as_millis() as u64, "late_ms": late.as_millis() as u64, "recovery_ms": recovery.as_millis() as u64, "kept_bytes": kept, "tokens_generated": continued, "tokens_if_restarted": restart }),
                )
            }
            _ => ("stall: no watchdog kill was seen".to_owned(), json!({})),
        };
        checks.push(Check {
            name: "api-server",
            ok: kills.len() == 1
                && kept.is_some_and(|k| k > 0)
                && self.attempts("api-server", 0) == Some(2)
                && self.all_answered("api-server"),
            detail,
            metrics,
        });

        // The thinking pause.
        let thinking_kills = self.events("docs-site", names::STREAM_TIMED_OUT).count();
        let pings = self.pings.get("docs-site").copied().unwrap_or(0);
        let thought = self
            .turns("docs-site")
            .first()
            .map(|o| o.finished_at.saturating_sub(o.sent_at))
            .unwrap_or_default();
        checks.push(Check {
            name: "docs-site",
            ok: thinking_kills == 0
                && pings > 0
                && thought > t.timeout
                && self.attempts("docs-site", 0) == Some(1)
                && self.all_answered("docs-site"),
            detail: format!(
                "thinking: {:.1}s with {pings} pings against a {:.1}s timeout, {} kill(s)",
                s(thought),
                s(t.timeout),
                thinking_kills
            ),
            metrics: json!({ "thinking_ms": thought.as_millis() as u64, "pings": pings, "kills": thinking_kills }),
        });

        // The 429.
        let retry = self
            .events("billing", "retry_scheduled")
            .find(|e| e.fields.get("code").and_then(Value::as_str) == Some("EAPI"));
        let (ok, detail, metrics) = match (retry, self.first_finish("billing")) {
            (Some(r), Some(done)) => {
                let delay = Duration::from_millis(ms(&r.fields, "delay_ms").unwrap_or(0));
                let recovery = done.saturating_sub(r.at);
                (
                    delay + Duration::from_millis(1) >= t.retry_after,
                    format!(
                        "HTTP 429: waited {:.2}s as retry-after asked ({:.2}s), answered {:.2}s after the 429",
                        s(delay),
                        s(t.retry_after),
                        s(recovery)
                    ),
                    json!({ "delay_ms": delay.as_millis() as u64, "recovery_ms": recovery.as_millis() as u64 }),
                )
            }
            _ => (
                false,
                "HTTP 429: no retry was scheduled".to_owned(),
                json!({}),
            ),
        };
        checks.push(Check {
            name: "billing",
            ok: ok && self.attempts("billing", 0) == Some(2) && self.all_answered("billing"),
            detail,
            metrics,
        });

        // The two resume failures.
        for (workspace, cause) in [
            ("legacy-app", "unknown_session"),
            ("monorepo", "prompt_too_long"),
        ] {
            let failed = self.events(workspace, names::RESUME_FAILED).next();
            let fresh = self.events(workspace, names::FRESH_FALLBACK).next();
            let told = self.events(workspace, "user_notified").count();
            let (ok, detail, metrics) = match (failed, fresh, self.first_finish(workspace)) {
                (Some(f), Some(fresh), Some(done)) => {
                    let seen = f.fields.get("cause").and_then(Value::as_str).unwrap_or("?");
                    let ready = fresh.at.saturating_sub(f.at);
                    let answered = done.saturating_sub(f.at);
                    (
                        seen == cause && told == 1,
                        format!(
                            "resume failed ({seen}): fresh session {:.0} ms later, message re-delivered, user told, answered {:.2}s after the failure",
                            ready.as_secs_f64() * 1000.0,
                            s(answered)
                        ),
                        json!({ "cause": seen, "fresh_ms": ready.as_millis() as u64, "recovery_ms": answered.as_millis() as u64, "notices": told }),
                    )
                }
                _ => (
                    false,
                    format!("expected a resume failure ({cause}) and a fresh fallback"),
                    json!({}),
                ),
            };
            checks.push(Check {
                name: workspace,
                ok: ok && self.all_answered(workspace),
                detail,
                metrics,
            });
        }

        // The idle reap and the resume.
        let reaped = self.events("mobile-app", names::SESSION_REAPED).next();
        let second_sent = self.turns("mobile-app").get(1).map(|o| o.sent_at);
        let ctx = self.ctx("mobile-app");
        let record = self.records.get("mobile-app");
        let conversation = record.and_then(|r| r.agent_session_id.clone());
        let kept = record.is_some_and(|r| r.past_session_ids.is_empty());
        let (ok, detail) = match (reaped, second_sent) {
            (Some(r), Some(sent)) => (
                r.at < sent && kept && ctx.len() == 2 && ctx[1] > ctx[0],
                format!(
                    "reaped after {:.1}s idle, resumed {} with its history on the next message: ctx {}",
                    ms(&r.fields, "idle_ms").unwrap_or(0) as f64 / 1000.0,
                    conversation.as_deref().unwrap_or("?"),
                    arrows(&ctx)
                ),
            ),
            _ => (false, "expected a reap between the two messages".to_owned()),
        };
        checks.push(Check {
            name: "mobile-app",
            ok: ok
                && self.all_answered("mobile-app")
                && self
                    .events("mobile-app", names::RESUME_FAILED)
                    .next()
                    .is_none(),
            detail,
            metrics: json!({ "ctx": ctx, "conversation": conversation }),
        });

        // The context indicator.
        let climbs: Vec<String> = self
            .plans
            .iter()
            .map(|p| format!("{} {}", p.name, arrows(&self.ctx(p.name))))
            .collect();
        let api = self.ctx("api-server");
        checks.push(Check {
            name: "context",
            ok: api.len() == 3 && api.windows(2).all(|w| w[1] > w[0]),
            detail: format!("indicator climbs with each turn: {}", climbs.join(", ")),
            metrics: json!(
                self.plans
                    .iter()
                    .map(|p| (p.name, self.ctx(p.name)))
                    .collect::<HashMap<_, _>>()
            ),
        });

        // No false kills anywhere.
        let kills_total = self.kills_total.unwrap_or(u64::MAX);
        checks.push(Check {
            name: "watchdog",
            ok: kills_total == 1,
            detail: format!(
                "{} kill(s) in total (only the stall); the mock saw {} stream(s) closed by the client",
                self.kills_total.map_or("?".to_owned(), |k| k.to_string()),
                self.closed_by_client
            ),
            metrics: json!({ "kills": self.kills_total, "closed_by_client": self.closed_by_client }),
        });
        checks
    }

    /// Prints the summary in the view's mode.
    pub(super) fn print(&self, view: &mut View, checks: &[Check], data_dir: &Path) {
        let ok = checks.iter().all(|c| c.ok);
        if view.json() {
            let list: Vec<Value> = checks
                .iter()
                .map(|c| {
                    json!({ "name": c.name, "ok": c.ok, "detail": c.detail, "metrics": c.metrics })
                })
                .collect();
            println!(
                "{}",
                json!({
                    "event": "summary",
                    "ok": ok,
                    "took_ms": self.took.as_millis() as u64,
                    "timeout_ms": self.timings.timeout.as_millis() as u64,
                    "data_dir": data_dir,
                    "checks": list,
                })
            );
            return;
        }
        view.say("");
        view.say(&format!(
            "Summary: {} in {:.1}s (watchdog timeout {:.1}s)",
            if ok {
                "every fault recovered"
            } else {
                "SOME EXPECTATIONS FAILED"
            },
            s(self.took),
            s(self.timings.timeout)
        ));
        for c in checks {
            view.say(&format!(
                "  {} {:<11} {}",
                if c.ok { "✓" } else { "✗" },
                c.name,
                c.detail
            ));
        }
        view.say(&format!(
            "Sessions are stored in {}; list them with: warden sessions --data-dir {}",
            data_dir.join(paths::DATABASE).display(),
            data_dir.display()
        ));
    }
}

fn arrows(values: &[u32]) -> String {
    if values.is_empty() {
        return "-".into();
    }
    values
        .iter()
        .map(|v| format!("{v}%"))
        .collect::<Vec<_>>()
        .join(" → ")
}
