// The sessions table: every session the node knows, live from the
// lifecycle stream (`GET /v1/events`), drawn at most once a frame and only
// the first rows of the sorted, filtered order.

import { api, Refused, sse, token } from "./api.js";
import { $, hooks, measure, state } from "./state.js";
import { markLive } from "./health.js";
import { ago, cells, contextText, put, shown } from "./text.js";
import { followTurn, onTurnLifecycle } from "./turn.js";

const COLUMNS = ["key", "agent", "model", "status", "ctx", "last", "restarts", "node", "pending"];

/** Recomputes a session's cells (what sorting and filtering read). */
function compute(entry) {
  const c = cells(entry.view);
  entry.cells = c;
  entry.text = [entry.view.key, c.key, c.model, c.status, c.node].join(" ").toLowerCase();
  entry.drawn = false;
}

/** Writes a session's cells into its row (made on first use). */
function drawRow(entry) {
  if (!entry.row) {
    const row = document.createElement("tr");
    row.dataset.key = entry.view.key;
    for (const col of COLUMNS) {
      const td = document.createElement("td");
      if (["ctx", "last", "restarts", "pending"].includes(col)) td.className = "num";
      if (col === "key") td.className = "key";
      row.appendChild(td);
    }
    entry.row = row;
  }
  const c = entry.cells;
  const tds = entry.row.children;
  put(tds[0], shown(c.key));
  if (tds[0].title !== entry.view.key) tds[0].title = entry.view.key;
  put(tds[1], c.agent);
  put(tds[2], c.model);
  put(tds[3], c.status, `status-${c.status}`);
  // Past its window (more than 100 %) a context is said so, with the numbers.
  const ctx = c.ctx == null ? "" : contextText(entry.view.context);
  put(tds[4], ctx, `num${c.ctx > 100 ? " ctx-over" : c.ctx >= 95 ? " ctx-full" : c.ctx >= 80 ? " ctx-high" : ""}`);
  if (tds[4].title !== ctx) tds[4].title = ctx;
  put(tds[5], ago(c.last));
  put(tds[6], String(c.restarts));
  put(tds[7], c.node);
  put(tds[8], String(c.pending));
  entry.drawn = true;
}

function upsert(view) {
  let entry = state.sessions.get(view.key);
  if (!entry) {
    entry = { view, row: null, cells: null, text: "", drawn: false };
    state.sessions.set(view.key, entry);
    state.resort = true;
  } else {
    entry.view = { ...entry.view, ...view };
  }
  markDirty(view.key);
}

function markDirty(key) {
  state.dirty.add(key);
  if (!state.frame) state.frame = requestAnimationFrame(paint);
}

/**
 * Applies every pending change in one frame. The table shows only the
 * first `state.limit` sessions of the sorted, filtered order: a page with
 * a thousand rows costs the browser a long layout for every change, one
 * with a hundred does not (the filter finds the rest).
 */
export function paint() {
  state.frame = 0;
  const started = performance.now();
  const sortCol = state.sort.col;
  for (const key of state.dirty) {
    const entry = state.sessions.get(key);
    if (!entry) continue;
    const before = entry.cells && entry.cells[sortCol];
    const text = entry.text;
    compute(entry);
    if (before !== entry.cells[sortCol] || (state.filter && text !== entry.text)) state.resort = true;
  }
  const changed = state.dirty.size;
  if (state.profile) {
    const now = performance.now();
    for (const key of state.dirty) {
      const at = state.received.get(key);
      if (at !== undefined) performance.measure("warden.latency", { start: at, end: now });
    }
    state.received.clear();
  }
  state.dirty.clear();
  if (state.resort) resort();
  for (const entry of state.shown) if (!entry.drawn) drawRow(entry);
  measure("warden.paint", started, { rows: changed });
  if (!state.painted && state.sessions.size > 0) {
    state.painted = true;
    if (state.profile) performance.measure("warden.first-table", "warden.signin");
  }
}

/** Sorts and filters the sessions, and puts the first `limit` in the table. */
export function resort() {
  state.resort = false;
  const { col, dir } = state.sort;
  const matching = [];
  for (const e of state.sessions.values()) {
    if (!e.cells) compute(e);
    if (state.filter === "" || e.text.includes(state.filter)) matching.push(e);
  }
  matching.sort((a, b) => {
    const x = a.cells[col];
    const y = b.cells[col];
    if (x === y) return a.view.key < b.view.key ? -1 : 1;
    if (x == null) return 1;
    if (y == null) return -1;
    return (x < y ? -1 : 1) * dir;
  });
  const shown = matching.slice(0, state.limit);
  // Move only the rows out of place (a session that became the most
  // recent is one move), then drop the rows no longer shown.
  const body = $("sessions-table").tBodies[0];
  let at = body.firstChild;
  for (const e of shown) {
    if (!e.drawn || !e.row) drawRow(e);
    if (e.row === at) at = at.nextSibling;
    else body.insertBefore(e.row, at);
  }
  while (at) {
    const next = at.nextSibling;
    at.remove();
    at = next;
  }
  state.shown = shown;
  const total = state.sessions.size;
  put($("session-count"), matching.length === total ? `(${total})` : `(${matching.length} of ${total})`);
  const more = $("more");
  more.hidden = matching.length <= shown.length;
  put(more, `Show ${Math.min(100, matching.length - shown.length)} more (${shown.length} of ${matching.length} shown)`);
  for (const th of $("sessions-table").tHead.rows[0].cells) {
    th.classList.toggle("sorted-asc", th.dataset.col === col && dir > 0);
    th.classList.toggle("sorted-desc", th.dataset.col === col && dir < 0);
  }
}

