"""Fault injection for crash tests: die by SIGKILL at a named point.

``AX_FAULT_POINT=<name>:<n>`` (read once, at import) makes the process SIGKILL itself
the n-th time execution passes ``faults.point(<name>)``. Points sit where a crash is
most dangerous: right after a store commit and before the enqueue, between claiming and
running, between performing a side effect and recording it, etc. Unset, a point costs
one dict lookup.
"""

from __future__ import annotations

import os
import signal

__all__ = ["POINTS", "point"]

#: Every fault point the code passes, for tests that enumerate them.
POINTS: tuple[str, ...] = (
    "before-commit",
    "after-commit",
    "after-enqueue",
    "after-pop",
    "after-claim",
    "handler-running",
    "before-complete",
    "after-complete",
    "after-ack",
    "effect-begun",
    "effect-performed",
)


def _parse(spec: str) -> tuple[str, int] | None:
    if not spec:
        return None
    name, _, count = spec.partition(":")
    return name, int(count or "1")


_TARGET = _parse(os.environ.get("AX_FAULT_POINT", ""))
#: ``AX_FAULT_TRACE=<file>`` appends the name of every point passed (to plan crash tests).
_TRACE = os.environ.get("AX_FAULT_TRACE", "")
_hits: dict[str, int] = {}


def point(name: str) -> None:
    """Mark a fault point; kills the process here when ``AX_FAULT_POINT`` says so."""
    if _TRACE:
        with open(_TRACE, "a", encoding="utf-8") as fh:
            fh.write(name + "\n")
    if _TARGET is None or _TARGET[0] != name:
        return
    _hits[name] = _hits.get(name, 0) + 1
    if _hits[name] == _TARGET[1]:
        os.kill(os.getpid(), signal.SIGKILL)
