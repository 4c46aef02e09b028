"""Replaying recorded fixtures: the resume re-runs nothing committed, and the recorded
decisions hold on the DAG under test — or the failure names the node that changed."""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from axengine.dag import load_dag
from axengine.engine import NextHop, NodeState, Snapshot
from axengine.errors import InputError
from axengine.fixtures import check_fixture
from axengine.testing import (
    AxTestEngine,
    HopDiff,
    Replay,
    ReplayMismatch,
    UnstubbedNodeError,
    assert_replays,
    decision_diffs,
)
from axengine.wire import RunResult
from tests.testing.dags import EXAMPLE_FIXTURE, FINANCIAL, LEGACY_FIXTURES

MEDIUM = ["parse_pdf", "extract_metrics", "assess_risk", "send_medium_risk_email",
          "log_completion"]


def edited(tmp_path: Path, old: str, new: str) -> Path:
    """The financial DAG with one guard edited, as a change under review would be."""
    text = FINANCIAL.read_text()
    assert old in text
    path = tmp_path / "financial_risk_assessment.yaml"
    path.write_text(text.replace(old, new))
    return path


def test_a_recorded_run_replays_on_its_dag(ax_replay: Callable[..., Replay]) -> None:
    replay = ax_replay(EXAMPLE_FIXTURE, dag=FINANCIAL)
    assert replay.ok and replay.rerun == [] and replay.executed == []
    assert list(replay.result.path) == MEDIUM
    assert replay.check is not None and replay.check.path == MEDIUM
    assert "replays on" in replay.report()


def test_an_edited_guard_fails_the_replay_with_a_diff_naming_the_node(
        tmp_path: Path, ax_replay: Callable[..., Replay]) -> None:
    dag = edited(tmp_path, "debt_to_equity > 2.0: medium_risk", "debt_to_equity > 3.0: medium_risk")
    with pytest.raises(ReplayMismatch) as caught:
        ax_replay(EXAMPLE_FIXTURE, dag=dag)
    lines = str(caught.value).splitlines()
    assert lines[0] == f"{EXAMPLE_FIXTURE} does not replay on {dag}:"
    # The node whose expression changed comes first, then what followed from it.
    assert lines[1] == ("  node assess_risk: recorded medium_risk -> send_medium_risk_email, "
                        "replayed low_risk -> send_low_risk_email")
    assert lines[2:5] == [
        "  node send_low_risk_email: recorded SKIPPED, replayed reached",
        "  node send_medium_risk_email: recorded -> log_completion, replayed SKIPPED",
        "  node log_completion: recorded -> (end), replayed not reached",
    ]
    assert "If the new path is intended, record the fixture again" in lines[-1]


def test_an_edited_edge_guard_of_a_tool_node_is_caught_too(tmp_path: Path) -> None:
    dag = edited(tmp_path, "{{ .output.status == 'success' }}", "{{ .output.pages > 5 }}")
    with pytest.raises(ReplayMismatch, match="node parse_pdf: recorded -> extract_metrics, "
                                             "replayed -> \\(no edge taken\\)"):
        assert_replays(EXAMPLE_FIXTURE, dag=dag, home=tmp_path / "home")


def test_a_removed_node_and_a_new_entry_node_are_differences(tmp_path: Path) -> None:
    text = FINANCIAL.read_text().replace(
        "nodes:\n", "nodes:\n  audit: {type: tool_call, tool: echo, input: audit}\n", 1)
    path = tmp_path / "with_audit.yaml"
    path.write_text(text)
    with pytest.raises(ReplayMismatch, match="node audit: recorded \\(not in the recording\\), "
                                             "replayed reached"):
        assert_replays(EXAMPLE_FIXTURE, dag=path, home=tmp_path / "home")


def test_a_fixture_recorded_mid_run_resumes_with_stubs(tmp_path: Path) -> None:
    """parse_pdf and extract_metrics committed, the email claimed by a worker that
    crashed: the resume sends it (stubbed here) and nothing committed runs again."""
    fixture = LEGACY_FIXTURES / "financial_success.json"
    with AxTestEngine(tmp_path / "unstubbed") as engine, pytest.raises(
            UnstubbedNodeError, match=r"node 'send_medium_risk_email' .* ran without a stub"):
        engine.replay(fixture)
    with AxTestEngine(tmp_path / "stubbed") as engine:
        replay = engine.assert_replays(fixture, dag=FINANCIAL, stubs={
            "tool:send_email": {"status": "sent"}, "tool:echo": {"logged": True}})
        assert engine.result().task_id == replay.result.task_id == "fixture-success"
    assert replay.executed == ["send_medium_risk_email", "log_completion"]
    assert list(replay.result.path) == MEDIUM
    assert replay.resumed is not None and replay.resumed.calls("parse_pdf") == 0


