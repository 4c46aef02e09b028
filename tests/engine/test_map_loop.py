"""Maps over runtime lists and bounded loops: expansion committed once, items fenced
and counted off, outputs in item order, failure policies, cancel/retry/fork reaching
the items, loops visiting at most their bound with each visit kept."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from axengine.dag import Dag, load_dag_text
from axengine.engine import Engine, NodeState, fork_task
from axengine.errors import InputError
from axengine.testing import AxTestEngine, fail
from executors.contract import Failure, Success
from tests.engine.conftest import FakeClock, run

TOOLS = {"echo", "split", "summarise", "join", "draft", "review", "publish"}
MODELS = {"m"}


def dag_of(text: str) -> Dag:
    return load_dag_text(text, tools=TOOLS, models=MODELS)


def map_dag(*, concurrency: int | None = 2, policy: str = "fail", retry: int = 0,
            max_items: int | None = None, on_failure: bool = False) -> Dag:
    extra = "".join([
        f"\n    max_concurrency: {concurrency}" if concurrency else "",
        f"\n    max_items: {max_items}" if max_items else "",
        "\n    on_failure: alert" if on_failure else "",
    ])
    alert = ("\n  alert:\n    type: tool_call\n    tool: echo\n    input: failed"
             if on_failure else "")
    return dag_of(f"""
name: mapped
nodes:
  split:
    type: tool_call
    tool: split
    input: "{{{{ .input.text }}}}"
    next: summarise
  summarise:
    type: tool_call
    tool: summarise
    map: "{{{{ .nodes.split.output.sections }}}}"
    on_item_failure: {policy}
    retry: {retry}
    input:
      section: "{{{{ .item }}}}"
      index: "{{{{ .index }}}}"{extra}
    next: join
  join:
    type: tool_call
    tool: join
    input: "{{{{ .nodes.summarise.output }}}}"{alert}
