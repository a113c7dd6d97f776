"""The client against a real `warden serve` on `warden mock`.

Started by crates/cli/tests/it/client_packages_against_serve.rs (the package
from this tree) and crates/cli/tests/it/clients_installed_as_their_readmes_say.rs
(the package as its README installs it), which set: WARDEN_URL (the
server), WARDEN_FLAKY_URL (the same server through a relay that cuts the
first event stream of a turn mid-reply), WARDEN_TOKEN, WARDEN_WORKSPACE
(an existing directory) and WARDEN_QUIET_MODEL (a model whose reply the mock
holds 20 s quiet, pings only). The mock's first request stalls mid-text
(the server's watchdog, 1 s, kills it and the reply is continued); every
later one is answered. Tests run in name order.
"""

import asyncio
import os
import socket
import threading
import time
import unittest

import httpx

import warden_client
from warden_client import (
    AsyncWarden,
    Conflict,
    ConnectionLost,
    Continuing,
    Done,
    Error,
    IdempotencyKeyReused,
    InvalidRequest,
    NotFound,
    Retrying,
    Started,
    Text,
    TurnFailed,
    Unauthorized,
    Unavailable,
    Warden,
    WardenError,
)

URL = os.environ["WARDEN_URL"]
FLAKY_URL = os.environ["WARDEN_FLAKY_URL"]
TOKEN = os.environ["WARDEN_TOKEN"]
WORKSPACE = os.environ["WARDEN_WORKSPACE"]
#: A model whose upstream holds the reply 20 s quiet (pings only): the
#: server sends a keep-alive comment meanwhile.
QUIET_MODEL = os.environ["WARDEN_QUIET_MODEL"]


def reply(message: str) -> str:
    """What the mock answers to ``message``."""
    return f"Hello from warden-mock. Your last message had {len(message)} characters."


def shown(events) -> str:
    """The text a client shows: ``retrying``/``restarting`` drop it,
    ``continuing`` keeps it."""
    text = ""
    for e in events:
        if isinstance(e, Text):
            text += e.text
        elif e.type in ("retrying", "restarting") and e.data.get("discard"):
            text = ""
    return text


def done_turn_id(w, key):
    """The id of the newest turn of session ``key``."""
    return w.turns(key)[0]["id"]


