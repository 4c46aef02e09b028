"""The second peer: DBOS Transact with a SQLite system database, running the same shapes.

Each shape is a DBOS workflow whose nodes are steps (``@DBOS.step()``) that do nothing
but stamp the time, like ax's echo handler:

``chain`` N
    A workflow calling N steps in order.
``financial``
    ``parse_pdf`` → (if its status is ``success``) ``extract_metrics`` → ``assess_risk``
    (a step returning the risk level: the condition's decision is recorded, as ax
    records its condition node) → the workflow branches on it to one of three
    ``send_*_email`` steps → ``log_completion``. Five steps run, as five nodes run in
    ax and in LangGraph.
``fanout`` N
    An async workflow: ``src``, then N async steps under ``asyncio.gather`` (DBOS gives
    each step its id when it is called, so a replay is deterministic), then ``join``.

DBOS writes the workflow's status when it starts, each step's output when the step
returns (before the workflow goes on) and the result at the end: each step is durable
before the next starts, the promise ax makes per node. The system database is a SQLite
file put in WAL mode before launch (DBOS leaves SQLite's rollback journal otherwise; ax
and LangGraph's saver use WAL); its ``synchronous`` setting is read back and reported
(FULL is SQLite's default). Concurrent tasks run on a thread pool, one workflow call
each: DBOS runs a synchronous workflow in the calling thread. Per-node time in a chain
is the interval between consecutive step starts, as for LangGraph.
"""

from __future__ import annotations

import asyncio
import shutil
import sqlite3
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import shapes
from bench.common import chain_steps, cpu_seconds, rate, summary

__all__ = ["run"]

Stamps = list[tuple[str, float]]


@dataclass(frozen=True)
class _Workflows:
    """The registered workflows; each takes its shape's argument and runs to the end."""

    chain: Callable[[int], int]
    financial: Callable[[str], dict[str, Any]]
    fanout: Callable[[int], Any]  # async: returns a coroutine


def _define(stamps: Stamps) -> _Workflows:
    """Register the shapes' steps and workflows with DBOS (before launch)."""
    from dbos import DBOS

    def stamp(name: str) -> None:
        stamps.append((name, time.perf_counter()))

    @DBOS.step(name="chain_node")
    def chain_node(i: int) -> int:
        stamp(f"n{i}")
        return i

    @DBOS.workflow(name="bench_chain")
    def chain(n: int) -> int:
        last = -1
        for i in range(n):
            last = chain_node(i)
        return last

    @DBOS.step(name="fan_node")
    async def fan_node(name: str, i: int) -> int:
        stamp(name)
        return i

    @DBOS.workflow(name="bench_fanout")
    async def fanout(width: int) -> int:
        await fan_node("src", -1)
        outs = await asyncio.gather(*(fan_node(f"w{i}", i) for i in range(width)))
        await fan_node("join", width)
        return len(outs)

    @DBOS.step(name="parse_pdf")
    def parse_pdf(doc: str) -> dict[str, Any]:
        stamp("parse_pdf")
        return {"status": "success", "text": f"report {doc}"}

    @DBOS.step(name="extract_metrics")
    def extract_metrics(text: str) -> dict[str, Any]:
        stamp("extract_metrics")
        return {**shapes.FINANCIAL_METRICS, "source": text}

    @DBOS.step(name="assess_risk")
    def assess_risk(m: dict[str, Any]) -> str:
        stamp("assess_risk")
        if m["revenue_growth"] > 0.15 and m["net_profit_margin"] < 0.12:
            return "high_risk"
        if m["debt_to_equity"] > 2.0:
            return "medium_risk"
        return "low_risk"

    @DBOS.step(name="send_high_risk_email")
    def send_high_risk_email(growth: float) -> dict[str, Any]:
        stamp("send_high_risk_email")
        return {"to": "risk-officer@example.com", "growth": growth}

    @DBOS.step(name="send_medium_risk_email")
    def send_medium_risk_email(d2e: float) -> dict[str, Any]:
        stamp("send_medium_risk_email")
        return {"to": "risk-team@example.com", "d2e": d2e}

    @DBOS.step(name="send_low_risk_email")
    def send_low_risk_email(doc: str) -> dict[str, Any]:
        stamp("send_low_risk_email")
        return {"to": "risk-team@example.com", "doc": doc}

    @DBOS.step(name="log_completion")
    def log_completion(doc: str, risk: str) -> dict[str, Any]:
        stamp("log_completion")
        return {"doc": doc, "risk": risk}

    @DBOS.workflow(name="bench_financial")
    def financial(doc: str) -> dict[str, Any]:
        parsed = parse_pdf(doc)
        if parsed["status"] != "success":
            return {}
        metrics = extract_metrics(parsed["text"])
        risk = assess_risk(metrics)
        if risk == "high_risk":
            send_high_risk_email(metrics["revenue_growth"])
        elif risk == "medium_risk":
            send_medium_risk_email(metrics["debt_to_equity"])
        else:
            send_low_risk_email(doc)
        return log_completion(doc, risk)

    return _Workflows(chain=chain, financial=financial, fanout=fanout)