""")


def split(sections: list[str]) -> Callable[[Any], Any]:
    return lambda request: {"sections": sections}


def summarise(request: Any) -> Any:
    return {"summary": request.input["section"].upper(), "index": request.input["index"]}


def test_a_map_runs_once_per_item_and_its_output_keeps_item_order(tmp_path: Path) -> None:
    sections = ["intro", "revenue", "risks", "outlook", "appendix"]
    with AxTestEngine(tmp_path) as ax:
        result = ax.run(map_dag(concurrency=2), {"text": "..."}, stubs={
            "split": split(sections), "summarise": summarise, "join": lambda r: r.input})
    assert result.status == "SUCCEEDED"
    expected = [{"summary": s.upper(), "index": i} for i, s in enumerate(sections)]
    assert result.outputs["summarise"] == expected
    assert result.outputs["join"] == expected
    # Each item has its own snapshot, attempt and fence, and ran exactly once.
    for i in range(len(sections)):
        snap = result.snapshots[f"summarise[{i}]"]
        assert snap.state is NodeState.SUCCEEDED and snap.attempt == 1 and snap.fence >= 1
        assert result.calls(f"summarise[{i}]") == 1
    # The expansion is committed in the map node's snapshot.
    parent = result.snapshots["summarise"]
    assert parent.input == {"items": sections}
    assert (parent.items, parent.items_started, parent.items_done) == (5, 5, 5)
    # Never more than max_concurrency items waiting or running at once.
    live: set[str] = set()
    most = 0
    for event in result.events:
        if not event.node_id.startswith("summarise["):
            continue
        if event.kind == "ready":
            live.add(event.node_id)
        elif event.kind in ("committed", "failed", "cancelled"):
            live.discard(event.node_id)
        most = max(most, len(live))
    assert most == 2
    assert result.path == ["split", *[f"summarise[{i}]" for i in range(5)], "summarise",
                           "join"]


def test_an_empty_map_succeeds_at_once_with_an_empty_list(tmp_path: Path) -> None:
    with AxTestEngine(tmp_path) as ax:
        result = ax.run(map_dag(), {"text": ""}, stubs={
            "split": split([]), "summarise": summarise, "join": lambda r: r.input})
    assert result.status == "SUCCEEDED"
    assert result.outputs["summarise"] == []
    assert result.outputs["join"] == []
    assert not [n for n in result.states if n.startswith("summarise[")]


@pytest.mark.parametrize(("answer", "message"), [
    ({"sections": "not a list"}, "map template rendered a string, not a list"),
    ({"sections": list(range(4))}, "map template rendered 4 items; the bound is 3"),
])
def test_a_map_that_cannot_expand_fails_the_node_naming_why(
        tmp_path: Path, answer: Any, message: str) -> None:
    with AxTestEngine(tmp_path) as ax:
        result = ax.run(map_dag(max_items=3, on_failure=True), {"text": ""}, stubs={
            "split": lambda r: answer, "summarise": summarise, "join": lambda r: r.input,
            "alert": lambda r: r.input})
    assert result.states["summarise"] == "FAILED"
    assert message in result.errors["summarise"]
    # Routed by on_failure; no item was started.
    assert result.states["alert"] == "SUCCEEDED" and result.states["join"] == "SKIPPED"
    assert not [n for n in result.states if n.startswith("summarise[")]


def failing_at(bad: int) -> Callable[[Any], Any]:
    def answer(request: Any) -> Any:
        if request.input["index"] == bad:
            return Failure(f"section {bad} is unreadable", retryable=False)
        return summarise(request)
    return answer


def test_fail_policy_fails_the_map_at_the_first_failed_item(tmp_path: Path) -> None:
    with AxTestEngine(tmp_path) as ax:
        result = ax.run(map_dag(concurrency=1), {"text": ""}, stubs={
            "split": split(["a", "b", "c", "d"]), "summarise": failing_at(1),
            "join": lambda r: r.input})
    assert result.status == "FAILED"
    assert result.states["summarise"] == "FAILED"
    assert result.errors["summarise"] == "item 1 failed: section 1 is unreadable"
    assert result.states["summarise[0]"] == "SUCCEEDED"
    assert result.states["summarise[1]"] == "FAILED"
    # One at a time: the items after the failed one never started.
    assert "summarise[2]" not in result.states and "summarise[3]" not in result.states
    assert result.states["join"] == "SKIPPED"


def test_fail_policy_cancels_the_items_still_running(tmp_path: Path, clock: FakeClock,
                                                   make_engine: Callable[..., Engine]) -> None:
    engine = make_engine()

    async def main() -> dict[str, Any]:
        task = (await engine.submit(map_dag(concurrency=3), {"text": ""})).task_id
        split_run = await engine.claim(task, "split", worker="w")
        await engine.complete(task, "split", fence=split_run.request.fence,
                              outcome=Success({"sections": ["a", "b", "c"]}))
        runs = {i: await engine.claim(task, f"summarise[{i}]", worker=f"w{i}")
                for i in range(3)}
        assert all(r.result == "claimed" for r in runs.values())
        await engine.complete(task, "summarise[1]", fence=runs[1].request.fence,
                              outcome=Failure("bad section", retryable=False))
        # The cancelled items' workers are fenced out: their results are stale.
        late = await engine.complete(task, "summarise[0]", fence=runs[0].request.fence,
                                     outcome=Success({"summary": "A"}))
        view = await engine.get_task(task)
        return {"late": late, "states": {n: s.state.value for n, s in view.snapshots.items()},
                "status": view.task.status.value}

    out = run(main())
    assert out["late"] == "stale"
    assert out["states"]["summarise[0]"] == "CANCELLED"
    assert out["states"]["summarise[2]"] == "CANCELLED"
    assert out["states"]["summarise[1]"] == "FAILED"
    assert out["states"]["summarise"] == "FAILED"
    assert out["status"] == "FAILED"


def test_an_item_out_of_attempts_makes_the_map_dead(tmp_path: Path) -> None:
    with AxTestEngine(tmp_path) as ax:
        result = ax.run(map_dag(concurrency=2, retry=1), {"text": ""}, stubs={
            "split": split(["a", "b"]), "join": lambda r: r.input,
            "summarise": lambda r: (fail("timeout talking to the model")
                                    if r.input["index"] == 0 else summarise(r))})
    assert result.states["summarise[0]"] == "FAILED"
    assert result.calls("summarise[0]") == 2  # retry: 1
    assert result.states["summarise"] == "DEAD"
    assert result.status == "DEAD"


def test_collect_policy_runs_every_item_and_records_each_result(tmp_path: Path) -> None:
    with AxTestEngine(tmp_path) as ax:
        result = ax.run(map_dag(policy="collect"), {"text": ""}, stubs={
            "split": split(["a", "b", "c"]), "summarise": failing_at(1),
            "join": lambda r: r.input})
    assert result.status == "SUCCEEDED"
    assert result.outputs["summarise"] == [
        {"ok": True, "output": {"summary": "A", "index": 0}},
        {"ok": False, "error": "section 1 is unreadable"},
        {"ok": True, "output": {"summary": "C", "index": 2}},
    ]
    assert result.states["summarise[1]"] == "FAILED"
    assert result.states["join"] == "SUCCEEDED"


def test_cancel_and_retry_reach_the_items(make_engine: Callable[..., Engine]) -> None:
    engine = make_engine()

    async def main() -> None:
        task = (await engine.submit(map_dag(concurrency=2), {"text": ""})).task_id
        first = await engine.claim(task, "split", worker="w")
        await engine.complete(task, "split", fence=first.request.fence,
                              outcome=Success({"sections": ["a", "b", "c"]}))
        held = await engine.claim(task, "summarise[0]", worker="w")
        assert await engine.cancel(task) == "committed"
        view = await engine.get_task(task)
        assert view.task.status.value == "CANCELLED"
        assert view.snapshots["summarise[0]"].state is NodeState.CANCELLED
        assert view.snapshots["summarise[1]"].state is NodeState.CANCELLED
        assert "summarise[2]" not in view.snapshots  # never started
        stale = await engine.complete(task, "summarise[0]", fence=held.request.fence,
                                      outcome=Success({"summary": "A"}))
        assert stale == "stale"
        with pytest.raises(InputError, match="map node"):
            await engine.retry(task, "summarise", input_override={"x": 1})
        # A retry from the map expands it again, under fences above the old runs.
        await engine.retry(task, "summarise")
        view = await engine.get_task(task)
        assert view.snapshots["summarise"].owner == "ax:map"
        again = await engine.claim(task, "summarise[0]", worker="w2")
        assert again.result == "claimed" and again.request.fence > held.request.fence
        assert again.request.node_id == "summarise[0]"
        assert again.request.input == {"section": "a", "index": 0}

    run(main())


def test_a_resumed_map_never_expands_again(make_engine: Callable[..., Engine]) -> None:
    """The expansion is what the readying transaction committed: a later change of what
    the map template reads cannot change the items of a task in flight."""
    engine = make_engine()

    async def main() -> None:
        task = (await engine.submit(map_dag(concurrency=1), {"text": ""})).task_id
        first = await engine.claim(task, "split", worker="w")
        await engine.complete(task, "split", fence=first.request.fence,
                              outcome=Success({"sections": ["a", "b"]}))
        parent = await engine.snapshot(task, "summarise")
        assert parent is not None and parent.input == {"items": ["a", "b"]}
        # Another engine on the same store (a restarted process) carries on.
        other = Engine(store=engine._store, queue=engine.queue,
                       blob_dir=engine._blobs.root, clock=engine.clock)
        for i, section in enumerate(["a", "b"]):
            claim = await other.claim(task, f"summarise[{i}]", worker="w2")
            assert claim.request.input["section"] == section
            await other.complete(task, f"summarise[{i}]", fence=claim.request.fence,
                                 outcome=Success(section))
        assert (await other.snapshot(task, "summarise")).output == ["a", "b"]  # type: ignore[union-attr]

    run(main())


LOOP = """
name: revise
nodes:
  draft:
    type: tool_call
    tool: draft
    input:
      visit: "{{ .visit }}"
      feedback: "{{ .previous.review.feedback if .previous.review else '' }}"
    next: review
  review:
    type: tool_call
    tool: review
    input: {visit: "{{ .visit }}", text: "{{ .nodes.draft.output }}"}
    next:
      - target: draft
        condition: "{{ not .output.approved }}"
        max_visits: 3
      - target: publish
        condition: "{{ .output.approved }}"
      - target: escalate
        condition: "{{ not .output.approved and .visit >= 3 }}"
  publish:
    type: tool_call
    tool: publish
    input: "{{ .nodes.draft.output }}"
  escalate:
    type: tool_call
    tool: echo
    input: "{{ .nodes.draft.output }}"