def test_a_replay_that_reruns_a_committed_node_is_refused() -> None:
    """What the engine guarantees, checked on every replay: a Replay whose resume ran a
    committed node again does not pass."""
    result = RunResult(task_id="t", status="SUCCEEDED", outputs={}, path=[], states={})
    replay = Replay(result=result, executed=["parse_pdf", "log_completion"],
                    committed_before=["parse_pdf"], source="f.json", dag="d.yaml")
    assert replay.rerun == ["parse_pdf"] and not replay.ok
    with pytest.raises(ReplayMismatch, match="committed nodes ran again on resume: parse_pdf"):
        replay.assert_ok()


def snap(node: str, state: NodeState, *taken: str, output: object = None) -> Snapshot:
    return Snapshot(task_id="t", node_id=node, state=state, output=output,
                    next_hops=tuple(NextHop(t, True) for t in taken))


def test_decision_diffs_compare_states_and_taken_edges() -> None:
    dag = load_dag(FINANCIAL)
    recorded = {
        "parse_pdf": snap("parse_pdf", NodeState.SUCCEEDED, "extract_metrics"),
        "extract_metrics": snap("extract_metrics", NodeState.RUNNING),
        "assess_risk": snap("assess_risk", NodeState.PENDING),
    }
    same = dict(recorded, extract_metrics=snap("extract_metrics", NodeState.PAUSED))
    assert decision_diffs(recorded, same, recorded_dag=dag, replayed_dag=dag,
                          recording_final=False) == []
    # A node not reached yet in the recording is not compared; one that was reached must
    # be reached again.
    moved = dict(same, assess_risk=snap("assess_risk", NodeState.SKIPPED),
                 extract_metrics=snap("extract_metrics", NodeState.SKIPPED))
    assert decision_diffs(recorded, moved, recorded_dag=dag, replayed_dag=dag,
                          recording_final=False) == [
        HopDiff("extract_metrics", "reached (RUNNING)", "SKIPPED")]
    failed = dict(same, parse_pdf=Snapshot(task_id="t", node_id="parse_pdf",
                                           state=NodeState.FAILED))
    assert [str(d) for d in decision_diffs(recorded, failed, recorded_dag=dag,
                                           replayed_dag=dag, recording_final=False)] == [
        "node parse_pdf: recorded -> extract_metrics, replayed FAILED -> (end)"]


def test_replay_fixture_keeps_its_old_contract(tmp_path: Path) -> None:
    from axengine.testing import replay_fixture

    replay = replay_fixture(LEGACY_FIXTURES / "financial_timeout.json", home=tmp_path)
    assert replay.result.status == "SUCCEEDED" and replay.rerun == []
    assert replay.executed[0] == "extract_metrics"
    assert json.loads((LEGACY_FIXTURES / "financial_timeout.json").read_text())["version"] == 1


def test_a_recorded_map_and_loop_replay_item_by_item_and_visit_by_visit(
        tmp_path: Path, ax_replay: Callable[..., Replay]) -> None:
    """Each item answers what it answered and each visit of a loop's node what that
    visit answered, so the re-run of dags/report_digest.yaml takes the recorded path."""
    import asyncio

    from axengine.config import AxConfig
    from axengine.fixtures import export_task
    from axengine.local import LocalSession

    digest = FINANCIAL.parent / "report_digest.yaml"
    report = {"pdf_url": str(FINANCIAL.parent / "inputs" / "acme_annual_report.pdf")}

    async def record() -> tuple[dict[str, object], list[str]]:
        async with LocalSession(AxConfig(home=tmp_path / "home")) as session:
            task_id = await session.submit(digest, report)
            result = await session.wait(task_id)
            return await export_task(session.engine, task_id), list(result.path)

    fixture, path = asyncio.run(record())
    assert path.count("draft_digest") == 2 and "summarise_sections[8]" in path
    # The items and kept visits are node instances a fixture may hold, never PENDING.
    check_fixture(fixture)
    for instance in ("summarise_sections[8]", "draft_digest#1"):
        edited = copy.deepcopy(fixture)
        snap = next(s for s in edited["snapshots"] if s["node_id"] == instance)
        snap["state"] = "PENDING"
        with pytest.raises(InputError, match=re.escape(
                f"'{instance}' is PENDING, which a map's item or a loop's kept visit")):
            check_fixture(edited)
    replay = ax_replay(fixture, dag=digest)
    assert replay.ok and replay.rerun == []
    assert replay.check is not None
    assert replay.check.path.count("draft_digest") == 2
    assert sorted(n for n in replay.check.path if "[" in n) == sorted(
        n for n in path if "[" in n)
    assert replay.check.outputs["summarise_sections"] == \
        replay.result.outputs["summarise_sections"]
