"""An error that escapes while a node is readied is a bug of ax, never of the DAG (those
are caught where they arise). It fails the node being readied, with what its readying
wrote undone — not the completion that readied it, which would otherwise fail on every
retry until its own node was DEAD."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

import axengine as ax
from axengine.engine import _expand, _rules

CHAIN = {"name": "net", "nodes": {
    "a": {"type": "tool_call", "tool": "echo", "input": {"x": 1}, "next": "b"},
    "b": {"type": "tool_call", "tool": "echo", "input": {"x": "{{ .nodes.a.output.x }}"},
          "next": "c"},
    "c": {"type": "tool_call", "tool": "echo", "input": {"x": 3}},
}}

MAP = {"name": "net_map", "nodes": {
    "a": {"type": "tool_call", "tool": "echo", "input": {"xs": [1, 2, 3]}, "next": "m"},
    "m": {"type": "tool_call", "tool": "echo", "map": "{{ .nodes.a.output.xs }}",
          "input": {"x": "{{ .item }}"}, "next": "c"},
    "c": {"type": "tool_call", "tool": "echo", "input": {"x": 3}},
}}


def test_a_bug_readying_a_node_fails_that_node_not_its_predecessor(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    render = _rules._Builder.render_params

    def broken(self: Any, node: Any, item: Any = None) -> Any:
        if node.id == "b":
            raise RuntimeError("boom")
        return render(self, node, item)

    monkeypatch.setattr(_rules._Builder, "render_params", broken)
    with caplog.at_level(logging.ERROR, logger="axengine.engine._rules"):
        result = ax.run(CHAIN, {}, home=tmp_path)
    assert result.status == "FAILED"
    assert result.states == {"a": "SUCCEEDED", "b": "FAILED", "c": "SKIPPED"}
    assert result.errors["b"] == ("ax could not ready this node (RuntimeError: boom): a bug "
                                  "of ax, please report it")
    assert list(result.path) == ["a"]
    assert any("readying node b failed" in r.message and r.exc_info for r in caplog.records)


def test_what_a_failed_readying_wrote_is_undone(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    ready_map = _expand.ready_map

    def half_then_broken(b: Any, node: Any, snap: Any) -> Any:
        ready_map(b, node, snap)  # writes the map node and its items, queues them
        assert any("[" in n for n in b.plan.writes)  # (it did write items)
        raise RuntimeError("after the items")

    monkeypatch.setattr(_expand, "ready_map", half_then_broken)
    result = ax.run(MAP, {}, home=tmp_path)
    assert result.status == "FAILED"
    assert result.states == {"a": "SUCCEEDED", "m": "FAILED", "c": "SKIPPED"}  # no items
    assert "RuntimeError: after the items" in result.errors["m"]
