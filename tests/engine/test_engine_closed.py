"""The engine is closed: one owner of keys, record encoding and blobs; fenced effects.

Two contracts (issue 9):

- Only :mod:`axengine.engine` touches the store's key layout (:mod:`axengine.keys`), the
  blob store (:mod:`axengine.blobs`) and the codec's store-record functions
  (``encode_*`` / ``decode_*`` of tasks, snapshots, events and effects). Every other
  module of ``axengine/`` and ``executors/`` asks the engine; the import walk below fails
  on any new back door.
- The side-effect outbox is fenced in the effect's own transaction: an attempt whose
  fence no longer holds the node can neither begin nor finish an effect, even when its
  fence goes stale between the engine's read and its write (the store wrapper below
  takes the node over at exactly that moment).
"""

from __future__ import annotations

import ast
import asyncio
import threading
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from axengine.dag import load_dag_text
from axengine.engine import Engine, EngineConfig
from axengine.queue.inprocess import InProcessQueue
from axengine.store import Compare, Op, Put, StateStore, StoreWrapper, TxnResult
from axengine.store.embedded import SqliteStore
from axengine.worker import Worker
from axengine.worker._context import FencedOut
from executors.contract import NodeContext, NodeRequest, Outcome, Success
from tests.engine.conftest import FakeClock, run

ROOT = Path(__file__).resolve().parents[2]

# ---------------------------------------------------------------------------- imports

#: Modules whose names another module may not import (outside the allow-list).
CLOSED_MODULES = frozenset({"axengine.keys", "axengine.blobs"})
#: The codec's store-record functions (its ``*_message`` wire forms stay open).
RECORD_FUNCTIONS = frozenset(f"{verb}_{kind}" for verb in ("encode", "decode")
                             for kind in ("task", "snapshot", "event", "effect"))

#: Files (relative to the repository) that may use what is closed. Keep it tiny; every
#: entry says why.
ALLOWED: dict[str, str] = {
    # The owner itself: the shell, the reads, the reconciler and the pure rules.
    "axengine/engine/": "the engine owns keys, records and blobs",
    # The codec defines the record functions (and builds encode_* on *_message).
    "axengine/codec.py": "defines the record functions",
    # The key layout module names the prefix; the blob module is the blob store.
    "axengine/keys.py": "is the key layout",
    "axengine/blobs.py": "is the blob store",
}


def _allowed(rel: str) -> bool:
    return any(rel == entry or (entry.endswith("/") and rel.startswith(entry))
               for entry in ALLOWED)


def closed_uses(source: str) -> list[str]:
    """What ``source`` uses of the closed modules: imports of ``axengine.keys`` or
    ``axengine.blobs``, and the codec's record functions however they are reached
    (``from axengine.codec import encode_task``, ``codec.decode_event(...)``, an alias)."""
    tree = ast.parse(source)
    found: list[str] = []
    codec_names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in CLOSED_MODULES or any(
                        alias.name.startswith(m + ".") for m in CLOSED_MODULES):
                    found.append(f"line {node.lineno}: import {alias.name}")
                if alias.name == "axengine.codec":
                    codec_names.add(alias.asname or "axengine.codec")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                if node.module in CLOSED_MODULES or full in CLOSED_MODULES:
                    found.append(f"line {node.lineno}: from {node.module} import {alias.name}")
                if node.module == "axengine.codec" and alias.name in RECORD_FUNCTIONS:
                    found.append(f"line {node.lineno}: from axengine.codec import "
                                 f"{alias.name}")
                if full == "axengine.codec":
                    codec_names.add(alias.asname or alias.name)
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and node.attr in RECORD_FUNCTIONS
                and ast.unparse(node.value) in codec_names):
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def _modules() -> Iterator[tuple[str, Path]]:
    for top in ("axengine", "executors"):
        for path in sorted((ROOT / top).rglob("*.py")):
            yield path.relative_to(ROOT).as_posix(), path


def test_only_the_engine_touches_keys_records_and_blobs() -> None:
    offenders = {rel: uses for rel, path in _modules() if not _allowed(rel)
                 if (uses := closed_uses(path.read_text()))}
    assert offenders == {}, (
        "these modules reach past the engine; add an Engine method instead: "
        f"{offenders}")


