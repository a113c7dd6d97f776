// One session and its turn: the turn's reply as it streams, its phase and
// the watchdog's allowance, its prompt, model, start and duration, its
// timeline (listed and drawn, from the server's times), the actions on
// it, the session's recent turns, and a box to send the session a message.

import { api, Refused, sse } from "./api.js";
import { $, hooks, state } from "./state.js";
import { cells, clock, contextText, metaLine, seconds, shown, when } from "./text.js";
import { cancelled, drawBars, drawList, LIFECYCLE, record, story } from "./timeline.js";
import { clearTrace, loadTrace } from "./trace.js";

export async function openSession(key, turnId) {
  $("session-key").textContent = shown(key);
  $("session-key").dataset.key = key;
  $("session-meta").textContent = "";
  $("action-result").textContent = "";
  $("send-result").textContent = "";
  const view = await showMeta(key);
  if (!view) return;
  const turns = await loadTurns(key);
  const running = view.turn && view.turn.turn_id;
  const latest = turns.length > 0 ? turns[0].id : null;
  const id = turnId || running || latest;
  if (id) followTurn(key, id, turns);
  else resetTurn(key, null);
}

/** The session's line under its name (and its trace link); its view. */
async function showMeta(key) {
  let view;
  try {
    view = await api("GET", `/v1/sessions/${encodeURIComponent(key)}`);
  } catch (e) {
    if (e instanceof Refused) return hooks.signOut("The token was refused.");
    $("session-meta").textContent = e.message;
    return null;
  }
  if ($("session-key").dataset.key !== key) return null;
  const c = cells({ ...view, key });
  state.sessionView = { ...view, key };
  metaLine($("session-meta"), [
    view.workspace && ["workspace", view.workspace],
    ["status", c.status],
    c.ctx != null && ["context", contextText(view.context, " tokens")],
    view.conversation && ["conversation", view.conversation],
    ["restarts", String(c.restarts)],
    ["pending", String(c.pending)],
  ]);
  const trace = $("trace");
  trace.hidden = !(state.server.jaeger_url && view.trace_id);
  if (!trace.hidden) trace.href = `${state.server.jaeger_url}/trace/${view.trace_id}`;
  return view;
}

/** A kept turn's outcome in words: a cancelled one is not a failure. */
function outcome(t) {
  return t.outcome === "error" && cancelled(t) ? "cancelled" : t.outcome;
}

/** Milliseconds of an RFC 3339 time, or null. */
function ms(time) {
  const t = time ? Date.parse(time) : NaN;
  return Number.isNaN(t) ? null : t;
}

async function loadTurns(key) {
  let turns = [];
  try {
    turns = (await api("GET", `/v1/sessions/${encodeURIComponent(key)}/turns`)).turns;
  } catch {
    return [];
  }
  if ($("session-key").dataset.key !== key) return turns;
  const body = $("turns-table").tBodies[0];
  body.textContent = "";
  for (const t of turns) {
    const row = body.insertRow();
    const link = document.createElement("a");
    link.href = `#/session/${encodeURIComponent(key)}/${encodeURIComponent(t.id)}`;
    link.textContent = t.id;
    row.insertCell().appendChild(link);
    const started = ms(t.started_at);
    const ended = ms(t.ended_at);
    const cell = (text, css) => {
      const td = row.insertCell();
      td.textContent = text;
      if (css) td.className = css;
    };
    cell(started ? when(started) : "", "num");
    cell(started && ended ? seconds(ended - started) : "", "num");
    cell(shown(t.model || ""));
    const prompt = t.prompt || "";
    cell(prompt.length > 80 ? `${prompt.slice(0, 80)}…` : prompt);
    const how = outcome(t);
    cell(how, `outcome-${how}`);
    const detail = t.outcome === "done" ? t.text || "" : t.code ? `${t.code}: ${t.message || ""}` : "";
    cell(detail.length > 120 ? `${detail.slice(0, 120)}…` : detail);
  }
  const t = state.turn;
  if (t) {
    const summary = turns.find((s) => s.id === t.id);
    if (summary) {
      t.summary = summary;
      showTurnMeta(t);
    }
  }
  return turns;
}

