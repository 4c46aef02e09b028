"""Validation cost of a large DAG: ``load_dag_mapping`` on an N-node chain.

Two variants: literal inputs (schema and graph checks only) and one template per node
(``{{ .nodes.n{i-1}.output }}``: every template is compiled in the sandbox and its
references checked against the graph). Each is timed ``repeat`` times in this process;
the minimum is the figure (the rest is noise from other work on the machine), the
median is reported too.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from bench import shapes

__all__ = ["run"]


def run(spec: dict[str, Any]) -> dict[str, Any]:
    """Time validation: ``nodes`` (default 10,000) and ``repeat`` (default 3)."""
    from axengine.dag import load_dag_mapping

    n, repeat = int(spec.get("nodes", 10_000)), int(spec.get("repeat", 3))
    out: dict[str, Any] = {"nodes": n, "repeat": repeat}
    for label, template in (("literal", False), ("template_per_node", True)):
        mapping = shapes.chain(n, template=template)
        times = []
        for _ in range(repeat):
            t = time.perf_counter()
            dag = load_dag_mapping(mapping)
            times.append(time.perf_counter() - t)
        t = time.perf_counter()
        stored = dag.storage_json()
        hash_s = time.perf_counter() - t
        out[label] = {
            "min_s": round(min(times), 4), "median_s": round(statistics.median(times), 4),
            "per_node_us": round(min(times) / n * 1e6, 2),
            "storage_json_s": round(hash_s, 4), "stored_bytes": len(stored),
        }
    return out
