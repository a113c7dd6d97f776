/**
 * A client for `warden serve`: run turns on long-lived LLM agent sessions
 * over HTTP + SSE, from Node 20+ or a browser (fetch and a standard SSE
 * parser). A dropped connection is re-attached with `Last-Event-ID` on its
 * own — no event lost or repeated — and errors are typed from the API's
 * error body.
 */

import { createParser, type EventSourceMessage } from "eventsource-parser";

import type { components } from "./api.js";

/** The API's schemas, generated from `/openapi.json` (`clients/openapi.json`, `npm run gen`). */
export type Schemas = components["schemas"];

/** The types of a turn's events (the SSE `event:`), as the API document lists them. */
export type TurnEventType = Schemas["TurnEvent"];

/** One event of a turn: its number (unique and increasing within the turn, from 1). */
export type TurnEvent =
  | { id: number; type: "queued"; data: { attempt: number; behind?: number } }
  | { id: number; type: "started"; data: { attempt: number } }
  | { id: number; type: "text" | "thinking"; data: { text: string } }
  | { id: number; type: "tool"; data: { id: string; name?: string; state: "started" | "finished" } }
  | {
      id: number;
      type: "retrying" | "continuing";
      data: { failed_attempt: number; delay_ms: number; code: string; discard: boolean; node?: string };
    }
  | { id: number; type: "restarting"; data: { cause: string; notice: string; discard: true } }
  | { id: number; type: "done"; data: Done }
  | { id: number; type: "error"; data: TurnErrorData };

// Every event type of the API document has its shape above (a type error
// here names the one missing), and no shape names a type the API lacks.
const everyEventTyped: [Exclude<TurnEventType, TurnEvent["type"]>, Exclude<TurnEvent["type"], TurnEventType>] extends [never, never]
  ? true
  : never = true;
void everyEventTyped;

/** The `done` event's data: the turn's answer. */
export interface Done {
  turn: number;
  text: string;
  attempts: number;
  continuations: number;
  context: { tokens: number; window: number; percent: number } | null;
  output_tokens: number | null;
}

/** The `error` event's data. `exit`: 3 API, 4 timeout, 5 unavailable, 6 deferred (the message stays pending: do not send it again), 130 cancelled, 1 other. */
export interface TurnErrorData {
  code: string;
  message: string;
  exit: number;
}

/** One event of `GET /v1/events`; `reset` (no id) says events were missed or the server restarted. */
export interface LifecycleEvent {
  id: number | null;
  type: string;
  data: Record<string, unknown>;
}

/** An error answer of the API: its status, `error.type`, message and the whole error object. */
export class WardenError extends Error {
  constructor(
    readonly status: number,
    readonly type: string,
    message: string,
    readonly body: Record<string, unknown> = {},
    readonly retryAfter: number | null = null,
  ) {
    super(`${status} ${type}: ${message}`);
    this.name = new.target.name;
  }
}
/** 400, 413, 415, 422: the request is wrong. */
export class InvalidRequest extends WardenError {}
/**
 * 422 `idempotency_key_reused`: the `idempotencyKey` was first sent with
 * another message, model or agent (its turn is `body.id`); nothing was sent.
 * A key names one message: send a new message with a new key.
 */
export class IdempotencyKeyReused extends InvalidRequest {}
/** 401: no token or the wrong one. */
export class Unauthorized extends WardenError {}
/** 404: no such turn, session or route. */
export class NotFound extends WardenError {}
/** 409: `session_failed`, `agent_mismatch` (`body.agent`) or `turn_recovering` (retried by `send`). */
export class Conflict extends WardenError {}
/** 503: ask again after `retryAfter` seconds. */
export class Unavailable extends WardenError {}
/** The stream kept breaking; the turn may still run: follow it again by its id. */
export class ConnectionLost extends WardenError {
  constructor(message: string) {
    super(0, "connection_lost", message);
  }
}
/** A turn ended with an `error` event. */
export class TurnFailed extends Error {
  constructor(readonly data: TurnErrorData) {
    super(`${data.code}: ${data.message}`);
    this.name = "TurnFailed";
  }
  /** Whether the message stays pending and is answered later. */
  get deferred(): boolean {
    return this.data.exit === 6;
  }
}

const BY_STATUS: Record<number, typeof WardenError> = {
  400: InvalidRequest,
  401: Unauthorized,
  404: NotFound,
  409: Conflict,
  413: InvalidRequest,
  415: InvalidRequest,
  422: InvalidRequest,
  503: Unavailable,
};

/** Error types with a class of their own (a subclass of their status's). */
const BY_TYPE = new Map<string, typeof WardenError>([["idempotency_key_reused", IdempotencyKeyReused]]);

