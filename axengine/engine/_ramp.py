"""The slow ramp after an outage, shared by every executor through the store.

When a node's dependency (its model, or its tool) answers *unavailable*, the engine
opens a ramp for that dependency: from then on at most ``limit`` nodes using it are
admitted to run at once, starting with one (the probe). Each success doubles the
limit; at ``RuleConfig.ramp_full`` the outage is over and the ramp is removed. Another
*unavailable* sends the limit back to one.

Admission happens at the claim, before any lease is taken: a node the ramp does not
admit stays WAITING with no owner, so waiting for the ramp can never expire a lease or
spend an attempt. Nodes refused by the ramp are remembered as *waiters*; when slots
free up, the waiters are admitted in seed 000's order (see :func:`order`), whichever
executor happens to ask first.

The ramp is one JSON record per dependency (``StoreKeys.ramp``), read by the rule that
needs it (:class:`~axengine.engine._view.Need`) and written in the same transaction as
the claim or the outcome, under a compare on its revision.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from typing import Any

from axengine.dag import Node

__all__ = ["Ramp", "Waiter", "decode_ramp", "dependency_of", "encode_ramp", "order"]


def dependency_of(node: Node) -> str | None:
    """The dependency a node's outages are counted against: ``model:<model>`` for an
    ``llm_call``, ``tool:<tool>`` for a ``tool_call``; None for other types."""
    if node.type == "llm_call" and node.model:
        return f"model:{node.model}"
    if node.type == "tool_call" and node.tool:
        return f"tool:{node.tool}"
    return None


@dataclass(frozen=True)
class Waiter:
    """A node refused by the ramp, with what orders it.

    Attributes:
        queued: When its current wait for a worker began (``queued_since``).
        deadline: Its task's deadline (0: none).
        budget: Attempts it has left.
        seen: When it last asked; a waiter that stops asking (cancelled, claimed
            elsewhere) is forgotten after ``RuleConfig.ramp_waiter_ttl``.
    """

    queued: float
    deadline: float
    budget: int
    seen: float


def order(item: tuple[str, Waiter]) -> tuple[float, float, int, str]:
    """Seed 000's order of admission: the longest waiting first (the oldest wait tells
    more than the length of the backlog), then the nearest deadline (none: last), then
    the most attempts left (a probe may still fail), then the node's key (stable)."""
    key, waiter = item
    return (waiter.queued, waiter.deadline or math.inf, -waiter.budget, key)


@dataclass(frozen=True)
class Ramp:
    """One dependency's ramp.

    Attributes:
        limit: Nodes admitted at once.
        since: When the dependency was last seen unavailable.
        admitted: ``task/node`` → until when its slot counts (its claim's bound; freed
            earlier by its outcome or its lapsed lease).
        waiting: ``task/node`` → :class:`Waiter`.
    """

    limit: int = 1
    since: float = 0.0
    admitted: dict[str, float] = field(default_factory=dict)
    waiting: dict[str, Waiter] = field(default_factory=dict)

    def pruned(self, now: float, waiter_ttl: float) -> Ramp:
        """Without slots whose bound passed and waiters that stopped asking."""
        return replace(
            self,
            admitted={k: until for k, until in self.admitted.items() if until > now},
            waiting={k: w for k, w in self.waiting.items() if now - w.seen <= waiter_ttl})

    def first(self, count: int) -> list[str]:
        """The ``count`` waiters next in line."""
        return [key for key, _ in sorted(self.waiting.items(), key=order)[:max(count, 0)]]

    def released(self, key: str) -> Ramp:
        return replace(self, admitted={k: v for k, v in self.admitted.items() if k != key})


def encode_ramp(ramp: Ramp) -> bytes:
    data: dict[str, Any] = {
        "limit": ramp.limit, "since": ramp.since, "admitted": ramp.admitted,
        "waiting": {k: [w.queued, w.deadline, w.budget, w.seen]
                    for k, w in ramp.waiting.items()},
    }
    return json.dumps(data, sort_keys=True, separators=(",", ":")).encode()


def decode_ramp(raw: bytes) -> Ramp:
    data = json.loads(raw)
    return Ramp(
        limit=int(data["limit"]), since=float(data["since"]),
        admitted={str(k): float(v) for k, v in data["admitted"].items()},
        waiting={str(k): Waiter(float(q), float(d), int(b), float(s))
                 for k, (q, d, b, s) in data["waiting"].items()})
