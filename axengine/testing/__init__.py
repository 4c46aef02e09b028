"""Testing DAGs the way you test code: stubbed paths, a test clock, recorded fixtures.

With the package installed, pytest finds the ``ax_engine`` and ``ax_replay`` fixtures
(:mod:`axengine.pytest_plugin`, registered under the ``pytest11`` entry point)::

    from axengine.testing import fail, timeout

    DAG = "dags/financial_risk_assessment.yaml"
    PARSED = {"status": "success", "text": "..."}

    def test_high_risk_goes_to_review(ax_engine):
        run = ax_engine.run(DAG, {"pdf_url": "report.pdf"}, stubs={
            "parse_pdf": PARSED,
            "model:gpt-4-turbo": {"revenue_growth": 0.3, "net_profit_margin": 0.05,
                                  "debt_to_equity": 1.0},
            "tool:send_email": {"sent": True},
        }, decide={"send_high_risk_email": "approve"})
        assert run.path == ["parse_pdf", "extract_metrics", "assess_risk",
                            "send_high_risk_email", "notify_high_risk", "log_completion"]

    def test_recorded_run_still_replays(ax_replay):
        ax_replay("tests/fixtures/medium.fixture.json", dag=DAG)

Nodes are stubbed by node id, ``tool:NAME`` or ``model:NAME`` with an output, or with
:func:`fail`, :func:`unavailable`, :func:`timeout`, :func:`pause`, or :func:`calls` of
several; conditions and guards are evaluated by ax itself. The engine runs on a test
clock: retries, backoff and timed pauses take no real time, and
``ax_engine.advance(seconds)`` lets time pass for gate timeouts and deadlines
(docs/testing.md).

Outside pytest: :class:`AxTestEngine` (``with AxTestEngine(home) as engine``),
:class:`AsyncAxTestEngine` (``async with``), :func:`assert_replays`. The older
:func:`replay_fixture` resumes a fixture with the real handlers and reports what ran.

Errors a test meets, apart from the :class:`~axengine.errors.InputError` of a stub,
``decide`` or ``real`` key that names nothing in the DAG::

    AssertionError
    ├── UnstubbedNodeError   a node without a stub ran, and real handlers were not allowed
    └── ReplayMismatch       a fixture left its recorded path, or re-ran a committed node
"""

from __future__ import annotations

from axengine.testing._engine import (
    DEFAULT_START,
    AsyncAxTestEngine,
    AxRun,
    AxTestEngine,
    Decision,
)
from axengine.testing._replay import (
    HopDiff,
    Replay,
    ReplayMismatch,
    assert_replays,
    decision_diffs,
    replay,
    replay_fixture,
)
from axengine.testing._stubs import (
    Calls,
    StubBook,
    Timeout,
    UnstubbedNodeError,
    calls,
    fail,
    pause,
    stub,
    timeout,
    unavailable,
)

__all__ = [
    "DEFAULT_START",
    "AsyncAxTestEngine",
    "AxRun",
    "AxTestEngine",
    "Calls",
    "Decision",
    "HopDiff",
    "Replay",
    "ReplayMismatch",
    "StubBook",
    "Timeout",
    "UnstubbedNodeError",
    "assert_replays",
    "calls",
    "decision_diffs",
    "fail",
    "pause",
    "replay",
    "replay_fixture",
    "stub",
    "timeout",
    "unavailable",
]
