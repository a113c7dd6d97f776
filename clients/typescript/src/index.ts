/**
 * A client for `warden serve`: run turns on long-lived LLM agent sessions
 * over HTTP + SSE, from Node 20+ or a browser (fetch and a standard SSE
 * parser). A dropped connection is re-attached with `Last-Event-ID` on its
 * own — no event lost or repeated — and every failure is a typed
 * `WardenError`.
 */

import type { components } from "./api.js";
import {
  Conflict,
  ConnectionLost,
  InvalidRequest,
  TurnFailed,
  Unavailable,
  WardenError,
  errorFrom,
  gaveUp,
  transportError,
  type TurnErrorData,
} from "./errors.js";
import { messages, parseAt } from "./sse.js";

export {
  Conflict,
  ConnectionLost,
  IdempotencyKeyReused,
  InvalidRequest,
  NotFound,
  TurnFailed,
  Unauthorized,
  Unavailable,
  WardenError,
  type TurnErrorData,
} from "./errors.js";
export { STREAM_IDLE_MS } from "./sse.js";

/** The API's schemas, generated from `/openapi.json` (`clients/openapi.json`, `npm run gen`). */
export type Schemas = components["schemas"];

/** The agent a session runs (`claude-code`, `codex`, …): the OpenAPI document's enum. */
export type Agent = Schemas["Agent"];

/** The types of a turn's events (the SSE `event:`), as the API document lists them. */
export type TurnEventType = Schemas["TurnEvent"];

/** A turn event's `data`, as the API document types it (`TurnEvents`): its fields and `at` (RFC 3339, absent from an older server). */
export type TurnEventData<K extends TurnEventType> = NonNullable<Schemas["TurnEvents"][K]>;

/**
 * One event of a turn: its number (unique and increasing within the turn,
 * from 1), its type, its data and `at`, when the server made it (`null`
 * from a server older than that field). Each type's data is the document's
 * schema for it, so a field the server adds or renames is a type error here.
 */
export type TurnEvent = { id: number; at: Date | null } & {
  [K in TurnEventType]: { type: K; data: TurnEventData<K> };
}[TurnEventType];

/** The `done` event's data: the turn's answer. */
export type Done = TurnEventData<"done">;

/** The types of `GET /v1/events`' events: every published transition under its one name, and `reset`, `lagged`. */
export type LifecycleEventType = Schemas["LifecycleEvent"];

/** A lifecycle event's `data`, as the API document types it (`LifecycleEvents`). */
export type LifecycleEventData<K extends LifecycleEventType> = NonNullable<Schemas["LifecycleEvents"][K]>;

/** One event of `GET /v1/events`; `reset` (no id) says events were missed or the server restarted. */
export type LifecycleEvent = {
  id: number | null;
  /** When the server made it; `null` from an older server. */
  at: Date | null;
} & { [K in LifecycleEventType]: { type: K; data: LifecycleEventData<K> } }[LifecycleEventType];

/** Consecutive failed re-attaches before a stream gives up. */
export const MAX_REATTACHES = 10;

const backoff = (failures: number) => Math.min(2000, 200 * 2 ** Math.max(0, failures - 1));

/** Waits `ms`; rejects with `signal`'s reason as soon as it aborts. */
function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const aborted = () => {
      clearTimeout(timer);
      reject(signal?.reason);
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", aborted);
      resolve();
    }, ms);
    signal?.addEventListener("abort", aborted, { once: true });
  });
}

/** `error`, unless `signal` aborted: then its reason (the `AbortError`, or `TimeoutError`), as `fetch` rejects. */
function unlessAborted(error: unknown, signal: AbortSignal | undefined): unknown {
  return signal?.aborted ? signal.reason : error;
}

/** One signal that aborts when any of `signals` does; `undefined` for none. */
function anySignal(signals: (AbortSignal | undefined)[]): AbortSignal | undefined {
  const some = signals.filter((s): s is AbortSignal => s !== undefined);
  return some.length <= 1 ? some[0] : AbortSignal.any(some);
}

