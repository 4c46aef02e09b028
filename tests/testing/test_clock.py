"""The test clock of the test engine: a gate timeout, a deadline and a pause take their
route when the test lets time pass, at the recorded times, and in no real time."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from axengine.testing import (
    DEFAULT_START,
    AsyncAxTestEngine,
    AxRun,
    AxTestEngine,
    calls,
    fail,
    unavailable,
)
from tests.testing.dags import FINANCIAL, FLOW, FLOW_STUBS, HAPPY, METRICS

HIGH_RISK = {"parse_pdf": {"status": "success", "text": "..."},
             "model:gpt-4-turbo": METRICS["high_risk"], "tool:send_email": {"status": "sent"},
             "tool:echo": {"logged": True}}


def test_a_gate_takes_its_default_route_when_its_wait_runs_out(
        ax_engine: AxTestEngine) -> None:
    run = ax_engine.run(FINANCIAL, {"pdf_url": "r.pdf"}, stubs=HIGH_RISK)
    assert (run.status, run.waiting) == ("PAUSED", ["send_high_risk_email"])
    gate = run.snapshots["send_high_risk_email"]
    assert gate.gate_until == run.now + 86400

    wall = time.monotonic()
    run = ax_engine.advance(86399)
    assert run.waiting == ["send_high_risk_email"]  # not a second early
    run = ax_engine.advance(1)
    assert time.monotonic() - wall < 5  # a day of test time (1 s is the usual bound)

    assert run.status == "SUCCEEDED"
    decision = run.snapshots["send_high_risk_email"].decision
    assert decision is not None
    assert (decision["decision"], decision["by"], decision["at"]) == (
        "reject", "ax:gate-timeout", gate.gate_until)
    assert run.path[-2:] == ["send_high_risk_email", "log_completion"]
    assert run.now == gate.gate_until


def test_time_passes_in_order_up_to_the_target(ax_engine: AxTestEngine) -> None:
    """An hour-long gate that approves by default, then a publish that fails once:
    advancing two hours fires the gate at 3600 s and the retry right after it."""
    run = ax_engine.run(FLOW, {"url": "u"}, stubs={
        **FLOW_STUBS, "publish": calls(fail("busy"), "published")})
    assert run.waiting == ["review"]
    start = run.now
    run = ax_engine.advance(7200)
    assert run.path == HAPPY
    assert run.outputs["publish"] == "published"
    at = {e.kind: e.at - start for e in run.events if e.node_id in ("review", "publish")}
    assert at["decided"] == 3600
    assert 3600 < at["committed"] < 3600 + 60  # after its backoff, not at the target
    assert run.now == start + 7200  # and the rest of the time passed too


def test_a_deadline_passes_while_the_task_waits_but_not_while_a_gate_does(
        ax_engine: AxTestEngine) -> None:
    run = ax_engine.run(FLOW, {"url": "u"}, deadline=600, stubs={
        **FLOW_STUBS, "fetch": unavailable("origin", "down", retry_after=3600)})
    # The clock jumped to the deadline, not to the re-offer an hour later.
    assert (run.status, run.states["fetch"]) == ("DEAD", "DEAD")
    assert run.now == DEFAULT_START + 600

    run = ax_engine.run(FLOW, {"url": "u"}, stubs=FLOW_STUBS, deadline=600)
    assert run.waiting == ["review"]
    # A PAUSED task's deadline moves on while it waits for the reviewer; the gate's
    # own bound (an hour, approve) decides.
    run = ax_engine.advance(3600)
    assert (run.status, run.path) == ("SUCCEEDED", HAPPY)


def test_advance_and_decide_act_on_the_last_task_or_the_one_named(
        ax_engine: AxTestEngine) -> None:
    first = ax_engine.run(FLOW, {"url": "1"}, stubs=FLOW_STUBS)
    second = ax_engine.run(FLOW, {"url": "2"}, stubs=FLOW_STUBS)
    assert ax_engine.task_id == second.task_id
    run = ax_engine.decide("review", "reject", task_id=first.task_id, comment="no")
    assert (run.task_id, run.status, run.path) == (first.task_id, "SUCCEEDED",
                                                   ["fetch", "summarize", "review"])
    assert ax_engine.result().waiting == ["review"]  # the second still waits
    with pytest.raises(ValueError, match="time does not go back"):
        ax_engine.advance(-1)


def test_an_engine_needs_a_task_before_it_can_report_one(tmp_path: Path) -> None:
    with AxTestEngine(tmp_path) as engine:
        assert engine.now == DEFAULT_START
        with pytest.raises(RuntimeError, match="no task yet"):
            engine.result()
        engine.close()  # closing twice is harmless


def test_the_async_engine_for_async_tests(tmp_path: Path) -> None:
    async def main() -> tuple[AxRun, AxRun]:
        async with AsyncAxTestEngine(tmp_path) as engine:
            waiting = await engine.run(FLOW, {"url": "u"}, stubs=FLOW_STUBS)
            return waiting, await engine.decide("review")

    waiting, done = asyncio.run(main())
    assert waiting.waiting == ["review"]
    assert (done.task_id, done.path) == (waiting.task_id, HAPPY)
