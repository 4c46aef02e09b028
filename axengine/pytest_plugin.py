"""The pytest plugin of ax: fixtures for testing DAGs (docs/testing.md).

Installed with the package and found through the ``pytest11`` entry point, so it is
loaded into every pytest session of the environment: it defines fixtures only — no
hook, no option, no import of the engine until a test asks for a fixture.

- ``ax_engine``: a fresh :class:`~axengine.testing.AxTestEngine` per test — its own
  store under the test's ``tmp_path``, a test clock, stubs and gate decisions per run.
- ``ax_replay``: ``ax_replay(fixture, dag=...)`` replays a recorded snapshot fixture in
  a fresh engine and fails the test with a per-node diff unless it replays.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from axengine.testing import AxTestEngine, Replay


@pytest.fixture
def ax_engine(tmp_path: Path) -> Iterator[AxTestEngine]:
    """A fresh embedded ax engine on a test clock (see :class:`axengine.testing.AxTestEngine`).

    ``ax_engine.run(dag, input, stubs=..., decide=..., real=...)`` runs a DAG until it
    ends or waits; ``ax_engine.advance(seconds)`` lets test time pass.
    """
    from axengine.testing import AxTestEngine

    engine = AxTestEngine(tmp_path / "ax-engine")
    try:
        yield engine
    finally:
        engine.close()


@pytest.fixture
def ax_replay(tmp_path: Path) -> Callable[..., Replay]:
    """``ax_replay(fixture, dag=None, stubs=..., real=..., decide=...)``: replay a
    recorded fixture in a fresh engine and assert nothing committed ran again and every
    recorded decision holds on ``dag`` (:func:`axengine.testing.assert_replays`)."""
    from axengine.testing import assert_replays

    count = itertools.count()

    def replay(fixture: Any, **options: Any) -> Replay:
        __tracebackhide__ = True
        return assert_replays(fixture, home=tmp_path / f"ax-replay-{next(count)}", **options)

    return replay