/**
 * What every call takes, as `fetch` users expect: `signal` aborts it (its
 * promise rejects, or its event stream ends by throwing, with the signal's
 * reason: an `AbortError` `DOMException` unless you gave another);
 * `timeout`, in milliseconds, bounds a request's call (a `TimeoutError`
 * `DOMException` past it, as `AbortSignal.timeout`) but not an event stream,
 * which may rightly run for minutes (a dead one is cut after
 * `STREAM_IDLE_MS` of silence and re-attached).
 */
export interface CallOptions {
  signal?: AbortSignal;
  timeout?: number;
}

/** An event's data: a JSON object (a typed error when it is not JSON). */
function eventData(raw: string, what: string): Record<string, unknown> {
  let data: unknown;
  try {
    data = JSON.parse(raw);
  } catch (e) {
    throw new WardenError(200, "invalid_event", `${what}: data that is not JSON: ${raw.slice(0, 200)}`, {}, null, {
      cause: e,
    });
  }
  return data !== null && typeof data === "object" && !Array.isArray(data)
    ? (data as Record<string, unknown>)
    : { value: data };
}

/**
 * What `send` takes: the body of `POST /v1/turns` but the message —
 * `workspace` (an absolute directory) or `key` (a name), `model`, `agent` —
 * and the request's `idempotencyKey`.
 */
export type SendOptions = Omit<Schemas["NewTurn"], "message"> & CallOptions & {
  /**
   * Names this message so that sending it again returns its turn instead of
   * a second one (default: a new random UUID per `send` call, which the
   * call's own retries reuse). Keep it, and pass it again, to retry a send
   * whose outcome you did not learn (your process died mid-call). 1 to 255
   * visible ASCII characters: another throws `InvalidRequest` before
   * anything is sent.
   */
  idempotencyKey?: string;
};

/**
 * What `turn` takes: the session's `key` (informative), `lastEventId`, to
 * follow it from after that event, and `signal`, which ends following it.
 */
export interface TurnOptions {
  key?: string;
  lastEventId?: number;
  signal?: AbortSignal;
}

/** Tries of one `send` (a connection refused or dropped, or its message being re-delivered after a restart). */
export const SEND_TRIES = 5;

/** The `Idempotency-Key` header's value; `InvalidRequest` for one the server refuses. */
function idempotencyKey(key: string | undefined): string {
  if (key === undefined) return crypto.randomUUID();
  if (typeof key !== "string" || key.length === 0 || key.length > 255 || !/^[!-~]+$/.test(key)) {
    throw new InvalidRequest(
      0,
      "invalid_idempotency_key",
      `an idempotency key is 1 to 255 visible ASCII characters (! to ~), not ${JSON.stringify(String(key)).slice(0, 80)}`,
    );
  }
  return key;
}

/**
 * A turn: `for await (const event of turn)`, re-attached by itself after a
 * dropped connection, until its last event (`done` or `error`), which it
 * keeps: iterating it again then yields nothing more, and `result()`
 * answers at once. The signal of the `send` or `turn` call that made it
 * (and the client's) ends following it: the loop throws its reason.
 */
export class Turn implements AsyncIterable<TurnEvent> {
  /** How many times its stream broke and was re-attached. */
  reattached = 0;
  /** Its last event (`done` or `error`), once seen. */
  #end: TurnEvent | undefined;

  constructor(
    private readonly warden: Warden,
    readonly id: string,
    readonly key: string,
    /** The last event's id: where the next (re-)attach goes on from. */
    public lastEventId = 0,
    private readonly signal?: AbortSignal,
  ) {}

