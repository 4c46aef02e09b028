"""Helpers shared by the tools: paced waiting, simulated faults, bounded reads.

What a tool may reach (hosts, local files, mail recipients) is decided in one place,
:mod:`executors.policy`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from executors.contract import Failure, NodeContext, NodeRequest, Outcome, Unavailable
from executors.keepalive import DEFAULT_HEARTBEAT_INTERVAL, Keepalive

__all__ = [
    "STEP",
    "heartbeat_interval",
    "pause",
    "read_bounded",
    "simulated_fault",
    "stopped",
]

#: Seconds between cancellation checks while a tool waits.
STEP = 0.05


def heartbeat_interval(ctx: NodeContext) -> float:
    """The ``heartbeat_interval`` setting (seconds between heartbeats while waiting)."""
    return float(ctx.settings.get("heartbeat_interval", DEFAULT_HEARTBEAT_INTERVAL))


def stopped() -> Failure:
    """The outcome of a run that stopped because it was cancelled or fenced out.

    The worker discards it (its fence is stale or the node was cancelled), so it only
    has to be honest, not useful.
    """
    return Failure(
        "stopped: the run was cancelled or its fence went stale",
        retryable=True,
        details={"stopped": True},
    )


def pause(ctx: NodeContext, seconds: float, keepalive: Keepalive | None = None) -> bool:
    """Wait ``seconds`` in small steps, heartbeating at the configured interval.

    Returns:
        True after the full wait; False as soon as the run is cancelled or fenced out.
    """
    alive = keepalive or Keepalive(ctx, interval=heartbeat_interval(ctx))
    deadline = time.monotonic() + max(0.0, seconds)
    while (remaining := deadline - time.monotonic()) > 0:
        time.sleep(min(STEP, remaining))
        if not alive():
            return False
    return alive()


def simulated_fault(request: NodeRequest, ctx: NodeContext) -> Outcome | None:
    """Apply the node's generic ``simulate:`` knobs before a tool runs.

    ``unavailable`` / ``unavailable_until`` (epoch seconds) → ``Unavailable``;
    ``latency`` → wait first; ``fail_attempts: N`` → the first N attempts fail with a
    retryable error. All of them act before the tool does anything, so a side-effecting
    tool never half-runs because of a simulated fault.

    Returns:
        The outcome to report instead of running the tool, or None to run it.
    """
    knobs = request.config.get("simulate") or {}
    if not isinstance(knobs, Mapping):
        return Failure(f"node {request.node_id!r}: simulate must be a mapping", retryable=False)
    tool = request.config.get("tool")
    try:
        until = _number(knobs, "unavailable_until", 0.0)
        latency = _number(knobs, "latency", 0.0)
        failures = int(_number(knobs, "fail_attempts", 0))
    except ValueError as exc:
        return Failure(f"node {request.node_id!r}: {exc}", retryable=False)
    if knobs.get("unavailable"):
        return Unavailable(f"tool:{tool}", f"tool {tool!r} is down (simulate.unavailable)")
    if until and time.time() < until:
        stamp = datetime.fromtimestamp(until, UTC).isoformat(timespec="seconds")
        return Unavailable(
            f"tool:{tool}", f"tool {tool!r} is down until {stamp} (simulate.unavailable_until)"
        )
    if latency and not pause(ctx, latency):
        return stopped()
    if request.attempt <= failures:
        return Failure(
            f"simulated transient failure of tool {tool!r} on attempt {request.attempt} of "
            f"the first {failures} (simulate.fail_attempts)",
            retryable=True,
        )
    return None


def _number(knobs: Mapping[str, Any], name: str, default: float) -> float:
    value = knobs.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"simulate.{name} must be a number, got {value!r}")
    return float(value)


def read_bounded(stream: Any, limit: int) -> bytes | None:
    """Read at most ``limit`` bytes; None when the stream holds more."""
    data = bytes(stream.read(limit + 1))
    return None if len(data) > limit else data
