"""Fixtures edited at random, field by field: each edit is either refused by the
fixture check (one :class:`InputError`) or restores and replays to an answer. Never a
traceback from inside restore or replay, never a hang.

The edits are a fixed sample (seeded), not every field times every value: the check
runs on all of them, the replay on a bounded subset of those the check let through.
"""

from __future__ import annotations

import asyncio
import copy
import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from axengine.errors import AxError, InputError
from axengine.fixtures import check_fixture
from axengine.testing import AsyncAxTestEngine
from axengine.testing._replay import replay

FIXTURES = Path(__file__).resolve().parents[1] / "data" / "fixtures"
BASES = {p.stem: json.loads(p.read_text()) for p in sorted(FIXTURES.glob("*.json"))}

#: Values no field of a record expects, or expects only at its edge.
HOSTILE: list[Any] = [
    None, True, -1, 0, 2**31, 2**63, 10**400, 1e308, float("nan"), "", "x" * 300,
    "a\udcff", [], {}, {"a": 1}, [{"target_node_id": "nowhere", "is_taken": True}],
]
#: Edits replayed (of those the check let through), per base fixture.
REPLAYED = 25
#: Longest a replay of an edited fixture may take before it counts as a hang.
REPLAY_TIMEOUT = 10.0


def _places(data: dict[str, Any]) -> Iterator[tuple[str, Any, Any]]:
    """(name, container, key) of every field of every record, and of the DAG's top level
    and of each of its nodes."""
    for key in data["task"]:
        yield f"task.{key}", data["task"], key
    for i, snap in enumerate(data["snapshots"]):
        for key in snap:
            yield f"snapshots[{i}].{key}", snap, key
    for i, event in enumerate(data.get("events", ())):
        for key in event:
            yield f"events[{i}].{key}", event, key
    for key in data["dag"]:
        yield f"dag.{key}", data["dag"], key
    for nid, node in data["dag"]["nodes"].items():
        for key in node:
            yield f"dag.nodes.{nid}.{key}", node, key


def _edits(base: dict[str, Any], rng: random.Random) -> list[tuple[str, dict[str, Any]]]:
    places = list(_places(base))
    chosen = rng.sample(places, min(len(places), 120))
    edits = []
    for name, _, key in chosen:
        for value in rng.sample(HOSTILE, 4):
            data = copy.deepcopy(base)
            # The same place in the copy.
            target = next(c for n, c, k in _places(data) if n == name and k == key)
            target[key] = value
            edits.append((f"{name} = {value!r:.40}", data))
        data = copy.deepcopy(base)
        target = next(c for n, c, k in _places(data) if n == name and k == key)
        del target[key]
        edits.append((f"del {name}", data))
    return edits


@pytest.mark.parametrize("base", sorted(BASES))
def test_an_edited_fixture_is_refused_or_replays(base: str, tmp_path: Path) -> None:
    rng = random.Random(f"ax-fixture-mutations-{base}")
    passed: list[tuple[str, dict[str, Any]]] = []
    refused = 0
    for what, data in _edits(BASES[base], rng):
        try:
            check_fixture(data, "f.json")
        except InputError as exc:
            assert str(exc).startswith("f.json"), (what, str(exc))
            refused += 1
        else:
            passed.append((what, data))
    assert refused > len(passed)  # most hostile values are refused

    async def replay_all(sample: list[tuple[str, dict[str, Any]]]) -> int:
        answered = 0
        for i, (what, data) in enumerate(sample):
            async with AsyncAxTestEngine(tmp_path / str(i)) as engine:
                try:
                    await asyncio.wait_for(replay(engine, data, real=True),
                                           REPLAY_TIMEOUT)
                except AxError:
                    pass  # an answer: a node failed, a stub is missing...
                except TimeoutError:
                    pytest.fail(f"{what}: the replay did not end in {REPLAY_TIMEOUT} s")
                answered += 1
        return answered

    sample = rng.sample(passed, min(len(passed), REPLAYED))
    assert asyncio.run(replay_all(sample)) == len(sample)
