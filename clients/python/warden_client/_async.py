"""`AsyncWarden` and `AsyncTurn`: the API of `warden serve`, async — the
surface of :mod:`._sync` with ``await`` and ``async for``."""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator, Dict, List, Optional

import httpx
from httpx_sse import aconnect_sse

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


class AsyncTurn:
    """A turn of a session (async): ``async for event in turn``, with the
    same re-attach as :class:`warden_client.Turn`."""

    def __init__(self, warden: "AsyncWarden", id: str, key: str, last_event_id: int = 0) -> None:
        self.id = id
        self.key = key
        #: The last event's id: where the next (re-)attach goes on from.
        self.last_event_id = last_event_id
        #: How many times its stream broke and was re-attached.
        self.reattached = 0
        self._warden = warden
        #: Its last event (``done`` or ``error``), once seen.
        self._end: Optional[TurnEvent] = None

    async def __aiter__(self) -> AsyncIterator[TurnEvent]:
        if self._end is not None:
            return  # it ended: there is nothing after its last event
        failures = 0
        last_error: Optional[Exception] = None
        while True:
            headers = {}
            if self.last_event_id:
                headers["last-event-id"] = str(self.last_event_id)
            try:
                async with aconnect_sse(
                    self._warden._http, "GET", f"/v1/turns/{q(self.id)}/events", headers=headers
                ) as source:
                    response = source.response
                    if response.status_code != 200:
                        error = error_from(response, await response.aread())
                        if isinstance(error, Unavailable) and failures < MAX_REATTACHES:
                            failures += 1
                            await asyncio.sleep(error.retry_after or backoff(failures))
                            continue
                        raise error
                    async for sse in _sse.aevents(source):
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
            failures += 1
            self.reattached += 1
            if failures > MAX_REATTACHES:
                raise gave_up(f"turn {self.id}", failures, last_error) from last_error
            await asyncio.sleep(backoff(failures))

    async def result(self) -> Done:
        """Follows the turn to its end (see :meth:`warden_client.Turn.result`):
        at once when it was already iterated to its end."""
        async for _ in self:
            pass
        return result(self._end)

    async def cancel(self) -> bool:
        """Cancels the turn; whether it was still live."""
        body = await self._warden._request("DELETE", f"/v1/turns/{q(self.id)}")
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
            headers={"authorization": f"Bearer {token}"},
            timeout=http_timeout(timeout),
            transport=transport,
        )

    async def __aenter__(self) -> "AsyncWarden":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Closes the connections."""
        await self._http.aclose()

    async def _answer(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = await self._http.request(method, path, **kwargs)
        except httpx.TransportError as e:
            raise transport_error(e, f"{method} {path}") from e
        if response.status_code >= 400:
            raise error_from(response, response.content)
        return response

    async def _request(self, method: str, path: str, **kwargs: Any) -> Dict[str, Any]:
        return json_answer(await self._answer(method, path, **kwargs))

    async def send(
        self,
        message: str,
        *,
        workspace: Optional[str] = None,
        key: Optional[str] = None,
        model: Optional[str] = None,
        agent: Optional[Agent] = None,
        idempotency_key: Optional[str] = None,
    ) -> AsyncTurn:
        """See :meth:`warden_client.Warden.send`."""
        body = turn_body(message, workspace, key, model, agent)
        headers = idempotency_headers(idempotency_key)
        tries = 0
        while True:
            tries += 1
            try:
                created = await self._request("POST", "/v1/turns", json=body, headers=headers)
                return AsyncTurn(self, created["id"], created["key"])
            except Exception as e:
                delay = send_retry_delay(e, tries)
                if delay is None:
                    raise
                await asyncio.sleep(delay)

    def turn(self, id: str, key: str = "", *, last_event_id: int = 0) -> AsyncTurn:
        """See :meth:`warden_client.Warden.turn`."""
        return AsyncTurn(self, id, key, last_event_id)

    async def sessions(self, detail: bool = False) -> List[Dict[str, Any]]:
        """See :meth:`warden_client.Warden.sessions`."""
        params = {"detail": "full"} if detail else None
        return list((await self._request("GET", "/v1/sessions", params=params))["sessions"])

    async def session(self, key: str) -> Dict[str, Any]:
        """See :meth:`warden_client.Warden.session`."""
        return await self._request("GET", f"/v1/sessions/{q(key)}")

    async def turns(self, key: str) -> List[Dict[str, Any]]:
        """See :meth:`warden_client.Warden.turns`."""
        return list((await self._request("GET", f"/v1/sessions/{q(key)}/turns"))["turns"])

    async def reset(self, key: str) -> None:
        """See :meth:`warden_client.Warden.reset`."""
        await self._request("POST", f"/v1/sessions/{q(key)}/reset")

    async def recover(self, key: str, how: str) -> bool:
        """See :meth:`warden_client.Warden.recover`."""
        body = await self._request(
            "POST", f"/v1/sessions/{q(key)}/recover", params={"how": how}
        )
        return bool(body.get("recovered"))

    async def server(self) -> Dict[str, Any]:
        """See :meth:`warden_client.Warden.server`."""
        return await self._request("GET", "/v1/server")

    async def metrics(self) -> str:
        """See :meth:`warden_client.Warden.metrics`."""
        return (await self._answer("GET", "/metrics")).text

    async def events(self, last_event_id: Optional[int] = None) -> AsyncIterator[LifecycleEvent]:
        """See :meth:`warden_client.Warden.events`."""
        last = last_event_id
        failures = 0
        last_error: Optional[Exception] = None
        while True:
            headers = {} if last is None else {"last-event-id": str(last)}
            try:
                async with aconnect_sse(self._http, "GET", "/v1/events", headers=headers) as source:
                    response = source.response
                    if response.status_code != 200:
                        raise error_from(response, await response.aread())
                    async for sse in _sse.aevents(source):
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
            await asyncio.sleep(backoff(failures))
