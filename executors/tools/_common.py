"""Helpers shared by the tools: paced waiting, simulated faults, guarded HTTP."""

from __future__ import annotations

import math
import time
import urllib.parse
import urllib.request
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from executors.contract import Failure, NodeContext, NodeRequest, Outcome, Unavailable
from executors.llm import Keepalive

__all__ = [
    "DEFAULT_ALLOWED_HOSTS",
    "STEP",
    "HostNotAllowed",
    "check_host",
    "heartbeat_interval",
    "no_redirect_opener",
    "pause",
    "read_bounded",
    "simulated_fault",
    "stopped",
]

#: Hosts the HTTP-speaking tools may contact unless ``http_allowed_hosts`` says otherwise.
DEFAULT_ALLOWED_HOSTS: tuple[str, ...] = ("127.0.0.1", "localhost", "::1")
#: Seconds between cancellation checks while a tool waits.
STEP = 0.05


def heartbeat_interval(ctx: NodeContext) -> float:
    """The ``heartbeat_interval`` setting (seconds between heartbeats while waiting)."""
    return float(ctx.settings.get("heartbeat_interval", 1.0))


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


class HostNotAllowed(ValueError):
    """The URL's host is not in ``http_allowed_hosts``."""


def check_host(url: str, settings: Mapping[str, Any]) -> urllib.parse.SplitResult:
    """Parse an http(s) URL and check its host against ``http_allowed_hosts``.

    The default allows only the loopback interface; ``["*"]`` allows every host.

    Raises:
        ValueError: Not an http or https URL with a host.
        HostNotAllowed: The host is not allowed.
    """
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"expected an http:// or https:// URL, got {url!r}")
    allowed = settings.get("http_allowed_hosts", DEFAULT_ALLOWED_HOSTS)
    if isinstance(allowed, str):
        allowed = [allowed]
    names = {str(h).lower() for h in allowed}
    if "*" not in names and parts.hostname.lower() not in names:
        raise HostNotAllowed(
            f"host {parts.hostname!r} is not allowed: add it to the http_allowed_hosts "
            f"setting (now {sorted(names)})"
        )
    return parts


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    # A redirect could lead to a host the allowlist forbids; the 3xx is returned to the
    # caller instead (urllib raises it as an HTTPError).
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def no_redirect_opener() -> urllib.request.OpenerDirector:
    """A urllib opener that ignores proxy variables and never follows redirects."""
    return urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirect())


def read_bounded(stream: Any, limit: int) -> bytes | None:
    """Read at most ``limit`` bytes; None when the stream holds more."""
    data = bytes(stream.read(limit + 1))
    return None if len(data) > limit else data