async function errorFrom(response: Response): Promise<WardenError> {
  const text = await response.text();
  let error: Record<string, unknown> = {};
  try {
    const parsed = JSON.parse(text);
    if (parsed && typeof parsed === "object" && parsed.error) error = parsed.error;
  } catch {
    // not JSON: the text is the message
  }
  const header = response.headers.get("retry-after");
  const retryAfter = header !== null && !Number.isNaN(Number(header)) ? Number(header) : null;
  const Kind = BY_TYPE.get(String(error.type)) ?? BY_STATUS[response.status] ?? WardenError;
  return new Kind(
    response.status,
    String(error.type ?? "unknown"),
    String(error.message ?? text.slice(0, 200)),
    error,
    retryAfter,
  );
}

/** Consecutive failed re-attaches before a stream gives up. */
export const MAX_REATTACHES = 10;
/** A stream this long without a byte (the server sends a keep-alive every 15 s) is dead: re-attached. */
export const STREAM_IDLE_MS = 45_000;

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
const backoff = (failures: number) => Math.min(2000, 200 * 2 ** Math.max(0, failures - 1));

/** The SSE messages of a response body, ending when it ends; a body silent for `STREAM_IDLE_MS` is cut. */
async function* messages(response: Response): AsyncGenerator<EventSourceMessage> {
  const queue: EventSourceMessage[] = [];
  const parser = createParser({ onEvent: (m) => queue.push(m) });
  const reader = response.body!.pipeThrough(new TextDecoderStream()).getReader();
  try {
    while (true) {
      let timer: ReturnType<typeof setTimeout> | undefined;
      const idle = new Promise<never>((_, reject) => {
        timer = setTimeout(() => reject(new Error("the stream went silent")), STREAM_IDLE_MS);
      });
      let chunk: ReadableStreamReadResult<string>;
      try {
        chunk = await Promise.race([reader.read(), idle]);
      } finally {
        clearTimeout(timer);
      }
      if (chunk.done) return;
      parser.feed(chunk.value);
      while (queue.length > 0) yield queue.shift()!;
    }
  } finally {
    reader.cancel().catch(() => {});
  }
}

/**
 * What `send` takes: the body of `POST /v1/turns` but the message —
 * `workspace` (an absolute directory) or `key` (a name), `model`, `agent` —
 * and the request's `idempotencyKey`.
 */
export type SendOptions = Omit<Schemas["NewTurn"], "message"> & {
  /**
   * Names this message so that sending it again returns its turn instead of
   * a second one (default: a new random UUID per `send` call, which the
   * call's own retries reuse). Keep it, and pass it again, to retry a send
   * whose outcome you did not learn (your process died mid-call).
   */
  idempotencyKey?: string;
};

/** Tries of one `send` (a dropped connection, or its message being re-delivered after a restart). */
export const SEND_TRIES = 5;

/** A turn: `for await (const event of turn)`, re-attached by itself after a dropped connection. */
export class Turn implements AsyncIterable<TurnEvent> {
  /** The last event's id: where a re-attach goes on from. */
  lastEventId = 0;
  /** How many times its stream broke and was re-attached. */
  reattached = 0;

  constructor(
    private readonly warden: Warden,
    readonly id: string,
    readonly key: string,
  ) {}

  async *[Symbol.asyncIterator](): AsyncIterator<TurnEvent> {
    let failures = 0;
    const path = `/v1/turns/${encodeURIComponent(this.id)}/events`;
    while (true) {
      const headers: Record<string, string> = { accept: "text/event-stream" };
      if (this.lastEventId) headers["last-event-id"] = String(this.lastEventId);
      let response: Response | undefined;
      try {
        response = await this.warden.fetch(path, { headers });
      } catch {
        response = undefined; // the connection failed: re-attach below
      }
      if (response && response.status !== 200) {
        const error = await errorFrom(response);
        if (error instanceof Unavailable && failures < MAX_REATTACHES) {
          failures += 1;
          await sleep(error.retryAfter !== null ? error.retryAfter * 1000 : backoff(failures));
          continue;
        }
        throw error;
      }
      if (response) {
        try {
          for await (const m of messages(response)) {
            if (!m.id) continue;
            const event = { id: Number(m.id), type: m.event, data: JSON.parse(m.data) } as TurnEvent;
            this.lastEventId = event.id;
            failures = 0;
            yield event;
            if (event.type === "done" || event.type === "error") return;
          }
        } catch {
          // the stream broke: re-attach below
        }
      }
      failures += 1;
      this.reattached += 1;
      if (failures > MAX_REATTACHES) {
        throw new ConnectionLost(`turn ${this.id}: the stream broke ${failures} times in a row`);
      }
      await sleep(backoff(failures));
    }
  }

  /** Follows the turn to its end: its `done` data, or `TurnFailed`. */
  async result(): Promise<Done> {
    let last: TurnEvent | undefined;
    for await (const event of this) last = event;
    if (last?.type === "done") return last.data;
    if (last?.type === "error") throw new TurnFailed(last.data);
    throw new ConnectionLost("the turn's stream ended without its last event");
  }