@pytest.mark.parametrize("source", [
    "from axengine.keys import StoreKeys",
    "import axengine.blobs",
    "from axengine import blobs",
    "from axengine.blobs import DirBlobStore as D",
    "from axengine.codec import decode_snapshot",
    "from axengine import codec\ncodec.encode_task(t)",
    "import axengine.codec as c\nc.decode_effect(b)",
    "import axengine.codec\naxengine.codec.encode_event(e)",
])
def test_the_walk_sees_every_way_in(source: str) -> None:
    assert closed_uses(source), source


def test_the_walk_leaves_the_open_parts_alone() -> None:
    source = ("from axengine import codec\n"
              "codec.canonical_json(x)\ncodec.task_message(t)\ncodec.effect_from_message(m)\n"
              "from axengine.engine import check_digest\n")
    assert closed_uses(source) == []


def test_the_engine_exposes_no_store_keys_or_blobs(
        make_engine: Callable[..., Engine]) -> None:
    engine = make_engine()
    for name in ("store", "keys", "blobs"):
        assert not hasattr(engine, name), name


# ---------------------------------------------------------------------------- effects

ONE = load_dag_text("""
name: outbox
nodes:
  send: {type: tool_call, tool: echo, input: x, timeout: 60}
""")


class RacingStore(StoreWrapper):
    """A :class:`StateStore` that runs ``before_effect_write`` (once) just before the
    first transaction writing an outbox record: the moment between the engine's read of
    the node and its write of the record."""

    def __init__(self, inner: StateStore) -> None:
        super().__init__(inner)
        self.before_effect_write: Callable[[], Awaitable[None]] | None = None
        self.raced = 0
        self.effect_txns: list[bool] = []

    async def txn(self, compares: Sequence[Compare], success: Sequence[Op],
                  failure: Sequence[Op] = ()) -> TxnResult:
        effect = any(isinstance(op, Put) and "/effects/" in op.key for op in success)
        if effect and self.before_effect_write is not None:
            hook, self.before_effect_write = self.before_effect_write, None
            await hook()
            self.raced += 1
        result = await self.inner.txn(compares, success, failure)
        if effect:
            self.effect_txns.append(result.succeeded)
        return result


@pytest.fixture
def racing(tmp_path: Path, clock: FakeClock) -> Iterator[tuple[Engine, RacingStore]]:
    store = RacingStore(SqliteStore(path=tmp_path / "ax.db"))
    engine = Engine(store=store, queue=InProcessQueue(), blob_dir=tmp_path / "blobs",
                    config=EngineConfig(lease_seconds=30), clock=clock)
    yield engine, store
    asyncio.run(store.close())


async def _claimed(engine: Engine, worker: str = "w1") -> tuple[str, int]:
    task = (await engine.submit(ONE, {})).task_id
    claim = await engine.claim(task, "send", worker=worker)
    assert claim.result == "claimed" and claim.request is not None
    return task, claim.request.fence


def test_a_stale_fence_can_neither_begin_nor_finish_an_effect(
        racing: tuple[Engine, RacingStore], clock: FakeClock) -> None:
    engine, _ = racing

    async def main() -> None:
        task, fence = await _claimed(engine)
        ids = {"task_id": task, "node_id": "send"}
        assert await engine.task_effects(task) == {}
        # A fence the node never had, and a node that does not exist: nothing begins.
        assert await engine.effect_begin("k", fence=fence + 1, **ids) == "stale"
        assert await engine.effect_begin("k", task_id=task, node_id="nope",
                                         fence=fence) == "stale"
        assert await engine.effect_get("k") is None
        assert await engine.effect_begin("k", fence=fence, **ids) == "NEW"
        assert await engine.effect_done("k", {"id": 1}, fence=fence + 1, **ids) == "stale"
        assert (await engine.effect_get("k")).state == "SENDING"
        # The lease runs out: the same fence no longer holds, even before a takeover.
        clock.advance(31)
        assert await engine.effect_done("k", {"id": 1}, fence=fence, **ids) == "stale"
        assert await engine.effect_begin("k2", fence=fence, **ids) == "stale"
        assert (await engine.effect_get("k")).state == "SENDING"
        assert await engine.effect_get("k2") is None
        # Another worker takes over: it settles the record; the old fence stays out.
        taken = await engine.claim(task, "send", worker="w2")
        assert taken.request is not None and taken.request.fence == fence + 1
        new = taken.request.fence
        assert await engine.effect_begin("k", fence=new, **ids) == "SENDING"
        assert (await engine.effect_get("k")).state == "UNKNOWN"
        assert await engine.effect_done("k", {"id": 2}, fence=fence, **ids) == "stale"
        assert await engine.effect_done("k", {"id": 2}, fence=new, **ids) == "ok"
        record = await engine.effect_get("k")
        assert (record.state, record.result) == ("DONE", {"id": 2})
        assert [e.key for e in (await engine.task_effects(task))["send"]] == ["k"]
        assert await engine.effect_begin("k", fence=new, **ids) == "DONE"
        assert await engine.effect_begin("k", fence=fence, **ids) == "stale"

    run(main())