class AgainstServe(unittest.TestCase):
    def test_0_a_quiet_pause_of_twenty_seconds_is_waited_out_sync_and_async(self):
        # The sync and the async client at once: one pause for both.
        message = "think it over for a while"
        outcome = {}

        def follow_async():
            async def go():
                async with AsyncWarden(URL, TOKEN) as w:
                    turn = await w.send(message, key="quiet-async", model=QUIET_MODEL)
                    return await turn.result()

            try:
                outcome["async"] = asyncio.run(asyncio.wait_for(go(), timeout=90))
            except BaseException as e:  # reported below, on the test's thread
                outcome["async"] = e

        thread = threading.Thread(target=follow_async)
        thread.start()
        began = time.monotonic()
        with Warden(URL, TOKEN) as w:
            events = list(w.send(message, key="quiet-sync", model=QUIET_MODEL))
        took = time.monotonic() - began
        thread.join(timeout=90)
        self.assertFalse(thread.is_alive(), "the async client ended its turn in time")
        self.assertGreater(took, 16, "the pause outlasted the server's 15 s keep-alive")
        self.assertIsInstance(events[-1], Done, [e.type for e in events])
        self.assertEqual(shown(events), reply(message))
        self.assertEqual([e.id for e in events], list(range(1, len(events) + 1)))
        done = outcome.get("async")
        self.assertIsInstance(done, Done, repr(done))
        self.assertEqual(done.text, reply(message))

    def test_1_a_stalled_reply_is_continued_and_shown_once(self):
        with Warden(URL, TOKEN) as w:
            turn = w.send("hello", key="stalled")
            events = list(turn)
        self.assertIsInstance(events[-1], Done, events)
        self.assertTrue(
            any(isinstance(e, (Continuing, Retrying)) for e in events),
            f"the stall was recovered: {[e.type for e in events]}",
        )
        self.assertEqual(events[-1].text, reply("hello"))
        self.assertEqual(shown(events), reply("hello"))
        self.assertEqual([e.id for e in events], list(range(1, len(events) + 1)))

    def test_2_a_dropped_connection_is_re_attached_with_nothing_lost_or_repeated(self):
        message = "a longer message, so the reply has more to say"
        with Warden(FLAKY_URL, TOKEN) as w:
            turn = w.send(message, workspace=WORKSPACE, model="claude-x")
            events = list(turn)
        self.assertGreaterEqual(turn.reattached, 1, "the relay cut the stream")
        ids = [e.id for e in events]
        self.assertEqual(ids, list(range(1, len(events) + 1)), "no gap, no repeat")
        self.assertIsInstance(events[0], Started)
        self.assertIsInstance(events[-1], Done)
        self.assertEqual(shown(events), reply(message))

    def test_3_result_and_typed_events(self):
        with Warden(URL, TOKEN) as w:
            done = w.send("typed", key="typed").result()
        self.assertIsInstance(done, Done)
        self.assertEqual(done.text, reply("typed"))
        self.assertGreaterEqual(done.attempts, 1)
        if "at" in done.data:  # a server that stamps its events
            self.assertIsNotNone(done.at, done.data["at"])
            self.assertIsNotNone(done.at.tzinfo)
        # Followed again from an event it saw: only the ones after it.
        with Warden(URL, TOKEN) as w:
            rest = list(w.turn(done_turn_id(w, "typed"), last_event_id=2))
        self.assertEqual(rest[0].id, 3)
        self.assertEqual(rest[-1].id, done.id)
        self.assertIsInstance(rest[-1], Done)

    def test_3a_result_after_iterating_to_done_answers_at_once_sync_and_async(self):
        # A turn followed to its `done` keeps it: result() does not follow
        # it again (it once waited 15 s there and raised ConnectionLost),
        # and iterating it again yields nothing more.
        with Warden(URL, TOKEN) as w:
            turn = w.send("iterated", key="iterated")
            events = list(turn)
            self.assertIsInstance(events[-1], Done)
            started = time.monotonic()
            done = turn.result()
            took = time.monotonic() - started
            self.assertLess(took, 1.0, "result() after done answers at once")
            self.assertEqual(done.text, reply("iterated"))
            self.assertEqual(list(turn), [], "nothing after its last event")

        async def run():
            async with AsyncWarden(URL, TOKEN) as w:
                turn = await w.send("iterated async", key="iterated")
                async for event in turn:
                    if isinstance(event, Done):
                        break  # stopped at it: the turn kept it all the same
                started = time.monotonic()
                done = await turn.result()
                return done, time.monotonic() - started, [e async for e in turn]

        done, took, again = asyncio.run(asyncio.wait_for(run(), timeout=60))
        self.assertLess(took, 1.0, "the async result() after done answers at once")
        self.assertEqual(done.text, reply("iterated async"))
        self.assertEqual(again, [])

    def test_4_a_cancelled_turn_ends_with_its_error(self):
        with Warden(URL, TOKEN) as w:
            first = w.send("first, long enough to be running " * 4, key="cancel")
            second = w.send("second", key="cancel")
            self.assertTrue(second.cancel(), "the queued turn was live")
            events = list(second)
            self.assertIsInstance(events[-1], Error)
            self.assertEqual(events[-1].code, "ECANCELLED")
            self.assertEqual(events[-1].exit, 130)
            with self.assertRaises(TurnFailed) as failed:
                w.turn(second.id).result()
            self.assertEqual(failed.exception.code, "ECANCELLED")
            self.assertEqual(failed.exception.data["exit"], 130)
            self.assertIsInstance(failed.exception, WardenError)
            self.assertIsInstance(first.result(), Done)

    def test_5_sessions_list_get_reset(self):
        with Warden(URL, TOKEN) as w:
            w.send("hi", key="listed").result()
            keys = [s["key"] for s in w.sessions()]
            self.assertIn("listed", keys)
            self.assertEqual(w.session("listed")["key"], "listed")
            w.reset("listed")
            with self.assertRaises(NotFound):
                w.reset("never-seen")
            with self.assertRaises(NotFound):
                w.session("never-seen")
            detailed = {s["key"]: s for s in w.sessions(detail=True)}
            self.assertIn("status", detailed["listed"], detailed["listed"])
            self.assertFalse(w.recover("listed", "retry"), "nothing was stuck")
            with self.assertRaises(InvalidRequest):
                w.recover("listed", "sideways")
            server = w.server()
            self.assertEqual(server["agent"], "anthropic")
            self.assertIn("version", server)
            self.assertIn("warden_turns_total", w.metrics())

    def test_6_errors_are_typed(self):
        with Warden(URL, "not-the-token") as w:
            with self.assertRaises(Unauthorized) as e:
                w.sessions()
            self.assertEqual(e.exception.status, 401)
        with Warden(URL, TOKEN) as w:
            with self.assertRaises(InvalidRequest) as e:
                w.send("hi", workspace="relative/path")
            self.assertEqual(e.exception.type, "invalid_workspace")
            with self.assertRaises(Conflict) as e:
                w.send("hi", key="typed", agent="claude-code")
            self.assertEqual(e.exception.type, "agent_mismatch")
            self.assertEqual(e.exception.body["agent"], "anthropic")
            with self.assertRaises(InvalidRequest):
                w.send("hi")
            # A key the server would refuse: refused here, nothing sent.
            with self.assertRaises(InvalidRequest) as e:
                w.send("hi", key="never-sent", idempotency_key="commande-n°1")
            self.assertEqual(e.exception.type, "invalid_idempotency_key")
            with self.assertRaises(NotFound):
                w.session("never-sent")

    def test_6a_a_server_that_cannot_be_reached_is_unavailable(self):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        # Nothing listens on `port` now: every connection is refused.
        with Warden(f"http://127.0.0.1:{port}", TOKEN) as w:
            with self.assertRaises(Unavailable) as e:
                w.sessions()
            self.assertIsInstance(e.exception.__cause__, httpx.ConnectError)
            self.assertEqual((e.exception.status, e.exception.type), (0, "unreachable"))
            with self.assertRaises(Unavailable) as e:
                w.send("hi", key="nowhere")  # after its retries
            self.assertIsInstance(e.exception.__cause__, httpx.ConnectError)

        async def run():
            async with AsyncWarden(f"http://127.0.0.1:{port}", TOKEN) as w:
                await w.server()

        with self.assertRaises(Unavailable) as e:
            asyncio.run(asyncio.wait_for(run(), timeout=30))
        self.assertIsInstance(e.exception.__cause__, httpx.ConnectError)

    def test_6b_a_connection_cut_before_its_answer_is_lost(self):
        # A server that takes the request and hangs up without answering.
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]

        def hang_up():
            while True:
                try:
                    conn, _ = listener.accept()
                except OSError:
                    return
                conn.recv(65536)
                conn.close()

        threading.Thread(target=hang_up, daemon=True).start()
        try:
            with Warden(f"http://127.0.0.1:{port}", TOKEN) as w:
                with self.assertRaises(ConnectionLost) as e:
                    w.server()
                self.assertIsInstance(e.exception.__cause__, httpx.TransportError)
                self.assertEqual(e.exception.status, 0)
        finally:
            listener.close()

    def test_7_lifecycle_events_replay_after_a_reset(self):
        with Warden(URL, TOKEN) as w:
            seen = []
            # An id from before this server's start: a reset, then what is kept.
            for event in w.events(last_event_id=1):
                seen.append(event)
                if event.type == "turn_finished":
                    break
        self.assertEqual(seen[0].type, "reset")
        self.assertEqual(seen[0].data["reason"], "restarted")
        self.assertIsNone(seen[0].id)
        self.assertTrue(all(e.id is not None for e in seen[1:]))

    def test_8_async_send_follow_and_cancel(self):
        async def run():
            async with AsyncWarden(FLAKY_URL, TOKEN) as w:
                message = "the async client, through the flaky relay as well"
                turn = await w.send(message, key="async")
                events = [e async for e in turn]
                self.assertGreaterEqual(turn.reattached, 1, "the relay cut the stream")
                self.assertEqual([e.id for e in events], list(range(1, len(events) + 1)))
                self.assertEqual(shown(events), reply(message))
                busy = await w.send("busy " * 20, key="async-cancel")
                queued = await w.send("queued", key="async-cancel")
                self.assertTrue(await queued.cancel())
                with self.assertRaises(TurnFailed):
                    await queued.result()
                self.assertIsInstance(await busy.result(), Done)
                keys = [s["key"] for s in await w.sessions()]
                self.assertIn("async", keys)
                detailed = {s["key"]: s for s in await w.sessions(detail=True)}
                self.assertIn("status", detailed["async"])
                self.assertFalse(await w.recover("async", "fresh"))
                self.assertEqual((await w.server())["agent"], "anthropic")
                self.assertIn("warden_turns_total", await w.metrics())
                rest = [e async for e in w.turn(turn.id, last_event_id=events[-2].id)]
                self.assertEqual([e.id for e in rest], [events[-1].id])

        asyncio.run(asyncio.wait_for(run(), timeout=60))

    def test_8a_a_send_repeated_with_its_idempotency_key_gets_the_same_turn(self):
        with Warden(URL, TOKEN) as w:
            first = w.send("once", key="idem-py", idempotency_key="py-order-1")
            again = w.send("once", key="idem-py", idempotency_key="py-order-1")
            self.assertEqual(again.id, first.id)
            # The key with another message: refused, typed, nothing sent.
            with self.assertRaises(IdempotencyKeyReused) as e:
                w.send("twice", key="idem-py", idempotency_key="py-order-1")
            self.assertIsInstance(e.exception, InvalidRequest)
            self.assertEqual((e.exception.status, e.exception.type), (422, "idempotency_key_reused"))
            self.assertEqual(e.exception.body["id"], first.id)
            self.assertEqual(first.result().text, reply("once"))
            other = w.send("once", key="idem-py")
            self.assertNotEqual(other.id, first.id, "without the key, another turn")
            other.result()
            turns = w.turns("idem-py")
        self.assertEqual([t["id"] for t in turns], [other.id, first.id])
        self.assertTrue(all(t["outcome"] == "done" for t in turns), turns)

    def test_8b_every_event_type_of_the_contract_is_typed(self):
        import httpx

        from warden_client import _events

        document = httpx.get(f"{URL}/openapi.json", timeout=10).json()
        schemas = document["components"]["schemas"]
        def enum(schema):
            """The values of an enum schema, through a $ref."""
            ref = schema.get("$ref")
            return enum(schemas[ref.rsplit("/", 1)[-1]]) if ref else schema["enum"]

        contract = set(enum(schemas["TurnEvent"]))
        typed = set(_events._TYPES)
        self.assertEqual(typed, contract, "a class per event type, no more")
        # Field by field: every field a class reads is one its event's
        # schema (derived from the server's types) has.
        derived = {"context_percent": "context"}
        for name, cls in _events._TYPES.items():
            ref = schemas["TurnEvents"]["properties"][name]["$ref"]
            fields = set(schemas[ref.rsplit("/", 1)[-1]]["properties"])
            self.assertIn("at", fields, name)
            read = {
                derived.get(attr, attr)
                for attr, value in vars(cls).items()
                if isinstance(value, property) and attr != "at"
            }
            self.assertLessEqual(read, fields, f"{name} reads fields its schema lacks")
        # The agents, as the contract's one enum lists them.
        from warden_client import AGENTS

        self.assertEqual(set(AGENTS), set(enum(schemas["Agent"])), "the contract's agents")
        # The outcomes `turns()` reports, as the contract lists them.
        outcomes = set(enum(schemas["TurnSummary"]["properties"]["outcome"]))
        self.assertEqual(outcomes, {"done", "error", "running", "pending", "moved"})
        # Every field `send` sends is one the contract takes.
        from warden_client._common import turn_body

        body = turn_body("m", None, "k", "model", "codex")
        self.assertLessEqual(set(body), set(schemas["NewTurn"]["properties"]))
        params = document["paths"]["/v1/turns"]["post"]["parameters"]
        self.assertIn("Idempotency-Key", [p["name"] for p in params])

    def test_9_the_package_exports_what_its_readme_uses(self):
        for name in (
            "Warden",
            "AsyncWarden",
            "Text",
            "Done",
            "TurnFailed",
            "WardenError",
            "IdempotencyKeyReused",
            "Unavailable",
            "ConnectionLost",
        ):
            self.assertTrue(hasattr(warden_client, name), name)


if __name__ == "__main__":
    unittest.main()