  async *[Symbol.asyncIterator](): AsyncIterator<TurnEvent> {
    if (this.#end) return; // it ended: there is nothing after its last event
    const signal = this.signal;
    let failures = 0;
    let lastError: unknown;
    const path = `/v1/turns/${encodeURIComponent(this.id)}/events`;
    while (true) {
      const headers: Record<string, string> = { accept: "text/event-stream" };
      if (this.lastEventId) headers["last-event-id"] = String(this.lastEventId);
      let response: Response | undefined;
      try {
        response = await this.warden.fetch(path, { headers, signal });
      } catch (e) {
        if (signal?.aborted) throw signal.reason;
        lastError = e; // the connection failed: re-attach below
      }
      if (response && response.status !== 200) {
        const error = await errorFrom(response);
        if (signal?.aborted) throw signal.reason;
        if (error instanceof Unavailable && failures < MAX_REATTACHES) {
          failures += 1;
          await sleep(error.retryAfter !== null ? error.retryAfter * 1000 : backoff(failures), signal);
          continue;
        }
        throw error;
      }
      if (response) {
        lastError = undefined;
        try {
          for await (const m of messages(response)) {
            signal?.throwIfAborted(); // an event already read is not given after the abort
            if (!m.id) continue;
            const data = eventData(m.data, `a turn's ${m.event} event`);
            const event = { id: Number(m.id), type: m.event, data, at: parseAt(data.at) } as unknown as TurnEvent;
            this.lastEventId = event.id;
            failures = 0;
            const last = event.type === "done" || event.type === "error";
            if (last) this.#end = event; // before the caller may stop at it
            yield event;
            if (last) return;
          }
        } catch (e) {
          if (signal?.aborted) throw signal.reason;
          if (e instanceof WardenError) throw e;
          lastError = e; // the stream broke: re-attach below
        }
      }
      failures += 1;
      this.reattached += 1;
      if (failures > MAX_REATTACHES) throw gaveUp(`turn ${this.id}`, failures, lastError);
      await sleep(backoff(failures), signal);
    }
  }

  /** Follows the turn to its end: its `done` data, or `TurnFailed`; at once when it was already followed to its end. */
  async result(): Promise<Done> {
    for await (const _ of this);
    const last = this.#end;
    if (last?.type === "done") return last.data;
    if (last?.type === "error") throw new TurnFailed(last.data);
    throw new ConnectionLost("the turn's stream ended without its last event");
  }

  /** Cancels the turn (queued or running); whether it was still live. */
  async cancel(options: CallOptions = {}): Promise<boolean> {
    const path = `/v1/turns/${encodeURIComponent(this.id)}`;
    const body = await this.warden.request<Schemas["TurnCancelled"]>("DELETE", path, undefined, {}, options);
    return body.cancelled;
  }
}

/** A session of `sessions({ detail: true })`: its summary and the fields of `session(key)`. */
export type SessionDetail = Schemas["SessionSummary"] & Partial<Schemas["Session"]>;

/** What a `Warden` takes: a `signal` that aborts every call and stream of it, and a default `timeout` (ms) of its requests (see `CallOptions`). */
export type WardenOptions = CallOptions;

/** A client of one `warden serve` node. */
export class Warden {
  private readonly base: string;

  constructor(
    baseUrl: string,
    private readonly token: string,
    private readonly options: WardenOptions = {},
  ) {
    this.base = baseUrl.replace(/\/+$/, "");
  }

  /** The signal of a call made with `options`: the client's, the call's and, unless it is a stream's, the timeout's. */
  private signalOf(options: CallOptions, stream = false): AbortSignal | undefined {
    const timeout = stream ? undefined : (options.timeout ?? this.options.timeout);
    return anySignal([this.options.signal, options.signal, timeout === undefined ? undefined : AbortSignal.timeout(timeout)]);
  }

  /** `fetch` with the token (for the turn streams); transport failures stay as fetch throws them. */
  fetch(path: string, init: RequestInit = {}): Promise<Response> {
    const headers = new Headers(init.headers);
    headers.set("authorization", `Bearer ${this.token}`);
    return fetch(`${this.base}${path}`, { ...init, headers });
  }

