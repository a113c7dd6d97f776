// The warden console: sessions, a live turn, the cluster. No dependencies,
// served by `warden serve` at /ui; talks only to the node that served it
// (its Content-Security-Policy allows nothing else). The token is kept in
// this tab's sessionStorage, sent as `Authorization: Bearer`, never in a URL.

const TOKEN_KEY = "warden-token";
const $ = (id) => document.getElementById(id);

const state = {
  server: null,
  sessions: new Map(), // key -> { view, row }
  sort: { col: "last", dir: -1 },
  filter: "",
  dirty: new Set(), // keys whose rows need redrawing
  stale: new Set(), // keys to fetch again
  resort: false,
  limit: 100, // rows shown: the first ones in the sort order ("show more" adds 100)
  shown: [], // the entries in the table now, in order
  frame: 0,
  live: null, // the lifecycle stream's AbortController
  turn: null, // the followed turn
  route: "",
  lastFull: 0, // when the whole list was last fetched (performance.now())
  refreshing: false, // a whole-list fetch a `reset` asked for is under way
  refreshAgain: false, // and another reset came meanwhile
  received: new Map(), // key -> when its first unpainted event came (profiling)
  painted: false,
  // Set by a benchmark (sessionStorage `warden-profile`): the page then
  // records how long it takes to draw what it receives (User Timing).
  profile: sessionStorage.getItem("warden-profile") === "1",
  timers: false, // the periodic refreshes, started at the first sign-in
};

function measure(name, start, detail) {
  if (state.profile) performance.measure(name, { start, end: performance.now(), detail });
}

// ---------- the API ----------

class Refused extends Error {}

function token() {
  return sessionStorage.getItem(TOKEN_KEY) || "";
}

async function api(method, path) {
  const response = await fetch(path, { method, headers: { authorization: `Bearer ${token()}` } });
  if (response.status === 401) throw new Refused("the token was refused");
  const body = await response.json().catch(() => ({}));
  if (!response.ok) {
    const e = body.error || {};
    throw new Error(`${response.status} ${e.type || ""}: ${e.message || response.statusText}`);
  }
  return body;
}

/** The events of an SSE route, from `after` on: {id, event, data}. */
async function* sse(path, signal, after) {
  const headers = { authorization: `Bearer ${token()}`, accept: "text/event-stream" };
  if (after) headers["last-event-id"] = String(after);
  const response = await fetch(path, { headers, signal });
  if (response.status === 401) throw new Refused("the token was refused");
  if (!response.ok) throw new Error(`${path}: ${response.status}`);
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value.replace(/\r\n?/g, "\n");
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      let id = null, event = "message", data = "";
      for (const line of block.split("\n")) {
        if (line.startsWith(":")) continue;
        const colon = line.indexOf(":");
        const field = colon < 0 ? line : line.slice(0, colon);
        const text = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
        if (field === "id") id = Number(text);
        else if (field === "event") event = text;
        else if (field === "data") data += (data ? "\n" : "") + text;
      }
      if (!data && event === "message") continue;
      let parsed = {};
      try { parsed = data ? JSON.parse(data) : {}; } catch { parsed = { raw: data }; }
      yield { id, event, data: parsed };
    }
  }
}

// ---------- sign in ----------

function show(section) {
  for (const id of ["login", "sessions", "session", "cluster"]) $(id).hidden = id !== section;
  $("nav-sessions").classList.toggle("active", section === "sessions" || section === "session");
  $("nav-cluster").classList.toggle("active", section === "cluster");
}

function signOut(message) {
  sessionStorage.removeItem(TOKEN_KEY);
  if (state.live) state.live.abort();
  if (state.turn) state.turn.abort.abort();
  state.live = null;
  state.turn = null;
  // Nothing the token showed stays on the page.
  state.sessions.clear();
  state.shown = [];
  state.stale.clear();
  state.dirty.clear();
  $("sessions-table").tBodies[0].textContent = "";
  for (const id of ["reply", "timeline", "session-meta", "session-key", "action-result", "session-count"]) $(id).textContent = "";
  for (const id of ["turns-table", "nodes-table", "leases-table", "moves-table"]) $(id).tBodies[0].textContent = "";
  $("nav").hidden = true;
  $("signout").hidden = true;
  state.server = null;
  $("server").textContent = "";
  $("live").textContent = "";
  $("login-error").textContent = message || "";
  show("login");
  $("token").focus();
}