"""


def reviewer(approve_at: int) -> Callable[[Any], Any]:
    return lambda request: {"approved": request.input["visit"] >= approve_at,
                            "feedback": f"tighten visit {request.input['visit']}"}


def drafter(request: Any) -> Any:
    return f"draft {request.input['visit']} ({request.input['feedback']})"


@pytest.mark.parametrize("approve_at", [1, 2, 3])
def test_a_loop_goes_round_until_its_guard_lets_it_out(tmp_path: Path,
                                                       approve_at: int) -> None:
    with AxTestEngine(tmp_path) as ax:
        result = ax.run(dag_of(LOOP), {}, stubs={
            "draft": drafter, "review": reviewer(approve_at), "publish": lambda r: r.input,
            "escalate": lambda r: r.input})
    assert result.status == "SUCCEEDED"
    assert result.path == ["draft", "review"] * approve_at + ["publish"]
    assert result.states["escalate"] == "SKIPPED"
    # Each visit is kept with its own snapshot and visit number; the last is live.
    for visit in range(1, approve_at):
        kept = result.snapshots[f"review#{visit}"]
        assert kept.state is NodeState.SUCCEEDED and max(kept.visit, 1) == visit
        assert [h.target_node_id for h in kept.next_hops if h.is_taken] == ["draft"]
    assert max(result.snapshots["draft"].visit, 1) == approve_at
    assert result.taken("review") == ["publish"]
    # A later visit reads the previous visit's review.
    feedback = f" (tighten visit {approve_at - 1})" if approve_at > 1 else " ()"
    assert result.outputs["publish"] == f"draft {approve_at}{feedback}"


def test_a_loop_stops_at_its_bound(tmp_path: Path) -> None:
    with AxTestEngine(tmp_path) as ax:
        result = ax.run(dag_of(LOOP), {}, stubs={
            "draft": drafter, "review": reviewer(99), "publish": lambda r: r.input,
            "escalate": lambda r: r.input})
    assert result.path == ["draft", "review"] * 3 + ["escalate"]
    assert result.states["publish"] == "SKIPPED"
    assert sorted(n for n in result.states if "#" in n) == [
        "draft#1", "draft#2", "review#1", "review#2"]
    # At the bound the back edge is recorded as not taken.
    assert result.taken("review") == ["escalate"]
    ended = [e for e in result.events if e.kind == "loop_ended"]
    assert len(ended) == 1 and "max_visits 3" in ended[0].detail
    assert result.calls("draft") == 3  # the handler was called once per visit


def test_a_retry_from_before_a_loop_counts_its_visits_from_one(
        make_engine: Callable[..., Engine]) -> None:
    engine = make_engine()
    dag = dag_of(LOOP.replace("name: revise", "name: revise2").replace(
        "  draft:\n    type: tool_call", "  start:\n    type: tool_call\n    tool: echo\n"
        "    input: go\n    next: draft\n  draft:\n    type: tool_call"))

    async def drive(task: str) -> list[str]:
        order: list[str] = []
        for _ in range(20):
            view = await engine.get_task(task)
            waiting = [n for n, s in view.snapshots.items() if s.state is NodeState.WAITING]
            if not waiting:
                return order
            nid = waiting[0]
            claim = await engine.claim(task, nid, worker="w")
            answer: Any = {"approved": False, "feedback": "no"} if nid == "review" else "ok"
            await engine.complete(task, nid, fence=claim.request.fence,
                                  outcome=Success(answer))
            order.append(nid)
        raise AssertionError("did not finish")

    async def main() -> None:
        task = (await engine.submit(dag, {})).task_id
        assert await drive(task) == ["start"] + ["draft", "review"] * 3 + ["escalate"]
        await engine.retry(task, "start")
        assert await drive(task) == ["start"] + ["draft", "review"] * 3 + ["escalate"]
        view = await engine.get_task(task)
        assert max(view.snapshots["draft"].visit, 1) == 3
        assert view.task.status.value == "SUCCEEDED"

    run(main())


def test_forking_after_a_map_and_a_loop_keeps_their_history(tmp_path: Path) -> None:
    from axengine.config import AxConfig
    from axengine.local import LocalSession

    dag = dag_of("""
