// Whether this node reaches its database, as `/readyz` says (no token
// needed): while it cannot, a plain banner says so and the live mark stops
// claiming "live" — the rows shown are what the node knew before.

import { $, state } from "./state.js";

/** How often the node is asked. */
const EVERY_MS = 2000;

/** Starts asking (once per page). */
export function watchHealth() {
  if (state.health) return;
  state.health = setInterval(check, EVERY_MS);
  check();
}

async function check() {
  let down;
  try {
    const response = await fetch("/readyz");
    const body = response.ok ? {} : await response.json().catch(() => ({}));
    down = !response.ok && body.error && body.error.type === "database_unreachable";
  } catch {
    return; // the node itself is gone: the lifecycle stream says reconnecting
  }
  if (down === state.databaseDown) return;
  state.databaseDown = down;
  $("db-banner").hidden = !down;
  drawLive();
}

/** The lifecycle stream is connected (`true`) or reconnecting. */
export function markLive(connected) {
  state.streaming = connected;
  drawLive();
}

function drawLive() {
  const live = $("live");
  live.classList.toggle("error", Boolean(state.databaseDown));
  if (state.databaseDown) live.textContent = "● database unreachable";
  else if (state.streaming) live.textContent = "● live";
  else if (state.streaming === false) live.textContent = "○ reconnecting";
  else live.textContent = "";
}
