"""Property tests of the loader: random DAGs, shuffled documents, injected cycles."""

from __future__ import annotations

import itertools
import random
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from axengine.dag import load_dag_text
from axengine.errors import DagError
from tests.dag import MODELS, TOOLS

SETTINGS = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
TOOL_NAMES = sorted(TOOLS)
MODEL_NAMES = sorted(MODELS)


@st.composite
def acyclic_dags(draw: st.DrawFn) -> dict[str, Any]:
    """A document whose edges only go from a lower to a higher node index."""
    count = draw(st.integers(min_value=1, max_value=30))
    nodes: dict[str, Any] = {}
    for i in range(count):
        later = [f"n{j}" for j in range(i + 1, count)]
        targets = draw(st.lists(st.sampled_from(later), unique=True, max_size=3)) \
            if later else []
        if draw(st.booleans()):
            node: dict[str, Any] = {"type": "tool_call",
                                    "tool": draw(st.sampled_from(TOOL_NAMES))}
        else:
            node = {"type": "llm_call", "model": draw(st.sampled_from(MODEL_NAMES)),
                    "prompt": "Summarise {{ .input.text }}",
                    "temperature": draw(st.sampled_from([0, 0.5, 1]))}
        if draw(st.booleans()):
            node["timeout"] = draw(st.integers(min_value=1, max_value=3600))
        if targets:
            node["next"] = targets if len(targets) > 1 or draw(st.booleans()) else targets[0]
        nodes[f"n{i}"] = node
    return {"name": "random", "nodes": nodes}


def shuffled(doc: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    """The same document with node order and each node's field order shuffled."""
    items = list(doc["nodes"].items())
    rng.shuffle(items)
    nodes = {}
    for nid, node in items:
        fields = list(node.items())
        rng.shuffle(fields)
        nodes[nid] = dict(fields)
    top: list[tuple[str, Any]] = [("name", doc["name"]), ("nodes", nodes)]
    rng.shuffle(top)
    return dict(top)


def dump(doc: dict[str, Any]) -> str:
    return yaml.safe_dump(doc, sort_keys=False)


def load(text: str) -> Any:
    return load_dag_text(text, tools=TOOLS, models=MODELS)


@SETTINGS
@given(doc=acyclic_dags(), seed=st.integers(min_value=0, max_value=2**32 - 1))
def test_random_acyclic_dags_validate_and_hash_ignores_order(
    doc: dict[str, Any], seed: int
) -> None:
    dag = load(dump(doc))
    again = load(dump(shuffled(doc, random.Random(seed))))

    assert list(dag.nodes) == list(doc["nodes"])
    assert dag.hash == again.hash
    assert dag.canonical_json() == again.canonical_json()
    assert "n0" in dag.entry_nodes


def _edges(doc: dict[str, Any]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for nid, node in doc["nodes"].items():
        value = node.get("next", [])
        out[nid] = [value] if isinstance(value, str) else list(value)
    return out


@st.composite
def dags_with_a_back_edge(draw: st.DrawFn) -> tuple[dict[str, Any], str, str]:
    """An acyclic document plus one edge from a node back to one of its ancestors."""
    doc = draw(acyclic_dags())
    edges = _edges(doc)
    pairs = []
    for start in edges:  # every (ancestor, descendant) pair, self included
        seen, stack = {start}, [start]
        while stack:
            for nxt in edges[stack.pop()]:
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append(nxt)
        pairs += [(start, end) for end in sorted(seen)]
    ancestor, descendant = draw(st.sampled_from(pairs))
    node = doc["nodes"][descendant]
    node["next"] = [*edges[descendant], ancestor]
    return doc, descendant, ancestor


@SETTINGS
@given(case=dags_with_a_back_edge())
def test_a_back_edge_is_always_reported_as_a_real_cycle(
    case: tuple[dict[str, Any], str, str]
) -> None:
    doc, source, target = case

    with pytest.raises(DagError) as info:
        load(dump(doc))

    paths = [p.message.removeprefix("cycle: ").split(" -> ")
             for p in info.value.problems if p.code == "cycle"]
    edges = _edges(doc)
    assert paths
    for path in paths:
        steps = list(itertools.pairwise(path))
        assert path[0] == path[-1]
        assert all(b in edges[a] for a, b in steps)
        # Every cycle of a DAG plus one edge runs through that edge.
        assert (source, target) in steps


@SETTINGS
@given(length=st.integers(min_value=1, max_value=30), data=st.data())
def test_a_chain_closed_by_one_back_edge_names_exactly_its_cycle(
    length: int, data: st.DataObject
) -> None:
    start = data.draw(st.integers(min_value=0, max_value=length - 1))
    end = data.draw(st.integers(min_value=start, max_value=length - 1))
    nodes: dict[str, Any] = {}
    for i in range(length):
        nodes[f"n{i}"] = {"type": "tool_call", "tool": "echo"}
        if i + 1 < length:
            nodes[f"n{i}"]["next"] = f"n{i + 1}"
    nodes[f"n{end}"]["next"] = [*([f"n{end + 1}"] if end + 1 < length else []), f"n{start}"]

    with pytest.raises(DagError) as info:
        load(dump({"name": "loop", "nodes": nodes}))

    expected = " -> ".join([*(f"n{i}" for i in range(start, end + 1)), f"n{start}"])
    assert [p.message for p in info.value.problems if p.code == "cycle"] == [
        f"cycle: {expected}"
    ]
