"""The peer: LangGraph with its SQLite checkpointer, running the same shapes.

Each shape is a ``StateGraph`` of no-op nodes compiled with
``langgraph.checkpoint.sqlite.SqliteSaver`` on a file database (WAL, ``synchronous``
set to ``FULL`` like ax's embedded store) and invoked with ``durability="sync"``, so a
step's checkpoint is on disk before the next step starts: the same promise ax makes
per node. Per-node time is taken inside the nodes (``perf_counter`` at entry): in a
chain, the interval between two consecutive node starts is the framework's per-step
overhead (checkpoint write included), the counterpart of ax's ``ready`` → ``committed``.

Concurrent tasks run on a thread pool (``inflight`` threads, one ``invoke`` each, one
shared saver: its connection is guarded by the saver's lock), which is how a
synchronous LangGraph application serves several requests.

``mode: "oneshot"`` is the counterpart of a one-shot ``ax.run``: every call opens the
saver on the same file, builds, compiles and invokes the graph, and closes the saver.
"""

from __future__ import annotations

import operator
import secrets
import shutil
import sqlite3
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Annotated, Any, TypedDict

from bench import shapes
from bench.common import chain_steps, cpu_seconds, rate, summary

__all__ = ["run"]


class _ChainState(TypedDict, total=False):
    last: int


class _FanState(TypedDict, total=False):
    outs: Annotated[list[int], operator.add]


class _FinState(TypedDict, total=False):
    doc: str
    parse: dict[str, Any]
    metrics: dict[str, Any]
    risk: str
    email: dict[str, Any]
    log: dict[str, Any]


Stamps = list[tuple[str, float]]


def _stamp(stamps: Stamps, name: str) -> None:
    stamps.append((name, time.perf_counter()))


def _chain_graph(n: int, stamps: Stamps) -> Any:
    from langgraph.graph import END, START, StateGraph

    graph: Any = StateGraph(_ChainState)

    def make(i: int) -> Callable[[_ChainState], dict[str, Any]]:
        name = f"n{i}"

        def node(state: _ChainState) -> dict[str, Any]:
            _stamp(stamps, name)
            return {"last": i}

        return node

    for i in range(n):
        graph.add_node(f"n{i}", make(i))
    graph.add_edge(START, "n0")
    for i in range(n - 1):
        graph.add_edge(f"n{i}", f"n{i + 1}")
    graph.add_edge(f"n{n - 1}", END)
    return graph


def _fanout_graph(width: int, stamps: Stamps) -> Any:
    from langgraph.graph import END, START, StateGraph

    graph: Any = StateGraph(_FanState)

    def make(name: str, value: int) -> Callable[[_FanState], dict[str, Any]]:
        def node(state: _FanState) -> dict[str, Any]:
            _stamp(stamps, name)
            return {"outs": [value]}

        return node

    branches = [f"w{i}" for i in range(width)]
    graph.add_node("src", make("src", -1))
    for i, name in enumerate(branches):
        graph.add_node(name, make(name, i))
        graph.add_edge("src", name)
    graph.add_node("join", make("join", width))
    graph.add_edge(START, "src")
    graph.add_edge(branches, "join")  # waits for every branch
    graph.add_edge("join", END)
    return graph


