"""The SDK as users call it: ``ax.run`` one shot, and the reusable ``ax.open`` engine.

``oneshot``
    ``ax.run(path, input, home=...)`` in a loop: every call opens the embedded engine
    (store, executor, reconciler), reads and validates the DAG file, runs the task and
    closes everything again.
``reuse``
    ``with ax.open(home) as engine:`` then ``engine.run(path, input)`` in a loop: the
    engine and the parsed DAG are set up once.

Both use the SDK's defaults (``AX_*`` variables are cleared in this process): the
shape's YAML file on disk, the real ``echo`` tool behind the default handler, 4 slots.
Each run's wall time (``perf_counter``) and CPU time (``time.process_time``: every
thread of the process) are recorded after warm-up runs (two by default); wall / CPU near 1 means
the run never waits on a timer or a poll. Afterwards the timelines of the timed tasks
give each node's ``ready`` → ``committed`` time, as for the embedded runs.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

from bench import shapes
from bench.axrun import timeline_latencies
from bench.common import rate, summary

__all__ = ["run"]


async def _latencies(home: Path, task_ids: Sequence[str]) -> dict[str, list[float]]:
    """``ready`` → ``committed`` (and its halves) of every node of ``task_ids``."""
    from axengine.config import AxConfig
    from axengine.wiring import build_runtime

    runtime = build_runtime(AxConfig.from_env(home=home))
    out: dict[str, list[float]] = {}
    try:
        for task_id in task_ids:
            for key, values in timeline_latencies(await runtime.engine.events(task_id)).items():
                out.setdefault(key, []).extend(values)
    finally:
        await runtime.close()
    return out


def run(spec: dict[str, Any]) -> dict[str, Any]:
    """Run ``runs`` SDK calls: ``mode`` (``oneshot``/``reuse``), ``shape``
    (``financial``/``chain``), ``size``, ``warmup`` (untimed calls first, default 2),
    ``latency_tasks``."""
    for name in [k for k in os.environ if k.startswith("AX_")]:
        del os.environ[name]
    import axengine as ax

    mode, kind = spec["mode"], spec.get("shape", "financial")
    size, runs = int(spec.get("size", 0)), int(spec.get("runs", 10))
    root = Path(tempfile.mkdtemp(prefix="ax-bench-sdk-"))
    home = root / "ax"
    dag = root / f"{kind}.yaml"
    dag.write_text(yaml.safe_dump(shapes.shape(kind, size), sort_keys=False))
    walls: list[float] = []
    cpus: list[float] = []
    ids: list[str] = []
    statuses: dict[str, int] = {}

    def timed(call: Callable[[int], Any], i: int) -> None:
        t, c = time.perf_counter(), time.process_time()
        result = call(i)
        if i >= 0:
            walls.append(time.perf_counter() - t)
            cpus.append(time.process_time() - c)
            ids.append(result.task_id)
            statuses[result.status] = statuses.get(result.status, 0) + 1

    def inputs(i: int) -> dict[str, Any]:
        return {"doc": f"doc-{i}", "seed": i}

    def loop(call: Callable[[int], Any]) -> float:
        """``warmup`` untimed calls, then ``runs`` timed ones; the timed loop's time."""
        for i in range(-1, -1 - int(spec.get("warmup", 2)), -1):
            timed(call, i)
        t0 = time.perf_counter()
        for i in range(runs):
            timed(call, i)
        return time.perf_counter() - t0

    open_s: float | None = None
    close_s: float | None = None
    try:
        if mode == "oneshot":
            elapsed = loop(lambda i: ax.run(dag, inputs(i), home=home))
        elif mode == "reuse":
            t = time.perf_counter()
            engine = ax.open(home)
            open_s = time.perf_counter() - t
            try:
                elapsed = loop(lambda i: engine.run(dag, inputs(i)))
            finally:
                t = time.perf_counter()
                engine.close()
                close_s = time.perf_counter() - t
        else:
            raise ValueError(f"unknown mode {mode!r}")
        wall = sum(walls)
        latencies = asyncio.run(_latencies(home, ids[: int(spec.get("latency_tasks", runs))]))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    nodes_per_task = shapes.executed_nodes(kind, size)
    nodes = nodes_per_task * runs
    cpu = sum(cpus)
    return {
        "mode": mode, "shape": kind, "size": size, "runs": runs, "tasks": runs,
        "nodes_per_task": nodes_per_task, "nodes": nodes, "statuses": statuses,
        "wall_s": round(wall, 4), "elapsed_s": round(elapsed, 4), "cpu_s": round(cpu, 4),
        "open_s": None if open_s is None else round(open_s, 4),
        "close_s": None if close_s is None else round(close_s, 4),
        "run_wall": summary(walls), "run_cpu": summary(cpus),
        "wall_over_cpu": round(wall / cpu, 3) if cpu else None,
        "wall_per_node_ms": round(wall / nodes * 1000, 4),
        "cpu_per_node_ms": round(cpu / nodes * 1000, 4),
        "nodes_per_s": rate(nodes, wall),
        "node_latency": {k: summary(v) for k, v in latencies.items()},
    }
