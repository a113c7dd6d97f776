/**
 * The SSE layer: the events a response body dispatches, per the SSE spec
 * (eventsource-parser). The server keeps a quiet stream alive with a
 * comment (`: keep-alive`) every 15 s: a comment is no event, and an event
 * whose data is empty carries nothing — neither reaches the caller.
 */

import { createParser, type EventSourceMessage } from "eventsource-parser";

/** A stream this long without a byte (the server sends a keep-alive every 15 s) is dead: re-attached. */
export const STREAM_IDLE_MS = 45_000;

/** The stream went silent for `STREAM_IDLE_MS`. */
export class StreamSilent extends Error {
  constructor() {
    super(`the stream went silent for ${STREAM_IDLE_MS / 1000} s`);
    this.name = "StreamSilent";
  }
}

/** The SSE events of a response body that carry data, ending when it ends; a body silent for `STREAM_IDLE_MS` is cut. */
export async function* messages(response: Response): AsyncGenerator<EventSourceMessage> {
  const queue: EventSourceMessage[] = [];
  const parser = createParser({
    onEvent: (m) => {
      if (m.data !== "") queue.push(m);
    },
  });
  if (!response.body) return;
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  try {
    while (true) {
      let timer: ReturnType<typeof setTimeout> | undefined;
      const idle = new Promise<never>((_, reject) => {
        timer = setTimeout(() => reject(new StreamSilent()), STREAM_IDLE_MS);
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

/** An event's `at` (RFC 3339, the server's clock) as a `Date`; `null` when absent (an older server) or unreadable. */
export function parseAt(value: unknown): Date | null {
  if (typeof value !== "string" || value === "") return null;
  const at = new Date(value);
  return Number.isNaN(at.getTime()) ? null : at;
}
