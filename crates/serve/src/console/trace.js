// A turn's trace as Jaeger has it, read through this server (`GET
// /v1/turns/{id}/trace`: the server asks Jaeger's query API, so the token
// stays here and the browser never reaches Jaeger) and drawn from the
// same span data a Jaeger user sees: each span a row on one time axis
// (the turn, its attempts with their kills — the silence measured and the
// allowance —, backoffs, continuations), errors in red, the links to the
// incarnation and the turn before, and a span's tags and logs on click.

import { api, Refused } from "./api.js";
import { $, hooks, state } from "./state.js";
import { seconds, shown } from "./text.js";

const SVG = "http://www.w3.org/2000/svg";

/** How often, and how many times, a trace Jaeger does not have yet is asked for again. */
const AGAIN_MS = 1000;
const TRIES = 30;

function svg(name, attributes) {
  const el = document.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attributes)) el.setAttribute(k, String(v));
  return el;
}

/** A span's tag `key`'s value, or undefined. */
export function tag(span, key) {
  const t = (span.tags || []).find((t) => t.key === key);
  return t ? t.value : undefined;
}

function isError(span) {
  return tag(span, "error") === true || tag(span, "otel.status_code") === "ERROR";
}

/** The watchdog's kills, by span name. */
const KILLS = new Set(["watchdog_killed", "stream_timed_out"]);

/** What a span's row says after its name: the numbers that tell its story. */
export function detail(span) {
  const t = (k) => tag(span, k);
  const parts = [];
  switch (span.operationName) {
    case "turn_started":
      if (t("warden.turn") != null) parts.push(`turn ${t("warden.turn")}`);
      if (t("warden.attempts") != null) parts.push(`${t("warden.attempts")} attempt(s)`);
      if (t("warden.recovered") === true) parts.push("re-delivered after its session stopped");
      break;
    case "attempt_started":
      parts.push(`attempt ${t("warden.attempt")}`);
      if (t("warden.timeout_ms") != null) parts.push(`allowance ${seconds(t("warden.timeout_ms"))}`);
      break;
    case "watchdog_killed":
    case "stream_timed_out":
      parts.push(`silent ${seconds(t("warden.silent_ms") || 0)} of ${seconds(t("warden.timeout_ms") || 0)} allowed`);
      if (t("stream.phase")) parts.push(`in ${t("stream.phase")}`);
      break;
    case "retry_scheduled":
    case "continue_scheduled":
      parts.push(`backoff ${seconds(t("warden.delay_ms") || 0)} → attempt ${t("warden.attempt")}`);
      if (t("warden.kept_bytes") != null) parts.push(`${t("warden.kept_bytes")} bytes kept`);
      break;
    case "turn_redelivered":
      parts.push(`${t("warden.cause")}: its session stopped without answering it`);
      parts.push(`the client had ${t("warden.events_delivered")} event(s)`);
      if (t("warden.previous_trace")) parts.push(`accepted in trace ${String(t("warden.previous_trace")).slice(0, 12)}…`);
      break;
    default:
      if (t("warden.incarnation") != null) parts.push(String(t("warden.incarnation")));
  }
  if (t("error.type")) parts.push(String(t("error.type")));
  return parts.join(" · ");
}

/** The spans in tree order (each after its parent), with their depth. */
function ordered(spans) {
  const byId = new Map(spans.map((s) => [s.spanID, s]));
  const children = new Map();
  const roots = [];
  for (const s of spans) {
    const parent = (s.references || []).find((r) => r.refType === "CHILD_OF" && byId.has(r.spanID));
    if (parent) {
      if (!children.has(parent.spanID)) children.set(parent.spanID, []);
      children.get(parent.spanID).push(s);
    } else roots.push(s);
  }
  const out = [];
  const walk = (s, depth) => {
    out.push({ span: s, depth });
    for (const c of (children.get(s.spanID) || []).sort((a, b) => a.startTime - b.startTime)) walk(c, depth + 1);
  };
  for (const r of roots.sort((a, b) => a.startTime - b.startTime)) walk(r, 0);
  return out;
}

/** What a linked span is, in words. */
function linkText(span) {
  if (!span) return "a span Jaeger does not have";
  const what = detail(span);
  const incarnation = tag(span, "warden.incarnation");
  const name = incarnation ? `${span.operationName} (${incarnation})` : span.operationName;
  return what && !incarnation ? `${name} · ${what}` : name;
}

function jaegerLink(traceId, text) {
  const a = document.createElement("a");
  a.href = `${state.server.jaeger_url}/trace/${traceId}`;
  a.target = "_blank";
  a.rel = "noreferrer noopener";
  a.textContent = text;
  return a;
}

/** Shows span `span`'s tags and logs (its times relative to `start`). */
function showTags(span, start) {
  const box = $("trace-tags");
  box.hidden = false;
  box.dataset.span = span.spanID;
  box.textContent = "";
  const head = document.createElement("h4");
  head.textContent = `${span.operationName} · span ${span.spanID} · +${seconds((span.startTime - start) / 1000)}, ${seconds(span.duration / 1000)}`;
  const table = document.createElement("table");
  const row = (k, v) => {
    const tr = table.insertRow();
    tr.insertCell().textContent = k;
    tr.insertCell().textContent = shown(typeof v === "string" ? v : JSON.stringify(v));
  };
  for (const t of span.tags || []) row(t.key, t.value);
  for (const r of span.references || []) row(r.refType, `${r.traceID} / ${r.spanID}`);
  for (const l of span.logs || []) {
    const fields = (l.fields || []).map((f) => `${f.key}=${typeof f.value === "string" ? f.value : JSON.stringify(f.value)}`);
    row(`log +${seconds((l.timestamp - start) / 1000)}`, fields.join(" "));
  }
  box.append(head, table);
}

