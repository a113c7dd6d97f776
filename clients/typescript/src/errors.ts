import type { components } from "./api.js";

/**
 * Typed errors: one class per kind of failure, all `WardenError`.
 *
 * An error answer of the server is typed from its `error.type` and status
 * (the catalogue in docs/serve.md); a connection that could not be made is
 * `Unavailable`, one cut before its answer or its stream's end
 * `ConnectionLost` (each with the transport's error as its `cause`); a
 * turn that ended with an `error` event is `TurnFailed`.
 */

/** The `error` event's data, as the API document types it. `exit`: 3 API, 4 timeout, 5 unavailable, 6 deferred (the message stays pending: do not send it again), 130 cancelled, 1 other; `at`: when the server made it (RFC 3339), absent from an older server. */
export type TurnErrorData = components["schemas"]["FailedEvent"];

/**
 * Any failure of the client: its HTTP status (0 when the server gave no
 * answer), `error.type`, message and the whole error object.
 */
export class WardenError extends Error {
  constructor(
    readonly status: number,
    readonly type: string,
    message: string,
    readonly body: Record<string, unknown> = {},
    readonly retryAfter: number | null = null,
    options?: { cause?: unknown },
  ) {
    super(status ? `${status} ${type}: ${message}` : `${type}: ${message}`, options);
    this.name = new.target.name;
  }
}
/**
 * 400, 405, 413, 415, 422: the request is wrong. Also thrown before
 * sending (status 0) for what the client can tell is wrong:
 * `invalid_idempotency_key` (empty, over 255 characters or not visible
 * ASCII), `invalid_request` (neither or both of `workspace` and `key`).
 */
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
/**
 * 503: ask again after `retryAfter` seconds. Also (status 0, type
 * `unreachable`) no connection could be made: the server is down or the
 * URL is wrong; the transport's error is the `cause`.
 */
export class Unavailable extends WardenError {}
/**
 * The connection broke before its answer, or a stream kept breaking
 * (status 0, type `connection_lost`; the transport's error, if any, is the
 * `cause`). A turn may still run: follow it again by its id.
 */
export class ConnectionLost extends WardenError {
  constructor(message: string, options?: { cause?: unknown }) {
    super(0, "connection_lost", message, {}, null, options);
  }
}
/**
 * A turn ended with an `error` event (status 0, type `turn_failed`): its
 * `code`, `exit` class and `data`, the event's whole data.
 */
export class TurnFailed extends WardenError {
  constructor(readonly data: TurnErrorData) {
    super(0, "turn_failed", data.message, { ...data });
    this.message = `${data.code}: ${data.message}`;
  }
  /** The error's code (`ESTREAM_TIMEOUT`, `ECANCELLED`…). */
  get code(): string {
    return this.data.code;
  }
  /** Its exit class. */
  get exit(): number {
    return this.data.exit;
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
  405: InvalidRequest,
  409: Conflict,
  413: InvalidRequest,
  415: InvalidRequest,
  422: InvalidRequest,
  503: Unavailable,
};

/** Error types with a class of their own (a subclass of their status's). */
const BY_TYPE = new Map<string, typeof WardenError>([["idempotency_key_reused", IdempotencyKeyReused]]);

/** The typed error of an error answer. */
export async function errorFrom(response: Response): Promise<WardenError> {
  const text = await response.text().catch(() => "");
  let error: Record<string, unknown> = {};
  try {
    const parsed = JSON.parse(text);
    if (parsed && typeof parsed === "object" && parsed.error && typeof parsed.error === "object") error = parsed.error;
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

/** Node's codes for a connection that could not be made (no request sent). */
const CONNECT_CODES = new Set([
  "ECONNREFUSED",
  "ENOTFOUND",
  "EAI_AGAIN",
  "EHOSTUNREACH",
  "ENETUNREACH",
  "EADDRNOTAVAIL",
  "UND_ERR_CONNECT_TIMEOUT",
]);

/** The error codes in `error`'s cause chain (an AggregateError's too). */
function codes(error: unknown, depth = 0): string[] {
  if (!error || typeof error !== "object" || depth > 5) return [];
  const e = error as { code?: unknown; cause?: unknown; errors?: unknown };
  const own = typeof e.code === "string" ? [e.code] : [];
  const nested = Array.isArray(e.errors) ? e.errors.flatMap((x) => codes(x, depth + 1)) : [];
  return [...own, ...nested, ...codes(e.cause, depth + 1)];
}

/** Whether `error` (from `fetch`) says no connection could be made. */
export function cannotConnect(error: unknown): boolean {
  return codes(error).some((code) => CONNECT_CODES.has(code));
}

/**
 * The typed error of a transport failure while doing `what`:
 * `Unavailable` when no connection could be made, `InvalidRequest` for a
 * URL fetch cannot use, else `ConnectionLost`; `error` is its `cause`.
 */
export function transportError(error: unknown, what: string): WardenError {
  if (error instanceof WardenError) return error;
  const detail = error instanceof Error ? error.message : String(error);
  if (cannotConnect(error)) {
    return new Unavailable(0, "unreachable", `${what}: cannot connect: ${codes(error)[0] ?? detail}`, {}, null, {
      cause: error,
    });
  }
  if (codes(error).includes("ERR_INVALID_URL")) {
    return new InvalidRequest(0, "invalid_url", `${what}: ${detail}`, {}, null, { cause: error });
  }
  const cause = (error as { cause?: unknown })?.cause;
  const why = cause instanceof Error ? `${detail} (${cause.message})` : detail;
  return new ConnectionLost(`${what}: the connection broke: ${why}`, { cause: error });
}

/**
 * The error of a stream that broke `failures` times in a row, the last
 * time with `last` (`undefined`: it ended early).
 */
export function gaveUp(what: string, failures: number, last: unknown): WardenError {
  const message = `${what}: the stream broke ${failures} times in a row`;
  if (last === undefined) return new ConnectionLost(message);
  const error = transportError(last, message);
  return error instanceof InvalidRequest ? new ConnectionLost(error.message, { cause: last }) : error;
}
