"""The test engine watches a task's live nodes, not its finished ones: between two
commits it decodes the snapshots that can keep the task busy or fall due (RUNNING,
WAITING, PAUSED), so a chain whose nodes return large outputs runs in time linear in
its length (decoding every finished output at every commit made it quadratic: a chain
of 60 nodes of 60 KB each took 155 ms per node, now 29)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from axengine import codec
from axengine.testing import AxTestEngine

LENGTH = 30


def chain(length: int) -> str:
    lines = ["name: long_chain", "nodes:"]
    for i in range(length):
        lines += [f"  n{i}:", "    type: tool_call", "    tool: echo"]
        if i < length - 1:
            lines += [f"    next: [n{i + 1}]"]
    return "\n".join(lines) + "\n"


def test_finished_outputs_are_not_decoded_at_every_commit(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = {"mark": "the first node's output"}
    decoded: list[str] = []
    original = codec._json_or_none

    def counting(text: str) -> Any:
        value = original(text)
        if value == first:
            decoded.append(text)
        return value

    monkeypatch.setattr(codec, "_json_or_none", counting)
    dag = tmp_path / "chain.yaml"
    dag.write_text(chain(LENGTH))
    with AxTestEngine(tmp_path / "home") as engine:
        run = engine.run(dag, {}, stubs={f"n{i}": first if i == 0 else {"i": i}
                                         for i in range(LENGTH)})
    assert run.result.status == "SUCCEEDED"
    assert run.snapshots["n0"].output == first
    # Decoded for the run's result, and perhaps to render n1's input (the engine's cache
    # holds it): not at each of the 30 commits that followed, as it was (31 times).
    assert len(decoded) <= 2, len(decoded)
