// The cluster: its members, every session's lease, the latest failovers
// and handovers (`GET /v1/cluster`, read from the database, so any node
// shows the whole cluster).

import { api, Refused } from "./api.js";
import { $, hooks } from "./state.js";
import { clock } from "./text.js";

export async function openCluster() {
  let view;
  let sessions;
  try {
    [view, { sessions }] = await Promise.all([api("GET", "/v1/cluster"), api("GET", "/v1/sessions")]);
  } catch (e) {
    if (e instanceof Refused) return hooks.signOut("The token was refused.");
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
