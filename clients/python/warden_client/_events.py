"""The events of a turn and of the lifecycle stream, typed.

Each keeps its whole ``data``: a field this client does not know (a newer
server) is there too. ``at`` is when the server made the event.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Dict, Optional

from ._sse import parse_at


@dataclass(frozen=True)
class TurnEvent:
    """One event of a turn: its number (unique and increasing within the
    turn, from 1), its type and its fields. Types this client does not know
    (a newer server) come as this class."""

    id: int
    type: str
    data: Dict[str, Any] = field(default_factory=dict)

    @property
    def at(self) -> Optional[datetime]:
        """When the server made it (``data["at"]``, RFC 3339, aware);
        ``None`` from a server older than that field."""
        return parse_at(self.data.get("at"))

    @property
    def is_last(self) -> bool:
        """Whether it ends the turn (``done`` or ``error``)."""
        return self.type in ("done", "error")


@dataclass(frozen=True)
class Queued(TurnEvent):
    """Waiting: behind ``behind`` turns of its session, or for a stream
    slot."""

    @property
    def behind(self) -> Optional[int]:
        return self.data.get("behind")


@dataclass(frozen=True)
class Started(TurnEvent):
    """An attempt's stream opened."""

    @property
    def attempt(self) -> int:
        return int(self.data.get("attempt", 0))


@dataclass(frozen=True)
class Text(TurnEvent):
    """A delta of the reply's text."""

    @property
    def text(self) -> str:
        return str(self.data.get("text", ""))


@dataclass(frozen=True)
class Thinking(TurnEvent):
    """A delta of the model's thinking."""

    @property
    def text(self) -> str:
        return str(self.data.get("text", ""))


@dataclass(frozen=True)
class Tool(TurnEvent):
    """A tool call started or finished."""

    @property
    def state(self) -> str:
        return str(self.data.get("state", ""))


@dataclass(frozen=True)
class Retrying(TurnEvent):
    """An attempt failed; the turn starts over: drop the text so far."""

    @property
    def code(self) -> str:
        return str(self.data.get("code", ""))


@dataclass(frozen=True)
class Continuing(TurnEvent):
    """An attempt broke mid-text; the reply goes on where it broke: keep
    the text so far."""

    @property
    def code(self) -> str:
        return str(self.data.get("code", ""))


@dataclass(frozen=True)
class Restarting(TurnEvent):
    """The conversation could not be resumed; a fresh session answers the
    message: drop the text so far."""


@dataclass(frozen=True)
class Done(TurnEvent):
    """The turn's answer (last)."""

    @property
    def text(self) -> str:
        return str(self.data.get("text", ""))

    @property
    def attempts(self) -> int:
        return int(self.data.get("attempts", 0))

    @property
    def context_percent(self) -> Optional[int]:
        context = self.data.get("context") or {}
        return context.get("percent")


@dataclass(frozen=True)
class Error(TurnEvent):
    """The turn failed (last): ``code``, ``message``, ``exit``."""

    @property
    def code(self) -> str:
        return str(self.data.get("code", ""))

    @property
    def message(self) -> str:
        return str(self.data.get("message", ""))

    @property
    def exit(self) -> int:
        return int(self.data.get("exit", 1))


_TYPES = {
    "queued": Queued,
    "started": Started,
    "text": Text,
    "thinking": Thinking,
    "tool": Tool,
    "retrying": Retrying,
    "continuing": Continuing,
    "restarting": Restarting,
    "done": Done,
    "error": Error,
}


def turn_event(id: int, type: str, data: Dict[str, Any]) -> TurnEvent:
    """The typed event."""
    return _TYPES.get(type, TurnEvent)(id, type, data)


@dataclass(frozen=True)
class LifecycleEvent:
    """One event of ``GET /v1/events`` (``turn_started``, ``turn_finished``,
    ``stream_timed_out``…). ``reset`` (no id) says the client missed events
    no longer kept, or the server restarted (``data["reason"]``); the
    events kept follow."""

    id: Optional[int]
    type: str
    data: Dict[str, Any] = field(default_factory=dict)

    @property
    def at(self) -> Optional[datetime]:
        """When the server made it (see :attr:`TurnEvent.at`)."""
        return parse_at(self.data.get("at"))
