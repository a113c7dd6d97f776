// A turn's timeline from the server's times (`at` on every event): the
// list of what happened, and each attempt drawn as a bar on one time axis
// with its phases — streaming, silent (the gap before the watchdog's
// kill), killed, backoff, continued — so a reopened turn shows the real
// times and gaps it had, not when this page received them.
//
// `record` keeps what a turn's events and the lifecycle stream said, as
// few records as it can (runs of text are one); `story` turns the records
// into list items and bars (pure: the same records give the same story);
// `draw` puts it on the page.

import { clock, seconds } from "./text.js";

/** Error codes of the watchdog's kills (silence, or no progress). */
const WATCHDOG = new Set(["ESTREAM_TIMEOUT", "ESTREAM_NO_PROGRESS", "ETIMEDOUT"]);

/** Whether a turn's `error` is its cancellation (not a failure). */
export function cancelled(d) {
  return d.code === "ECANCELLED" || d.code === "ECANCELED" || d.exit === 130;
}

/** A lifecycle event's name the timeline shows. */
export const LIFECYCLE = new Set(["stream_timed_out", "attempt_queued", "fresh_fallback", "resume_failed"]);

/**
 * Adds an event (`kind`, its `data`, its server time `at` in ms) to
 * `records`. Text and thinking only move the attempt's last activity.
 */
export function record(records, kind, data, at) {
  const last = records[records.length - 1];
  if (kind === "text" || kind === "thinking") {
    if (last && last.kind === kind && last.at <= at) {
      last.last = at;
      return;
    }
    records.push({ kind, at, last: at, data: {} });
    return;
  }
  records.push({ kind, at, last: at, data });
}

/** The attempt's phases up to `end`, after its last activity `active`. */
function close(attempt, active, end, how) {
  const streaming = attempt.continued ? "continued" : "streaming";
  if (how === "killed") {
    attempt.phases.push({ phase: streaming, from: attempt.start, to: active });
    attempt.phases.push({ phase: "silent", from: active, to: attempt.killAt });
    attempt.phases.push({ phase: "killed", from: attempt.killAt, to: end });
  } else if (how === "live") {
    attempt.phases.push({ phase: streaming, from: attempt.start, to: active });
    // Silent for more than a second: the gap the watchdog is counting.
    if (end - active > 1000) attempt.phases.push({ phase: "silent", from: active, to: end });
  } else if (how) {
    // Failed or cancelled: a silence of more than a second before it shows.
    const quiet = end - active > 1000;
    attempt.phases.push({ phase: streaming, from: attempt.start, to: quiet ? active : end });
    if (quiet) attempt.phases.push({ phase: "silent", from: active, to: end });
    attempt.phases.push({ phase: how, from: end, to: end });
  } else {
    attempt.phases.push({ phase: streaming, from: attempt.start, to: end });
  }
  attempt.phases = attempt.phases.filter((p) => p.to > p.from || !["streaming", "continued", "silent"].includes(p.phase));
  attempt.end = end;
}

/**
 * The story of `records`: `{start, end, items, attempts}` — items
 * `{kind, at, detail, css}` in time order, attempts `{n, start, end,
 * phases: [{phase, from, to}]}`. `now` (server time) ends a running
 * attempt's bar.
 */