export async function refreshAll() {
  const started = performance.now();
  const { sessions } = await api("GET", "/v1/sessions?detail=full");
  const seen = new Set();
  for (const v of sessions) {
    seen.add(v.key);
    upsert(v);
  }
  for (const key of [...state.sessions.keys()]) {
    if (!seen.has(key)) {
      state.sessions.delete(key);
      state.resort = true;
    }
  }
  state.lastFull = performance.now();
  measure("warden.refresh", started, { rows: sessions.length });
}

/** The least time between two whole-list fetches a `reset` asks for. */
const RESET_REFRESH_GAP_MS = 1000;

/**
 * The whole list again after a `reset` (the events missed are not
 * replayed): one fetch at a time, at most one per second; resets that
 * come meanwhile fold into one more fetch after it, never one each.
 */
function refreshAfterReset() {
  if (state.refreshing) {
    state.refreshAgain = true;
    return;
  }
  state.refreshing = true;
  const wait = Math.max(0, state.lastFull + RESET_REFRESH_GAP_MS - performance.now());
  setTimeout(() => {
    refreshAll()
      .catch(() => {})
      .finally(() => {
        state.lastFull = performance.now();
        state.refreshing = false;
        if (state.refreshAgain && token()) {
          state.refreshAgain = false;
          refreshAfterReset();
        }
      });
  }, wait);
}

/** Sessions fetched again per tick, the first ones events said changed. */
const STALE_PER_TICK = 20;

/**
 * Fetches the sessions events said changed (what events do not carry: the
 * pending count, the model): up to 20 per tick; when more keep changing,
 * the whole list at most every 5 s instead.
 */
export async function flushStale() {
  if (state.stale.size === 0) return;
  if (state.stale.size > STALE_PER_TICK && performance.now() - state.lastFull > 5000) {
    state.stale.clear();
    return refreshAll().catch(() => {});
  }
  const keys = [...state.stale].slice(0, STALE_PER_TICK);
  for (const key of keys) state.stale.delete(key);
  await Promise.all(
    keys.map((key) =>
      api("GET", `/v1/sessions/${encodeURIComponent(key)}`)
        .then((v) => upsert({ ...v, key }))
        .catch(() => {}),
    ),
  );
}

// The lifecycle stream: each event applied to its row at the next frame;
// the followed turn's own (the watchdog's kill) go to its timeline.

export async function followLifecycle() {
  let last = 0;
  let failures = 0;
  for (;;) {
    const abort = new AbortController();
    state.live = abort;
    try {
      markLive(true);
      for await (const e of sse("/v1/events", abort.signal, last)) {
        if (e.id != null) last = e.id;
        // A `reset` alone is no sign the stream works: a connection that
        // gives only that and ends still backs off.
        if (e.event !== "reset") failures = 0;
        onLifecycle(e);
      }
    } catch (e) {
      if (e instanceof Refused) return hooks.signOut("The token was refused.");
      if (abort.signal.aborted) return;
    }
    markLive(false);
    failures += 1;
    await new Promise((r) => setTimeout(r, Math.min(5000, 250 * 2 ** failures)));
    if (!token()) return;
  }
}

function onLifecycle(e) {
  const started = performance.now();
  if (e.event === "reset") {
    refreshAfterReset();
    return;
  }
  const key = e.data.key;
  // When it happened, by the server's clock.
  const at = Date.parse(e.data.at);
  const when = Number.isNaN(at) ? Date.now() : at;
  if (key) {
    const entry = state.sessions.get(key);
    const patch = { key };
    if (e.event === "turn_started") Object.assign(patch, { running: true, turn: { id: e.data.turn, turn_id: e.data.turn_id }, last_active_ms: when });
    else if (e.event === "turn_finished") Object.assign(patch, { turn: null, last_active_ms: when });
    else if (e.event === "context_usage") patch.context = { percent: e.data.percent, tokens: e.data.tokens, window: e.data.window };
    else if (e.event === "session_failed") patch.status = "failed";
    else if (e.event === "session_stopped") patch.running = false;
    else if (e.event === "session_spawned") patch.running = true;
    if (entry || e.event === "session_spawned" || e.event === "turn_started") {
      if (state.profile && !state.received.has(key)) state.received.set(key, started);
      upsert(patch);
    }
    state.stale.add(key);
  }
  const t = state.turn;
  if (t && e.data.turn_id && e.data.turn_id === t.id) onTurnLifecycle(e);
  if (t && key === t.key && e.event === "turn_started" && e.data.turn_id && e.data.turn_id !== t.id && t.ended) {
    followTurn(t.key, e.data.turn_id);
  }
  measure("warden.apply", started);
}

