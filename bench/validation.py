"""Validation cost of a large DAG: an N-node chain, literal inputs or a template per node.

Three variants of the chain ``n0 → … → n{N-1}`` (``shapes.chain``):

* ``literal``: ``load_dag_mapping`` with literal inputs, the schema and graph checks only;
* ``template_per_node``: ``load_dag_mapping``, each input reading the previous output:
  every template checked statically and its reference checked against the graph;
* ``yaml_template_per_node``: the same templated DAG written as YAML and read by
  ``load_dag_text``, which is what ``ax validate`` does with a file.

Each is timed ``repeat`` times in this process after a warm-up load (imports, the
executor registry); the minimum is the figure (the rest is noise from other work on the
machine) and the median is reported too. Each templated load reads a field no earlier
load read (``.output.r<k>``), so no template cache answers: every load is the first
validation of its DAG. ``scaling`` times the templated variants at N/10 and N too:
per-node cost that stays flat means validation is linear.

``target`` judges issue 14's "a 10,000-node DAG with a template per node validates in
under 1 s" on the median of both templated variants (not judged below 10,000 nodes).
Run this section alone with ``python -m bench.validation [--nodes N] [--repeat R]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import yaml

from bench import shapes

__all__ = ["TARGET_NODES", "TARGET_S", "run"]

#: Issue 14, item 6: a DAG of this many nodes, a template on each ...
TARGET_NODES = 10_000
#: ... validates in under this many seconds (median of ``repeat`` loads).
TARGET_S = 1.0

_Dumper: type[yaml.SafeDumper] = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def _times(load: Callable[[int], Any], repeat: int) -> tuple[list[float], Any]:
    """Time ``load(k)`` for k = 0 .. repeat - 1."""
    times, result = [], None
    for k in range(repeat):
        started = time.perf_counter()
        result = load(k)
        times.append(time.perf_counter() - started)
    return times, result


def _fresh(mapping: dict[str, Any], k: int) -> dict[str, Any]:
    """``mapping`` with each template reading field ``r<k>`` of what it read."""
    nodes = {nid: {**node, "input": node["input"].replace(" }}", f".r{k} }}}}")}
             for nid, node in mapping["nodes"].items()}
    return {**mapping, "nodes": nodes}


def _figures(times: list[float], nodes: int) -> dict[str, Any]:
    return {"min_s": round(min(times), 4), "median_s": round(statistics.median(times), 4),
            "per_node_us": round(min(times) / nodes * 1e6, 2)}


def _stored(dag: Any) -> dict[str, Any]:
    """The time to serialise ``dag`` for storage, and its size."""
    started = time.perf_counter()
    stored = dag.storage_json()
    return {"storage_json_s": round(time.perf_counter() - started, 4),
            "stored_bytes": len(stored)}


def _variants(n: int, repeat: int, *, literal: bool) -> dict[str, dict[str, Any]]:
    from axengine.dag import load_dag_mapping, load_dag_text

    out: dict[str, dict[str, Any]] = {}
    if literal:
        mapping = shapes.chain(n)
        times, dag = _times(lambda k: load_dag_mapping(mapping), repeat)
        out["literal"] = {**_figures(times, n), **_stored(dag)}
    templated = shapes.chain(n, template=True)
    mappings = [_fresh(templated, k) for k in range(repeat)]
    times, dag = _times(lambda k: load_dag_mapping(mappings[k]), repeat)
    out["template_per_node"] = {**_figures(times, n), **_stored(dag)}
    texts = [yaml.dump(_fresh(templated, repeat + k), Dumper=_Dumper, sort_keys=False)
             for k in range(repeat)]
    times, _ = _times(lambda k: load_dag_text(texts[k]), repeat)
    out["yaml_template_per_node"] = {**_figures(times, n), "yaml_bytes": len(texts[0])}
    return out


def _target(n: int, figures: dict[str, dict[str, Any]]) -> dict[str, Any]:
    medians = {name: figures[name]["median_s"]
               for name in ("template_per_node", "yaml_template_per_node")}
    value = max(medians.values())
    return {
        "name": f"{TARGET_NODES:,}-node DAG with a template per node validates in "
                f"< {TARGET_S:g} s",
        "target_s": TARGET_S, "value_s": value,
        # Below the target's size the figure says nothing about it.
        "met": value < TARGET_S if n >= TARGET_NODES else None,
        "detail": f"{n:,} nodes, median of the loads: " + ", ".join(
            f"{name} {seconds:.3f} s" for name, seconds in medians.items()),
    }


def run(spec: dict[str, Any]) -> dict[str, Any]:
    """Time validation: ``nodes`` (default 10,000) and ``repeat`` (default 3)."""
    from axengine.dag import load_dag_mapping

    n, repeat = int(spec.get("nodes", TARGET_NODES)), int(spec.get("repeat", 3))
    load_dag_mapping(shapes.chain(2, template=True))  # imports and the registry, untimed
    out: dict[str, Any] = {"nodes": n, "repeat": repeat}
    figures = _variants(n, repeat, literal=True)
    out.update(figures)
    scaling: dict[str, Any] = {}
    for size in sorted({max(n // 10, 1), n}):
        scaling[str(size)] = (
            {k: v for k, v in figures.items() if k != "literal"} if size == n
            else _variants(size, repeat, literal=False))
    out["scaling"] = scaling
    out["target"] = _target(n, figures)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.validation",
                                     description="time the validation of a large DAG")
    parser.add_argument("--nodes", type=int, default=TARGET_NODES)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    result = run({"nodes": args.nodes, "repeat": args.repeat})
    for size, variants in result["scaling"].items():
        for name, figures in variants.items():
            print(f"{int(size):>7,} nodes  {name:<24} min {figures['min_s']:.3f} s  median "
                  f"{figures['median_s']:.3f} s  {figures['per_node_us']:.1f} µs/node",
                  file=sys.stderr)
    target = result["target"]
    verdict = {True: "met", False: "MISSED", None: "not judged"}[target["met"]]
    print(f"{target['name']}: {target['value_s']:.3f} s ({verdict}; {target['detail']})",
          file=sys.stderr)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