export function story(records, now) {
  // In time order; a kill before the failure it caused in the same ms.
  const first = (r) => (r.kind === "stream_timed_out" ? 0 : 1);
  const sorted = records.slice().sort((a, b) => a.at - b.at || first(a) - first(b));
  const items = [];
  const attempts = [];
  const item = (kind, at, detail, css) => items.push({ kind, at, detail: detail || "", css: css || "" });
  let current = null;
  let active = 0; // the current attempt's last activity
  let continued = false;
  let thinking = false;
  // The watchdog's kills the lifecycle stream told (attempt -> time): known
  // before the attempt's failure is read, in whichever order they came.
  const killed = new Map();
  for (const r of sorted) if (r.kind === "stream_timed_out") killed.set(r.data.attempt, { at: r.at });
  for (const r of sorted) {
    const d = r.data;
    switch (r.kind) {
      case "queued":
        item("queued", r.at, d.behind != null ? `behind ${d.behind} turn(s) of its session` : "waiting for a stream slot");
        break;
      case "attempt_queued":
        item("admission", r.at, `attempt ${d.attempt} waits for a slot (${d.pool || "pool"})`);
        break;
      case "started":
        if (current && current.end == null) close(current, active, r.at);
        current = { n: d.attempt, start: r.at, end: null, phases: [], continued };
        attempts.push(current);
        active = r.at;
        continued = false;
        thinking = false;
        item("started", r.at, `attempt ${d.attempt}${current.continued ? ", continuing the reply" : ""}`);
        break;
      case "text":
      case "thinking":
        active = Math.max(active, r.last);
        if (r.kind === "thinking" && !thinking) item("thinking", r.at);
        thinking = r.kind === "thinking";
        break;
      case "tool":
        active = Math.max(active, r.at);
        item(`tool ${d.state}`, r.at, d.name || d.id);
        break;
      case "stream_timed_out":
        item("killed", r.at, `the watchdog stopped attempt ${d.attempt}: silent ${seconds(d.silent_ms || 0)}`, "kill");
        break;
      case "retrying":
      case "continuing": {
        const watchdog = WATCHDOG.has(d.code);
        const kill = killed.get(d.failed_attempt);
        if (current && current.end == null) {
          if (watchdog) {
            current.killAt = kill ? Math.min(kill.at, r.at) : r.at;
            close(current, Math.min(active, current.killAt), r.at, "killed");
          } else {
            close(current, active, r.at, "failed");
          }
          if (d.delay_ms > 0) current.phases.push({ phase: "backoff", from: r.at, to: r.at + d.delay_ms });
        }
        if (watchdog && !kill) {
          const silent = current ? r.at - Math.min(active, r.at) : 0;
          item("killed", r.at, `the watchdog stopped attempt ${d.failed_attempt}: silent ${seconds(silent)}`, "kill");
        }
        continued = r.kind === "continuing";
        const next = continued ? "the reply goes on where it broke" : "starts over";
        const wait = d.delay_ms > 0 ? ` in ${seconds(d.delay_ms)}` : "";
        item(r.kind, r.at, `${d.code} on attempt ${d.failed_attempt}${d.node ? ` (now on node ${d.node})` : ""}; ${next}${wait}`, "recover");
        break;
      }
      case "restarting":
        if (current && current.end == null) close(current, active, r.at, "failed");
        continued = false;
        item("restarting", r.at, `${d.cause}; fresh session, reply starts over`, "recover");
        break;
      case "fresh_fallback":
      case "resume_failed":
        item(r.kind.replace("_", " "), r.at, d.cause || "", "recover");
        break;
      case "done":
        if (current && current.end == null) close(current, active, r.at);
        item("done", r.at, `${d.attempts} attempt(s), ${d.continuations} continuation(s)`, "done");
        break;
      case "error": {
        const stop = cancelled(d);
        if (current && current.end == null) close(current, active, r.at, stop ? "cancelled" : "failed");
        item(stop ? "cancelled" : "error", r.at, `${d.code}: ${d.message} (exit ${d.exit})`, stop ? "cancelled" : "error");
        break;
      }
      case "lost":
        item("stream", r.at, `lost: ${d.message}`, "error");
        break;
      default:
        item(r.kind, r.at);
    }
  }
  const over = items.some((i) => ["done", "error", "cancelled"].includes(i.kind));
  if (current && current.end == null) {
    if (over) close(current, active, active);
    else close(current, active, Math.max(now, active), "live");
  }
  const start = sorted.length ? sorted[0].at : 0;
  let end = start;
  for (const r of sorted) end = Math.max(end, r.last);
  for (const a of attempts) for (const p of a.phases) end = Math.max(end, p.to);
  return { start, end, items, attempts };
}

