"""echo, sleep, video_vendor and the tool_call dispatcher's simulated faults."""

from __future__ import annotations

import time

import pytest

from executors.contract import Failure, NodeRequest, Success, Unavailable
from executors.tools import TOOLS, tool_call
from executors.tools.video_vendor import VENDOR
from tests.executors.fakes import FakeContext, FakeEffect, make_request

FAST_VENDOR = {"queue_seconds": 0.05, "render_seconds": 0.3, "poll_interval": 0.02}


def test_tool_names() -> None:
    assert set(TOOLS) == {"pdf_parser", "http_request", "send_email", "video_vendor", "echo",
                          "sleep"}


def test_echo_returns_input() -> None:
    value = {"a": [1, 2], "b": None}
    outcome = tool_call(make_request(config={"tool": "echo"}, input=value), FakeContext())
    assert outcome == Success(value)


def test_unknown_tool_is_not_retryable() -> None:
    outcome = tool_call(make_request(config={"tool": "teleport"}), FakeContext())
    assert isinstance(outcome, Failure)
    assert outcome.retryable is False
    assert "pdf_parser" in outcome.message


def test_sleep_heartbeats() -> None:
    ctx = FakeContext(settings={"heartbeat_interval": 0.02})
    started = time.monotonic()
    outcome = tool_call(make_request(config={"tool": "sleep"}, input={"seconds": 0.2}), ctx)
    assert outcome == Success({"slept": 0.2})
    assert time.monotonic() - started >= 0.2
    assert ctx.heartbeats >= 3


def test_sleep_stops_when_heartbeat_is_refused() -> None:
    ctx = FakeContext(settings={"heartbeat_interval": 0.0}, stale_after_heartbeats=2)
    started = time.monotonic()
    outcome = tool_call(make_request(config={"tool": "sleep"}, input=30), ctx)
    assert isinstance(outcome, Failure)
    assert outcome.details["stopped"] is True
    assert time.monotonic() - started < 5


def test_sleep_stops_when_cancelled() -> None:
    ctx = FakeContext()
    ctx.cancel()
    outcome = tool_call(make_request(config={"tool": "sleep"}, input=30), ctx)
    assert isinstance(outcome, Failure)
    assert outcome.details["stopped"] is True


@pytest.mark.parametrize("bad", [-1, "soon", True, float("nan"), None])
def test_sleep_rejects_bad_input(bad: object) -> None:
    outcome = tool_call(make_request(config={"tool": "sleep"}, input=bad), FakeContext())
    assert isinstance(outcome, Failure)
    assert outcome.retryable is False


def test_simulated_fail_attempts_then_success() -> None:
    config = {"tool": "echo", "simulate": {"fail_attempts": 2}}
    outcomes = [tool_call(make_request(config=config, input="x", attempt=n), FakeContext())
                for n in (1, 2, 3)]
    assert [type(o).__name__ for o in outcomes] == ["Failure", "Failure", "Success"]
    assert all(o.retryable for o in outcomes[:2] if isinstance(o, Failure))


def test_simulated_unavailable_tool() -> None:
    down = tool_call(make_request(config={"tool": "echo", "simulate": {"unavailable": True}}),
                     FakeContext())
    later = tool_call(
        make_request(config={"tool": "echo", "simulate": {"unavailable_until": time.time() + 60}}),
        FakeContext(),
    )
    past = tool_call(
        make_request(config={"tool": "echo", "simulate": {"unavailable_until": time.time() - 1}},
                     input="ok"),
        FakeContext(),
    )
    assert isinstance(down, Unavailable) and down.dependency == "tool:echo"
    assert isinstance(later, Unavailable) and "until" in later.evidence
    assert past == Success("ok")


def test_simulated_fault_knob_type_error() -> None:
    outcome = tool_call(make_request(config={"tool": "echo", "simulate": {"latency": "slow"}}),
                        FakeContext())
    assert isinstance(outcome, Failure)
    assert outcome.retryable is False
    assert "simulate.latency" in outcome.message


def _video(attempt: int = 1) -> NodeRequest:
    return make_request(config={"tool": "video_vendor", "simulate": FAST_VENDOR},
                        input={"prompt": "a cat on a skateboard", "seconds": 8},
                        node_id="render", attempt=attempt)


def test_video_vendor_reports_progress_and_completes() -> None:
    before = VENDOR.submissions
    ctx = FakeContext(settings={"heartbeat_interval": 0.0})
    outcome = tool_call(_video(), ctx)
    assert isinstance(outcome, Success)
    assert outcome.output["status"] == "ready"
    job_id = outcome.output["vendor_job_id"]
    assert outcome.output["video_uri"].endswith(f"{job_id}.mp4")
    assert VENDOR.submissions == before + 1
    assert ctx.markers[0] == "vendor:queued"
    assert any(m.startswith("vendor:rendering ") for m in ctx.markers)
    assert ctx.markers[-1] == "vendor:downloaded"
    # Progress is recorded only when the vendor state moves; heartbeats fill the gaps.
    assert len(ctx.markers) == len(set(ctx.markers))
    assert ctx.heartbeats > len(ctx.markers)
    key = "video:task-1:render:rev-1"
    assert ctx.effects[key].status == "DONE"
    recorded = ctx.effects[key].recorded
    assert recorded is not None and recorded["vendor_job_id"] == job_id


def test_video_vendor_reattaches_after_a_crash_instead_of_paying_twice() -> None:
    before = VENDOR.submissions
    ctx = FakeContext(stale_after_progress=2)  # the worker loses its lease mid-render
    first = tool_call(_video(attempt=1), ctx)
    assert isinstance(first, Failure) and first.details["stopped"] is True

    retry_ctx = FakeContext(effects=ctx.effects)  # a new worker, same outbox
    second = tool_call(_video(attempt=2), retry_ctx)
    assert isinstance(second, Success)
    assert VENDOR.submissions == before + 1
    assert retry_ctx.markers[0].startswith("vendor:reattached vj-")
    assert second.output["vendor_job_id"] in retry_ctx.markers[0]


def test_video_vendor_unknown_submission_needs_a_person() -> None:
    before = VENDOR.submissions
    ctx = FakeContext()
    key = "video:task-1:render:rev-1"
    ctx.effects[key] = FakeEffect(key, status="SENDING")
    outcome = tool_call(_video(attempt=2), ctx)
    assert isinstance(outcome, Failure)
    assert outcome.retryable is False
    assert outcome.details["effect"] == "UNKNOWN"
    assert VENDOR.submissions == before


def test_video_vendor_bad_input() -> None:
    outcome = tool_call(make_request(config={"tool": "video_vendor"}, input={"seconds": 3}),
                        FakeContext())
    assert isinstance(outcome, Failure)
    assert outcome.retryable is False
