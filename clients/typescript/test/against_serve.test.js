// The client against a real `warden serve` on `warden mock`, started by
// crates/cli/tests/it/client_packages_against_serve.rs (the package in this
// tree) and crates/cli/tests/it/clients_installed_as_their_readmes_say.rs (the
// package as its README installs it: `@warden/client` is then the
// installed one), which set WARDEN_URL, WARDEN_FLAKY_URL (the same server
// through a relay that cuts each turn's first event stream mid-reply),
// WARDEN_TOKEN, WARDEN_WORKSPACE and WARDEN_QUIET_MODEL (a model whose
// reply the mock holds 20 s quiet, pings only). The mock's first request
// stalls mid-text (the server's watchdog, 1 s, kills it and the reply is
// continued). Tests run in order.

import assert from "node:assert/strict";
import { createServer } from "node:net";
import { test } from "node:test";

import {
  Conflict,
  ConnectionLost,
  IdempotencyKeyReused,
  InvalidRequest,
  NotFound,
  TurnFailed,
  Unauthorized,
  Unavailable,
  Warden,
  WardenError,
} from "@warden/client";

const { WARDEN_URL, WARDEN_FLAKY_URL, WARDEN_TOKEN, WARDEN_WORKSPACE, WARDEN_QUIET_MODEL } = process.env;

const reply = (message) => `Hello from warden-mock. Your last message had ${message.length} characters.`;

/** The text a client shows: `retrying`/`restarting` drop it, `continuing` keeps it. */
function shown(events) {
  let text = "";
  for (const e of events) {
    if (e.type === "text") text += e.data.text;
    else if ((e.type === "retrying" || e.type === "restarting") && e.data.discard) text = "";
  }
  return text;
}

async function collect(turn) {
  const events = [];
  for await (const e of turn) events.push(e);
  return events;
}

