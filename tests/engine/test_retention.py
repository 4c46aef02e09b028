"""What an engine keeps alive after its work is done: large values passed node to node
must not pile up in its caches, where every object is one more for each full garbage
collection to scan (a chain passing a 60 KB value spent about 15 % of its time there)."""

from __future__ import annotations

import gc
from pathlib import Path

import axengine as ax

NODES = 60
#: A marker key no other object in the process has: the live copies of the value are
#: the dicts holding it.
MARK = "ax-retention-test-marker"


def _dag(nodes: int) -> str:
    lines = ["name: retention_chain", "nodes:"]
    for i in range(nodes):
        source = f".nodes.n{i - 1}.output" if i else ".input"
        lines += [f"  n{i}:", "    type: tool_call", "    tool: echo",
                  f'    input: "{{{{ {source} }}}}"']
        if i < nodes - 1:
            lines.append(f"    next: [n{i + 1}]")
    return "\n".join(lines) + "\n"


def _live_copies() -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if type(o) is dict and MARK in o)


def test_finished_nodes_values_are_not_kept_alive(tmp_path: Path) -> None:
    # About 50 KB of JSON, under the blob threshold (64 KB): inline in each snapshot.
    value = {MARK: True, "items": [{"id": i, "text": f"record {i:05d} " + "x" * 40}
                                   for i in range(800)]}
    dag = tmp_path / "chain.yaml"
    dag.write_text(_dag(NODES))
    with ax.open(home=tmp_path / "home") as engine:
        result = engine.run(dag, value)
        assert result.status == "SUCCEEDED"
        assert result.outputs[f"n{NODES - 1}"] == value
        del result
        kept = _live_copies() - 1  # (the test's own value)
    # Each node's rendered input is a copy of the value; before, every finished node's
    # stayed alive (by node, up to 128 nodes), with the recent snapshots' (up to 8 MB
    # of records). Now only the recent records' copies stay, within 2 MB (about 20
    # snapshots holding 100 KB each, their input and output).
    assert kept <= 25, f"{kept} copies of the value alive after a chain of {NODES}"
