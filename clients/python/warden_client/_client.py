"""`Warden` (sync) and `AsyncWarden`: the API of `warden serve`."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any, AsyncIterator, Dict, Iterator, List, Optional
from urllib.parse import quote

import httpx
from httpx_sse import aconnect_sse, connect_sse

from ._errors import Conflict, ConnectionLost, TurnFailed, Unavailable, error_from
from ._events import Done, Error, LifecycleEvent, TurnEvent, turn_event

#: Read timeout of the event streams: the server sends a keep-alive every
#: 15 s, so this long without a byte means the connection is dead (a NAT
#: or load balancer dropped it): the stream is re-attached.
STREAM_READ_TIMEOUT = 45.0

#: Consecutive failed re-attaches before a stream gives up.
MAX_REATTACHES = 10

#: Errors of the connection, not of the server: a re-attach helps.
_TRANSIENT = (httpx.TransportError,)


def _backoff(failures: int) -> float:
    """Seconds before re-attach number ``failures`` (0.2 s doubling to 2 s)."""
    return min(2.0, 0.2 * (2 ** max(0, failures - 1)))


def _turn_body(
    message: str,
    workspace: Optional[str],
    key: Optional[str],
    model: Optional[str],
    agent: Optional[str],
) -> Dict[str, Any]:
    if (workspace is None) == (key is None):
        raise ValueError("give exactly one of workspace= or key=")
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


#: Tries of one ``send`` (a dropped connection, or its message being
#: re-delivered after a restart): each with the same Idempotency-Key.
SEND_TRIES = 5


def _send_retry_delay(error: Exception, tries: int) -> Optional[float]:
    """Seconds before trying ``send`` again after ``error``, or ``None`` to
    raise it: a connection that failed, or the message accepted before a
    restart and being re-delivered (``turn_recovering``) — the same key
    finds its turn. Anything else is the answer."""
    if tries >= SEND_TRIES:
        return None
    if isinstance(error, Conflict) and error.type == "turn_recovering":
        return error.retry_after if error.retry_after is not None else _backoff(tries)
    if isinstance(error, _TRANSIENT):
        return _backoff(tries)
    return None


def _headers(token: str) -> Dict[str, str]:
    return {"authorization": f"Bearer {token}"}


def _timeout(timeout: float) -> httpx.Timeout:
    return httpx.Timeout(timeout, read=STREAM_READ_TIMEOUT)


def _result(events: List[TurnEvent]) -> Done:
    last = events[-1] if events else None
    if isinstance(last, Done):
        return last
    if isinstance(last, Error):
        raise TurnFailed(last.code, last.message, last.exit)
    raise ConnectionLost("the turn's stream ended without its last event")


class Turn:
    """A turn of a session (sync). Iterate it for its events: a dropped
    connection is re-attached with ``Last-Event-ID`` — no event is lost or
    repeated — until the turn's last event (``done`` or ``error``)."""

    def __init__(self, warden: "Warden", id: str, key: str) -> None:
        self.id = id
        self.key = key
        self.last_event_id = 0
        #: How many times its stream broke and was re-attached.
        self.reattached = 0
        self._warden = warden

    def __iter__(self) -> Iterator[TurnEvent]:
        failures = 0
        while True:
            headers = {}
            if self.last_event_id:
                headers["last-event-id"] = str(self.last_event_id)
            try:
                with connect_sse(
                    self._warden._http,
                    "GET",
                    f"/v1/turns/{quote(self.id, safe='')}/events",
                    headers=headers,
                ) as source:
                    response = source.response
                    if response.status_code != 200:
                        error = error_from(response, response.read())
                        if isinstance(error, Unavailable) and failures < MAX_REATTACHES:
                            failures += 1
                            time.sleep(error.retry_after or _backoff(failures))
                            continue
                        raise error
                    for sse in source.iter_sse():
                        if not sse.id:
                            continue
                        event = turn_event(int(sse.id), sse.event, json.loads(sse.data))
                        self.last_event_id = event.id
                        failures = 0
                        yield event
                        if event.is_last:
                            return
            except _TRANSIENT:
                pass
            # The stream broke or ended before the turn did (its node
            # stopped, it moved): follow it again from the last event.
            failures += 1
            self.reattached += 1
            if failures > MAX_REATTACHES:
                raise ConnectionLost(
                    f"turn {self.id}: the stream broke {failures} times in a row"
                )
            time.sleep(_backoff(failures))

    def result(self) -> Done:
        """Follows the turn to its end: its ``done`` event, or
        :class:`TurnFailed` with the ``error`` event's code."""
        return _result(list(self))

    def cancel(self) -> bool:
        """Cancels the turn (queued or running); whether it was still
        live."""
        body = self._warden._request("DELETE", f"/v1/turns/{quote(self.id, safe='')}")
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
            headers=_headers(token),
            timeout=_timeout(timeout),
            transport=transport,
        )

    def __enter__(self) -> "Warden":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Closes the connections."""
        self._http.close()

    def _request(self, method: str, path: str, **kwargs: Any) -> Dict[str, Any]:
        response = self._http.request(method, path, **kwargs)
        if response.status_code >= 400:
            raise error_from(response, response.content)
        return response.json()

    def send(
        self,
        message: str,
        *,
        workspace: Optional[str] = None,
        key: Optional[str] = None,
        model: Optional[str] = None,
        agent: Optional[str] = None,
        idempotency_key: Optional[str] = None,
    ) -> Turn:
        """Sends ``message`` to the session of ``workspace`` (an absolute
        directory) or ``key`` (a name); returns once it is durably accepted.
        ``model``: this turn's model; ``agent``: the agent kind expected
        (another than the session's raises :class:`Conflict`).

        ``idempotency_key`` names the message: sending it again with the
        same key returns its turn instead of a second one. Default: a new
        UUID per call, which the call's own retries (a dropped connection)
        reuse; keep your own and pass it again to retry a send whose outcome
        you did not learn."""
        body = _turn_body(message, workspace, key, model, agent)
        headers = {"idempotency-key": idempotency_key or str(uuid.uuid4())}
        tries = 0
        while True:
            tries += 1
            try:
                created = self._request("POST", "/v1/turns", json=body, headers=headers)
                return Turn(self, created["id"], created["key"])
            except Exception as e:
                delay = _send_retry_delay(e, tries)
                if delay is None:
                    raise
                time.sleep(delay)

    def turn(self, id: str, key: str = "") -> Turn:
        """A turn sent earlier (by its id), to follow or cancel."""
        return Turn(self, id, key)

    def sessions(self) -> List[Dict[str, Any]]:
        """The sessions running (on a cluster node: every session)."""
        return list(self._request("GET", "/v1/sessions")["sessions"])

    def session(self, key: str) -> Dict[str, Any]:
        """One session's record (and its running turn)."""
        return self._request("GET", f"/v1/sessions/{quote(key, safe='')}")

    def turns(self, key: str) -> List[Dict[str, Any]]:
        """The session's recent turns still kept, newest first: ``id``,
        ``message_id``, ``outcome`` and, when done, ``text``."""
        return list(self._request("GET", f"/v1/sessions/{quote(key, safe='')}/turns")["turns"])

    def reset(self, key: str) -> None:
        """Forgets that the session was given up."""
        self._request("POST", f"/v1/sessions/{quote(key, safe='')}/reset")

    def events(self, last_event_id: Optional[int] = None) -> Iterator[LifecycleEvent]:
        """Every session's lifecycle events, from now on or after
        ``last_event_id``; a dropped connection is re-attached from the last
        event. A ``reset`` event says events were missed (no longer kept,
        or the server restarted). Endless: break out of it."""
        last = last_event_id
        failures = 0
        while True:
            headers = {} if last is None else {"last-event-id": str(last)}
            try:
                with connect_sse(self._http, "GET", "/v1/events", headers=headers) as source:
                    response = source.response
                    if response.status_code != 200:
                        raise error_from(response, response.read())
                    for sse in source.iter_sse():
                        event_id = int(sse.id) if sse.id else None
                        if event_id is not None:
                            last = event_id
                        failures = 0
                        yield LifecycleEvent(event_id, sse.event, json.loads(sse.data or "{}"))
            except _TRANSIENT:
                pass
            failures += 1
            if failures > MAX_REATTACHES:
                raise ConnectionLost(f"the lifecycle stream broke {failures} times in a row")
            time.sleep(_backoff(failures))


class AsyncTurn:
    """A turn of a session (async): ``async for event in turn``, with the
    same re-attach as :class:`Turn`."""

    def __init__(self, warden: "AsyncWarden", id: str, key: str) -> None:
        self.id = id
        self.key = key
        self.last_event_id = 0
        #: How many times its stream broke and was re-attached.
        self.reattached = 0
        self._warden = warden

    async def __aiter__(self) -> AsyncIterator[TurnEvent]:
        failures = 0
        while True:
            headers = {}
            if self.last_event_id:
                headers["last-event-id"] = str(self.last_event_id)
            try:
                async with aconnect_sse(
                    self._warden._http,
                    "GET",
                    f"/v1/turns/{quote(self.id, safe='')}/events",
                    headers=headers,
                ) as source:
                    response = source.response
                    if response.status_code != 200:
                        error = error_from(response, await response.aread())
                        if isinstance(error, Unavailable) and failures < MAX_REATTACHES:
                            failures += 1
                            await asyncio.sleep(error.retry_after or _backoff(failures))
                            continue
                        raise error
                    async for sse in source.aiter_sse():
                        if not sse.id:
                            continue
                        event = turn_event(int(sse.id), sse.event, json.loads(sse.data))
                        self.last_event_id = event.id
                        failures = 0
                        yield event
                        if event.is_last:
                            return
            except _TRANSIENT:
                pass
            failures += 1
            self.reattached += 1
            if failures > MAX_REATTACHES:
                raise ConnectionLost(
                    f"turn {self.id}: the stream broke {failures} times in a row"
                )
            await asyncio.sleep(_backoff(failures))

    async def result(self) -> Done:
        """Follows the turn to its end (see :meth:`Turn.result`)."""
        return _result([e async for e in self])

    async def cancel(self) -> bool:
        """Cancels the turn; whether it was still live."""
        body = await self._warden._request("DELETE", f"/v1/turns/{quote(self.id, safe='')}")
        return bool(body.get("cancelled"))


class AsyncWarden:
    """A client of one `warden serve` node (async). Use as an async context
    manager, or call :meth:`aclose`."""

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        timeout: float = 30.0,
        transport: Optional[httpx.AsyncBaseTransport] = None,
    ) -> None:
        self._http = httpx.AsyncClient(
            base_url=base_url.rstrip("/"),
            headers=_headers(token),
            timeout=_timeout(timeout),
            transport=transport,
        )

    async def __aenter__(self) -> "AsyncWarden":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Closes the connections."""
        await self._http.aclose()

    async def _request(self, method: str, path: str, **kwargs: Any) -> Dict[str, Any]:
        response = await self._http.request(method, path, **kwargs)
        if response.status_code >= 400:
            raise error_from(response, response.content)
        return response.json()

    async def send(
        self,
        message: str,
        *,
        workspace: Optional[str] = None,
        key: Optional[str] = None,
        model: Optional[str] = None,
        agent: Optional[str] = None,
        idempotency_key: Optional[str] = None,
    ) -> AsyncTurn:
        """See :meth:`Warden.send`."""
        body = _turn_body(message, workspace, key, model, agent)
        headers = {"idempotency-key": idempotency_key or str(uuid.uuid4())}
        tries = 0
        while True:
            tries += 1
            try:
                created = await self._request("POST", "/v1/turns", json=body, headers=headers)
                return AsyncTurn(self, created["id"], created["key"])
            except Exception as e:
                delay = _send_retry_delay(e, tries)
                if delay is None:
                    raise
                await asyncio.sleep(delay)

    def turn(self, id: str, key: str = "") -> AsyncTurn:
        """A turn sent earlier (by its id), to follow or cancel."""
        return AsyncTurn(self, id, key)

    async def sessions(self) -> List[Dict[str, Any]]:
        """See :meth:`Warden.sessions`."""
        return list((await self._request("GET", "/v1/sessions"))["sessions"])

    async def session(self, key: str) -> Dict[str, Any]:
        """See :meth:`Warden.session`."""
        return await self._request("GET", f"/v1/sessions/{quote(key, safe='')}")

    async def turns(self, key: str) -> List[Dict[str, Any]]:
        """See :meth:`Warden.turns`."""
        return list(
            (await self._request("GET", f"/v1/sessions/{quote(key, safe='')}/turns"))["turns"]
        )

    async def reset(self, key: str) -> None:
        """See :meth:`Warden.reset`."""
        await self._request("POST", f"/v1/sessions/{quote(key, safe='')}/reset")

    async def events(self, last_event_id: Optional[int] = None) -> AsyncIterator[LifecycleEvent]:
        """See :meth:`Warden.events`."""
        last = last_event_id
        failures = 0
        while True:
            headers = {} if last is None else {"last-event-id": str(last)}
            try:
                async with aconnect_sse(self._http, "GET", "/v1/events", headers=headers) as source:
                    response = source.response
                    if response.status_code != 200:
                        raise error_from(response, await response.aread())
                    async for sse in source.aiter_sse():
                        event_id = int(sse.id) if sse.id else None
                        if event_id is not None:
                            last = event_id
                        failures = 0
                        yield LifecycleEvent(event_id, sse.event, json.loads(sse.data or "{}"))
            except _TRANSIENT:
                pass
            failures += 1
            if failures > MAX_REATTACHES:
                raise ConnectionLost(f"the lifecycle stream broke {failures} times in a row")
            await asyncio.sleep(_backoff(failures))