/** `promise`, or a rejection naming `what` after `ms`: no test waits unbounded. */
function within(ms, what, promise) {
  let timer;
  const late = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what}: not settled within ${ms} ms`)), ms);
  });
  return Promise.race([promise, late]).finally(() => clearTimeout(timer));
}

const ids = (events) => events.map((e) => e.id);
const oneToN = (n) => Array.from({ length: n }, (_, i) => i + 1);

test("a quiet pause of twenty seconds upstream is waited out", async () => {
  // The upstream sends only pings for 20 s: the server's 15 s keep-alive
  // comment reaches the client mid-turn.
  const w = new Warden(WARDEN_URL, WARDEN_TOKEN);
  const message = "think it over for a while";
  const began = Date.now();
  const events = await collect(await w.send(message, { key: "quiet", model: WARDEN_QUIET_MODEL }));
  assert.ok(Date.now() - began > 16_000, "the pause outlasted the server's keep-alive");
  assert.equal(events.at(-1).type, "done", JSON.stringify(events));
  assert.equal(shown(events), reply(message));
  assert.deepEqual(ids(events), oneToN(events.length));
});

test("a stalled reply is continued and shown once", async () => {
  const w = new Warden(WARDEN_URL, WARDEN_TOKEN);
  const events = await collect(await w.send("hello", { key: "stalled" }));
  assert.equal(events.at(-1).type, "done");
  assert.ok(events.some((e) => e.type === "continuing" || e.type === "retrying"), JSON.stringify(events));
  assert.equal(events.at(-1).data.text, reply("hello"));
  assert.equal(shown(events), reply("hello"));
  assert.deepEqual(ids(events), oneToN(events.length));
});

test("a dropped connection is re-attached with nothing lost or repeated", async () => {
  const w = new Warden(WARDEN_FLAKY_URL, WARDEN_TOKEN);
  const message = "a longer message, so the reply has more to say";
  const turn = await w.send(message, { workspace: WARDEN_WORKSPACE, model: "claude-x" });
  const events = await collect(turn);
  assert.ok(turn.reattached >= 1, "the relay cut the stream");
  assert.deepEqual(ids(events), oneToN(events.length));
  assert.equal(events[0].type, "started");
  assert.equal(events.at(-1).type, "done");
  assert.equal(shown(events), reply(message));
});

test("a cancelled turn ends with its error", async () => {
  const w = new Warden(WARDEN_URL, WARDEN_TOKEN);
  const first = await w.send("first, long enough to be running ".repeat(4), { key: "cancel" });
  const second = await w.send("second", { key: "cancel" });
  assert.equal(await second.cancel(), true);
  const events = await collect(second);
  assert.equal(events.at(-1).type, "error");
  assert.equal(events.at(-1).data.code, "ECANCELLED");
  assert.equal(events.at(-1).data.exit, 130);
  await assert.rejects(
    w.turn(second.id).result(),
    (e) =>
      e instanceof TurnFailed &&
      e instanceof WardenError &&
      e.code === "ECANCELLED" &&
      e.data.code === "ECANCELLED" &&
      e.exit === 130,
  );
  assert.equal((await first.result()).text, reply("first, long enough to be running ".repeat(4)));
});

test("sessions: list, get, reset", async () => {
  const w = new Warden(WARDEN_URL, WARDEN_TOKEN);
  await (await w.send("hi", { key: "listed" })).result();
  assert.ok((await w.sessions()).some((s) => s.key === "listed"));
  assert.equal((await w.session("listed")).key, "listed");
  await w.reset("listed");
  await assert.rejects(w.reset("never-seen"), NotFound);
  await assert.rejects(w.session("never-seen"), NotFound);
  const detailed = (await w.sessions({ detail: true })).find((s) => s.key === "listed");
  assert.ok(detailed && "status" in detailed, JSON.stringify(detailed));
  assert.equal(await w.recover("listed", "retry"), false, "nothing was stuck");
  await assert.rejects(w.recover("listed", "sideways"), InvalidRequest);
  const server = await w.server();
  assert.equal(server.agent, "anthropic");
  assert.ok(server.version);
  assert.match(await w.metrics(), /warden_turns_total/);
});

test("a turn followed from an event it saw yields only the ones after it", async () => {
  const w = new Warden(WARDEN_URL, WARDEN_TOKEN);
  const turn = await w.send("typed", { key: "typed" });
  const events = await collect(turn);
  const rest = await collect(w.turn(turn.id, { lastEventId: 2 }));
  assert.deepEqual(ids(rest), ids(events).slice(2));
  assert.equal(rest.at(-1).type, "done");
  if (events.at(-1).data.at !== undefined) assert.ok(events.at(-1).at instanceof Date, "a server that stamps its events");
});

test("result() after iterating a turn to done answers at once with its text", async () => {
  const w = new Warden(WARDEN_URL, WARDEN_TOKEN);
  const turn = await w.send("iterated", { key: "iterated" });
  const events = await within(30_000, "the turn", collect(turn));
  assert.equal(events.at(-1).type, "done");
  const began = Date.now();
  const done = await within(20_000, "result() after done", turn.result());
  const took = Date.now() - began;
  assert.ok(took < 1000, `result() after done took ${took} ms`);
  assert.equal(done.text, reply("iterated"));
  assert.deepEqual(await within(20_000, "iterating again", collect(turn)), [], "nothing after its last event");
});

test("aborting mid-turn ends its event stream with the standard AbortError", async () => {
  const w = new Warden(WARDEN_URL, WARDEN_TOKEN);
  const controller = new AbortController();
  // The quiet model: the turn is still running (20 s) when it is aborted.
  const turn = await w.send("abort me", { key: "aborted", model: WARDEN_QUIET_MODEL, signal: controller.signal });
  const seen = [];
  const following = (async () => {
    for await (const event of turn) {
      seen.push(event);
      controller.abort();
    }
  })();
  const began = Date.now();
  await assert.rejects(within(5000, "the aborted stream", following), (e) => e instanceof DOMException && e.name === "AbortError");
  assert.ok(Date.now() - began < 2000, `it ended ${Date.now() - began} ms after the abort`);
  assert.equal(seen.length, 1, "no event after the abort");
  // Aborting stops following the turn, not the turn: it is still live.
  assert.equal(await turn.cancel(), true);
  await assert.rejects(w.send("never", { key: "aborted", signal: AbortSignal.abort() }), (e) => e.name === "AbortError");
  const client = new AbortController();
  const lifecycle = (async () => {
    for await (const _ of new Warden(WARDEN_URL, WARDEN_TOKEN, { signal: client.signal }).events());
  })();
  setTimeout(() => client.abort(), 200);
  await assert.rejects(within(5000, "the aborted lifecycle stream", lifecycle), (e) => e.name === "AbortError");
});

test("a request past its timeout rejects with the standard TimeoutError", async () => {
  // A server that takes the request and never answers.
  const sockets = [];
  const server = createServer((socket) => sockets.push(socket));
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  try {
    const url = `http://127.0.0.1:${server.address().port}`;
    const began = Date.now();
    await assert.rejects(within(5000, "server()", new Warden(url, WARDEN_TOKEN).server({ timeout: 300 })), (e) => e.name === "TimeoutError");
    await assert.rejects(
      within(5000, "send()", new Warden(url, WARDEN_TOKEN, { timeout: 300 }).send("hi", { key: "late" })),
      (e) => e.name === "TimeoutError",
    );
    assert.ok(Date.now() - began < 3000, `both timed out in ${Date.now() - began} ms`);
  } finally {
    for (const socket of sockets) socket.destroy();
    server.close();
  }
});

