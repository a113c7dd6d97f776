// The client against canned answers from a local HTTP server: no warden
// needed (`node --test test/offline.test.js`).

import assert from "node:assert/strict";
import { createServer } from "node:http";
import { after, before, test } from "node:test";

import { WardenError, Warden } from "@warden/client";

// A turn's stream as the server writes it through a quiet pause: keep-alive
// comments, an empty `data:` event, fields this client does not know (a
// newer server), `at` on some events and not on others.
const TURN_STREAM =
  'id: 1\nevent: started\ndata: {"attempt":1,"at":"2026-12-05T10:00:00.000Z"}\n\n' +
  ": keep-alive\n\n" +
  "event: text\ndata:\n\n" +
  'id: 2\nevent: text\ndata: {"text":"Hel","at":"2026-12-05T10:00:20.250Z","shiny":[1]}\n\n' +
  ": keep-alive\n\n" +
  'id: 3\nevent: text\ndata: {"text":"lo"}\n\n' +
  'id: 4\nevent: done\ndata: {"turn":1,"text":"Hello","attempts":1,"continuations":0,"context":null,"output_tokens":null}\n\n';

const LIFECYCLE_STREAM =
  ": keep-alive\n\n" +
  "event: ping\ndata:\n\n" +
  'id: 7\nevent: turn_started\ndata: {"key":"k","turn":1,"at":"2026-12-05T10:00:00.000Z"}\n\n' +
  ": keep-alive\n\n" +
  'id: 8\nevent: turn_finished\ndata: {"key":"k","turn":1}\n\n';

let server;
let base;
const lastEventIds = [];

before(async () => {
  server = createServer((req, res) => {
    if (req.url === "/v1/turns/t1/events") {
      lastEventIds.push(req.headers["last-event-id"] ?? null);
      res.writeHead(200, { "content-type": "text/event-stream" });
      res.end(TURN_STREAM);
    } else if (req.url === "/v1/events") {
      res.writeHead(200, { "content-type": "text/event-stream" });
      res.end(LIFECYCLE_STREAM);
    } else if (req.url === "/v1/server") {
      res.writeHead(200, { "content-type": "text/html" });
      res.end("<html>a proxy</html>");
    } else {
      res.writeHead(404, { "content-type": "application/json" });
      res.end('{"error":{"type":"not_found","message":"no"}}');
    }
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  base = `http://127.0.0.1:${server.address().port}`;
});

after(() => server.close());

test("comments and empty events never reach the caller", async () => {
  const w = new Warden(base, "t");
  const events = [];
  for await (const e of w.turn("t1")) events.push(e);
  assert.deepEqual(
    events.map((e) => e.id),
    [1, 2, 3, 4],
  );
  assert.equal(events.filter((e) => e.type === "text").map((e) => e.data.text).join(""), "Hello");
  assert.deepEqual(events[1].data.shiny, [1], "unknown fields are kept");
  const lifecycle = [];
  for await (const e of w.events()) {
    lifecycle.push(e);
    if (e.type === "turn_finished") break;
  }
  assert.deepEqual(
    lifecycle.map((e) => [e.id, e.type]),
    [
      [7, "turn_started"],
      [8, "turn_finished"],
    ],
  );
  assert.equal(lifecycle[0].at.toISOString(), "2026-12-05T10:00:00.000Z");
  assert.equal(lifecycle[1].at, null);
});

test("at is when the server made the event", async () => {
  const events = [];
  for await (const e of new Warden(base, "t").turn("t1")) events.push(e);
  assert.equal(events[1].at - events[0].at, 20_250);
  assert.equal(events[2].at, null, "an event without `at` (an older server)");
});

test("lastEventId is sent when following a turn from it", async () => {
  lastEventIds.length = 0;
  await new Warden(base, "t").turn("t1", { lastEventId: 3 }).result();
  assert.deepEqual(lastEventIds, ["3"]);
});

test("an answer that is not the API's JSON is a WardenError", async () => {
  await assert.rejects(new Warden(base, "t").server(), (e) => e instanceof WardenError && e.type === "invalid_response");
});
