// The cluster: its members, every session's lease, the latest failovers
// and handovers (`GET /v1/cluster`, read from the database, so any node
// shows the whole cluster).

import { api, databaseAway, Refused } from "./api.js";
import { $, hooks } from "./state.js";
import { clock } from "./text.js";

export async function openCluster() {
  // In a database outage the cluster view still answers (what this node
  // last read, `stale`); the sessions' leases do not.
  const [read, leases] = await Promise.allSettled([api("GET", "/v1/cluster"), api("GET", "/v1/sessions")]);
  if ([read, leases].some((r) => r.status === "rejected" && r.reason instanceof Refused)) return hooks.signOut("The token was refused.");
  if (read.status === "rejected") {
    // The banner says the database is away; the rows stay what they were.
    if (!databaseAway(read.reason)) $("cluster-figures").textContent = read.reason.message;
    return;
  }
  const view = read.value;
  $("cluster-node").textContent = view.node ? `(this node: ${view.node})` : "";
  const rtt = view.database_round_trip_ms;
  $("cluster-figures").textContent = `this node: leases held ${view.leases_held} · lost ${view.leases_lost} · taken over ${view.takeovers} · database outages ${view.database_outages} (${view.database_outage_secs.toFixed(1)} s) · database round trip ${rtt == null ? "unreachable" : `${rtt.toFixed(1)} ms`}`;
  $("cluster-wide").textContent = `cluster, last hour: ${wide(view)}${view.stale ? " — as last read: the database cannot be reached" : ""}`;
  fill("nodes-table", view.nodes, (n) => [`${n.node}${n.here ? " (here)" : ""}`, n.state || "–", n.advertise || "", `${n.heartbeat_age_secs.toFixed(1)} s`, String(n.sessions)], [3, 4]);
  for (const row of $("nodes-table").tBodies[0].rows) {
    const cell = row.cells[1];
    cell.className = `state-${cell.textContent}`;
  }
  story(view.moves);
  fill("moves-table", view.moves, (m) => [clock(m.at_ms), m.key, m.kind, `${m.from} → ${m.to}`, String(m.epoch)], [4]);
  if (leases.status === "rejected") return; // the leases stay what they were
  fill("leases-table", leases.value.sessions, (s) => [s.key, s.owner || "–", String(s.epoch), s.lease_remaining_secs == null ? "released" : s.lease_remaining_secs < 0 ? `expired ${(-s.lease_remaining_secs).toFixed(1)} s ago` : `${s.lease_remaining_secs.toFixed(1)} s`], [2, 3]);
}

/**
 * The cluster's moves of the last hour, counted by the database (not by
 * the node answering): "2 failovers (node-b → node-a 2) · 0 handovers".
 */
function wide(view) {
  const counted = (kind, total) => {
    const pairs = view.moved_last_hour.filter((m) => m.kind === kind).map((m) => `${m.from} → ${m.to} ${m.sessions}`);
    return `${total} ${kind}${total === 1 ? "" : "s"}${pairs.length ? ` (${pairs.join(", ")})` : ""}`;
  };
  return `${counted("failover", view.failovers_last_hour)} · ${counted("handover", view.handovers_last_hour)}`;
}

/**
 * What the moves say happened, one line per node that lost sessions:
 * "node-b died (moves from 12:01:07) — 3 sessions taken by node-a, 2 by
 * node-c" (failovers: its leases ran out), or "… left … — handed to …"
 * (handovers). From the latest move of each session, so a session that
 * moved again since counts for its last move only.
 */
function story(moves) {
  const lost = new Map(); // from -> { kind, at, to: Map(node -> count) }
  for (const m of moves) {
    const k = `${m.from}\u0000${m.kind}`;
    const entry = lost.get(k) || { from: m.from, kind: m.kind, at: m.at_ms, to: new Map() };
    entry.at = Math.min(entry.at, m.at_ms);
    entry.to.set(m.to, (entry.to.get(m.to) || 0) + 1);
    lost.set(k, entry);
  }
  const list = $("cluster-story");
  list.textContent = "";
  for (const e of [...lost.values()].sort((a, b) => b.at - a.at)) {
    const failover = e.kind === "failover";
    const parts = [...e.to].map(([node, n], i) => `${n}${i === 0 ? ` session${n === 1 ? "" : "s"} ${failover ? "taken" : "handed"}` : ""} ${failover ? "by" : "to"} ${node}`);
    const li = document.createElement("li");
    li.textContent = `${e.from} ${failover ? "died" : "left"} (moves from ${clock(e.at)}) — ${parts.join(", ")}`;
    list.append(li);
  }
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
