"""``ax.open`` / ``ax.aopen``: one embedded engine for many runs, and a stop that does not
wait out a poll timeout (the in-process queue's ``wake``)."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

import axengine as ax
from axengine import sdk
from axengine.errors import DagError
from axengine.queue import InProcessQueue, WorkItem

ROOT = Path(__file__).resolve().parents[1]
FINANCIAL = ROOT / "dags" / "financial_risk_assessment.yaml"
INPUT = json.loads((ROOT / "dags" / "inputs" / "financial_risk_assessment.json").read_text())
GATED = {"name": "gated_open", "nodes": {
    "review": {"type": "human_gateway", "description": "ok?", "timeout": 3600,
               "next": [{"condition": "{{ .output.decision == 'approve' }}",
                         "target": "done"}]},
    "done": {"type": "tool_call", "tool": "echo", "input": {"ok": True}}}}


@pytest.fixture
def counted_loads(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every DAG the SDK loads (parses and validates)."""
    loads: list[Any] = []
    real = sdk.load_any_dag

    def counting(dag: Any) -> Any:
        loads.append(dag)
        return real(dag)

    monkeypatch.setattr(sdk, "load_any_dag", counting)
    return loads


def test_one_engine_runs_many_tasks_and_reads_a_dag_file_once(
        tmp_path: Path, counted_loads: list[Any]) -> None:
    dag = tmp_path / "financial.yaml"
    shutil.copy(FINANCIAL, dag)
    with ax.open(home=tmp_path / "home") as engine:
        results = [engine.run(dag, INPUT) for _ in range(5)]
        assert [r.status for r in results] == ["SUCCEEDED"] * 5
        assert len({r.task_id for r in results}) == 5
        assert results[0].path == results[4].path and results[0].path[0] == "parse_pdf"
        assert len(counted_loads) == 1, "the file was parsed again for every run"
        # A changed file is read again.
        dag.write_text(dag.read_text().replace("name: financial_risk_assessment",
                                               "name: financial_changed"))
        changed = engine.run(dag, INPUT)
        assert changed.status == "SUCCEEDED" and len(counted_loads) == 2
        # Gates: decided up front, or left waiting and resumed later by the same engine.
        waiting = engine.run(GATED)
        assert waiting.status == "PAUSED" and waiting.waiting == ["review"]
        resumed = engine.resume(waiting.task_id, decide={"review": "approve"})
        assert resumed.status == "SUCCEEDED" and resumed.path == ["review", "done"]
    # The runs are durable: a one-shot run on the same home sees the same store.
    again = ax.resume(results[0].task_id, home=tmp_path / "home")
    assert again.status == "SUCCEEDED" and again.task_id == results[0].task_id


def test_a_dag_mapping_is_validated_once_per_content(
        tmp_path: Path, counted_loads: list[Any]) -> None:
    dag = json.loads(json.dumps(GATED))
    with ax.open(home=tmp_path / "home") as engine:
        runs = [engine.run(dag, decide={"review": "approve"}) for _ in range(3)]
        assert [r.status for r in runs] == ["SUCCEEDED"] * 3
        assert len(counted_loads) == 1, "the mapping was validated again for every run"
        # An equal mapping built anew is the same DAG; a changed one is validated again.
        assert engine.run(json.loads(json.dumps(GATED)), decide={"review": "approve"}).ok
        assert len(counted_loads) == 1
        dag["nodes"]["done"]["input"] = {"ok": False}
        changed = engine.run(dag, decide={"review": "approve"})
        assert changed.outputs["done"] == {"ok": False} and len(counted_loads) == 2
        # A mapping the loader refuses is refused on every run, naming the problem.
        dag["nodes"]["done"]["type"] = "nonsense"
        for _ in range(2):
            with pytest.raises(DagError, match="nonsense"):
                engine.run(dag)


def test_the_async_engine_runs_tasks_concurrently(tmp_path: Path) -> None:
    async def main() -> list[Any]:
        async with ax.aopen(home=tmp_path, concurrency=8) as engine:
            runs = [engine.run(FINANCIAL, INPUT, labels={"n": str(i)}) for i in range(4)]
            runs.append(engine.run(GATED, decide={"review": "reject"}))
            results = list(await asyncio.gather(*runs))
            # Nothing is kept per finished wait (a long-lived engine runs millions).
            assert engine._session._watching == {}
        with pytest.raises(RuntimeError, match="closed"):
            await engine.run(GATED)
        return results

    results = asyncio.run(main())
    assert [r.status for r in results] == ["SUCCEEDED"] * 5
    assert results[-1].path == ["review"]


def test_wake_ends_the_waiting_pops_of_one_worker_and_takes_nothing() -> None:
    async def main() -> tuple[Any, ...]:
        queue = InProcessQueue()
        # A worker with a capped fast lane waits in two pops at once.
        waiting = [asyncio.create_task(queue.pop("w1", timeout=3600)) for _ in range(2)]
        other = asyncio.create_task(queue.pop("w2", timeout=3600))
        await asyncio.sleep(0)  # every pop is waiting now
        await queue.wake("w1")
        # Both of w1's pops end; their 3600 s timeout is not waited out.
        woken = await asyncio.wait_for(asyncio.gather(*waiting), timeout=30)
        await queue.enqueue([WorkItem("t", "n")])
        served = await asyncio.wait_for(other, timeout=30)
        # Later pops of w1 wait and serve as usual.
        later = asyncio.create_task(queue.pop("w1", timeout=3600))
        await asyncio.sleep(0)
        await queue.enqueue([WorkItem("t", "m")])
        again = await asyncio.wait_for(later, timeout=30)
        held = {w: list(items) for w, items in queue._processing.items() if items}
        await queue.close()
        return woken, served, again, held

    woken, served, again, held = asyncio.run(main())
    assert woken == [None, None]
    assert served == WorkItem("t", "n") and again == WorkItem("t", "m")
    assert held == {"w2": [WorkItem("t", "n")], "w1": [WorkItem("t", "m")]}