/** Fills the list `ol` with the story's items (only when they changed). */
export function drawList(ol, s) {
  const signature = s.items.map((i) => `${i.kind}\u0000${i.at}\u0000${i.detail}`).join("\u0001");
  if (ol.dataset.signature === signature) return;
  ol.dataset.signature = signature;
  ol.textContent = "";
  for (const i of s.items) {
    const li = document.createElement("li");
    li.dataset.kind = i.kind;
    li.dataset.offsetMs = String(Math.round(i.at - s.start));
    if (i.css) li.className = i.css;
    const time = document.createElement("span");
    time.className = "t";
    time.textContent = `${clock(i.at)} +${seconds(i.at - s.start)}`;
    li.append(time, `${i.kind}${i.detail ? ` — ${i.detail}` : ""}`);
    ol.appendChild(li);
  }
}

const SVG = "http://www.w3.org/2000/svg";

/** How wide a moment's mark is, in percent of the axis. */
const MARK = 0.8;

function svg(name, attributes) {
  const el = document.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attributes)) el.setAttribute(k, String(v));
  return el;
}

/** A tick step for `span` ms: 1, 2 or 5 times a power of ten, about 6 ticks. */
function step(span) {
  const rough = Math.max(span / 6, 1);
  const power = 10 ** Math.floor(Math.log10(rough));
  for (const m of [1, 2, 5, 10]) if (m * power >= rough) return m * power;
  return 10 * power;
}

/**
 * Draws the story's attempts into `box`: one row per attempt, each phase a
 * rectangle at its place on the shared axis (percentages of the turn's
 * span: no inline style, which the page's policy forbids), and the axis.
 */
export function drawBars(box, s) {
  box.textContent = "";
  if (s.attempts.length === 0) {
    box.hidden = true;
    return;
  }
  box.hidden = false;
  const span = Math.max(s.end - s.start, 1);
  const pct = (ms) => `${((100 * (ms - s.start)) / span).toFixed(3)}%`;
  for (const a of s.attempts) {
    const row = document.createElement("div");
    row.className = "bar-row";
    row.dataset.attempt = String(a.n);
    row.dataset.startMs = String(Math.round(a.start - s.start));
    const label = document.createElement("span");
    label.className = "bar-label";
    label.textContent = `attempt ${a.n}`;
    const bar = svg("svg", { class: "bar", role: "img" });
    bar.append(svg("rect", { class: "track", x: "0%", y: 3, width: "100%", height: 12 }));
    for (const p of a.phases) {
      const ms = Math.round(p.to - p.from);
      // A moment (a kill, a failure) is a mark a little wide, ending at
      // it: drawn over the end of what came before, not under what follows.
      const moment = p.to <= p.from;
      const width = moment ? MARK : (100 * (p.to - p.from)) / span;
      const x = moment ? `${Math.max(0, (100 * (p.from - s.start)) / span - MARK).toFixed(3)}%` : pct(p.from);
      const rect = svg("rect", { class: `ph ph-${p.phase}`, x, y: 1, width: `${width.toFixed(3)}%`, height: 16 });
      rect.dataset.phase = p.phase;
      rect.dataset.ms = String(ms);
      const title = svg("title", {});
      title.textContent = `${p.phase} ${seconds(ms)} (${clock(p.from)} → ${clock(p.to)})`;
      rect.append(title);
      bar.append(rect);
    }
    row.append(label, bar);
    box.append(row);
  }
  const axis = document.createElement("div");
  axis.className = "bar-row axis";
  axis.append(document.createElement("span"));
  const ticks = svg("svg", { class: "bar" });
  const every = step(span);
  for (let t = 0; t <= span; t += every) {
    const x = `${((100 * t) / span).toFixed(3)}%`;
    ticks.append(svg("line", { x1: x, x2: x, y1: 0, y2: 5 }));
    const label = svg("text", { x, y: 16, "text-anchor": t === 0 ? "start" : t + every > span ? "end" : "middle" });
    label.textContent = `+${every < 1000 ? (t / 1000).toFixed(1) : (t / 1000).toFixed(0)} s`;
    ticks.append(label);
  }
  axis.append(ticks);
  box.append(axis);
}
