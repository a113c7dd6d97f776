"""A client for `warden serve`: run turns on long-lived LLM agent sessions
over HTTP + SSE, from Python (sync and async).

    from warden_client import Warden

    with Warden("http://127.0.0.1:8700", token) as w:
        turn = w.send("why does the build fail?", workspace="/abs/ws")
        for event in turn:          # re-attaches by itself after a dropped connection
            ...
"""

from ._async import AsyncTurn, AsyncWarden
from ._common import AGENTS, Agent
from ._sync import Turn, Warden
from ._errors import (
    Conflict,
    ConnectionLost,
    IdempotencyKeyReused,
    InvalidRequest,
    NotFound,
    TurnFailed,
    Unauthorized,
    Unavailable,
    WardenError,
)
from ._events import (
    Continuing,
    Done,
    Error,
    LifecycleEvent,
    Queued,
    Restarting,
    Retrying,
    Started,
    Text,
    Thinking,
    Tool,
    TurnEvent,
)

__all__ = [
    "AGENTS",
    "Agent",
    "AsyncTurn",
    "AsyncWarden",
    "Conflict",
    "ConnectionLost",
    "Continuing",
    "Done",
    "Error",
    "IdempotencyKeyReused",
    "InvalidRequest",
    "LifecycleEvent",
    "NotFound",
    "Queued",
    "Restarting",
    "Retrying",
    "Started",
    "Text",
    "Thinking",
    "Tool",
    "Turn",
    "TurnEvent",
    "TurnFailed",
    "Unauthorized",
    "Unavailable",
    "Warden",
    "WardenError",
]
