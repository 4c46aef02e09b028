"""In-memory fakes of the executor contract (``NodeContext``, ``Effect``) and helpers.

The outbox fake follows the contract's state machine exactly: ``begin`` on NEW moves to
SENDING and returns NEW; on SENDING it moves to UNKNOWN and returns SENDING; DONE and
UNKNOWN stay put; ``done`` settles SENDING or UNKNOWN (a verified delivery).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from executors.contract import EffectState, NodeRequest


@dataclass
class FakeEffect:
    """One outbox record kept in memory."""

    key: str
    status: EffectState = "NEW"
    recorded: Mapping[str, Any] | None = None
    begins: int = 0

    def state(self) -> EffectState:
        return self.status

    def begin(self) -> EffectState:
        self.begins += 1
        before = self.status
        if before == "NEW":
            self.status = "SENDING"
        elif before == "SENDING":
            self.status = "UNKNOWN"
        return before

    def done(self, result: Mapping[str, Any]) -> None:
        assert self.status in ("SENDING", "UNKNOWN"), f"done() from {self.status}"
        self.status = "DONE"
        self.recorded = dict(result)

    def result(self) -> Mapping[str, Any] | None:
        return self.recorded


@dataclass
class FakeContext:
    """A ``NodeContext`` that records everything a handler does.

    Attributes:
        stale_after_heartbeats: heartbeat() returns False from this call number on.
        stale_after_progress: progress() returns False from this call number on.
        on_progress: Called with each marker (tests use it to crash or cancel mid-run).
    """

    settings: dict[str, Any] = field(default_factory=dict)
    effects: dict[str, FakeEffect] = field(default_factory=dict)
    heartbeats: int = 0
    markers: list[str] = field(default_factory=list)
    stale_after_heartbeats: int | None = None
    stale_after_progress: int | None = None
    on_progress: Callable[[str], None] | None = None
    checkpoints: list[Any] = field(default_factory=list)
    _cancelled: threading.Event = field(default_factory=threading.Event)

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def cancel(self) -> None:
        self._cancelled.set()

    def heartbeat(self) -> bool:
        self.heartbeats += 1
        return self.stale_after_heartbeats is None or self.heartbeats < self.stale_after_heartbeats

    def progress(self, marker: str) -> bool:
        self.markers.append(marker)
        if self.on_progress is not None:
            self.on_progress(marker)
        return self.stale_after_progress is None or len(self.markers) < self.stale_after_progress

    def checkpoint(self, state: Any) -> bool:
        self.checkpoints.append(state)
        return True

    def effect(self, key: str) -> FakeEffect:
        return self.effects.setdefault(key, FakeEffect(key))


def make_request(
    node_type: str = "tool_call",
    *,
    config: Mapping[str, Any] | None = None,
    input: Any = None,
    attempt: int = 1,
    task_id: str = "task-1",
    node_id: str = "node-1",
    input_revision: str = "rev-1",
) -> NodeRequest:
    """A NodeRequest with test defaults."""
    return NodeRequest(
        task_id=task_id,
        node_id=node_id,
        node_type=node_type,
        attempt=attempt,
        fence=attempt,
        config=dict(config or {}),
        input=input,
        input_revision=input_revision,
    )