function resetTurn(key, id) {
  if (state.turn) state.turn.abort.abort();
  state.turn = {
    key, id, abort: new AbortController(), text: "", phase: "idle", beat: 0, streaming: false, ended: id == null,
    records: [], skew: null, summary: null, prompt: null, drawn: 0,
  };
  $("turn-id").textContent = id || "–";
  $("reply").textContent = "";
  $("timeline").textContent = "";
  delete $("timeline").dataset.signature;
  $("bars").textContent = "";
  $("bars").hidden = true;
  $("prompt").textContent = "";
  $("prompt").hidden = true;
  $("turn-meta").textContent = "";
  $("cancel").disabled = id == null;
  clearTrace();
  setPhase(id ? "waiting" : "idle");
  return state.turn;
}

function setPhase(phase) {
  state.turn.phase = phase;
  const badge = $("phase");
  badge.textContent = phase;
  badge.className = `badge ${phase}`;
}

/** The server's clock now, as far as this page can tell (its events' `at`). */
function serverNow(t) {
  return Date.now() - (t.skew || 0);
}

/** Keeps an event for the timeline, at its server time. */
function keep(t, kind, data) {
  const received = Date.now();
  const at = ms(data.at);
  if (at != null) t.skew = t.skew == null ? received - at : Math.min(t.skew, received - at);
  record(t.records, kind, data, at != null ? at : received - (t.skew || 0));
  scheduleDraw(t);
}

function scheduleDraw(t) {
  if (t.drawn) return;
  t.drawn = requestAnimationFrame(() => {
    t.drawn = 0;
    if (state.turn === t) drawTimeline(t);
  });
}

function drawTimeline(t) {
  const s = story(t.records, serverNow(t));
  drawList($("timeline"), s);
  drawBars($("bars"), s);
  t.story = s;
  showTurnMeta(t);
}

/** The turn's prompt, model, start and duration. */
function showTurnMeta(t) {
  const s = t.summary || {};
  const prompt = s.prompt != null ? s.prompt : t.prompt;
  const box = $("prompt");
  box.hidden = !prompt;
  if ((prompt || "") !== box.textContent) box.textContent = prompt || "";
  const first = t.records.length ? Math.min(...t.records.map((r) => r.at)) : null;
  const start = ms(s.started_at) ?? first;
  const storyEnd = t.story && t.ended ? t.story.end : null;
  const end = ms(s.ended_at) ?? storyEnd;
  const parts = [
    ["model", s.model || (t.summary ? "the server's default" : "…")],
    start != null && ["started", when(start)],
    start != null && end != null && ["took", seconds(end - start)],
    start != null && end == null && !t.ended && ["running for", seconds(serverNow(t) - start)],
  ];
  const line = $("turn-meta");
  const before = line.textContent;
  const scratch = document.createElement("p");
  metaLine(scratch, parts);
  if (scratch.textContent !== before) line.replaceChildren(...scratch.childNodes);
}

/** Follows turn `id` of session `key` (`turns`: its list, when just fetched). */
export async function followTurn(key, id, turns) {
  const t = resetTurn(key, id);
  const summary = turns && turns.find((s) => s.id === id);
  if (summary) t.summary = summary;
  else loadTurns(key);
  try {
    for await (const e of sse(`/v1/turns/${encodeURIComponent(id)}/events`, t.abort.signal, 0)) {
      if (state.turn !== t) return;
      onTurnEvent(t, e);
      if (e.event === "done" || e.event === "error") break;
    }
  } catch (e) {
    if (e instanceof Refused) return hooks.signOut("The token was refused.");
    if (t.abort.signal.aborted) return;
    keep(t, "lost", { message: e.message });
  }
  if (state.turn === t) {
    t.ended = true;
    t.streaming = false;
    $("cancel").disabled = true;
    scheduleDraw(t);
    loadTurns(key);
    showMeta(key);
    loadTrace(t);
  }
}

