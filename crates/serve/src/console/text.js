// How the page writes text: only ever as text (textContent, never markup),
// names with their direction controls made visible, times and sizes.


/** Sets `el`'s text (and class) only where it changed: no layout work for the rest. */
export function put(el, text, className) {
  if (el.textContent !== text) el.textContent = text;
  if (className !== undefined && el.className !== className) el.className = className;
}

/** Invisible characters that change the direction of the text around them. */
const BIDI_CONTROLS = /[\u061C\u200E\u200F\u202A-\u202E\u2066-\u2069]/g;

/**
 * A name as shown: its direction controls made visible (`⟨U+202E⟩`), so a
 * workspace cannot pass for another one (`evil\u202Egnp.exe` shows as
 * `evil⟨U+202E⟩gnp.exe`, not `evilexe.png`).
 */
export function shown(text) {
  return String(text).replace(BIDI_CONTROLS, (c) => `⟨U+${c.codePointAt(0).toString(16).toUpperCase().padStart(4, "0")}⟩`);
}

/**
 * Fills `element` with "label value · label value …", each value in its
 * own `<bdi>`: a value's text (a workspace path, an id the agent chose)
 * may hold right-to-left characters or overrides (U+202E), and isolated
 * they cannot reorder the labels or the values after them.
 */
export function metaLine(element, parts) {
  element.textContent = "";
  for (const part of parts.filter(Boolean)) {
    if (element.childNodes.length > 0) element.append(" · ");
    const value = document.createElement("bdi");
    value.textContent = shown(part[1]);
    element.append(`${part[0]} `, value);
  }
}

/** `HH:MM:SS.mmm`, local time. */
export function clock(ms) {
  const d = new Date(ms);
  const p = (n, w = 2) => String(n).padStart(w, "0");
  return `${p(d.getHours())}:${p(d.getMinutes())}:${p(d.getSeconds())}.${p(d.getMilliseconds(), 3)}`;
}

/** A time with its date when it is not today's. */
export function when(ms) {
  const d = new Date(ms);
  const today = new Date().toDateString() === d.toDateString();
  return today ? clock(ms) : `${d.toISOString().slice(0, 10)} ${clock(ms)}`;
}

export function seconds(ms) {
  return `${(ms / 1000).toFixed(1)} s`;
}

export function ago(ms) {
  if (!ms) return "";
  const s = Math.max(0, (Date.now() - ms) / 1000);
  if (s < 60) return `${s.toFixed(0)} s ago`;
  if (s < 3600) return `${(s / 60).toFixed(0)} min ago`;
  return `${(s / 3600).toFixed(1)} h ago`;
}

const count = (n) => Number(n).toLocaleString("en-US");

/**
 * How full a context window is, as words: `87 %`, or past the window
 * (more than 100 %) `over the window: 250,000 / 200,000` with the numbers.
 */
export function contextText(context, unit = "") {
  if (!context || context.percent == null) return "";
  const numbers = context.tokens != null && context.window != null ? `${count(context.tokens)} / ${count(context.window)}${unit}` : "";
  if (context.percent > 100) return `over the window: ${numbers || `${context.percent} %`}`;
  return numbers && unit ? `${context.percent} % (${numbers})` : `${context.percent}`;
}

/** A session's table cells (what sorting and filtering read). */
export function cells(v) {
  // A turn runs; else messages wait (for the session to start, or on a
  // node that stopped); else the record's own status.
  const busy = v.turn && v.turn.id != null ? "running" : v.pending > 0 ? "waiting" : null;
  const status = busy || v.status || "unknown";
  return {
    key: v.workspace || v.key,
    // The session's own (a server may run several agents).
    agent: v.agent || "",
    model: v.model || "",
    status,
    ctx: v.context && v.context.percent != null ? v.context.percent : null,
    last: v.last_active_ms || 0,
    restarts: v.restarts || 0,
    node: v.owner ? `${v.owner} · ${v.epoch}` : "",
    pending: v.pending || 0,
  };
}
