"""``sleep``: wait a number of seconds while heartbeating (timeout and lease tests).

Input: seconds, or ``{"seconds": n}``. Output: ``{"slept": n}``. Stops early (and
reports so) once the run is cancelled or its fence goes stale.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from executors.contract import Failure, NodeContext, NodeRequest, Outcome, Success
from executors.tools._common import pause, stopped

__all__ = ["sleep"]


def sleep(request: NodeRequest, ctx: NodeContext) -> Outcome:
    """Wait the seconds given as input."""
    seconds = request.input
    if isinstance(seconds, Mapping):
        seconds = seconds.get("seconds")
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, int | float)
        or not math.isfinite(seconds)
        or seconds < 0
    ):
        return Failure(
            f"node {request.node_id!r}: sleep input must be a non-negative number of "
            f"seconds (or {{seconds: n}}), got {request.input!r}",
            retryable=False,
        )
    if not pause(ctx, float(seconds)):
        return stopped()
    return Success({"slept": seconds})
