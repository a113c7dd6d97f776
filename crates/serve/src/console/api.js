// The server's API as the page uses it: the token from this tab's
// sessionStorage, sent as `Authorization: Bearer`, never in a URL.

export const TOKEN_KEY = "warden-token";

/** A 401: the token is missing or wrong (the server's message says which). */
export class Refused extends Error {}

/**
 * Whether `error` (thrown by `api`) says the node cannot reach its
 * database: the page's banner says that, not the failed request.
 */
export function databaseAway(error) {
  return error.type === "database_unreachable";
}

export function token() {
  return sessionStorage.getItem(TOKEN_KEY) || "";
}

async function refusal(response) {
  const body = await response.json().catch(() => ({}));
  return new Refused((body.error && body.error.message) || "the token was refused");
}

/** `method path` (with a JSON `body`): the JSON answer, or throws. */
export async function api(method, path, body) {
  const headers = { authorization: `Bearer ${token()}` };
  const init = { method, headers };
  if (body !== undefined) {
    headers["content-type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const response = await fetch(path, init);
  if (response.status === 401) throw await refusal(response);
  const answer = await response.json().catch(() => ({}));
  if (!response.ok) {
    const e = answer.error || {};
    const error = new Error(`${response.status} ${e.type || ""}: ${e.message || response.statusText}`);
    error.type = e.type;
    throw error;
  }
  return answer;
}

/**
 * What the server says to a request without a token: its 401 names the
 * server's token file. `null` when it says nothing of the kind.
 */
export async function tokenHint() {
  try {
    const response = await fetch("/v1/server");
    if (response.status !== 401) return null;
    const body = await response.json();
    return (body.error && body.error.message) || null;
  } catch {
    return null;
  }
}

/** The events of an SSE route, from `after` on: {id, event, data}. */
export async function* sse(path, signal, after) {
  const headers = { authorization: `Bearer ${token()}`, accept: "text/event-stream" };
  if (after) headers["last-event-id"] = String(after);
  const response = await fetch(path, { headers, signal });
  if (response.status === 401) throw await refusal(response);
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
