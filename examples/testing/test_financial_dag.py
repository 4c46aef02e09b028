"""Tests of dags/financial_risk_assessment.yaml: the worked example of docs/testing.md.

Run with plain pytest where ax is installed (``pip install axengine pytest``): the
``ax_engine`` and ``ax_replay`` fixtures come from ax's pytest plugin. No tool or model
runs for real — each test says what the nodes answer and asserts the path the DAG
takes — and time is a test clock: a 24-hour gate timeout takes no real time.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from axengine.testing import AxTestEngine, Replay, calls, fail

HERE = Path(__file__).resolve().parent
DAG = HERE.parents[1] / "dags" / "financial_risk_assessment.yaml"
# Recorded from a real run (docs/testing.md#recording-a-fixture):
#   ax run dags/financial_risk_assessment.yaml --input dags/inputs/financial_risk_assessment.json
#   ax snapshot export TASK --redact nodes.parse_pdf.output.text --redact 'nodes.*.output.path' \
#       -o examples/testing/fixtures/acme_medium.fixture.json
FIXTURE = HERE / "fixtures" / "acme_medium.fixture.json"

REPORT = {"pdf_url": "reports/acme-2024.pdf"}
PARSED = {"status": "success", "text": "Revenue growth: 8.0% ..."}

# What the model extracts picks the branch of assess_risk:
#   high_risk    revenue growth > 15% and net profit margin < 12%
#   medium_risk  otherwise, debt to equity > 2
#   low_risk     otherwise
METRICS = {
    "high_risk": {"revenue_growth": 0.30, "net_profit_margin": 0.05, "debt_to_equity": 1.0},
    "medium_risk": {"revenue_growth": 0.08, "net_profit_margin": 0.14, "debt_to_equity": 2.4},
    "low_risk": {"revenue_growth": 0.05, "net_profit_margin": 0.20, "debt_to_equity": 0.5},
}

# Stubs by node id, by tool ("tool:NAME") or by model ("model:NAME").
STUBS = {
    "parse_pdf": PARSED,
    "tool:send_email": {"status": "sent"},
}
# log_completion calls the harmless echo tool: let it run for real.
REAL = ["tool:echo"]

START = ["parse_pdf", "extract_metrics", "assess_risk"]


@pytest.mark.parametrize(("risk", "branch"), [
    ("high_risk", ["send_high_risk_email", "notify_high_risk"]),
    ("medium_risk", ["send_medium_risk_email"]),
    ("low_risk", ["send_low_risk_email"]),
])
def test_each_risk_level_takes_its_branch(ax_engine: AxTestEngine, risk: str,
                                          branch: list[str]) -> None:
    run = ax_engine.run(DAG, REPORT, stubs={**STUBS, "model:gpt-4-turbo": METRICS[risk]},
                        real=REAL, decide={"send_high_risk_email": "approve"})
    assert run.status == "SUCCEEDED"
    assert run.outputs["assess_risk"] == risk
    assert run.path == [*START, *branch, "log_completion"]
    assert run.outputs["log_completion"] == {"pdf_url": "reports/acme-2024.pdf", "risk": risk}


def test_an_unanswered_review_is_rejected_after_24_hours(ax_engine: AxTestEngine) -> None:
    run = ax_engine.run(DAG, REPORT, real=REAL,
                        stubs={**STUBS, "model:gpt-4-turbo": METRICS["high_risk"]})
    assert run.status == "PAUSED"
    assert run.waiting == ["send_high_risk_email"]

    start = ax_engine.now
    run = ax_engine.advance(24 * 3600 - 1)  # not a second early
    assert run.waiting == ["send_high_risk_email"]
    run = ax_engine.advance(1)
    assert ax_engine.now - start == 24 * 3600  # a day of test time, no real waiting

    # The gate's default route (on_timeout: reject): no email goes out.
    assert run.status == "SUCCEEDED"
    assert run.decision("send_high_risk_email") == "reject"
    assert run.path == [*START, "send_high_risk_email", "log_completion"]
    assert run.states["notify_high_risk"] == "SKIPPED"


def test_a_parser_failure_alerts_the_operators(ax_engine: AxTestEngine) -> None:
    run = ax_engine.run(DAG, REPORT, real=REAL, stubs={
        **STUBS, "parse_pdf": {"status": "failed", "error": "encrypted PDF"}})
    assert run.path == ["parse_pdf", "send_alert", "log_completion"]
    assert run.states["extract_metrics"] == "SKIPPED"
    assert run.outputs["log_completion"]["risk"] == "not assessed"


def test_a_flaky_parser_is_retried_without_waiting_out_its_backoff(
        ax_engine: AxTestEngine) -> None:
    run = ax_engine.run(DAG, REPORT, real=REAL, stubs={
        **STUBS,
        "parse_pdf": calls(fail("connection reset"), fail("connection reset"), PARSED),
        "model:gpt-4-turbo": METRICS["low_risk"],
    })
    assert run.ok
    assert run.calls("parse_pdf") == 3  # retry: 2 — three attempts in all
    assert [e.kind for e in run.events if e.node_id == "parse_pdf"].count("retry") == 2


def test_the_recorded_acme_run_still_replays(ax_replay: Callable[..., Replay]) -> None:
    replay = ax_replay(FIXTURE, dag=DAG)
    assert replay.result.path == [*START, "send_medium_risk_email", "log_completion"]
    assert replay.rerun == []