def _financial_graph(stamps: Stamps) -> Any:
    from langgraph.graph import END, START, StateGraph

    graph: Any = StateGraph(_FinState)

    def parse_pdf(state: _FinState) -> dict[str, Any]:
        _stamp(stamps, "parse_pdf")
        return {"parse": {"status": "success", "text": f"report {state['doc']}"}}

    def extract_metrics(state: _FinState) -> dict[str, Any]:
        _stamp(stamps, "extract_metrics")
        return {"metrics": {**shapes.FINANCIAL_METRICS, "source": state["parse"]["text"]}}

    def assess_risk(state: _FinState) -> dict[str, Any]:
        _stamp(stamps, "assess_risk")
        m = state["metrics"]
        if m["revenue_growth"] > 0.15 and m["net_profit_margin"] < 0.12:
            return {"risk": "high_risk"}
        if m["debt_to_equity"] > 2.0:
            return {"risk": "medium_risk"}
        return {"risk": "low_risk"}

    def email(name: str) -> Callable[[_FinState], dict[str, Any]]:
        def node(state: _FinState) -> dict[str, Any]:
            _stamp(stamps, name)
            return {"email": {"to": "risk-team@example.com",
                              "d2e": state["metrics"]["debt_to_equity"]}}

        return node

    def log_completion(state: _FinState) -> dict[str, Any]:
        _stamp(stamps, "log_completion")
        return {"log": {"doc": state["doc"], "risk": state["risk"]}}

    graph.add_node("parse_pdf", parse_pdf)
    graph.add_node("extract_metrics", extract_metrics)
    graph.add_node("assess_risk", assess_risk)
    for level in ("high", "medium", "low"):
        graph.add_node(f"send_{level}_risk_email", email(f"send_{level}_risk_email"))
        graph.add_edge(f"send_{level}_risk_email", "log_completion")
    graph.add_node("log_completion", log_completion)
    graph.add_edge(START, "parse_pdf")
    graph.add_conditional_edges(
        "parse_pdf", lambda s: "extract_metrics" if s["parse"]["status"] == "success" else END,
        ["extract_metrics", END])
    graph.add_edge("extract_metrics", "assess_risk")
    graph.add_conditional_edges(
        "assess_risk", lambda s: "send_" + s["risk"] + "_email",
        [f"send_{level}_risk_email" for level in ("high", "medium", "low")])
    graph.add_edge("log_completion", END)
    return graph


def _saver(path: Path) -> tuple[Any, sqlite3.Connection]:
    from langgraph.checkpoint.sqlite import SqliteSaver

    conn = sqlite3.connect(str(path), check_same_thread=False)
    saver = SqliteSaver(conn)
    saver.setup()  # WAL
    conn.execute("PRAGMA synchronous=FULL")
    return saver, conn


def _build(kind: str, size: int, stamps: Stamps) -> Any:
    if kind == "chain":
        return _chain_graph(size, stamps)
    if kind == "fanout":
        return _fanout_graph(size, stamps)
    if kind == "financial":
        return _financial_graph(stamps)
    raise ValueError(f"unknown shape {kind!r}")


def _oneshot(spec: dict[str, Any]) -> dict[str, Any]:
    """``runs`` calls that each open the saver, build, compile and invoke the financial
    graph (after two warm-up calls); per call wall and CPU time."""
    import langgraph.version

    runs = int(spec.get("runs", 10))
    home = Path(tempfile.mkdtemp(prefix="ax-bench-lg1-"))
    stamps: Stamps = []
    walls: list[float] = []
    cpus: list[float] = []
    builds: list[float] = []

    def call(i: int) -> None:
        t, c = time.perf_counter(), time.process_time()
        saver, conn = _saver(home / "checkpoints.db")
        try:
            app = _financial_graph(stamps).compile(checkpointer=saver)
            built = time.perf_counter() - t
            app.invoke({"doc": f"doc-{i}"}, {"configurable": {"thread_id": f"t-{i}"}},
                       durability="sync")
        finally:
            conn.close()
        if i >= 0:
            walls.append(time.perf_counter() - t)
            cpus.append(time.process_time() - c)
            builds.append(built)

    try:
        for j in range(2):
            call(-1 - j)
        stamps.clear()
        t0 = time.perf_counter()
        for i in range(runs):
            call(i)
        wall = time.perf_counter() - t0
    finally:
        shutil.rmtree(home, ignore_errors=True)
    nodes = shapes.executed_nodes("financial") * runs
    if len(stamps) != nodes:
        raise RuntimeError(f"LangGraph ran {len(stamps)} nodes, expected {nodes}")
    return {
        "engine": f"langgraph {langgraph.version.__version__}", "mode": "oneshot",
        "what": "per call: open SqliteSaver (WAL, synchronous=FULL), build, compile, "
                "invoke (durability=sync), close",
        "shape": "financial", "runs": runs, "nodes": nodes, "wall_s": round(wall, 4),
        "run_wall": summary(walls), "run_cpu": summary(cpus), "build_compile": summary(builds),
        "wall_over_cpu": round(sum(walls) / sum(cpus), 3) if sum(cpus) else None,
    }


