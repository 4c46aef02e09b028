"""Large values passed node to node: ax (``ax.open``, and ``AxTestEngine``) against
LangGraph on one shape. ``bench/run`` runs ``ax.open`` and LangGraph in its ``payload``
section, in rounds (a comparison without a target: the issue's targets are for nodes
that pass a few bytes); this module's command line runs the three sides once each.

The shape: a chain of ``--nodes`` nodes, each handing the next the value it was given —
ax's ``echo`` tool with ``input: "{{ .nodes.<previous>.output }}"``; in LangGraph a
state channel the node returns as it read it (``SqliteSaver`` on a file, WAL,
``synchronous=FULL``, durability "sync"). The value: ``--records`` records of four
fields (1,000: about 60 KB of JSON, under ax's 64 KB blob threshold, so it stays
inline). Each side runs ``--runs`` times in one process after one warm-up run; the
figures are the median run's wall and CPU time per node.

Usage: ``.venv/bin/python -m bench.payload [--nodes 60] [--records 1000] [--runs 3]``
(``bench.child`` runs one side: ``{"part": "payload", "side": "ax_open", "nodes": 60,
"records": 1000, "runs": 3}``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sqlite3
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypedDict

__all__ = ["SIDES", "main", "run"]


def value(records: int) -> dict[str, Any]:
    return {"items": [{"id": i, "name": f"item {i}", "score": i * 0.5, "tags": ["a", "é"]}
                      for i in range(records)]}


def json_size(data: Any) -> int:
    """Bytes of ``data`` as compact UTF-8 JSON (what is passed node to node)."""
    return len(json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode())


def dag_text(nodes: int) -> str:
    lines = ["name: payload_chain", "nodes:"]
    for i in range(nodes):
        lines += [f"  n{i}:", "    type: tool_call", "    tool: echo"]
        source = f".nodes.n{i - 1}.output" if i else ".input"
        lines.append(f'    input: "{{{{ {source} }}}}"')
        if i < nodes - 1:
            lines.append(f"    next: [n{i + 1}]")
    return "\n".join(lines) + "\n"


def _timed(runs: int, once: Callable[[int], None]) -> tuple[float, float]:
    """(wall, CPU) seconds of the median of ``runs`` calls, after one warm-up call."""
    once(-1)
    samples = []
    for i in range(runs):
        t, c = time.perf_counter(), time.process_time()
        once(i)
        samples.append((time.perf_counter() - t, time.process_time() - c))
    return sorted(samples)[len(samples) // 2]


def ax_open(home: Path, nodes: int, data: Any, runs: int) -> tuple[float, float]:
    import axengine as ax

    dag = home / "payload.yaml"
    dag.write_text(dag_text(nodes))
    with ax.open(home / "engine") as engine:
        def once(_: int) -> None:
            assert engine.run(dag, data).status == "SUCCEEDED"

        return _timed(runs, once)


def ax_test_engine(home: Path, nodes: int, data: Any, runs: int) -> tuple[float, float]:
    from axengine.testing import AsyncAxTestEngine

    dag = home / "payload.yaml"
    dag.write_text(dag_text(nodes))
    stubs = {f"n{i}": data for i in range(nodes)}

    async def main() -> tuple[float, float]:
        async with AsyncAxTestEngine(home / "test-engine") as engine:
            loop = asyncio.get_running_loop()
            samples = []
            for i in range(runs + 1):
                t, c = loop.time(), time.process_time()
                run = await engine.run(dag, {}, stubs=stubs)
                assert run.result.status == "SUCCEEDED"
                if i:  # (the first is the warm-up)
                    samples.append((loop.time() - t, time.process_time() - c))
            return sorted(samples)[len(samples) // 2]

    return asyncio.run(main())


class _State(TypedDict, total=False):
    data: Any


def langgraph(home: Path, nodes: int, data: Any, runs: int) -> tuple[float, float]:
    from langgraph.checkpoint.sqlite import SqliteSaver
    from langgraph.graph import END, START, StateGraph

    graph: Any = StateGraph(_State)
    for i in range(nodes):
        graph.add_node(f"n{i}", lambda state: {"data": state["data"]})
    graph.add_edge(START, "n0")
    for i in range(nodes - 1):
        graph.add_edge(f"n{i}", f"n{i + 1}")
    graph.add_edge(f"n{nodes - 1}", END)
    conn = sqlite3.connect(str(home / "checkpoints.db"), check_same_thread=False)
    saver = SqliteSaver(conn)
    saver.setup()  # WAL
    conn.execute("PRAGMA synchronous=FULL")
    app = graph.compile(checkpointer=saver)
    try:
        def once(i: int) -> None:
            app.invoke({"data": data}, {"configurable": {"thread_id": f"t{i}"}},
                       durability="sync")

        return _timed(runs, once)
    finally:
        conn.close()


#: The sides, by the name a child's spec gives them.
SIDES: dict[str, Callable[[Path, int, Any, int], tuple[float, float]]] = {
    "ax_open": ax_open, "ax_test_engine": ax_test_engine, "langgraph": langgraph,
}


def run(spec: dict[str, Any]) -> dict[str, Any]:
    """One side (``spec["side"]``, a key of :data:`SIDES`) on the chain of
    ``spec["nodes"]`` passing ``spec["records"]`` records, median of ``spec["runs"]``.

    Raises:
        RuntimeError: LangGraph is not installed (``scripts/bootstrap bench`` installs it).
    """
    if spec["side"] == "langgraph":
        try:
            from langgraph.checkpoint.sqlite import SqliteSaver  # noqa: F401 - checked here
        except ImportError as exc:
            raise RuntimeError(f"the peer is not installed ({exc}): run scripts/bootstrap "
                               "bench (bench/run does)") from exc
    nodes, records, runs = int(spec["nodes"]), int(spec["records"]), int(spec["runs"])
    data = value(records)
    with tempfile.TemporaryDirectory(prefix="ax-bench-payload-") as home:
        wall, cpu = SIDES[spec["side"]](Path(home), nodes, data, runs)
    return {"side": spec["side"], "nodes": nodes, "records": records, "runs": runs,
            "bytes": json_size(data),
            "wall_s": round(wall, 4), "cpu_s": round(cpu, 4),
            "wall_per_node_ms": round(wall / nodes * 1000, 4),
            "cpu_per_node_ms": round(cpu / nodes * 1000, 4)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=60)
    parser.add_argument("--records", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    data = value(args.records)
    size = json_size(data)
    print(f"chain of {args.nodes} nodes passing {size:,} bytes of JSON "
          f"({args.records:,} records), median of {args.runs} runs:")
    figures: dict[str, float] = {}
    for name, side in (("ax.open", ax_open), ("AxTestEngine", ax_test_engine),
                       ("LangGraph", langgraph)):
        with tempfile.TemporaryDirectory(prefix="ax-bench-payload-") as home:
            wall, cpu = side(Path(home), args.nodes, data, args.runs)
        figures[name] = wall / args.nodes
        print(f"  {name:<13} {wall / args.nodes * 1000:7.2f} ms per node "
              f"(CPU {cpu / args.nodes * 1000:.2f} ms)", flush=True)
    print(f"  ax.open / LangGraph: {figures['ax.open'] / figures['LangGraph']:.2f}")


if __name__ == "__main__":
    main()