name: mapfork
nodes:
  summarise:
    type: tool_call
    tool: echo
    map: "{{ .input.sections }}"
    input: "{{ .item }}"
    next: publish
  publish:
    type: tool_call
    tool: echo
    input: "{{ .nodes.summarise.output }}"
""")

    async def main() -> tuple[Any, Any]:
        async with LocalSession(AxConfig(home=tmp_path)) as s:
            source = await s.submit(dag, {"sections": ["a", "b"]})
            first = await s.wait(source)
            fork = await fork_task(s.engine, source, "publish", by="ops")
            return first, await s.wait(fork)

    first, forked = asyncio.run(main())
    assert first.outputs["summarise"] == ["a", "b"]
    # The map's items are shared history of the fork; publish ran again.
    assert forked.states["summarise[0]"] == "SUCCEEDED"
    assert forked.outputs["publish"] == first.outputs["publish"]


def test_a_fork_from_inside_a_loop_keeps_the_earlier_visits(tmp_path: Path) -> None:
    from axengine.config import AxConfig
    from axengine.local import LocalSession
    from executors.contract import NodeContext, NodeRequest, Outcome

    dag = dag_of(LOOP)
    verdicts = {"review": {"approved": False, "feedback": "more"}}

    def handler(request: NodeRequest, ctx: NodeContext) -> Outcome:
        if request.node_id == "draft":
            return Success(drafter(request))
        if request.node_id == "review":
            return Success({**verdicts["review"], "visit": request.input["visit"]})
        return Success(request.input)

    async def main() -> tuple[Any, Any]:
        async with LocalSession(AxConfig(home=tmp_path), handler=handler) as s:
            source = await s.submit(dag, {})
            first = await s.wait(source)
            verdicts["review"] = {"approved": True, "feedback": "fine"}
            fork = await fork_task(s.engine, source, "review", by="ops")
            return first, await s.engine.get_task(await _final(s, fork))

    async def _final(s: Any, task_id: str) -> str:
        await s.wait(task_id)
        return task_id

    first, forked = asyncio.run(main())
    assert first.path == ["draft", "review"] * 3 + ["escalate"]
    # The fork re-runs review at its third visit: the first two are shared history.
    snaps = forked.snapshots
    assert snaps["review#1"].state is NodeState.SUCCEEDED
    assert snaps["review#2"].state is NodeState.SUCCEEDED
    assert max(snaps["review"].visit, 1) == 3
    assert snaps["publish"].state is NodeState.SUCCEEDED
    assert snaps["escalate"].state is NodeState.SKIPPED
