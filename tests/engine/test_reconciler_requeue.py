"""The reconciler re-offers a WAITING node the queue lost, and only such a node.

A pass reads the queue, then the store. A node readied between the two reads is WAITING
in the store and not yet in the queue snapshot: its enqueue follows its commit. Taking
it for lost queued every node of a fan-out readied mid-pass a second time (each
duplicate then costs a pop and a refused claim).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from axengine.dag import load_dag_mapping
from axengine.engine import Engine, EngineConfig, Reconciler
from axengine.queue.inprocess import InProcessQueue
from axengine.store.embedded import SqliteStore
from executors.contract import Success
from tests.engine.conftest import FakeClock, run
from tests.engine.test_complete_and_claim import _drain

FANOUT = {"name": "fan", "nodes": {
    "src": {"type": "tool_call", "tool": "echo", "input": "s", "next": ["a", "b", "c"]},
    "a": {"type": "tool_call", "tool": "echo", "input": "a"},
    "b": {"type": "tool_call", "tool": "echo", "input": "b"},
    "c": {"type": "tool_call", "tool": "echo", "input": "c"},
}}


class _QueueReadThen(InProcessQueue):
    """A queue that runs ``after`` once its snapshot (``queued``) has been taken: what
    another coroutine does while a pass goes on to read the store."""

    after: Callable[[], Awaitable[Any]] | None = None

    async def queued(self) -> set[tuple[str, str]]:
        snapshot = await super().queued()
        after, self.after = self.after, None
        if after is not None:
            await after()
        return snapshot


def test_a_node_readied_after_the_queue_was_read_is_not_queued_twice(
        tmp_path: Any, clock: FakeClock) -> None:
    async def main() -> None:
        queue = _QueueReadThen()
        store = SqliteStore(path=tmp_path / "ax.db")
        engine = Engine(store=store, queue=queue, blob_dir=tmp_path / "blobs",
                        config=EngineConfig(), clock=clock)
        dag = load_dag_mapping(FANOUT, tools={"echo"}, models=set())
        task = (await engine.submit(dag, {})).task_id
        assert [i.node_id for i in await _drain(queue)] == ["src"]
        claim = await engine.claim(task, "src", worker="w1")
        assert claim.request is not None
        clock.advance(1.0)

        async def complete_src() -> None:
            await engine.complete(task, "src", fence=claim.request.fence,  # type: ignore[union-attr]
                                  outcome=Success("s"))

        queue.after = complete_src  # readies a, b, c between the queue and store reads
        report = await Reconciler(engine, owner="r").run_once()
        assert report.requeued == []
        assert sorted(i.node_id for i in await _drain(queue)) == ["a", "b", "c"]

        # Lost for real (the queue forgot them; a later pass): each is offered again.
        clock.advance(1.0)
        report = await Reconciler(engine, owner="r").run_once()
        assert sorted(n for _, n in report.requeued) == ["a", "b", "c"]
        assert sorted(i.node_id for i in await _drain(queue)) == ["a", "b", "c"]
        await store.close()

    run(main())
