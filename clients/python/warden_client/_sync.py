"""`Warden` and `Turn`: the API of `warden serve`, sync."""

from __future__ import annotations

import time
from typing import Any, Dict, Iterator, List, Optional

import httpx
from httpx_sse import connect_sse

from . import _sse
from ._common import (
    MAX_REATTACHES,
    Agent,
    backoff,
    decode_lifecycle_event,
    decode_turn_event,
    gave_up,
    idempotency_headers,
    json_answer,
    q,
    result,
    send_retry_delay,
    timeout as http_timeout,
    turn_body,
)
from ._errors import Unavailable, error_from, transport_error
from ._events import Done, LifecycleEvent, TurnEvent


class Turn:
    """A turn of a session (sync). Iterate it for its events: a dropped
    connection is re-attached with ``Last-Event-ID`` — no event is lost or
    repeated — until the turn's last event (``done`` or ``error``)."""

    def __init__(self, warden: "Warden", id: str, key: str, last_event_id: int = 0) -> None:
        self.id = id
        self.key = key
        #: The last event's id: where the next (re-)attach goes on from.
        self.last_event_id = last_event_id
        #: How many times its stream broke and was re-attached.
        self.reattached = 0
        self._warden = warden
        #: Its last event (``done`` or ``error``), once seen.
        self._end: Optional[TurnEvent] = None

    def __iter__(self) -> Iterator[TurnEvent]:
        if self._end is not None:
            return  # it ended: there is nothing after its last event
        failures = 0
        last_error: Optional[Exception] = None
        while True:
            headers = {}
            if self.last_event_id:
                headers["last-event-id"] = str(self.last_event_id)
            try:
                with connect_sse(
                    self._warden._http, "GET", f"/v1/turns/{q(self.id)}/events", headers=headers
                ) as source:
                    response = source.response
                    if response.status_code != 200:
                        error = error_from(response, response.read())
                        if isinstance(error, Unavailable) and failures < MAX_REATTACHES:
                            failures += 1
                            time.sleep(error.retry_after or backoff(failures))
                            continue
                        raise error
                    for sse in _sse.events(source):
                        if not sse.id:
                            continue
                        event = decode_turn_event(sse.id, sse.event, sse.data)
                        self.last_event_id = event.id
                        failures = 0
                        if event.is_last:
                            self._end = event  # before the caller may stop at it
                        yield event
                        if event.is_last:
                            return
                last_error = None
            except httpx.TransportError as e:
                last_error = e
            # The stream broke or ended before the turn did (its node
            # stopped, it moved): follow it again from the last event.
            failures += 1
            self.reattached += 1
            if failures > MAX_REATTACHES:
                raise gave_up(f"turn {self.id}", failures, last_error) from last_error
            time.sleep(backoff(failures))

    def result(self) -> Done:
        """Follows the turn to its end: its ``done`` event, or
        :class:`TurnFailed` with the ``error`` event's code. A turn already
        followed to its end (iterated to ``done``) answers at once."""
        for _ in self:
            pass
        return result(self._end)

    def cancel(self) -> bool:
        """Cancels the turn (queued or running); whether it was still
        live."""
        body = self._warden._request("DELETE", f"/v1/turns/{q(self.id)}")
        return bool(body.get("cancelled"))


