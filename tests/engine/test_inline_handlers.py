"""Inline handlers (``executors.contract.inline``): the thread runner calls them on its
event loop instead of handing them to a thread; everything else still runs in a thread,
and a blocking context call from the loop fails at once instead of waiting forever."""

from __future__ import annotations

import asyncio
import logging
import threading

import pytest

from axengine.worker import _runner
from axengine.worker._context import RunContext
from axengine.worker._runner import ThreadRunner
from executors.contract import (
    Failure,
    NodeContext,
    NodeRequest,
    Outcome,
    Success,
    inline,
    runs_inline,
)
from executors.handlers import handle


def request(node_type: str = "tool_call", **config: object) -> NodeRequest:
    return NodeRequest(task_id="t", node_id="n", node_type=node_type, attempt=1, fence=1,
                       config=dict(config), input={"x": 1})


def context(req: NodeRequest) -> RunContext:
    return RunContext(loop=asyncio.get_running_loop(), engine=None,  # type: ignore[arg-type]
                      request=req, lease_seconds=30, settings={})


def run(runner: ThreadRunner, req: NodeRequest) -> Outcome:
    async def main() -> Outcome:
        outcome = await runner.run(req, context(req), timeout=10)
        await runner.close()
        assert not isinstance(outcome, _runner.Reported)
        return outcome

    return asyncio.run(main())


def test_an_inline_handler_runs_on_the_event_loop_and_a_plain_one_in_a_thread() -> None:
    seen: dict[str, int] = {}

    def plain(req: NodeRequest, ctx: NodeContext) -> Outcome:
        seen["plain"] = threading.get_ident()
        return Success(req.input)

    @inline
    def quick(req: NodeRequest, ctx: NodeContext) -> Outcome:
        seen["quick"] = threading.get_ident()
        return Success(req.input)

    here = threading.get_ident()  # asyncio.run runs its loop in this thread
    assert run(ThreadRunner(plain), request()) == Success({"x": 1})
    assert run(ThreadRunner(quick), request()) == Success({"x": 1})
    assert seen["quick"] == here
    assert seen["plain"] != here


def test_the_default_handler_runs_echo_inline_and_nothing_that_may_wait() -> None:
    assert runs_inline(handle, request(tool="echo"))
    # A simulate: knob may wait (latency) before the tool runs: a thread.
    assert not runs_inline(handle, request(tool="echo", simulate={"latency": 1}))
    assert not runs_inline(handle, request(tool="sleep"))
    assert not runs_inline(handle, request(tool="no_such_tool"))
    assert not runs_inline(handle, request("llm_call", model="mock"))


def test_a_function_tool_marked_inline_runs_inline_whatever_the_decorator_order() -> None:
    import axengine as ax
    from executors.tools import REGISTRY

    @ax.tool("inline_test_upper")
    @ax.inline
    def upper(text: str) -> str:
        return text.upper()

    @ax.inline
    @ax.tool("inline_test_lower")
    def lower(text: str) -> str:
        return text.lower()

    @ax.tool("inline_test_plain")
    def plain(text: str) -> str:
        return text

    try:
        assert runs_inline(handle, request(tool="inline_test_upper"))
        assert runs_inline(handle, request(tool="inline_test_lower"))
        assert not runs_inline(handle, request(tool="inline_test_plain"))
        req = NodeRequest(task_id="t", node_id="n", node_type="tool_call", attempt=1,
                          fence=1, config={"tool": "inline_test_upper"},
                          input={"text": "ab"})
        assert run(ThreadRunner(handle), req) == Success("AB")
    finally:
        for name in ("inline_test_upper", "inline_test_lower", "inline_test_plain"):
            REGISTRY.unregister(name)


def test_a_blocking_context_call_from_an_inline_handler_fails_instead_of_hanging() -> None:
    @inline
    def beats(req: NodeRequest, ctx: NodeContext) -> Outcome:
        ctx.heartbeat()
        return Success(None)

    outcome = run(ThreadRunner(beats), request())
    assert isinstance(outcome, Failure)
    assert "runs inline, on the worker's event loop" in outcome.message
    assert "drop @inline" in outcome.message


def test_an_inline_handler_that_holds_the_loop_is_logged(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    @inline
    def quick(req: NodeRequest, ctx: NodeContext) -> Outcome:
        return Success(None)

    run(ThreadRunner(quick), request())
    assert not [r for r in caplog.records if "held the event loop" in r.getMessage()]
    monkeypatch.setattr(_runner, "INLINE_WARN_SECONDS", -1.0)  # any call is "too long"
    with caplog.at_level(logging.WARNING, logger=_runner.__name__):
        run(ThreadRunner(quick), request())
    assert any("inline handler of t/n held the event loop" in r.getMessage()
               for r in caplog.records)


def test_inline_takes_synchronous_handlers_only() -> None:
    async def coroutine(req: NodeRequest, ctx: NodeContext) -> Outcome:
        return Success(None)

    with pytest.raises(TypeError, match="synchronous handler"):
        inline(coroutine)
