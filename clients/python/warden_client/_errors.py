"""Typed errors: one class per kind of answer `warden serve` gives."""

from __future__ import annotations

from typing import Any, Dict, Optional

import httpx


class WardenError(Exception):
    """An error answer of the API: its HTTP status, its ``error.type``, its
    message and the whole error object (``error.limit``, ``error.owner``,
    ``error.agent``… where the type has them)."""

    def __init__(
        self,
        status: int,
        type: str,
        message: str,
        body: Optional[Dict[str, Any]] = None,
        retry_after: Optional[float] = None,
    ) -> None:
        super().__init__(f"{status} {type}: {message}")
        self.status = status
        self.type = type
        self.message = message
        self.body = body or {}
        self.retry_after = retry_after


class InvalidRequest(WardenError):
    """400, 413, 415 or 422: the request is wrong (``invalid_request``,
    ``invalid_workspace``, ``invalid_fields``, ``too_large``…); sending it
    again will not help."""


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
    """503: ask again after :attr:`retry_after` seconds
    (``too_many_sessions``, ``session_elsewhere``, ``database_unreachable``,
    ``unavailable``…)."""


class ConnectionLost(WardenError):
    """The connection to the server kept failing while following a stream;
    the turn itself may still be running: follow it again with its id."""

    def __init__(self, message: str) -> None:
        super().__init__(0, "connection_lost", message)


class TurnFailed(Exception):
    """A turn ended with an ``error`` event: its ``code`` (``ESTREAM_TIMEOUT``,
    ``ECANCELLED``…), message and exit class (3 API, 4 timeout, 5
    unavailable, 6 deferred — the message stays pending and is answered
    later: do not send it again —, 130 cancelled, 1 other)."""

    def __init__(self, code: str, message: str, exit: int) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.exit = exit

    @property
    def deferred(self) -> bool:
        """Whether the message stays pending and will be answered later."""
        return self.exit == 6


_BY_STATUS = {
    400: InvalidRequest,
    401: Unauthorized,
    404: NotFound,
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
    import json

    try:
        parsed = json.loads(body)
        error = parsed.get("error", {}) if isinstance(parsed, dict) else {}
    except ValueError:
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
