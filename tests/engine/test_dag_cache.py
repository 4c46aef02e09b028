"""The DAGs an engine keeps in memory are bounded.

A long-running API server stores every DAG its (untrusted) submitters send; keeping each
one decoded would let anyone with a submit token grow its memory without limit. The
engine keeps the most recently used ones and reads any other from the store again.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from axengine.dag import Dag, load_dag_mapping
from axengine.engine import Engine, NodeState
from axengine.lru import Lru
from executors.contract import Success
from tests.engine.conftest import run
from tests.engine.test_complete_and_claim import _drain


def _dag(i: int) -> Dag:
    return load_dag_mapping({"name": f"d{i}", "nodes": {
        "only": {"type": "tool_call", "tool": "echo", "input": f"x{i}"}}},
        tools={"echo"}, models=set())


def test_lru_keeps_the_most_recently_used_entries() -> None:
    lru: Lru[str, int] = Lru(2)
    lru.put("a", 1)
    lru.put("b", 2)
    assert lru.get("a") == 1  # "a" is now the most recently used
    lru.put("c", 3)
    assert len(lru) == 2
    assert "b" not in lru and lru.get("b") is None
    assert (lru.get("a"), lru.get("c")) == (1, 3)
    lru.put("a", 10)  # a rewrite counts as a use and keeps one entry
    lru.put("d", 4)
    assert (len(lru), lru.get("a"), "c" in lru) == (2, 10, False)
    with pytest.raises(ValueError, match="at least 1"):
        Lru(0)


def test_an_engine_keeps_a_bounded_number_of_dags_and_reads_the_others_again(
        make_engine: Callable[..., Engine]) -> None:
    async def main() -> None:
        engine = make_engine()
        engine._dags = Lru(3)
        tasks = [(await engine.submit(_dag(i), {})).task_id for i in range(10)]
        assert len(engine._dags) == 3
        first = _dag(0)
        assert first.hash not in engine._dags
        # The oldest task still runs: its DAG is read from the store when needed.
        assert [i.node_id for i in await _drain(engine.queue)] == ["only"] * 10  # type: ignore[arg-type]
        claim = await engine.claim(tasks[0], "only", worker="w1")
        assert claim.request is not None and claim.request.input == "x0"
        answer = await engine.complete(tasks[0], "only", fence=claim.request.fence,
                                       outcome=Success("done"))
        assert answer == "committed"
        view = await engine.get_task(tasks[0])
        assert view.dag.hash == first.hash
        assert view.snapshots["only"].state is NodeState.SUCCEEDED
        assert len(engine._dags) == 3
        # Submitting an evicted DAG again stores the same record (a second task runs it).
        again = await engine.submit(first, {})
        assert (await engine.get_task(again.task_id)).dag.hash == first.hash

    run(main())