function onTurnEvent(t, e) {
  const d = e.data;
  const beat = () => {
    t.beat = Date.now();
    t.streaming = true;
  };
  keep(t, e.event, d);
  switch (e.event) {
    case "queued":
      setPhase("waiting");
      break;
    case "started":
      beat();
      setPhase("waiting");
      break;
    case "text":
      beat();
      if (t.phase !== "text") setPhase("text");
      t.text += d.text || "";
      $("reply").textContent = t.text;
      break;
    case "thinking":
      beat();
      if (t.phase !== "thinking") setPhase("thinking");
      break;
    case "tool":
      beat();
      setPhase(d.state === "started" ? "tool" : "text");
      break;
    case "retrying":
    case "continuing":
    case "restarting":
      t.streaming = false;
      if (d.discard) {
        t.text = "";
        $("reply").textContent = "";
      }
      break;
    case "done":
      t.streaming = false;
      setPhase("done");
      break;
    case "error":
      t.streaming = false;
      setPhase(cancelled(d) ? "cancelled" : "error");
      break;
    default:
  }
}

/** A lifecycle event of the followed turn (the watchdog's kill, …). */
export function onTurnLifecycle(e) {
  const t = state.turn;
  if (!t || !LIFECYCLE.has(e.event)) return;
  if (e.event === "stream_timed_out") t.streaming = false;
  keep(t, e.event, e.data);
}

function tickAllowance() {
  const el = $("allowance");
  const t = state.turn;
  if (t && !t.ended && t.records.length) scheduleDraw(t);
  // Written only when it changes: a no-op write still costs the page a
  // style pass over every row of a large table.
  if (!t || !t.streaming || !state.server) {
    if (!el.hidden) el.hidden = true;
    return;
  }
  const left = state.server.stream_timeout_ms - (Date.now() - t.beat);
  if (el.hidden) el.hidden = false;
  const text = `watchdog ${Math.max(0, left / 1000).toFixed(1)} s`;
  if (el.textContent !== text) el.textContent = text;
  const low = left < state.server.stream_timeout_ms / 4;
  if (el.classList.contains("low") !== low) el.classList.toggle("low", low);
}

async function act(what, call) {
  $("action-result").textContent = `${what}…`;
  try {
    $("action-result").textContent = `${what}: ${await call()}`;
  } catch (e) {
    if (e instanceof Refused) return hooks.signOut("The token was refused.");
    $("action-result").textContent = `${what}: ${e.message}`;
  }
}

/**
 * Sends the box's message to the open session (`POST /v1/turns`, by its
 * workspace for a workspace session, else by its key) and follows the
 * turn it makes.
 */
async function send() {
  const key = $("session-key").dataset.key;
  const message = $("send-message").value;
  if (!key || !message.trim()) return;
  const view = state.sessionView && state.sessionView.key === key ? state.sessionView : {};
  const body = view.workspace ? { workspace: view.workspace, message } : { key, message };
  const button = $("send-button");
  button.disabled = true;
  $("send-result").textContent = "sending…";
  try {
    const created = await api("POST", "/v1/turns", body);
    $("send-message").value = "";
    $("send-result").textContent = `sent: turn ${created.id}`;
    if (!state.turn || state.turn.id !== created.id) followTurn(key, created.id);
    if (state.turn && state.turn.id === created.id && !state.turn.summary) {
      state.turn.prompt = message.slice(0, 2048);
      showTurnMeta(state.turn);
    }
  } catch (e) {
    if (e instanceof Refused) return hooks.signOut("The token was refused.");
    $("send-result").textContent = `not sent: ${e.message}`;
  } finally {
    button.disabled = false;
  }
}

export function wireTurn() {
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
  $("send-form").addEventListener("submit", (event) => {
    event.preventDefault();
    send();
  });
  $("send-message").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) {
      event.preventDefault();
      send();
    }
  });
  setInterval(tickAllowance, 100);
}
