// The warden console: sessions, a live turn, the cluster. No dependencies,
// served by `warden serve` at /ui as a few modules (this one signs in,
// routes and wires the page); talks only to the node that served it (its
// Content-Security-Policy allows nothing else). The token is kept in this
// tab's sessionStorage, sent as `Authorization: Bearer`, never in a URL.

import { api, Refused, TOKEN_KEY, token, tokenHint } from "./api.js";
import { openCluster } from "./cluster.js";
import { watchHealth } from "./health.js";
import { flushStale, followLifecycle, paint, refreshAll, resort } from "./sessions.js";
import { $, hooks, state } from "./state.js";
import { shown } from "./text.js";
import { wireTrace } from "./trace.js";
import { openSession, wireTurn } from "./turn.js";

// ---------- sign in ----------

function show(section) {
  for (const id of ["login", "sessions", "session", "cluster"]) $(id).hidden = id !== section;
  $("nav-sessions").classList.toggle("active", section === "sessions" || section === "session");
  $("nav-cluster").classList.toggle("active", section === "cluster");
}

/**
 * Names the running server's token file on the sign-in form: the page
 * asks the server without a token, and its refusal says where the file is.
 */
async function showTokenHint() {
  const hint = await tokenHint();
  if (token()) return;
  $("login-hint").textContent = hint ? `This server says: ${shown(hint)}` : "";
}

function signOut(message) {
  sessionStorage.removeItem(TOKEN_KEY);
  if (state.live) state.live.abort();
  if (state.turn) state.turn.abort.abort();
  state.live = null;
  state.turn = null;
  state.sessionView = null;
  // Nothing the token showed stays on the page.
  state.sessions.clear();
  state.shown = [];
  state.stale.clear();
  state.dirty.clear();
  $("sessions-table").tBodies[0].textContent = "";
  for (const id of ["reply", "timeline", "bars", "prompt", "turn-meta", "session-meta", "session-key", "action-result", "send-result", "session-count", "cluster-figures", "cluster-wide"]) $(id).textContent = "";
  $("send-message").value = "";
  for (const id of ["turns-table", "nodes-table", "leases-table", "moves-table"]) $(id).tBodies[0].textContent = "";
  $("cluster-story").textContent = "";
  $("nav").hidden = true;
  $("signout").hidden = true;
  state.server = null;
  $("server").textContent = "";
  $("live").textContent = "";
  state.streaming = null;
  $("login-error").textContent = message || "";
  show("login");
  $("token").focus();
  showTokenHint();
}
hooks.signOut = signOut;

async function signIn() {
  if (state.profile) performance.mark("warden.signin");
  try {
    state.server = await api("GET", "/v1/server");
  } catch (e) {
    signOut(e instanceof Refused ? `Refused: ${e.message}.` : `Cannot reach the server: ${e.message}`);
    return;
  }
  const s = state.server;
  $("server").textContent = `v${s.version}${s.agents && s.agents.length ? ` · ${s.agents.join(", ")}` : s.agent ? ` · ${s.agent}` : ""}${s.node ? ` · node ${s.node}` : ""} · watchdog ${(s.stream_timeout_ms / 1000).toFixed(0)} s`;
  $("nav").hidden = false;
  $("nav-cluster").hidden = !s.cluster;
  $("signout").hidden = false;
  $("login-error").textContent = "";
  // First, so a page opened while the node cannot reach its database shows
  // the banner and the mark, not a failed request.
  if (s.cluster) watchHealth();
  try {
    await refreshAll();
  } catch (e) {
    if (e instanceof Refused) {
      signOut(`Refused: ${e.message}.`);
      return;
    }
    // The node cannot list the sessions now (its database away): the
    // banner says so, and the list fills in when it can.
  }
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

// ---------- routing and wiring ----------

function route() {
  if (!token() || !state.server) return;
  const hash = location.hash || "#/sessions";
  const parts = hash.slice(2).split("/").map(decodeURIComponent);
  state.route = parts[0];
  if (parts[0] === "session" && parts[1]) {
    show("session");
    openSession(parts[1], parts[2]);
  } else if (parts[0] === "cluster" && state.server.cluster) {
    show("cluster");
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
  wireTurn();
  wireTrace();
  window.addEventListener("hashchange", route);
  // "last active" ages: redraw the shown rows' relative times now and then.
  setInterval(() => {
    for (const entry of state.shown) entry.drawn = false;
    if (state.shown.length && !state.frame) state.frame = requestAnimationFrame(paint);
  }, 10000);
}

wire();
if (token()) signIn();
else signOut("");
