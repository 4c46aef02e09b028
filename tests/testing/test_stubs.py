"""Stubs and the test clock: a DAG's path for given node outputs, with nothing real run
and no real time waited (the ``ax_engine`` fixture of ax's pytest plugin)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from axengine.errors import InputError
from axengine.testing import (
    DEFAULT_START,
    AxTestEngine,
    UnstubbedNodeError,
    calls,
    fail,
    pause,
    stub,
    timeout,
    unavailable,
)
from executors.contract import NodeRequest
from tests.testing.dags import FINANCIAL, FLOW, FLOW_STUBS, HAPPY, METRICS, PAGE


@pytest.mark.parametrize("risk", sorted(METRICS))
def test_the_model_stub_picks_the_branch_of_assess_risk(ax_engine: AxTestEngine,
                                                        risk: str) -> None:
    branch = {"high_risk": ["send_high_risk_email", "notify_high_risk"],
              "medium_risk": ["send_medium_risk_email"],
              "low_risk": ["send_low_risk_email"]}[risk]
    run = ax_engine.run(FINANCIAL, {"pdf_url": "r.pdf"}, stubs={
        "parse_pdf": {"status": "success", "text": "..."},
        "model:gpt-4-turbo": METRICS[risk], "tool:send_email": {"status": "sent"},
        "tool:echo": {"logged": True}}, decide={"send_high_risk_email": "approve"})
    assert (run.status, run.outputs["assess_risk"]) == ("SUCCEEDED", risk)
    assert run.path == ["parse_pdf", "extract_metrics", "assess_risk", *branch,
                        "log_completion"]
    assert run.taken("assess_risk") == [branch[0]]
    # The stubbed model got the rendered request, as a real one would.
    [request] = [r for r in run.requests if r.node_id == "extract_metrics"]
    assert request.input == "..." and request.config["model"] == "gpt-4-turbo"


def test_a_node_id_wins_over_its_tool_and_a_callable_sees_the_request(
        ax_engine: AxTestEngine) -> None:
    seen: list[Any] = []

    def summarize(request: NodeRequest) -> str:
        seen.append(request.input)
        return f"summary of {request.input}"

    run = ax_engine.run(FLOW, {"url": "https://example.org"}, stubs={
        "fetch": PAGE, "summarize": summarize, "model:gpt-4o-mini": "never used",
        "publish": stub(["a", "list", "output"]), "tool:echo": "unused"},
        decide={"review": "approve"})
    assert run.path == HAPPY
    assert seen == ["<h1>news</h1>"]
    assert run.outputs["summarize"] == "summary of <h1>news</h1>"
    assert run.outputs["publish"] == ["a", "list", "output"]
    assert run.calls("fetch") == 1 and run.requests[0].input == "https://example.org"


def test_retries_and_their_backoff_take_test_time_only(ax_engine: AxTestEngine) -> None:
    wall = time.monotonic()
    run = ax_engine.run(FLOW, {"url": "u"}, decide={"review": "approve"}, stubs={
        **FLOW_STUBS, "fetch": calls(fail("reset"), fail("reset"), PAGE)})
    assert run.path == HAPPY
    assert run.calls("fetch") == 3
    retries = [e for e in run.events if e.kind == "retry"]
    assert [e.node_id for e in retries] == ["fetch", "fetch"]
    # The backoffs (about 1 s, then 2 s) passed on the test clock, not the wall clock.
    assert run.now - DEFAULT_START >= 2.0
    assert run.snapshots["fetch"].attempt == 3
    assert time.monotonic() - wall < 2.5  # waiting them out would take about 3 s


def test_a_non_retryable_failure_and_exhausted_attempts(ax_engine: AxTestEngine) -> None:
    run = ax_engine.run(FLOW, {"url": "u"}, stubs={
        **FLOW_STUBS, "fetch": fail("403 forbidden", retryable=False)})
    assert (run.status, run.calls("fetch"), run.errors["fetch"]) == ("FAILED", 1,
                                                                      "403 forbidden")
    run = ax_engine.run(FLOW, {"url": "u"}, stubs={**FLOW_STUBS, "fetch": fail("flaky")})
    assert (run.status, run.calls("fetch")) == ("DEAD", 3)
    assert run.errors["fetch"].startswith("attempts exhausted (3/3)")


def test_a_timeout_stub_is_the_runners_timeout(ax_engine: AxTestEngine) -> None:
    run = ax_engine.run(FLOW, {"url": "u"}, decide={"review": "approve"},
                        stubs={**FLOW_STUBS, "fetch": calls(timeout(), PAGE)})
    assert run.path == HAPPY
    [retry] = [e for e in run.events if e.kind == "retry"]
    assert retry.detail.startswith("timed out after 30.0s (timeout 30s)")


def test_an_unavailable_dependency_spends_no_attempt(ax_engine: AxTestEngine) -> None:
    run = ax_engine.run(FLOW, {"url": "u"}, decide={"review": "approve"}, stubs={
        **FLOW_STUBS,
        "model:gpt-4o-mini": calls(unavailable("openai", "503", retry_after=120), "ok")})
    assert run.path == HAPPY
    assert run.snapshots["summarize"].attempt == 1  # the outage was refunded
    assert run.now - DEFAULT_START >= 120  # offered again after its Retry-After


def test_a_dependency_that_stays_down_stops_the_run_unsettled(tmp_path: Path) -> None:
    with AxTestEngine(tmp_path, max_jumps=5) as engine:
        run = engine.run(FLOW, {"url": "u"}, stubs={
            **FLOW_STUBS, "model:gpt-4o-mini": unavailable("openai", "503")})
    assert not run.settled
    assert run.status == "RUNNING" and run.states["summarize"] == "WAITING"
    assert run.snapshots["summarize"].evidence == "openai: 503"
    assert run.calls("summarize") == 6  # the first answer and one per jump
    assert run.snapshots["summarize"].attempt == 0


def test_a_timed_pause_resumes_by_itself_and_an_open_one_on_resume(
        ax_engine: AxTestEngine) -> None:
    run = ax_engine.run(FLOW, {"url": "u"}, decide={"review": "approve"}, stubs={
        **FLOW_STUBS, "fetch": calls(pause("rate limited", seconds=600), PAGE)})
    assert run.path == HAPPY and run.now - DEFAULT_START >= 600

    run = ax_engine.run(FLOW, {"url": "u"}, decide={"review": "approve"}, stubs={
        **FLOW_STUBS, "fetch": calls(pause("vendor job queued"), PAGE)})
    assert run.states["fetch"] == "PAUSED" and run.settled
    run = ax_engine.resume("fetch", {"job": "done"})
    assert run.path == HAPPY
    assert [r.resume for r in run.requests if r.node_id == "fetch"] == [None, {"job": "done"}]


def test_an_unstubbed_node_fails_the_test_with_the_keys_that_would_stub_it(
        ax_engine: AxTestEngine) -> None:
    with pytest.raises(UnstubbedNodeError) as caught:
        ax_engine.run(FLOW, {"url": "u"}, stubs={"fetch": PAGE})
    message = str(caught.value)
    assert "node 'summarize' (llm_call, model 'gpt-4o-mini') ran without a stub" in message
    assert "stubs={'summarize': ...} or stubs={'model:gpt-4o-mini': ...}" in message
    assert "real=True" in message
    run = ax_engine.result()
    assert run.status == "FAILED" and "ran without a stub" in run.errors["summarize"]


def test_real_handlers_run_when_the_test_allows_them(ax_engine: AxTestEngine) -> None:
    run = ax_engine.run(FLOW, {"url": "u"}, decide={"review": "approve"},
                        stubs={"fetch": PAGE, "model:gpt-4o-mini": "ok"}, real=["tool:echo"])
    # The real echo tool returns its input: what the reviewer saw, the summary.
    assert run.path == HAPPY and run.outputs["publish"] == "ok"
    run = ax_engine.run(FLOW, {"url": "u"}, stubs={"fetch": {"ok": False}}, real=True)
    assert run.path == ["fetch", "alert"] and run.outputs["alert"] == "alert"


@pytest.mark.parametrize(("stubs", "words"), [
    ({"fech": PAGE}, "flow has no node 'fech' (did you mean 'fetch'?)"),
    ({"tool:http": PAGE}, "no node of flow calls tool 'http'"),
    ({"model:gpt-4": "x"}, "no node of flow uses model 'gpt-4'"),
    ({"review": "x"}, "node 'review' is a human_gateway: give its decision with decide="),
])
def test_a_stub_that_names_nothing_is_refused(ax_engine: AxTestEngine,
                                              stubs: dict[str, Any], words: str) -> None:
    with pytest.raises(InputError) as caught:
        ax_engine.run(FLOW, {"url": "u"}, stubs=stubs)
    assert words in str(caught.value)
    assert ax_engine.task_id is None  # nothing was submitted


def test_a_condition_cannot_be_stubbed_and_a_decision_needs_a_gate(
        ax_engine: AxTestEngine) -> None:
    with pytest.raises(InputError, match="assess_risk' is a condition: ax evaluates it on "
                                         "the output of extract_metrics"):
        ax_engine.run(FINANCIAL, {"pdf_url": "x"}, stubs={"assess_risk": "high_risk"})
    with pytest.raises(InputError, match=r"decide 'reveiw'.*did you mean 'review'"):
        ax_engine.run(FLOW, {"url": "u"}, decide={"reveiw": "approve"})
    with pytest.raises(InputError, match="real 'tool:mail'"):
        ax_engine.run(FLOW, {"url": "u"}, real=["tool:mail"])


def test_approve_with_edits_passes_the_edited_data_on(ax_engine: AxTestEngine) -> None:
    run = ax_engine.run(FLOW, {"url": "u"}, real=["tool:echo"], stubs={
        "fetch": PAGE, "model:gpt-4o-mini": "a summary"}, decide={
        "review": {"decision": "approve", "data": "an edited summary", "comment": "typo"}})
    assert run.outputs["publish"] == "an edited summary"
    assert run.decision("review") == "approve"
    assert (run.snapshots["review"].decision or {}).get("comment") == "typo"