  /** A request answered with success; a typed error for anything else (the signal's reason once it aborted). */
  private async answer(
    method: string,
    path: string,
    body: unknown,
    headers: Record<string, string>,
    signal: AbortSignal | undefined,
  ): Promise<Response> {
    const init: RequestInit = { method, headers: { ...headers }, signal };
    if (body !== undefined) {
      init.body = JSON.stringify(body);
      init.headers = { ...headers, "content-type": "application/json" };
    }
    let response: Response;
    try {
      response = await this.fetch(path, init);
    } catch (e) {
      throw unlessAborted(transportError(e, `${method} ${path}`), signal);
    }
    if (response.status >= 400) {
      const error = await errorFrom(response);
      throw unlessAborted(error, signal);
    }
    return response;
  }

  /** A JSON request; a typed error for an error answer or a failed connection (the signal's reason once it aborted). */
  async request<T = Record<string, any>>(
    method: string,
    path: string,
    body?: unknown,
    headers: Record<string, string> = {},
    options: CallOptions = {},
  ): Promise<T> {
    return this.json<T>(method, path, body, headers, this.signalOf(options));
  }

  /** `request` with its signal made. */
  private async json<T>(
    method: string,
    path: string,
    body: unknown,
    headers: Record<string, string>,
    signal: AbortSignal | undefined,
  ): Promise<T> {
    const response = await this.answer(method, path, body, headers, signal);
    let text: string;
    try {
      text = await response.text();
    } catch (e) {
      throw unlessAborted(transportError(e, `${method} ${path}`), signal);
    }
    try {
      return JSON.parse(text) as T;
    } catch (e) {
      throw new WardenError(response.status, "invalid_response", `not the JSON of warden serve: ${text.slice(0, 200)}`, {}, null, {
        cause: e,
      });
    }
  }

  /**
   * Sends `message` to the session of `workspace` or `key`; resolves once it
   * is durably accepted. Sent with an `Idempotency-Key`, so a dropped
   * connection is retried without risk of a second turn.
   */
  async send(message: string, options: SendOptions): Promise<Turn> {
    const { idempotencyKey: key, signal: callSignal, timeout, ...fields } = options;
    if ((fields.workspace === undefined) === (fields.key === undefined)) {
      throw new InvalidRequest(0, "invalid_request", "give exactly one of workspace or key");
    }
    const body: Schemas["NewTurn"] = { message, ...fields };
    const headers = { "idempotency-key": idempotencyKey(key) };
    // The timeout bounds the call (its retries too), the signal the turn's stream as well.
    const signal = this.signalOf({ signal: callSignal, timeout });
    for (let tries = 1; ; tries += 1) {
      try {
        const created = await this.json<Schemas["TurnCreated"]>("POST", "/v1/turns", body, headers, signal);
        return new Turn(this, created.id, created.key, 0, this.signalOf({ signal: callSignal }, true));
      } catch (e) {
        if (signal?.aborted) throw signal.reason;
        // A connection that failed or broke (status 0), or the message
        // accepted before a restart and being re-delivered: the same key
        // finds its turn. Anything else is the answer.
        const recovering = e instanceof Conflict && e.type === "turn_recovering";
        const transport = (e instanceof Unavailable || e instanceof ConnectionLost) && e.status === 0;
        if (tries >= SEND_TRIES || !(recovering || transport)) throw e;
        await sleep(e instanceof WardenError && e.retryAfter !== null ? e.retryAfter * 1000 : backoff(tries), signal);
      }
    }
  }

  /**
   * A turn sent earlier (by its id), to follow or cancel; with
   * `lastEventId`, following it yields only the events after that one. (A
   * string second argument is the session's key, as before.)
   */
  turn(id: string, options: TurnOptions | string = {}): Turn {
    const { key = "", lastEventId = 0, signal } = typeof options === "string" ? { key: options } : options;
    return new Turn(this, id, key, lastEventId, this.signalOf({ signal }, true));
  }

