"""What the sync and the async client share: request bodies, the checks
made before sending, retry timing, and decoding events and answers."""

from __future__ import annotations

import json
import uuid
from typing import Any, Dict, Literal, Optional, get_args
from urllib.parse import quote

import httpx

from ._errors import (
    Conflict,
    ConnectionLost,
    InvalidRequest,
    TurnFailed,
    Unavailable,
    WardenError,
)
from ._events import Done, Error, LifecycleEvent, TurnEvent, turn_event

#: Read timeout of the event streams: the server sends a keep-alive every
#: 15 s, so this long without a byte means the connection is dead (a NAT
#: or load balancer dropped it): the stream is re-attached.
STREAM_READ_TIMEOUT = 45.0

#: Consecutive failed re-attaches before a stream gives up.
MAX_REATTACHES = 10

#: Tries of one ``send`` (a dropped connection, or its message being
#: re-delivered after a restart): each with the same Idempotency-Key.
SEND_TRIES = 5

#: What ``recover`` takes: ``retry`` (the attempt is stopped as failed and
#: retried, conversation kept) or ``fresh`` (the session restarts without
#: its stored conversation).
RECOVER_HOWS = ("retry", "fresh")


def backoff(failures: int) -> float:
    """Seconds before re-attach number ``failures`` (0.2 s doubling to 2 s)."""
    return min(2.0, 0.2 * (2 ** max(0, failures - 1)))


def q(part: str) -> str:
    """``part`` percent-encoded for a path (a workspace key's slashes too)."""
    return quote(part, safe="")


#: The agents a ``warden serve`` session may run: the contract's ``Agent``
#: enum (``clients/openapi.json``; the suite checks they are the same).
Agent = Literal["claude-code", "codex", "gemini", "opencode", "kilo-code", "qwen-code", "aider", "anthropic", "openai"]

#: :data:`Agent`'s values.
AGENTS = get_args(Agent)


def turn_body(
    message: str,
    workspace: Optional[str],
    key: Optional[str],
    model: Optional[str],
    agent: Optional[Agent],
) -> Dict[str, Any]:
    """The body of ``POST /v1/turns``; :class:`InvalidRequest` unless
    exactly one of ``workspace`` and ``key`` is given, or for an ``agent``
    that is not one of :data:`AGENTS`."""
    if (workspace is None) == (key is None):
        raise InvalidRequest(0, "invalid_request", "give exactly one of workspace= or key=")
    if agent is not None and agent not in AGENTS:
        raise InvalidRequest(
            0,
            "invalid_request",
            f"agent must be one of {', '.join(AGENTS)}, not {agent!r}",
        )
    body: Dict[str, Any] = {"message": message}
    if workspace is not None:
        body["workspace"] = str(workspace)
    if key is not None:
        body["key"] = key
    if model is not None:
        body["model"] = model
    if agent is not None:
        body["agent"] = agent
    return body


def idempotency_headers(key: Optional[str]) -> Dict[str, str]:
    """The ``Idempotency-Key`` header: ``key``, or a fresh UUID.
    :class:`InvalidRequest` (``invalid_idempotency_key``) before anything
    is sent for a key the server refuses: empty, over 255 characters, or
    not visible ASCII (``!`` to ``~``)."""
    if key is None:
        return {"idempotency-key": str(uuid.uuid4())}
    if not isinstance(key, str) or not 0 < len(key) <= 255 or not all("!" <= c <= "~" for c in key):
        raise InvalidRequest(
            0,
            "invalid_idempotency_key",
            f"an idempotency key is 1 to 255 visible ASCII characters (! to ~), not {key!r:.80}",
        )
    return {"idempotency-key": key}


def send_retry_delay(error: Exception, tries: int) -> Optional[float]:
    """Seconds before trying ``send`` again after ``error``, or ``None`` to
    raise it: a connection that failed or broke (status 0), or the message
    accepted before a restart and being re-delivered (``turn_recovering``)
    — the same key finds its turn. Anything else is the answer."""
    if tries >= SEND_TRIES:
        return None
    if isinstance(error, Conflict) and error.type == "turn_recovering":
        return error.retry_after if error.retry_after is not None else backoff(tries)
    if isinstance(error, (Unavailable, ConnectionLost)) and error.status == 0:
        return backoff(tries)
    return None


def timeout(seconds: float) -> httpx.Timeout:
    """Every timeout ``seconds``, but reads: :data:`STREAM_READ_TIMEOUT`."""
    return httpx.Timeout(seconds, read=STREAM_READ_TIMEOUT)


def json_answer(response: httpx.Response) -> Dict[str, Any]:
    """The JSON object of a success answer; :class:`WardenError`
    (``invalid_response``) when it is not one (a proxy's page)."""
    try:
        body = response.json()
    except ValueError as e:
        raise WardenError(
            response.status_code,
            "invalid_response",
            f"not the JSON of warden serve: {response.text[:200]!r}",
        ) from e
    if not isinstance(body, dict):
        raise WardenError(response.status_code, "invalid_response", f"not a JSON object: {body!r:.200}")
    return body


def _data(raw: str, what: str) -> Dict[str, Any]:
    try:
        data = json.loads(raw)
    except ValueError as e:
        raise WardenError(200, "invalid_event", f"{what}: data that is not JSON: {raw[:200]!r}") from e
    return data if isinstance(data, dict) else {"value": data}


def decode_turn_event(id: str, type: str, raw: str) -> TurnEvent:
    """A turn's SSE event, typed."""
    return turn_event(int(id), type, _data(raw, f"a turn's {type} event"))


def decode_lifecycle_event(id: str, type: str, raw: str) -> LifecycleEvent:
    """A lifecycle SSE event, typed (``reset`` has no id)."""
    return LifecycleEvent(int(id) if id else None, type, _data(raw, f"a {type} event"))


def gave_up(what: str, failures: int, last: Optional[Exception]) -> WardenError:
    """The error of a stream that broke ``failures`` times in a row, the
    last time with ``last`` (a transport error, or ``None``: it ended
    early): :class:`Unavailable` when the server could not be reached,
    else :class:`ConnectionLost`. Raise it ``from last``."""
    message = f"{what}: the stream broke {failures} times in a row"
    if isinstance(last, (httpx.ConnectError, httpx.ConnectTimeout)):
        return Unavailable(0, "unreachable", f"{message}, the last time: cannot connect: {last}")
    if last is not None:
        return ConnectionLost(f"{message}, the last time: {last or type(last).__name__}")
    return ConnectionLost(message)


def result(last: Optional[TurnEvent]) -> Done:
    """The turn's answer from its ``last`` event: the ``done``, or
    :class:`TurnFailed` for an ``error``, or :class:`ConnectionLost` when
    its stream ended without either."""
    if isinstance(last, Done):
        return last
    if isinstance(last, Error):
        raise TurnFailed(last.code, last.message, last.exit, dict(last.data))
    raise ConnectionLost("the turn's stream ended without its last event")