/** Draws `trace` (the route's answer) into the trace view. */
export function drawTrace(trace) {
  const view = $("trace-view");
  view.textContent = "";
  $("trace-tags").hidden = true;
  const spans = trace.spans;
  const start = Math.min(...spans.map((s) => s.startTime));
  const end = Math.max(...spans.map((s) => s.startTime + s.duration));
  const span = Math.max(end - start, 1);
  const pct = (us) => ((100 * (us - start)) / span).toFixed(3);
  const summary = document.createElement("p");
  summary.id = "trace-summary";
  summary.className = "muted";
  summary.append(`trace ${trace.trace_id} · ${spans.length} spans · ${seconds(span / 1000)} `, jaegerLink(trace.trace_id, "in Jaeger ↗"));
  view.append(summary);

  // The links out of this trace: its incarnation, the turn before, an
  // earlier incarnation's trace.
  const linked = new Map((trace.linked || []).map((s) => [`${s.traceID}/${s.spanID}`, s]));
  const own = new Set(spans.map((s) => s.traceID));
  const links = document.createElement("ul");
  links.id = "trace-links";
  for (const s of spans) {
    for (const r of s.references || []) {
      if (own.has(r.traceID)) continue;
      const li = document.createElement("li");
      const target = linked.get(`${r.traceID}/${r.spanID}`);
      li.dataset.link = target ? target.operationName : "";
      li.dataset.trace = r.traceID;
      li.append(`${s.operationName} → ${linkText(target)} · trace `, jaegerLink(r.traceID, `${r.traceID.slice(0, 12)}… ↗`));
      links.append(li);
    }
  }
  if (links.childNodes.length) view.append(links);

  for (const { span: s, depth } of ordered(spans)) {
    const row = document.createElement("div");
    row.className = "bar-row span-row";
    row.dataset.spanId = s.spanID;
    row.dataset.name = s.operationName;
    row.tabIndex = 0;
    if (isError(s)) row.classList.add("error");
    if (KILLS.has(s.operationName)) row.classList.add("kill");
    const label = document.createElement("span");
    label.className = `bar-label depth-${Math.min(depth, 4)}`;
    label.textContent = s.operationName;
    const about = detail(s);
    if (about) {
      const small = document.createElement("small");
      small.textContent = ` ${about}`;
      label.append(small);
    }
    const bar = svg("svg", { class: "bar", role: "img" });
    bar.append(svg("rect", { class: "track", x: "0%", y: 3, width: "100%", height: 12 }));
    const kind = KILLS.has(s.operationName) ? "ph-killed" : isError(s) ? "ph-failed" : s.operationName === "continue_scheduled" ? "ph-continued" : "ph-streaming";
    const width = Math.max((100 * s.duration) / span, 0.6);
    const x = Math.min(Number(pct(s.startTime)), 100 - width);
    const rect = svg("rect", { class: `ph ${kind}`, x: `${x.toFixed(3)}%`, y: 1, width: `${width.toFixed(3)}%`, height: 16 });
    const title = svg("title", {});
    title.textContent = `${s.operationName} +${seconds((s.startTime - start) / 1000)}, ${seconds(s.duration / 1000)}`;
    rect.append(title);
    bar.append(rect);
    // A backoff: the delay it scheduled, from its start.
    const delay = tag(s, "warden.delay_ms");
    if (delay) {
      const w = Math.min((100 * delay * 1000) / span, 100 - x);
      const backoff = svg("rect", { class: "ph ph-backoff", x: `${x.toFixed(3)}%`, y: 5, width: `${w.toFixed(3)}%`, height: 8 });
      backoff.dataset.phase = "backoff";
      bar.append(backoff);
    }
    for (const l of s.logs || []) {
      const lx = `${pct(l.timestamp)}%`;
      bar.append(svg("line", { class: "log", x1: lx, x2: lx, y1: 0, y2: 18 }));
    }
    row.append(label, bar);
    const open = () => showTags(s, start);
    row.addEventListener("click", open);
    row.addEventListener("keydown", (e) => {
      if (e.key === "Enter") open();
    });
    view.append(row);
  }
}

/** Clears the trace view (another turn is shown). */
export function clearTrace() {
  $("trace-view").textContent = "";
  $("trace-tags").hidden = true;
  $("trace-state").textContent = "";
  $("trace-section").hidden = !(state.server && state.server.jaeger_url);
}

/**
 * Reads turn `t`'s trace and draws it; while Jaeger does not have it
 * whole (its root `turn_started` is exported when the turn ends), asks
 * again.
 */
export async function loadTrace(t) {
  if (!state.server || !state.server.jaeger_url || !t.id) return;
  const say = (text) => {
    if (state.turn === t) $("trace-state").textContent = text;
  };
  for (let n = 0; n < TRIES && state.turn === t; n++) {
    try {
      const trace = await api("GET", `/v1/turns/${encodeURIComponent(t.id)}/trace`);
      if (state.turn !== t) return;
      drawTrace(trace);
      const whole = trace.spans.some((s) => s.operationName === "turn_started" && !(s.references || []).some((r) => r.refType === "CHILD_OF"));
      if (whole) return say("");
      say("Jaeger has part of this trace so far; asking again…");
    } catch (e) {
      if (e instanceof Refused) return hooks.signOut("The token was refused.");
      if (e.type !== "trace_not_found") return say(e.message);
      say(`${e.message}; asking again…`);
    }
    await new Promise((r) => setTimeout(r, AGAIN_MS));
  }
}

export function wireTrace() {
  $("trace-reload").addEventListener("click", () => {
    if (state.turn) loadTrace(state.turn);
  });
}