async function signIn() {
  if (state.profile) performance.mark("warden.signin");
  try {
    state.server = await api("GET", "/v1/server");
  } catch (e) {
    signOut(e instanceof Refused ? "Refused: that is not this server's token." : `Cannot reach the server: ${e.message}`);
    return;
  }
  const s = state.server;
  $("server").textContent = `v${s.version}${s.agent ? ` · ${s.agent}` : ""}${s.node ? ` · node ${s.node}` : ""} · watchdog ${(s.stream_timeout_ms / 1000).toFixed(0)} s`;
  $("nav").hidden = false;
  $("nav-cluster").hidden = !s.cluster;
  $("signout").hidden = false;
  $("login-error").textContent = "";
  await refreshAll();
  followLifecycle();
  if (!state.timers) {
    state.timers = true;
    // Other nodes' sessions change without events here: look again often.
    setInterval(() => {
      if (!token() || !state.server) return;
      refreshAll().catch(() => {});
      if (state.route === "cluster") openCluster();
    }, s.cluster ? 2000 : 15000);
    setInterval(() => token() && flushStale(), 500);
  }
  route();
}

// ---------- sessions ----------

const COLUMNS = ["key", "agent", "model", "status", "ctx", "last", "restarts", "node", "pending"];

function cells(v) {
  // A turn runs; else messages wait (for the session to start, or on a
  // node that stopped); else the record's own status.
  const busy = v.turn && v.turn.id != null ? "running" : v.pending > 0 ? "waiting" : null;
  const status = busy || v.status || "unknown";
  return {
    key: v.workspace || v.key,
    agent: (state.server && state.server.agent) || "",
    model: v.model || "",
    status,
    ctx: v.context && v.context.percent != null ? v.context.percent : null,
    last: v.last_active_ms || 0,
    restarts: v.restarts || 0,
    node: v.owner ? `${v.owner} · ${v.epoch}` : "",
    pending: v.pending || 0,
  };
}

function ago(ms) {
  if (!ms) return "";
  const s = Math.max(0, (Date.now() - ms) / 1000);
  if (s < 60) return `${s.toFixed(0)} s ago`;
  if (s < 3600) return `${(s / 60).toFixed(0)} min ago`;
  return `${(s / 3600).toFixed(1)} h ago`;
}