def run(spec: dict[str, Any]) -> dict[str, Any]:
    """Run one LangGraph workload: ``shape``, ``size``, ``tasks``, ``inflight``; or with
    ``mode: "oneshot"``, ``runs`` one-shot calls of the financial graph.

    Raises:
        RuntimeError: LangGraph is not installed (``scripts/bootstrap bench`` installs it).
    """
    try:
        import langgraph.version
        from langgraph.checkpoint.sqlite import SqliteSaver  # noqa: F401 - checked here
    except ImportError as exc:
        raise RuntimeError(f"the peer is not installed ({exc}): run scripts/bootstrap bench "
                           "(bench/run does)") from exc
    if spec.get("mode") == "oneshot":
        return _oneshot(spec)

    kind, size = spec["shape"], int(spec.get("size", 0))
    tasks, inflight = int(spec.get("tasks", 1)), int(spec.get("inflight", 1))
    home = Path(tempfile.mkdtemp(prefix="ax-bench-lg-"))
    saver, conn = _saver(home / "checkpoints.db")
    stamps: Stamps = []
    try:
        t_build = time.perf_counter()
        app = _build(kind, size, stamps).compile(checkpointer=saver)
        build_s = time.perf_counter() - t_build
        limit = shapes.executed_nodes(kind, size) + 25

        def invoke(i: int) -> Any:
            config = {"configurable": {"thread_id": f"t-{i}-{secrets.token_hex(3)}"},
                      "recursion_limit": limit}
            initial: dict[str, Any] = {"doc": f"doc-{i}"} if kind == "financial" else {}
            return app.invoke(initial, config, durability="sync")

        invoke(-1)  # warm-up: imports, first connection use
        stamps.clear()
        cpu0, t0 = cpu_seconds(), time.perf_counter()
        if inflight <= 1:
            task_walls = []
            for i in range(tasks):
                t = time.perf_counter()
                invoke(i)
                task_walls.append(time.perf_counter() - t)
        else:
            task_walls = []
            with ThreadPoolExecutor(max_workers=inflight) as pool:
                list(pool.map(invoke, range(tasks)))
        wall, cpu = time.perf_counter() - t0, cpu_seconds() - cpu0
        nodes_per_task = shapes.executed_nodes(kind, size)
        if len(stamps) != nodes_per_task * tasks:
            raise RuntimeError(f"LangGraph ran {len(stamps)} nodes, expected "
                               f"{nodes_per_task * tasks}")
        nodes = nodes_per_task * tasks
        steps = chain_steps(stamps) if kind == "chain" else []
        db_bytes = sum(p.stat().st_size for p in home.iterdir())
    finally:
        conn.close()
        shutil.rmtree(home, ignore_errors=True)
    return {
        "engine": f"langgraph {langgraph.version.__version__}",
        "checkpointer": "SqliteSaver (WAL, synchronous=FULL), durability=sync",
        "shape": kind, "size": size, "tasks": tasks, "inflight": inflight,
        "nodes_per_task": nodes_per_task, "nodes": nodes,
        "build_s": round(build_s, 4),
        "wall_s": round(wall, 4),
        "tasks_per_s": rate(tasks, wall), "nodes_per_s": rate(nodes, wall),
        "wall_per_node_ms": round(wall / nodes * 1000, 4),
        "cpu_s": round(cpu, 3), "cpu_per_node_ms": round(cpu / nodes * 1000, 4),
        "task_wall": summary(task_walls),
        "step_interval": summary(steps),
        "db_bytes": db_bytes,
    }
