"""Engine fixtures: an engine on the embedded store with a controllable clock."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from axengine.engine import Engine, EngineConfig
from axengine.queue.inprocess import InProcessQueue
from axengine.store.embedded import SqliteStore

T = TypeVar("T")


class FakeClock:
    """A clock tests move by hand (seconds)."""

    def __init__(self, start: float = 1_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def make_engine(tmp_path: Path, clock: FakeClock) -> Iterator[Callable[..., Engine]]:
    """Factory: an Engine on a fresh SQLite file, in-process queue, blob dir in tmp."""
    made: list[SqliteStore] = []

    def factory(**config: Any) -> Engine:
        store = SqliteStore(path=tmp_path / f"ax{len(made)}.db")
        made.append(store)
        return Engine(store=store, queue=InProcessQueue(), blob_dir=tmp_path / "blobs",
                      config=EngineConfig(**config), clock=clock)

    yield factory
    for store in made:
        asyncio.run(store.close())


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)
