"""The SSE layer: what a stream dispatches, per the SSE spec.

The server keeps a quiet stream alive with a comment (``: keep-alive``)
every 15 s. A comment is not an event, and an event whose data is empty
carries nothing: neither reaches the caller. (httpx-sse 0.4 hands a comment
over as an event with empty data, and the last ``id`` carried over.)
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, AsyncIterator, Iterator, Optional

from httpx_sse import EventSource, ServerSentEvent


def _carries_data(sse: ServerSentEvent) -> bool:
    return sse.data != ""


def events(source: EventSource) -> Iterator[ServerSentEvent]:
    """The events of ``source`` that carry data (no comment, no empty event)."""
    for sse in source.iter_sse():
        if _carries_data(sse):
            yield sse


async def aevents(source: EventSource) -> AsyncIterator[ServerSentEvent]:
    """See :func:`events`."""
    async for sse in source.aiter_sse():
        if _carries_data(sse):
            yield sse


def parse_at(value: Any) -> Optional[datetime]:
    """An event's ``at`` (RFC 3339, the server's clock) as an aware
    datetime; ``None`` when absent (an older server) or unreadable."""
    if not isinstance(value, str) or not value:
        return None
    text = value[:-1] + "+00:00" if value[-1] in "Zz" else value
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        return None
