"""The API server's waiting Takes (``axengine.api._takers``): who a submit claims for,
and how a Take ends whatever happens first — its wait, the submit's answer, its caller
going away, the server stopping."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from axengine.api._takers import Takers
from axengine.engine import ClaimResult
from executors.contract import NodeRequest


def _claim(node: str = "first") -> ClaimResult:
    request = NodeRequest(task_id="t-1", node_id=node, node_type="tool_call", attempt=1,
                          fence=1, config={}, input=None, labels={}, input_revision="r")
    return ClaimResult("claimed", request=request)


def _run(scenario: Callable[[Takers, list[str]], Awaitable[Any]]) -> tuple[Any, list[str]]:
    ended: list[str] = []

    async def main() -> Any:
        return await scenario(Takers(on_end=ended.append), ended)

    return asyncio.run(main()), ended


async def _waiting(takers: Takers, count: int) -> None:
    while len(takers) < count:  # (the waits are tasks: they register when they run)
        await asyncio.sleep(0)


def test_a_submit_answers_the_longest_waiting_take_of_its_lane() -> None:
    async def scenario(takers: Takers, ended: list[str]) -> Any:
        fast = asyncio.ensure_future(takers.wait("w-fast", ["fast"], lease_seconds=5,
                                                 timeout=5))
        default = asyncio.ensure_future(takers.wait("w-1", ["default", "fast"],
                                                    lease_seconds=5, timeout=5))
        later = asyncio.ensure_future(takers.wait("w-2", ["default"], lease_seconds=5,
                                                  timeout=0.2))
        await _waiting(takers, 3)
        taker = takers.reserve(["default"])
        assert taker is not None and taker.worker_id == "w-1" and len(takers) == 2
        claim = _claim()
        takers.answer(taker, claim)
        got = await default
        assert await later is None  # its wait ended
        assert takers.reserve(["default"]) is None
        fast.cancel()
        return got is claim, fast

    (same, _), ended = _run(scenario)
    assert same and ended == ["claimed", "empty"]


def test_a_submit_that_claims_nothing_puts_the_take_back_first_in_line() -> None:
    async def scenario(takers: Takers, ended: list[str]) -> Any:
        first = asyncio.ensure_future(takers.wait("w-1", ["default"], lease_seconds=None,
                                                  timeout=5))
        second = asyncio.ensure_future(takers.wait("w-2", ["default"], lease_seconds=None,
                                                   timeout=5))
        await _waiting(takers, 2)
        taker = takers.reserve(["default"])
        assert taker is not None and taker.worker_id == "w-1"
        takers.answer(taker, None)  # (the submit's node went to the queue)
        again = takers.reserve(["default"])
        assert again is taker
        takers.answer(again, _claim())
        takers.close()
        return (await first).request.node_id, await second

    (node, second), ended = _run(scenario)
    assert node == "first" and second is None
    assert sorted(ended) == ["claimed", "empty"]


def test_a_take_whose_wait_ends_while_a_submit_claims_for_it_gets_the_claim() -> None:
    async def scenario(takers: Takers, ended: list[str]) -> Any:
        wait = asyncio.ensure_future(takers.wait("w-1", ["default"], lease_seconds=None,
                                                 timeout=0.05))
        await _waiting(takers, 1)
        taker = takers.reserve(["default"])
        assert taker is not None
        while not taker.ended:  # the submit's transaction outlasts the wait's 50 ms
            await asyncio.sleep(0.01)
        await asyncio.sleep(0)
        assert not wait.done()  # (it waits for the submit's answer)
        claim = _claim()
        takers.answer(taker, claim)
        return (await wait) is claim

    same, ended = _run(scenario)
    assert same and ended == ["claimed"]


def test_a_claim_for_a_take_whose_caller_went_away_is_counted_lost(
        caplog: pytest.LogCaptureFixture) -> None:
    async def scenario(takers: Takers, ended: list[str]) -> Any:
        wait = asyncio.ensure_future(takers.wait("w-gone", ["default"],
                                                 lease_seconds=None, timeout=5))
        await _waiting(takers, 1)
        taker = takers.reserve(["default"])
        assert taker is not None
        wait.cancel()  # the executor stopped
        with pytest.raises(asyncio.CancelledError):
            await wait
        takers.answer(taker, _claim())  # (no one to hand it to: it lapses)
        return len(takers)

    with caplog.at_level(logging.WARNING, logger="axengine.api.takers"):
        left, ended = _run(scenario)
    assert left == 0 and ended == ["lost"]
    assert "t-1/first for worker w-gone, whose Take had ended" in caplog.text


def test_a_stopping_server_ends_every_take_without_a_claim() -> None:
    async def scenario(takers: Takers, ended: list[str]) -> Any:
        waits = [asyncio.ensure_future(takers.wait(f"w-{i}", ["default"],
                                                   lease_seconds=None, timeout=30))
                 for i in range(3)]
        await _waiting(takers, 3)
        takers.close()
        return await asyncio.gather(*waits), len(takers)

    (answers, left), ended = _run(scenario)
    assert answers == [None, None, None] and left == 0 and ended == ["empty"] * 3