/** Sets `el`'s text (and class) only where it changed: no layout work for the rest. */
function put(el, text, className) {
  if (el.textContent !== text) el.textContent = text;
  if (className !== undefined && el.className !== className) el.className = className;
}

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
  put(tds[4], c.ctx == null ? "" : String(c.ctx), `num${c.ctx >= 95 ? " ctx-full" : c.ctx >= 80 ? " ctx-high" : ""}`);
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
function paint() {
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
function resort() {
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

async function refreshAll() {
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
async function flushStale() {
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

// ---------- the lifecycle stream ----------

async function followLifecycle() {
  let last = 0;
  let failures = 0;
  for (;;) {
    const abort = new AbortController();
    state.live = abort;
    try {
      $("live").textContent = "● live";
      for await (const e of sse("/v1/events", abort.signal, last)) {
        if (e.id != null) last = e.id;
        // A `reset` alone is no sign the stream works: a connection that
        // gives only that and ends still backs off.
        if (e.event !== "reset") failures = 0;
        onLifecycle(e);
      }
    } catch (e) {
      if (e instanceof Refused) return signOut("The token was refused.");
      if (abort.signal.aborted) return;
    }
    $("live").textContent = "○ reconnecting";
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
  if (key) {
    const entry = state.sessions.get(key);
    const patch = { key };
    if (e.event === "turn_started") Object.assign(patch, { running: true, turn: { id: e.data.turn, turn_id: e.data.turn_id }, last_active_ms: Date.now() });
    else if (e.event === "turn_finished") Object.assign(patch, { turn: null, last_active_ms: Date.now() });
    else if (e.event === "context") patch.context = { percent: e.data.percent, tokens: e.data.tokens, window: e.data.window };
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
  if (t && e.data.turn_id && e.data.turn_id === t.id) timelineLifecycle(e);
  if (t && key === t.key && e.event === "turn_started" && e.data.turn_id && e.data.turn_id !== t.id && t.ended) {
    followTurn(t.key, e.data.turn_id);
  }
  measure("warden.apply", started);
}

// ---------- one session and its turn ----------

async function openSession(key) {
  show("session");
  $("session-key").textContent = shown(key);
  $("session-key").dataset.key = key;
  $("session-meta").textContent = "";
  $("action-result").textContent = "";
  const view = await showMeta(key);
  if (!view) return;
  const turns = await loadTurns(key);
  const running = view.turn && view.turn.turn_id;
  const latest = turns.length > 0 ? turns[0].id : null;
  if (running || latest) followTurn(key, running || latest);
  else resetTurn(key, null);
}

/** The session's line under its name (and its trace link); its view. */
async function showMeta(key) {
  let view;
  try {
    view = await api("GET", `/v1/sessions/${encodeURIComponent(key)}`);
  } catch (e) {
    if (e instanceof Refused) return signOut("The token was refused.");
    $("session-meta").textContent = e.message;
    return null;
  }
  if ($("session-key").dataset.key !== key) return null;
  const c = cells({ ...view, key });
  metaLine($("session-meta"), [
    view.workspace && ["workspace", view.workspace],
    ["status", c.status],
    c.ctx != null && ["context", `${c.ctx} %`],
    view.conversation && ["conversation", view.conversation],
    ["restarts", String(c.restarts)],
    ["pending", String(c.pending)],
  ]);
  const trace = $("trace");
  trace.hidden = !(state.server.jaeger_url && view.trace_id);
  if (!trace.hidden) trace.href = `${state.server.jaeger_url}/trace/${view.trace_id}`;
  return view;
}

/** Invisible characters that change the direction of the text around them. */
const BIDI_CONTROLS = /[\u061C\u200E\u200F\u202A-\u202E\u2066-\u2069]/g;

/**
 * A name as shown: its direction controls made visible (`⟨U+202E⟩`), so a
 * workspace cannot pass for another one (`evil\u202Egnp.exe` shows as
 * `evil⟨U+202E⟩gnp.exe`, not `evilexe.png`).
 */
function shown(text) {
  return String(text).replace(BIDI_CONTROLS, (c) => `⟨U+${c.codePointAt(0).toString(16).toUpperCase().padStart(4, "0")}⟩`);
}

/**
 * Fills `element` with "label value · label value …", each value in its
 * own `<bdi>`: a value's text (a workspace path, an id the agent chose)
 * may hold right-to-left characters or overrides (U+202E), and isolated
 * they cannot reorder the labels or the values after them.
 */
function metaLine(element, parts) {
  element.textContent = "";
  for (const part of parts.filter(Boolean)) {
    if (element.childNodes.length > 0) element.append(" · ");
    const value = document.createElement("bdi");
    value.textContent = shown(part[1]);
    element.append(`${part[0]} `, value);
  }
}

async function loadTurns(key) {
  let turns = [];
  try {
    turns = (await api("GET", `/v1/sessions/${encodeURIComponent(key)}/turns`)).turns;
  } catch {
    return [];
  }
  const body = $("turns-table").tBodies[0];
  body.textContent = "";
  for (const t of turns) {
    const row = body.insertRow();
    const link = document.createElement("a");
    link.href = `#/session/${encodeURIComponent(key)}/${encodeURIComponent(t.id)}`;
    link.textContent = t.id;
    row.insertCell().appendChild(link);
    const n = row.insertCell();
    n.className = "num";
    n.textContent = String(t.message_id);
    row.insertCell().textContent = t.outcome;
    const detail = t.outcome === "done" ? t.text || "" : t.code ? `${t.code}: ${t.message || ""}` : "";
    row.insertCell().textContent = detail.length > 120 ? `${detail.slice(0, 120)}…` : detail;
  }
  return turns;
}

function resetTurn(key, id) {
  if (state.turn) state.turn.abort.abort();
  state.turn = { key, id, abort: new AbortController(), text: "", phase: "idle", beat: 0, streaming: false, ended: id == null, first: 0 };
  $("turn-id").textContent = id || "–";
  $("reply").textContent = "";
  $("timeline").textContent = "";
  $("cancel").disabled = id == null;
  setPhase(id ? "waiting" : "idle");
  return state.turn;
}

function setPhase(phase) {
  state.turn.phase = phase;
  const badge = $("phase");
  badge.textContent = phase;
  badge.className = `badge ${phase}`;
}

function clock(ms) {
  const d = new Date(ms);
  const p = (n, w = 2) => String(n).padStart(w, "0");
  return `${p(d.getHours())}:${p(d.getMinutes())}:${p(d.getSeconds())}.${p(d.getMilliseconds(), 3)}`;
}

function timeline(kind, detail, css) {
  const t = state.turn;
  const now = Date.now();
  if (!t.first) t.first = now;
  const li = document.createElement("li");
  li.dataset.kind = kind;
  if (css) li.className = css;
  const time = document.createElement("span");
  time.className = "t";
  time.textContent = `${clock(now)} +${((now - t.first) / 1000).toFixed(1)} s`;
  li.append(time, `${kind}${detail ? ` — ${detail}` : ""}`);
  $("timeline").appendChild(li);
}

async function followTurn(key, id) {
  const t = resetTurn(key, id);
  try {
    for await (const e of sse(`/v1/turns/${encodeURIComponent(id)}/events`, t.abort.signal, 0)) {
      if (state.turn !== t) return;
      onTurnEvent(t, e);
      if (e.event === "done" || e.event === "error") break;
    }
  } catch (e) {
    if (e instanceof Refused) return signOut("The token was refused.");
    if (t.abort.signal.aborted) return;
    timeline("stream", `lost: ${e.message}`, "error");
  }
  if (state.turn === t) {
    t.ended = true;
    t.streaming = false;
    $("cancel").disabled = true;
    loadTurns(key);
    showMeta(key);
  }
}

function onTurnEvent(t, e) {
  const d = e.data;
  const beat = () => {
    t.beat = Date.now();
    t.streaming = true;
  };
  switch (e.event) {
    case "queued":
      setPhase("waiting");
      timeline("queued", d.behind != null ? `behind ${d.behind} turn(s) of its session` : "waiting for a stream slot");
      break;
    case "started":
      beat();
      setPhase("waiting");
      timeline("started", `attempt ${d.attempt}`);
      break;
    case "text":
      beat();
      if (t.phase !== "text") setPhase("text");
      t.text += d.text || "";
      $("reply").textContent = t.text;
      break;
    case "thinking":
      beat();
      if (t.phase !== "thinking") {
        setPhase("thinking");
        timeline("thinking");
      }
      break;
    case "tool":
      beat();
      setPhase(d.state === "started" ? "tool" : "text");
      timeline(`tool ${d.state}`, d.name || d.id);
      break;
    case "retrying":
    case "continuing":
    case "restarting": {
      t.streaming = false;
      if (d.discard) {
        t.text = "";
        $("reply").textContent = "";
      }
      const why = e.event === "restarting" ? d.cause : `${d.code} on attempt ${d.failed_attempt}${d.node ? ` (now on node ${d.node})` : ""}`;
      const what = e.event === "continuing" ? "the reply goes on where it broke" : e.event === "restarting" ? "fresh session, reply starts over" : `starts over in ${((d.delay_ms || 0) / 1000).toFixed(1)} s`;
      timeline(e.event, `${why}; ${what}`, "recover");
      break;
    }
    case "done":
      t.streaming = false;
      setPhase("done");
      timeline("done", `${d.attempts} attempt(s), ${d.continuations} continuation(s)`, "done");
      break;
    case "error":
      t.streaming = false;
      setPhase("error");
      timeline("error", `${d.code}: ${d.message} (exit ${d.exit})`, "error");
      break;
    default:
      timeline(e.event);
  }
}

function timelineLifecycle(e) {
  const d = e.data;
  switch (e.event) {
    case "stream_timed_out":
      state.turn.streaming = false;
      timeline("killed", `the watchdog stopped attempt ${d.attempt}: silent ${(d.silent_ms / 1000).toFixed(1)} s`, "kill");
      break;
    case "attempt_queued":
      timeline("admission", `attempt ${d.attempt} waits for a slot (${d.pool || "pool"})`);
      break;
    case "retry_scheduled":
      timeline("retry scheduled", `${d.code} on attempt ${d.failed_attempt}, in ${((d.delay_ms || 0) / 1000).toFixed(1)} s`, "recover");
      break;
    case "continue_scheduled":
      timeline("continuation scheduled", `${d.code} on attempt ${d.failed_attempt}`, "recover");
      break;
    case "fresh_fallback":
    case "resume_failed":
      timeline(e.event.replace("_", " "), d.cause || "", "recover");
      break;
    default:
  }
}

function tickAllowance() {
  const el = $("allowance");
  const t = state.turn;
  // Written only when it changes: a no-op write still costs the page a
  // style pass over every row of a large table.
  if (!t || !t.streaming || !state.server) {
    if (!el.hidden) el.hidden = true;
    return;
  }
  const left = state.server.stream_timeout_ms - (Date.now() - t.beat);
  if (el.hidden) el.hidden = false;
  put(el, `watchdog ${Math.max(0, left / 1000).toFixed(1)} s`);
  const low = left < state.server.stream_timeout_ms / 4;
  if (el.classList.contains("low") !== low) el.classList.toggle("low", low);
}

async function act(what, call) {
  $("action-result").textContent = `${what}…`;
  try {
    $("action-result").textContent = `${what}: ${await call()}`;
  } catch (e) {
    if (e instanceof Refused) return signOut("The token was refused.");
    $("action-result").textContent = `${what}: ${e.message}`;
  }
}

// ---------- the cluster ----------

async function openCluster() {
  show("cluster");
  let view;
  let sessions;
  try {
    [view, { sessions }] = await Promise.all([api("GET", "/v1/cluster"), api("GET", "/v1/sessions")]);
  } catch (e) {
    if (e instanceof Refused) return signOut("The token was refused.");
    $("cluster-figures").textContent = e.message;
    return;
  }
  $("cluster-node").textContent = view.node ? `(this node: ${view.node})` : "";
  const rtt = view.database_round_trip_ms;
  $("cluster-figures").textContent = `leases held here ${view.leases_held} · lost ${view.leases_lost} · taken over ${view.takeovers} · database round trip ${rtt == null ? "unreachable" : `${rtt.toFixed(1)} ms`}`;
  fill("nodes-table", view.nodes, (n) => [`${n.node}${n.here ? " (here)" : ""}`, n.advertise || "", `${n.heartbeat_age_secs.toFixed(1)} s`, String(n.sessions)], [2, 3]);
  fill("leases-table", sessions, (s) => [s.key, s.owner || "–", String(s.epoch), s.lease_remaining_secs == null ? "released" : s.lease_remaining_secs < 0 ? `expired ${(-s.lease_remaining_secs).toFixed(1)} s ago` : `${s.lease_remaining_secs.toFixed(1)} s`], [2, 3]);
  fill("moves-table", view.moves, (m) => [clock(m.at_ms), m.key, m.kind, `${m.from} → ${m.to}`, String(m.epoch)], [4]);
}

function fill(table, rows, cellsOf, numeric) {
  const body = $(table).tBodies[0];
  body.textContent = "";
  for (const r of rows) {
    const row = body.insertRow();
    cellsOf(r).forEach((text, i) => {
      const td = row.insertCell();
      td.textContent = text;
      if (numeric.includes(i)) td.className = "num";
    });
  }
}

// ---------- routing and wiring ----------

function route() {
  if (!token() || !state.server) return;
  const hash = location.hash || "#/sessions";
  const parts = hash.slice(2).split("/").map(decodeURIComponent);
  state.route = parts[0];
  if (parts[0] === "session" && parts[1]) {
    if (parts[2]) {
      openSession(parts[1]).then(() => followTurn(parts[1], parts[2]));
    } else {
      openSession(parts[1]);
    }
  } else if (parts[0] === "cluster" && state.server.cluster) {
    openCluster();
  } else {
    if (state.turn) state.turn.abort.abort();
    state.turn = null;
    show("sessions");
  }
}

function wire() {
  $("login-form").addEventListener("submit", (event) => {
    event.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, $("token").value.trim());
    $("token").value = "";
    signIn();
  });
  $("signout").addEventListener("click", () => signOut(""));
  $("filter").addEventListener("input", () => {
    state.filter = $("filter").value.trim().toLowerCase();
    state.limit = 100;
    resort();
  });
  $("more").addEventListener("click", () => {
    state.limit += 100;
    resort();
  });
  for (const th of $("sessions-table").tHead.rows[0].cells) {
    th.addEventListener("click", () => {
      const col = th.dataset.col;
      state.sort = { col, dir: state.sort.col === col ? -state.sort.dir : col === "last" || col === "ctx" ? -1 : 1 };
      resort();
    });
  }
  $("sessions-table").tBodies[0].addEventListener("click", (event) => {
    const row = event.target.closest("tr");
    if (row) location.hash = `#/session/${encodeURIComponent(row.dataset.key)}`;
  });
  $("cancel").addEventListener("click", () => {
    const t = state.turn;
    if (!t || !t.id) return;
    act("cancel", async () => {
      const r = await api("DELETE", `/v1/turns/${encodeURIComponent(t.id)}`);
      return r.cancelled ? "cancelled" : "it was already over";
    });
  });
  for (const how of ["retry", "fresh"]) {
    $(`recover-${how}`).addEventListener("click", () => {
      const t = state.turn;
      if (!t) return;
      act(`recover (${how})`, async () => {
        const r = await api("POST", `/v1/sessions/${encodeURIComponent(t.key)}/recover?how=${how}`);
        return r.recovered ? "done" : "nothing was stuck";
      });
    });
  }
  window.addEventListener("hashchange", route);
  setInterval(tickAllowance, 100);
  // "last active" ages: redraw the shown rows' relative times now and then.
  setInterval(() => {
    for (const entry of state.shown) entry.drawn = false;
    if (state.shown.length && !state.frame) state.frame = requestAnimationFrame(paint);
  }, 10000);
}

wire();
if (token()) signIn();
else signOut("");
