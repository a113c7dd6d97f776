"""The client against canned answers (httpx's MockTransport): no server
needed. ``python -m unittest discover -s tests`` runs these with the suite
against a real server; ``python -m unittest test_offline`` (in tests/)
alone."""

import asyncio
import unittest
from datetime import datetime, timedelta, timezone

import httpx

from warden_client import (
    AsyncWarden,
    Done,
    InvalidRequest,
    Started,
    Text,
    TurnFailed,
    Warden,
    WardenError,
)
from warden_client._sse import parse_at

# A turn's stream as the server writes it through a quiet pause: a
# keep-alive comment, an empty `data:` event, fields this client does not
# know (a newer server), `at` on some events and not on others.
TURN_STREAM = (
    'id: 1\nevent: started\ndata: {"attempt":1,"at":"2026-12-05T10:00:00.000Z"}\n\n'
    ": keep-alive\n\n"
    ": keep-alive\n\n"
    "event: text\ndata:\n\n"
    'id: 2\nevent: text\ndata: {"text":"Hel","at":"2026-12-05T10:00:20.250Z","shiny":[1]}\n\n'
    'id: 3\nevent: text\ndata: {"text":"lo"}\n\n'
    ": keep-alive\n\n"
    'id: 4\nevent: done\ndata: {"turn":1,"text":"Hello","attempts":1,"continuations":0,'
    '"context":null,"output_tokens":null,"at":"2026-12-05T10:00:21.000+00:00"}\n\n'
)

LIFECYCLE_STREAM = (
    ": keep-alive\n\n"
    "event: ping\ndata:\n\n"
    'id: 7\nevent: turn_started\ndata: {"key":"k","turn":1,"at":"2026-12-05T10:00:00.000Z"}\n\n'
    ": keep-alive\n\n"
    'id: 8\nevent: turn_finished\ndata: {"key":"k","turn":1}\n\n'
)


def sse_answer(text: str) -> httpx.Response:
    return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=text.encode())


def routes(request: httpx.Request) -> httpx.Response:
    if request.url.path == "/v1/turns/t1/events":
        return sse_answer(TURN_STREAM)
    if request.url.path == "/v1/events":
        return sse_answer(LIFECYCLE_STREAM)
    return httpx.Response(404, json={"error": {"type": "not_found", "message": "no"}})


class SseLayer(unittest.TestCase):
    def test_comments_and_empty_events_never_reach_the_caller(self):
        with Warden("http://w", "t", transport=httpx.MockTransport(routes)) as w:
            events = list(w.turn("t1"))
            lifecycle = []
            for event in w.events():
                lifecycle.append(event)
                if event.type == "turn_finished":
                    break
        self.assertEqual([e.id for e in events], [1, 2, 3, 4])
        self.assertIsInstance(events[0], Started)
        self.assertEqual("".join(e.text for e in events if isinstance(e, Text)), "Hello")
        self.assertIsInstance(events[-1], Done)
        self.assertEqual(events[1].data["shiny"], [1], "unknown fields are kept")
        self.assertEqual([(e.id, e.type) for e in lifecycle], [(7, "turn_started"), (8, "turn_finished")])

    def test_the_async_client_skips_them_too(self):
        async def run():
            async with AsyncWarden("http://w", "t", transport=httpx.MockTransport(routes)) as w:
                return [e async for e in w.turn("t1")]

        events = asyncio.run(asyncio.wait_for(run(), timeout=10))
        self.assertEqual([e.id for e in events], [1, 2, 3, 4])

    def test_last_event_id_is_sent_when_following_a_turn_from_it(self):
        seen = []

        def record(request):
            seen.append(request.headers.get("last-event-id"))
            return sse_answer('id: 4\nevent: done\ndata: {"text":"Hello"}\n\n')

        with Warden("http://w", "t", transport=httpx.MockTransport(record)) as w:
            self.assertEqual(w.turn("t1", last_event_id=3).result().text, "Hello")
        self.assertEqual(seen, ["3"])

    def test_at_is_when_the_server_made_the_event(self):
        with Warden("http://w", "t", transport=httpx.MockTransport(routes)) as w:
            events = list(w.turn("t1"))
        self.assertEqual(events[0].at, datetime(2026, 12, 5, 10, 0, tzinfo=timezone.utc))
        self.assertEqual(events[1].at - events[0].at, timedelta(seconds=20.25))
        self.assertIsNone(events[2].at, "an event without `at` (an older server)")
        self.assertEqual(events[3].at, datetime(2026, 12, 5, 10, 0, 21, tzinfo=timezone.utc))
        self.assertIsNone(parse_at("yesterday"))
        self.assertIsNone(parse_at(None))


class ErrorsBeforeSending(unittest.TestCase):
    def test_a_bad_idempotency_key_is_refused_before_anything_is_sent(self):
        sent = []

        def record(request):
            sent.append(request)
            return httpx.Response(202, json={"id": "t", "key": "k"})

        with Warden("http://w", "t", transport=httpx.MockTransport(record)) as w:
            for bad in ("", "clé", "two words", "x" * 256, "tab\there", "\u00a0"):
                with self.assertRaises(InvalidRequest, msg=repr(bad)) as e:
                    w.send("hi", key="k", idempotency_key=bad)
                self.assertEqual(e.exception.type, "invalid_idempotency_key")
                self.assertEqual(e.exception.status, 0)
            with self.assertRaises(InvalidRequest) as e:
                w.send("hi")
            self.assertIsInstance(e.exception, ValueError, "still a ValueError, as before")
            self.assertEqual(sent, [], "nothing was sent")
            w.send("hi", key="k", idempotency_key="!" + "~" * 254)
            self.assertEqual(len(sent), 1, "255 visible characters are a key")

    def test_the_async_client_refuses_it_too(self):
        async def run():
            async with AsyncWarden("http://w", "t", transport=httpx.MockTransport(routes)) as w:
                await w.send("hi", key="k", idempotency_key="naïve")

        with self.assertRaises(InvalidRequest):
            asyncio.run(run())

    def test_every_failure_is_a_warden_error(self):
        self.assertTrue(issubclass(TurnFailed, WardenError))
        failed = TurnFailed("ECANCELLED", "cancelled", 130)
        self.assertEqual((failed.code, failed.exit, failed.data["code"]), ("ECANCELLED", 130, "ECANCELLED"))
        self.assertEqual(str(failed), "ECANCELLED: cancelled")

        def html(request):
            return httpx.Response(200, text="<html>a proxy</html>")

        with Warden("http://w", "t", transport=httpx.MockTransport(html)) as w:
            with self.assertRaises(WardenError) as e:
                w.server()
        self.assertEqual(e.exception.type, "invalid_response")


class AgentsTest(unittest.TestCase):
    def test_an_agent_outside_the_contract_is_refused_before_sending(self):
        from warden_client import AGENTS
        from warden_client._common import turn_body

        self.assertIn("codex", AGENTS)
        self.assertEqual(turn_body("m", None, "k", None, "codex")["agent"], "codex")
        with self.assertRaises(InvalidRequest) as e:
            turn_body("m", None, "k", None, "claude")
        self.assertEqual(e.exception.status, 0)
        self.assertIn("claude-code", str(e.exception))


if __name__ == "__main__":
    unittest.main()
