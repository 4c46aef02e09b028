"""What an engine keeps alive after its work is done: large values passed node to node
must not pile up in its caches, where every object is one more for each full garbage
collection to scan (a chain passing a 60 KB value spent about 15 % of its time there)."""

from __future__ import annotations

import asyncio
import gc
from pathlib import Path

import axengine as ax
from axengine.dag import load_dag_mapping
from axengine.engine import Engine
from axengine.queue.inprocess import InProcessQueue
from axengine.store.embedded import SqliteStore
from executors.contract import Success

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


def test_a_finished_tasks_input_text_is_not_kept(tmp_path: Path) -> None:
    # The task record is written again at most transitions, so the engine keeps its
    # input's text (and the input) by task; a finished task is not written again.
    async def main() -> tuple[bool, bool]:
        store = SqliteStore(path=tmp_path / "ax.db")
        engine = Engine(store=store, queue=InProcessQueue(), blob_dir=tmp_path / "blobs")
        dag = load_dag_mapping({"name": "one", "nodes": {"a": {
            "type": "tool_call", "tool": "echo", "input": "{{ .input }}"}}},
            tools={"echo"}, models=set())
        sub = await engine.submit(dag, {MARK: True, "text": "x" * 1000})
        claim = await engine.claim(sub.task_id, "a", worker="w1")
        assert claim.request is not None
        kept_while_running = sub.task_id in engine._input_texts
        answer = await engine.complete(sub.task_id, "a", fence=claim.request.fence,
                                       outcome=Success(1))
        assert answer == "committed"
        kept_after = sub.task_id in engine._input_texts
        await store.close()
        return kept_while_running, kept_after

    assert asyncio.run(main()) == (True, False)
