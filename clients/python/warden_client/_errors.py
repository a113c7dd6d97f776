"""Typed errors: one class per kind of failure, all :class:`WardenError`.

An error answer of the server is typed from its ``error.type`` and status
(the catalogue in docs/serve.md); a connection that could not be made is
:class:`Unavailable`, one cut before its answer or its stream's end
:class:`ConnectionLost` (each with the transport's error as its
``__cause__``); a turn that ended with an ``error`` event is
:class:`TurnFailed`.
"""

from __future__ import annotations

import json
from typing import Any, Dict, Optional

import httpx


class WardenError(Exception):
    """Any failure of the client: its HTTP status (0 when the server gave
    no answer), its ``error.type``, its message and the whole error object
    (``error.limit``, ``error.owner``, ``error.agent``… where the type has
    them)."""

    def __init__(
        self,
        status: int,
        type: str,
        message: str,
        body: Optional[Dict[str, Any]] = None,
        retry_after: Optional[float] = None,
    ) -> None:
        super().__init__(f"{status} {type}: {message}" if status else f"{type}: {message}")
        self.status = status
        self.type = type
        self.message = message
        self.body = body or {}
        self.retry_after = retry_after


class InvalidRequest(WardenError, ValueError):
    """400, 405, 413, 415 or 422: the request is wrong (``invalid_request``,
    ``invalid_workspace``, ``invalid_fields``, ``too_large``…); sending it
    again will not help. Also raised before sending (status 0) for what the
    client can tell is wrong: ``invalid_idempotency_key`` (empty, over 255
    characters or not visible ASCII), ``invalid_request`` (neither or both
    of ``workspace=`` and ``key=``). A :class:`ValueError` too."""


class IdempotencyKeyReused(InvalidRequest):
    """422 ``idempotency_key_reused``: the ``idempotency_key`` was first sent
    with another message, model or agent (its turn is ``body["id"]``);
    nothing was sent. A key names one message: send a new message with a
    new key."""


class Unauthorized(WardenError):
    """401: no token, or the wrong one."""


class NotFound(WardenError):
    """404: no such turn (or it expired), session or route."""


class Conflict(WardenError):
    """409: ``session_failed`` (the session was given up: reset it),
    ``agent_mismatch`` (``body["agent"]`` says which agent the session
    has) or ``turn_recovering`` (its message is being re-delivered after a
    restart; ``send`` asks again by itself)."""


class Unavailable(WardenError):
    """503 (``too_many_sessions``, ``session_elsewhere``,
    ``database_unreachable``, ``unavailable``…): ask again after
    :attr:`retry_after` seconds. Also (status 0, type ``unreachable``) no
    connection could be made: the server is down or the URL is wrong; the
    transport's error is the ``__cause__``."""


class ConnectionLost(WardenError):
    """The connection broke before its answer, or a stream kept breaking
    (status 0, type ``connection_lost``; the transport's error, if any, is
    the ``__cause__``). A turn itself may still be running: follow it again
    with its id."""

    def __init__(self, message: str) -> None:
        super().__init__(0, "connection_lost", message)


class TurnFailed(WardenError):
    """A turn ended with an ``error`` event (status 0, type
    ``turn_failed``): its ``code`` (``ESTREAM_TIMEOUT``, ``ECANCELLED``…),
    message and exit class (3 API, 4 timeout, 5 unavailable, 6 deferred —
    the message stays pending and is answered later: do not send it again
    —, 130 cancelled, 1 other); ``data``, the event's whole data."""

    def __init__(
        self, code: str, message: str, exit: int, data: Optional[Dict[str, Any]] = None
    ) -> None:
        data = data if data is not None else {"code": code, "message": message, "exit": exit}
        super().__init__(0, "turn_failed", message, data)
        self.args = (f"{code}: {message}",)
        self.code = code
        self.exit = exit
        self.data = data

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"

    @property
    def deferred(self) -> bool:
        """Whether the message stays pending and will be answered later."""
        return self.exit == 6


_BY_STATUS = {
    400: InvalidRequest,
    401: Unauthorized,
    404: NotFound,
    405: InvalidRequest,
    409: Conflict,
    413: InvalidRequest,
    415: InvalidRequest,
    422: InvalidRequest,
    503: Unavailable,
}


#: Error types with a class of their own (a subclass of their status's).
_BY_TYPE = {
    "idempotency_key_reused": IdempotencyKeyReused,
}


def error_from(response: httpx.Response, body: bytes) -> WardenError:
    """The typed error of an error answer (its body already read)."""
    try:
        parsed = json.loads(body)
        error = parsed.get("error", {}) if isinstance(parsed, dict) else {}
    except ValueError:
        error = {}
    if not isinstance(error, dict):
        error = {}
    retry_after: Optional[float] = None
    header = response.headers.get("retry-after")
    if header is not None:
        try:
            retry_after = float(header)
        except ValueError:
            retry_after = None
    cls = _BY_TYPE.get(str(error.get("type")))
    if cls is None:
        cls = _BY_STATUS.get(response.status_code, WardenError)
    return cls(
        response.status_code,
        str(error.get("type", "unknown")),
        str(error.get("message", body[:200].decode("utf-8", "replace"))),
        error,
        retry_after,
    )


def transport_error(error: Exception, what: str) -> WardenError:
    """The typed error of a transport failure while doing ``what``:
    :class:`Unavailable` when no connection could be made,
    :class:`InvalidRequest` for a URL httpx cannot use, else
    :class:`ConnectionLost`. Raise it ``from error``."""
    if isinstance(error, (httpx.ConnectError, httpx.ConnectTimeout)):
        return Unavailable(0, "unreachable", f"{what}: cannot connect: {error}")
    if isinstance(error, httpx.UnsupportedProtocol):
        return InvalidRequest(0, "invalid_url", f"{what}: {error}")
    return ConnectionLost(f"{what}: the connection broke: {error or type(error).__name__}")