def _call(workflows: _Workflows, kind: str, size: int, i: int) -> Any:
    if kind == "chain":
        return workflows.chain(size)
    if kind == "fanout":
        return asyncio.run(workflows.fanout(size))
    if kind == "financial":
        return workflows.financial(f"doc-{i}")
    raise ValueError(f"unknown shape {kind!r}")


def run(spec: dict[str, Any]) -> dict[str, Any]:
    """Run one DBOS workload: ``shape``, ``size``, ``tasks``, ``inflight``.

    Raises:
        RuntimeError: DBOS is not installed (``scripts/bootstrap bench`` installs it).
    """
    try:
        from importlib.metadata import version

        import sqlalchemy as sa
        from dbos import DBOS
    except ImportError as exc:
        raise RuntimeError(f"the peer is not installed ({exc}): run scripts/bootstrap bench "
                           "(bench/run does)") from exc

    kind, size = spec["shape"], int(spec.get("size", 0))
    tasks, inflight = int(spec.get("tasks", 1)), int(spec.get("inflight", 1))
    home = Path(tempfile.mkdtemp(prefix="ax-bench-dbos-"))
    path = home / "dbos.sqlite"
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode=WAL")  # persistent: a property of the file
    conn.close()
    stamps: Stamps = []
    workflows = _define(stamps)
    t_launch = time.perf_counter()
    dbos = DBOS(config={"name": "ax-bench", "system_database_url": f"sqlite:///{path}",
                        "log_level": "WARNING"})
    try:
        DBOS.launch()
        launch_s = time.perf_counter() - t_launch
        engine = dbos._sys_db.engine  # counts the system database's transactions
        commits = [0]
        sa.event.listen(engine, "commit", lambda _conn: commits.__setitem__(0, commits[0] + 1))
        with engine.connect() as c:
            pragmas = {name: c.execute(sa.text(f"PRAGMA {name}")).scalar()
                       for name in ("journal_mode", "synchronous")}

        def recorded_steps() -> int:
            with engine.connect() as c:
                return int(c.execute(sa.text("SELECT count(*) FROM operation_outputs"))
                           .scalar() or 0)

        # Warm-up: imports, the connection pool, two small workflows end to end.
        for j in range(2):
            _call(workflows, kind, min(size, 3), -1 - j)
        stamps.clear()
        steps_before, commits[0] = recorded_steps(), 0
        cpu0, t0 = cpu_seconds(), time.perf_counter()
        task_walls: list[float] = []
        if inflight <= 1:
            for i in range(tasks):
                t = time.perf_counter()
                _call(workflows, kind, size, i)
                task_walls.append(time.perf_counter() - t)
        else:
            with ThreadPoolExecutor(max_workers=inflight) as pool:
                list(pool.map(lambda i: _call(workflows, kind, size, i), range(tasks)))
        wall, cpu = time.perf_counter() - t0, cpu_seconds() - cpu0
        txns = commits[0]
        steps = recorded_steps() - steps_before
    finally:
        DBOS.destroy(destroy_registry=True)
    nodes_per_task = shapes.executed_nodes(kind, size)
    nodes = nodes_per_task * tasks
    try:
        if len(stamps) != nodes:
            raise RuntimeError(f"DBOS ran {len(stamps)} steps, expected {nodes}")
        if steps != nodes:
            raise RuntimeError(f"DBOS recorded {steps} step outputs, expected {nodes}")
        db_bytes = sum(p.stat().st_size for p in home.iterdir())
    finally:
        shutil.rmtree(home, ignore_errors=True)
    return {
        "engine": f"dbos {version('dbos')}",
        "system_database": f"SQLite (journal_mode={pragmas['journal_mode']}, "
                           f"synchronous={pragmas['synchronous']})",
        "sqlite": pragmas,
        "shape": kind, "size": size, "tasks": tasks, "inflight": inflight,
        "nodes_per_task": nodes_per_task, "nodes": nodes,
        "launch_s": round(launch_s, 4),
        "wall_s": round(wall, 4),
        "tasks_per_s": rate(tasks, wall), "nodes_per_s": rate(nodes, wall),
        "wall_per_node_ms": round(wall / nodes * 1000, 4),
        "cpu_s": round(cpu, 3), "cpu_per_node_ms": round(cpu / nodes * 1000, 4),
        "recorded_steps": steps,
        "sys_db_txns": txns, "sys_db_txns_per_node": round(txns / nodes, 3),
        "task_wall": summary(task_walls),
        "step_interval": summary(chain_steps(stamps) if kind == "chain" else []),
        "db_bytes": db_bytes,
    }