test("errors are typed", async () => {
  await assert.rejects(new Warden(WARDEN_URL, "not-the-token").sessions(), (e) => e instanceof Unauthorized && e.status === 401);
  const w = new Warden(WARDEN_URL, WARDEN_TOKEN);
  await assert.rejects(w.send("hi", { workspace: "relative/path" }), (e) => e instanceof InvalidRequest && e.type === "invalid_workspace");
  await assert.rejects(
    w.send("hi", { key: "typed", agent: "claude-code" }),
    (e) => e instanceof Conflict && e.type === "agent_mismatch" && e.body.agent === "anthropic",
  );
  await assert.rejects(w.send("hi", {}), (e) => e instanceof InvalidRequest && e.status === 0);
  // A key the server would refuse: refused here, nothing sent.
  for (const bad of ["", "commande-n°1", "two words", "x".repeat(256)]) {
    await assert.rejects(
      w.send("hi", { key: "never-sent", idempotencyKey: bad }),
      (e) => e instanceof InvalidRequest && e.type === "invalid_idempotency_key",
      JSON.stringify(bad),
    );
  }
  await assert.rejects(w.session("never-sent"), NotFound);
});

/** A port nothing listens on. */
async function closedPort() {
  const server = createServer();
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address();
  await new Promise((resolve) => server.close(resolve));
  return port;
}

test("a server that cannot be reached is unavailable", async () => {
  const w = new Warden(`http://127.0.0.1:${await closedPort()}`, WARDEN_TOKEN);
  await assert.rejects(w.server(), (e) => e instanceof Unavailable && e.status === 0 && e.type === "unreachable" && e.cause !== undefined);
  // After its retries.
  await assert.rejects(w.send("hi", { key: "nowhere" }), (e) => e instanceof Unavailable && e.cause !== undefined);
});

test("a connection cut before its answer is lost", async () => {
  // A server that takes the request and hangs up without answering.
  const server = createServer((socket) => socket.once("data", () => socket.destroy()));
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  try {
    const w = new Warden(`http://127.0.0.1:${server.address().port}`, WARDEN_TOKEN);
    await assert.rejects(w.server(), (e) => e instanceof ConnectionLost && e.status === 0 && e.cause !== undefined);
  } finally {
    server.close();
  }
});

test("lifecycle events replay after a reset", async () => {
  const w = new Warden(WARDEN_URL, WARDEN_TOKEN);
  const seen = [];
  for await (const e of w.events(1)) {
    seen.push(e);
    if (e.type === "turn_finished") break;
  }
  assert.equal(seen[0].type, "reset");
  assert.equal(seen[0].data.reason, "restarted");
  assert.equal(seen[0].id, null);
  assert.ok(seen.slice(1).every((e) => e.id !== null));
});

test("a send repeated with its idempotency key gets the same turn", async () => {
  const w = new Warden(WARDEN_URL, WARDEN_TOKEN);
  const first = await w.send("once", { key: "idem-ts", idempotencyKey: "ts-order-1" });
  const again = await w.send("once", { key: "idem-ts", idempotencyKey: "ts-order-1" });
  assert.equal(again.id, first.id);
  // The key with another message: refused, typed, nothing sent.
  await assert.rejects(
    w.send("twice", { key: "idem-ts", idempotencyKey: "ts-order-1" }),
    (e) =>
      e instanceof IdempotencyKeyReused &&
      e instanceof InvalidRequest &&
      e.status === 422 &&
      e.type === "idempotency_key_reused" &&
      e.body.id === first.id,
  );
  assert.equal((await first.result()).text, reply("once"));
  const other = await w.send("once", { key: "idem-ts" });
  assert.notEqual(other.id, first.id, "without the key, another turn");
  await other.result();
  const turns = await w.turns("idem-ts");
  assert.deepEqual(
    turns.map((t) => t.id),
    [other.id, first.id],
  );
  assert.ok(turns.every((t) => t.outcome === "done"));
});