  /** Cancels the turn (queued or running); whether it was still live. */
  async cancel(): Promise<boolean> {
    const body = await this.warden.request<Schemas["TurnCancelled"]>("DELETE", `/v1/turns/${encodeURIComponent(this.id)}`);
    return body.cancelled;
  }
}

/** A client of one `warden serve` node. */
export class Warden {
  private readonly base: string;

  constructor(
    baseUrl: string,
    private readonly token: string,
  ) {
    this.base = baseUrl.replace(/\/+$/, "");
  }

  /** `fetch` with the token (for the turn streams). */
  fetch(path: string, init: RequestInit = {}): Promise<Response> {
    const headers = new Headers(init.headers);
    headers.set("authorization", `Bearer ${this.token}`);
    return fetch(`${this.base}${path}`, { ...init, headers });
  }

  /** A JSON request; a typed error for an error answer. */
  async request<T = Record<string, any>>(
    method: string,
    path: string,
    body?: unknown,
    headers: Record<string, string> = {},
  ): Promise<T> {
    const init: RequestInit = { method, headers: { ...headers } };
    if (body !== undefined) {
      init.body = JSON.stringify(body);
      init.headers = { ...headers, "content-type": "application/json" };
    }
    const response = await this.fetch(path, init);
    if (response.status >= 400) throw await errorFrom(response);
    return (await response.json()) as T;
  }

  /**
   * Sends `message` to the session of `workspace` or `key`; resolves once it
   * is durably accepted. Sent with an `Idempotency-Key`, so a dropped
   * connection is retried without risk of a second turn.
   */
  async send(message: string, options: SendOptions): Promise<Turn> {
    const { idempotencyKey, ...fields } = options;
    if ((fields.workspace === undefined) === (fields.key === undefined)) {
      throw new TypeError("give exactly one of workspace or key");
    }
    const body: Schemas["NewTurn"] = { message, ...fields };
    const headers = { "idempotency-key": idempotencyKey ?? crypto.randomUUID() };
    for (let tries = 1; ; tries += 1) {
      try {
        const created = await this.request<Schemas["TurnCreated"]>("POST", "/v1/turns", body, headers);
        return new Turn(this, created.id, created.key);
      } catch (e) {
        // A connection that failed (fetch's TypeError), or the message
        // accepted before a restart and being re-delivered: the same key
        // finds its turn. Anything else is the answer.
        const recovering = e instanceof Conflict && e.type === "turn_recovering";
        if (tries >= SEND_TRIES || !(recovering || e instanceof TypeError)) throw e;
        await sleep(e instanceof WardenError && e.retryAfter !== null ? e.retryAfter * 1000 : backoff(tries));
      }
    }
  }

  /** A turn sent earlier (by its id), to follow or cancel. */
  turn(id: string, key = ""): Turn {
    return new Turn(this, id, key);
  }

  /** The sessions running (on a cluster node: every session). */
  async sessions(): Promise<Schemas["SessionSummary"][]> {
    return (await this.request<Schemas["SessionList"]>("GET", "/v1/sessions")).sessions;
  }

  /** One session's record (and its running turn). */
  session(key: string): Promise<Schemas["Session"]> {
    return this.request<Schemas["Session"]>("GET", `/v1/sessions/${encodeURIComponent(key)}`);
  }

  /** The session's recent turns still kept, newest first, with their outcome and final text. */
  async turns(key: string): Promise<Schemas["TurnSummary"][]> {
    return (await this.request<Schemas["TurnList"]>("GET", `/v1/sessions/${encodeURIComponent(key)}/turns`)).turns;
  }

  /** Forgets that the session was given up. */
  async reset(key: string): Promise<void> {
    await this.request<Schemas["SessionReset"]>("POST", `/v1/sessions/${encodeURIComponent(key)}/reset`);
  }

  /** Every session's lifecycle events, from now or after `lastEventId`; endless (break out of it), re-attached from the last event. */
  async *events(lastEventId?: number): AsyncGenerator<LifecycleEvent> {
    let last = lastEventId;
    let failures = 0;
    while (true) {
      const headers: Record<string, string> = { accept: "text/event-stream" };
      if (last !== undefined) headers["last-event-id"] = String(last);
      try {
        const response = await this.fetch("/v1/events", { headers });
        if (response.status !== 200) throw await errorFrom(response);
        for await (const m of messages(response)) {
          const id = m.id ? Number(m.id) : null;
          if (id !== null) last = id;
          failures = 0;
          yield { id, type: m.event ?? "message", data: JSON.parse(m.data || "{}") };
        }
      } catch (e) {
        if (e instanceof WardenError) throw e;
      }
      failures += 1;
      if (failures > MAX_REATTACHES) {
        throw new ConnectionLost(`the lifecycle stream broke ${failures} times in a row`);
      }
      await sleep(backoff(failures));
    }
  }
}