def test_begin_refused_when_the_fence_goes_stale_between_read_and_write(
        racing: tuple[Engine, RacingStore], clock: FakeClock) -> None:
    engine, store = racing

    async def main() -> None:
        task, fence = await _claimed(engine)

        async def takeover() -> None:
            clock.advance(31)
            taken = await engine.claim(task, "send", worker="w2")
            assert taken.result == "claimed"

        store.before_effect_write = takeover
        answer = await engine.effect_begin("k", task_id=task, node_id="send", fence=fence)
        # The engine read a live fence and decided to write; the takeover landed before
        # its transaction, whose compare on the snapshot refused the write. Decided
        # again, the call is stale and the record was never begun.
        assert store.raced == 1 and store.effect_txns == [False]
        assert answer == "stale"
        assert await engine.effect_get("k") is None

    run(main())


def test_done_refused_when_the_fence_goes_stale_between_read_and_write(
        racing: tuple[Engine, RacingStore], clock: FakeClock) -> None:
    engine, store = racing

    async def main() -> None:
        task, fence = await _claimed(engine)
        ids = {"task_id": task, "node_id": "send", "fence": fence}
        assert await engine.effect_begin("k", **ids) == "NEW"

        async def cancel() -> None:
            await engine.cancel(task, by="test")

        store.before_effect_write = cancel
        assert await engine.effect_done("k", {"id": 1}, **ids) == "stale"
        assert store.raced == 1 and store.effect_txns == [True, False]
        assert (await engine.effect_get("k")).state == "SENDING"

    run(main())


def test_a_handler_fenced_out_mid_run_is_stopped_before_sending(
        racing: tuple[Engine, RacingStore], clock: FakeClock) -> None:
    """Embedded mode end to end: the run's fence goes stale while the handler runs; its
    ``effect.begin()`` raises, nothing is sent, and the worker discards the run."""
    engine, _ = racing
    seen: dict[str, Any] = {}
    # The worker stops waiting for a fenced-out handler at once (it abandons the
    # thread); the test waits for the thread itself before looking at what it saw.
    handler_done = threading.Event()

    async def main() -> str:
        task = (await engine.submit(ONE, {})).task_id
        loop = asyncio.get_running_loop()

        def handler(request: NodeRequest, ctx: NodeContext) -> Outcome:
            clock.advance(31)  # the lease runs out; another worker takes the node
            asyncio.run_coroutine_threadsafe(
                engine.claim(request.task_id, request.node_id, worker="w2"), loop
            ).result(10)
            effect = ctx.effect("mail")
            try:
                effect.begin()
            except FencedOut as exc:
                seen["refused"] = str(exc)
                seen["cancelled"] = ctx.cancelled
                raise
            else:
                seen["sent"] = True
                return Success("sent")
            finally:
                handler_done.set()

        worker = Worker(engine=engine, queue=engine.queue, handler=handler,
                        worker_id="w1", lease_seconds=30)
        item = await engine.queue.pop("w1", timeout=1)
        assert item is not None
        try:
            return await worker.process(item)
        finally:
            seen["record"] = await engine.effect_get("mail")
            seen["snapshot"] = await engine.snapshot(task, "send")

    assert run(main()) == "stale"
    assert handler_done.wait(10)
    assert "sent" not in seen and "stale" in seen["refused"] and seen["cancelled"]
    assert seen["record"] is None
    assert seen["snapshot"].owner == "w2"  # the late run committed nothing
