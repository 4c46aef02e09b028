"""Small helpers shared by every part of the benchmark: percentiles, resource usage,
progress lines, the choice of a workload's median round.

Nothing here knows about ax; every part reports plain JSON-able dicts built with
:func:`summary` and :func:`usage`.
"""

from __future__ import annotations

import itertools
import math
import os
import resource
import sys
import time
from collections.abc import Sequence
from typing import Any

__all__ = [
    "Progress",
    "cpu_seconds",
    "load",
    "median_round",
    "percentile",
    "rate",
    "summary",
    "usage",
]


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) of ``values`` by linear interpolation; NaN if empty."""
    if not values:
        return math.nan
    ordered = sorted(values)
    if len(ordered) == 1:
        return float(ordered[0])
    pos = (len(ordered) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return float(ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo))


def summary(seconds: Sequence[float]) -> dict[str, Any]:
    """p50/p90/p99/max/mean of durations given in seconds, reported in milliseconds."""
    if not seconds:
        return {"n": 0}
    return {
        "n": len(seconds),
        "p50_ms": round(percentile(seconds, 50) * 1000, 4),
        "p90_ms": round(percentile(seconds, 90) * 1000, 4),
        "p99_ms": round(percentile(seconds, 99) * 1000, 4),
        "max_ms": round(max(seconds) * 1000, 4),
        "mean_ms": round(sum(seconds) / len(seconds) * 1000, 4),
    }


def rate(count: float, seconds: float) -> float:
    """``count / seconds`` rounded for a report (0 when no time passed)."""
    return round(count / seconds, 2) if seconds > 0 else 0.0


def cpu_seconds() -> float:
    """User + system CPU time of this process so far (threads included)."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def usage() -> dict[str, Any]:
    """Peak RSS (MiB) and CPU time of this process, for a workload run in a fresh one."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    # Linux reports ru_maxrss in KiB.
    return {"peak_rss_mib": round(ru.ru_maxrss / 1024, 1),
            "cpu_user_s": round(ru.ru_utime, 3), "cpu_sys_s": round(ru.ru_stime, 3)}


def load() -> list[float]:
    """1, 5 and 15 minute load averages (other work on the machine skews figures)."""
    return [round(x, 2) for x in os.getloadavg()]


class Progress:
    """Prints ``[  12.3s] message`` lines to stderr, timed from construction."""

    def __init__(self, *, quiet: bool = False) -> None:
        self.start = time.monotonic()
        self.quiet = quiet

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def __call__(self, message: str) -> None:
        if not self.quiet:
            print(f"[{self.elapsed:7.1f}s] {message}", file=sys.stderr, flush=True)


def median_round(rounds: Sequence[dict[str, Any]], figure: Sequence[str]) -> dict[str, Any]:
    """The round of a workload to show as its figures: the one whose ``figure`` (a path of
    keys, e.g. ``("wall_per_node_ms",)``) is the median of the rounds'; with an even count
    the lower of the middle two. A round that failed (``error``) or lacks the figure is
    chosen only when no round has it, so one crash does not hide the rounds that ran."""

    def value(result: Any) -> float | None:
        for key in figure:
            if not isinstance(result, dict) or key not in result:
                return None
            result = result[key]
        return float(result) if isinstance(result, int | float) else None

    measured = sorted((r for r in rounds if "error" not in r and value(r) is not None),
                      key=lambda r: value(r) or 0.0)
    if not measured:
        return rounds[0]
    return measured[(len(measured) - 1) // 2]


def chain_steps(stamps: Sequence[tuple[str, float]]) -> list[float]:
    """Intervals between consecutive node starts of a peer's chain runs (``(name, time)``
    stamps in order, one run after another): a stamp of ``n0`` starts a new run, so
    the gap between two runs is not a step."""
    steps: list[float] = []
    for (_, a), (name, b) in itertools.pairwise(stamps):
        if name != "n0":
            steps.append(b - a)
    return steps