class Warden:
    """A client of one `warden serve` node (sync). Use as a context
    manager, or call :meth:`close`."""

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        timeout: float = 30.0,
        transport: Optional[httpx.BaseTransport] = None,
    ) -> None:
        self._http = httpx.Client(
            base_url=base_url.rstrip("/"),
            headers={"authorization": f"Bearer {token}"},
            timeout=http_timeout(timeout),
            transport=transport,
        )

    def __enter__(self) -> "Warden":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Closes the connections."""
        self._http.close()

    def _answer(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.TransportError as e:
            raise transport_error(e, f"{method} {path}") from e
        if response.status_code >= 400:
            raise error_from(response, response.content)
        return response

    def _request(self, method: str, path: str, **kwargs: Any) -> Dict[str, Any]:
        return json_answer(self._answer(method, path, **kwargs))

    def send(
        self,
        message: str,
        *,
        workspace: Optional[str] = None,
        key: Optional[str] = None,
        model: Optional[str] = None,
        agent: Optional[Agent] = None,
        idempotency_key: Optional[str] = None,
    ) -> Turn:
        """Sends ``message`` to the session of ``workspace`` (an absolute
        directory) or ``key`` (a name); returns once it is durably accepted.
        ``model``: this turn's model; ``agent``: the agent kind expected
        (another than the session's raises :class:`Conflict`).

        ``idempotency_key`` names the message: sending it again with the
        same key returns its turn instead of a second one. Default: a new
        UUID per call, which the call's own retries (a connection refused or
        dropped) reuse; keep your own and pass it again to retry a send
        whose outcome you did not learn. 1 to 255 visible ASCII characters:
        another raises :class:`InvalidRequest` before anything is sent."""
        body = turn_body(message, workspace, key, model, agent)
        headers = idempotency_headers(idempotency_key)
        tries = 0
        while True:
            tries += 1
            try:
                created = self._request("POST", "/v1/turns", json=body, headers=headers)
                return Turn(self, created["id"], created["key"])
            except Exception as e:
                delay = send_retry_delay(e, tries)
                if delay is None:
                    raise
                time.sleep(delay)

    def turn(self, id: str, key: str = "", *, last_event_id: int = 0) -> Turn:
        """A turn sent earlier (by its id), to follow or cancel; with
        ``last_event_id``, following it yields only the events after that
        one."""
        return Turn(self, id, key, last_event_id)

    def sessions(self, detail: bool = False) -> List[Dict[str, Any]]:
        """The sessions running (on a cluster node: every session), each
        ``{"key", …}``; with ``detail=True`` every stored session, running
        or not, each with the fields of :meth:`session`."""
        params = {"detail": "full"} if detail else None
        return list(self._request("GET", "/v1/sessions", params=params)["sessions"])

    def session(self, key: str) -> Dict[str, Any]:
        """One session's record (and its running turn)."""
        return self._request("GET", f"/v1/sessions/{q(key)}")

    def turns(self, key: str) -> List[Dict[str, Any]]:
        """The session's recent turns still kept, newest first: ``id``,
        ``message_id``, ``outcome`` and, when done, ``text``."""
        return list(self._request("GET", f"/v1/sessions/{q(key)}/turns")["turns"])

    def reset(self, key: str) -> None:
        """Forgets that the session was given up."""
        self._request("POST", f"/v1/sessions/{q(key)}/reset")

    def recover(self, key: str, how: str) -> bool:
        """Unsticks the session's running turn: ``how="retry"`` stops the
        attempt as failed so it is retried (conversation kept), ``"fresh"``
        restarts the session without its stored conversation. Whether
        anything was stuck."""
        body = self._request("POST", f"/v1/sessions/{q(key)}/recover", params={"how": how})
        return bool(body.get("recovered"))

    def server(self) -> Dict[str, Any]:
        """What the server says of itself (``GET /v1/server``):
        ``version``, ``agent``, ``stream_timeout_ms``, ``cluster``,
        ``node``, ``jaeger_url``…"""
        return self._request("GET", "/v1/server")

    def metrics(self) -> str:
        """The server's Prometheus metrics, as text (``GET /metrics``)."""
        return self._answer("GET", "/metrics").text

    def events(self, last_event_id: Optional[int] = None) -> Iterator[LifecycleEvent]:
        """Every session's lifecycle events, from now on or after
        ``last_event_id``; a dropped connection is re-attached from the last
        event. A ``reset`` event says events were missed (no longer kept,
        or the server restarted). Endless: break out of it."""
        last = last_event_id
        failures = 0
        last_error: Optional[Exception] = None
        while True:
            headers = {} if last is None else {"last-event-id": str(last)}
            try:
                with connect_sse(self._http, "GET", "/v1/events", headers=headers) as source:
                    response = source.response
                    if response.status_code != 200:
                        raise error_from(response, response.read())
                    for sse in _sse.events(source):
                        event = decode_lifecycle_event(sse.id, sse.event, sse.data)
                        if event.id is not None:
                            last = event.id
                        failures = 0
                        yield event
                last_error = None
            except httpx.TransportError as e:
                last_error = e
            failures += 1
            if failures > MAX_REATTACHES:
                raise gave_up("the lifecycle stream", failures, last_error) from last_error
            time.sleep(backoff(failures))