  /**
   * The sessions running (on a cluster node: every session), each `{key, …}`;
   * with `{ detail: true }` every stored session, running or not, each with
   * the fields of `session(key)`.
   */
  sessions(options?: CallOptions & { detail?: false }): Promise<Schemas["SessionSummary"][]>;
  sessions(options: CallOptions & { detail: true }): Promise<SessionDetail[]>;
  sessions(options?: CallOptions & { detail?: boolean }): Promise<Schemas["SessionSummary"][] | SessionDetail[]>;
  async sessions(options: CallOptions & { detail?: boolean } = {}): Promise<Schemas["SessionSummary"][] | SessionDetail[]> {
    const path = options.detail ? "/v1/sessions?detail=full" : "/v1/sessions";
    return (await this.request<Schemas["SessionList"]>("GET", path, undefined, {}, options)).sessions;
  }

  /** One session's record (and its running turn). */
  session(key: string, options: CallOptions = {}): Promise<Schemas["Session"]> {
    return this.request<Schemas["Session"]>("GET", `/v1/sessions/${encodeURIComponent(key)}`, undefined, {}, options);
  }

  /** The session's recent turns still kept, newest first, with their outcome and final text. */
  async turns(key: string, options: CallOptions = {}): Promise<Schemas["TurnSummary"][]> {
    const path = `/v1/sessions/${encodeURIComponent(key)}/turns`;
    return (await this.request<Schemas["TurnList"]>("GET", path, undefined, {}, options)).turns;
  }

  /** Forgets that the session was given up. */
  async reset(key: string, options: CallOptions = {}): Promise<void> {
    await this.request<Schemas["SessionReset"]>("POST", `/v1/sessions/${encodeURIComponent(key)}/reset`, undefined, {}, options);
  }

  /**
   * Unsticks the session's running turn: `"retry"` stops the attempt as
   * failed so it is retried (conversation kept), `"fresh"` restarts the
   * session without its stored conversation. Whether anything was stuck.
   */
  async recover(key: string, how: "retry" | "fresh", options: CallOptions = {}): Promise<boolean> {
    const path = `/v1/sessions/${encodeURIComponent(key)}/recover?how=${encodeURIComponent(how)}`;
    return (await this.request<Schemas["SessionRecovered"]>("POST", path, undefined, {}, options)).recovered;
  }

  /** What the server says of itself (`GET /v1/server`): version, agent, stream timeout, cluster node… */
  server(options: CallOptions = {}): Promise<Schemas["ServerInfo"]> {
    return this.request<Schemas["ServerInfo"]>("GET", "/v1/server", undefined, {}, options);
  }

  /** The server's Prometheus metrics, as text (`GET /metrics`). */
  async metrics(options: CallOptions = {}): Promise<string> {
    const signal = this.signalOf(options);
    const response = await this.answer("GET", "/metrics", undefined, {}, signal);
    try {
      return await response.text();
    } catch (e) {
      throw unlessAborted(transportError(e, "GET /metrics"), signal);
    }
  }

  /**
   * Every session's lifecycle events, from now or after `lastEventId`;
   * endless (break out of it, or abort `signal`), re-attached from the
   * last event.
   */
  async *events(lastEventId?: number, options: { signal?: AbortSignal } = {}): AsyncGenerator<LifecycleEvent> {
    const signal = this.signalOf(options, true);
    let last = lastEventId;
    let failures = 0;
    let lastError: unknown;
    while (true) {
      const headers: Record<string, string> = { accept: "text/event-stream" };
      if (last !== undefined) headers["last-event-id"] = String(last);
      try {
        const response = await this.fetch("/v1/events", { headers, signal });
        if (response.status !== 200) throw await errorFrom(response);
        lastError = undefined;
        for await (const m of messages(response)) {
          signal?.throwIfAborted();
          const id = m.id ? Number(m.id) : null;
          if (id !== null) last = id;
          failures = 0;
          const data = eventData(m.data, `a ${m.event ?? "message"} event`);
          yield { id, type: m.event ?? "message", data, at: parseAt(data.at) } as unknown as LifecycleEvent;
        }
      } catch (e) {
        if (signal?.aborted) throw signal.reason;
        if (e instanceof WardenError) throw e;
        lastError = e;
      }
      failures += 1;
      if (failures > MAX_REATTACHES) throw gaveUp("the lifecycle stream", failures, lastError);
      await sleep(backoff(failures), signal);
    }
  }
}
