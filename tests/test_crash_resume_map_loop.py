"""Crash test of a map and a bounded loop with real processes: ``ax run`` of
``dags/report_digest.yaml`` (a 9-item map, then a loop that drafts twice) is SIGKILLed
at every occurrence of every fault point of the run — inside the expanded map and inside
both loop visits — then ``ax run --resume`` must finish with the uninterrupted run's
expansion (the same items, committed in the map node's snapshot), the same visits (the
same kept snapshots, each gone the same way) and the same path, each item and each visit
of each node committed exactly once.

The run uses one executor slot (``--concurrency 1``) so that it passes its fault points
the same number of times on every run (:data:`SCENARIO`, checked against a fresh trace).
The cases live in their own module so that pytest-xdist (``--dist loadfile``) gives them
a worker of their own next to the financial DAG's crash module.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from axengine.config import AxConfig
from axengine.faults import POINTS
from axengine.wiring import build_runtime
from tests.test_crash_resume import Outcome, Scenario, ax, crash_and_resume

pytestmark = pytest.mark.integration

SCENARIO = Scenario(
    ("--input", "dags/inputs/report_digest.json", "--concurrency", "1"),
    {
        "before-commit": 31,
        "after-commit": 31,
        "after-enqueue": 7,
        "after-pop": 9,
        "after-claim": 15,
        "handler-running": 15,
        "before-complete": 15,
        "after-complete": 15,
        "after-ack": 9,
    },
    dag="dags/report_digest.yaml",
    mails=0,
)
MAP, LOOP = "summarise_sections", ("draft_digest", "review_digest")
CASES = [f"{name}:{n}" for name in POINTS for n in range(1, SCENARIO.hits.get(name, 0) + 1)]
#: Crash cases that killed and resumed, for the summary.
OUTCOMES: dict[str, Outcome] = {}


def path_key(path: list[str]) -> tuple[list[str], list[str]]:
    """The path's nodes in order, and its map items (which one slot runs in queue
    order, but which a resumed run may take in another order)."""
    return [n for n in path if "[" not in n], sorted(n for n in path if "[" in n)


def dynamic_state(home: Path, task_id: str | None = None) -> dict[str, Any]:
    """What the map and the loop committed: the expansion, the items' states, the kept
    visits and the way each went."""
    async def read() -> dict[str, Any]:
        runtime = build_runtime(AxConfig.from_env(env={}, home=home))
        try:
            found = task_id or (await runtime.engine.list_tasks())[0].task_id
            view = await runtime.engine.get_task(found)
            snaps = view.snapshots
            return {
                "expansion": snaps[MAP].input,
                "items": {n: s.state.value for n, s in snaps.items() if "[" in n},
                "visits": {n: ([h.target_node_id for h in s.next_hops if h.is_taken],
                               max(s.visit, 1))
                           for n, s in snaps.items() if n.split("#")[0] in LOOP},
            }
        finally:
            await runtime.close()

    return asyncio.run(read())


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("reference-map-loop")
    trace = tmp / "trace.txt"
    run = ax(tmp / "home", "run", SCENARIO.dag, *SCENARIO.args, "--json",
             env_extra={"AX_FAULT_TRACE": str(trace)})
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    assert result["status"] == "SUCCEEDED"
    state = dynamic_state(tmp / "home")
    # The run does what the test is about: a 9-item map and a loop that goes round once.
    assert len(state["expansion"]["items"]) == 9
    assert sorted(state["visits"]) == ["draft_digest", "draft_digest#1", "review_digest",
                                       "review_digest#1"]
    return {"result": result, "trace": trace.read_text().split(), "state": state}


def test_planned_crash_points_match_a_fresh_trace(reference: dict[str, Any]) -> None:
    hits = dict(Counter(reference["trace"]))
    assert hits == SCENARIO.hits, (
        "the report_digest run passes its fault points a different number of times now; "
        f"set its hits to {dict((p, hits[p]) for p in POINTS if p in hits)}")


@pytest.mark.slow
@pytest.mark.parametrize("fault", CASES, ids=CASES)
def test_sigkill_inside_a_map_or_a_loop_then_resume(fault: str, reference: dict[str, Any],
                                                    tmp_path: Path) -> None:
    outcome = crash_and_resume(tmp_path, "report_digest", fault,
                               reference["result"]["path"], SCENARIO, path_key)
    assert outcome.killed, f"{fault} did not kill ax run"
    if outcome.resumed:
        # The expansion, the items and the visits are the uninterrupted run's.
        assert dynamic_state(tmp_path) == reference["state"], fault
    OUTCOMES[fault] = outcome


@pytest.mark.slow
def test_map_loop_crash_summary(record_property: Any) -> None:
    missing = [f for f in CASES if f not in OUTCOMES]
    if missing:
        pytest.skip(f"{len(missing)} of {len(CASES)} crash cases did not run here")
    resumed = [o for o in OUTCOMES.values() if o.resumed]
    summary = (f"map+loop crash points tried {len(CASES)}, killed {len(OUTCOMES)}, "
               f"resumed {len(resumed)}")
    print(summary)
    record_property("summary", summary)
    # Only a kill before the submit committed leaves nothing to resume.
    assert len(resumed) >= len(CASES) - 1
