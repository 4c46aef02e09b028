"""Runs one workload in a fresh process (so its peak RSS is its own) and prints the
result as one ``BENCH-RESULT {json}`` line on stdout.

Usage: ``python -m bench.child < spec.json`` where ``spec["part"]`` names the module
(``floor``, ``axrun``, ``peer``, ``dbos``, ``sdk``, ``reconciler``, ``api``,
``validation``, ``payload``).
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from bench.common import load, usage

__all__ = ["MARKER", "main"]

#: Prefix of the line that carries the result.
MARKER = "BENCH-RESULT "


def main() -> int:
    spec: dict[str, Any] = json.load(sys.stdin)
    part = spec["part"]
    if part == "floor":
        from bench import floor as module
    elif part == "axrun":
        from bench import axrun as module  # type: ignore[no-redef]
    elif part == "peer":
        from bench import peer as module  # type: ignore[no-redef]
    elif part == "dbos":
        from bench import dbos_peer as module  # type: ignore[no-redef]
    elif part == "sdk":
        from bench import sdk as module  # type: ignore[no-redef]
    elif part == "reconciler":
        from bench import reconcile as module  # type: ignore[no-redef]
    elif part == "api":
        from bench import api as module  # type: ignore[no-redef]
    elif part == "validation":
        from bench import validation as module  # type: ignore[no-redef]
    elif part == "payload":
        from bench import payload as module  # type: ignore[no-redef]
    else:
        raise SystemExit(f"unknown part {part!r}")
    load_before, t = load(), time.perf_counter()
    result = module.run(spec)
    result["process"] = {**usage(), "elapsed_s": round(time.perf_counter() - t, 3),
                         "load_before": load_before, "load_after": load()}
    print(MARKER + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
