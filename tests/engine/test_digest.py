"""A value the engine hashes and stores — a node's output, a rendered input — is written
to JSON once: :meth:`_Builder.digest` keeps the text it hashed in the plan, and the
snapshot's write reuses it. The hash is the one :func:`sha256_json` gives."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from axengine import limits
from axengine.engine import _rules, _shell
from axengine.engine._rules import Plan, _Builder, sha256_json
from axengine.limits import canonical_json
from axengine.testing import AsyncAxTestEngine

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(value=JSON, task=st.text(min_size=1), node=st.text(min_size=1))
def test_a_digest_is_the_hash_of_the_canonical_json(value: Any, task: str, node: str) -> None:
    builder = SimpleNamespace(plan=Plan("committed"))
    try:
        expected = sha256_json(value)
    except Exception as exc:  # (a lone surrogate in a text: both refuse it alike)
        expected = repr(exc)
    try:
        got = _Builder.digest(builder, value)  # type: ignore[arg-type]
    except Exception as exc:
        got = repr(exc)
    assert got == expected
    try:
        scoped = sha256_json([task, node, value])
    except Exception as exc:
        scoped = repr(exc)
    try:
        got = _Builder.digest(builder, value, scope=(task, node))  # type: ignore[arg-type]
    except Exception as exc:
        got = repr(exc)
    assert got == scoped
    if id(value) in builder.plan.encoded:
        kept, text = builder.plan.encoded[id(value)]
        assert kept is value and text == canonical_json(value)


DAG = """
name: digest
nodes:
  make:
    type: tool_call
    tool: echo
    next: [{target: use}]
  use:
    type: tool_call
    tool: echo
    input: "{{ .nodes.make.output }}"
"""


def test_an_output_and_its_rendered_input_are_hashed_and_stored_from_one_encoding(
        tmp_path: Path, monkeypatch: Any) -> None:
    output = {"items": [{"id": i, "name": f"item {i}", "tags": ["a", "é"]}
                        for i in range(200)]}
    encoded: list[Any] = []
    original = canonical_json

    def counting(value: Any, field: str = "value") -> str:
        encoded.append(value)
        return original(value, field)

    for module in (limits, _rules, _shell):
        monkeypatch.setattr(module, "canonical_json", counting)
    dag_file = tmp_path / "digest.yaml"
    dag_file.write_text(DAG)

    async def main() -> Any:
        async with AsyncAxTestEngine(tmp_path / "home") as engine:
            return await engine.run(dag_file, {}, stubs={"make": output, "use": {"ok": 1}})

    run = asyncio.run(main())
    params = {"input": output}
    times = (sum(1 for v in encoded if v == output), sum(1 for v in encoded if v == params))
    assert run.result.status == "SUCCEEDED"
    make, use = run.snapshots["make"], run.snapshots["use"]
    assert make.output == output
    assert make.output_sha256 == sha256_json(output)
    assert use.input == params
    assert use.input_revision == sha256_json([run.task_id, "use", params])
    # The output: checked by the runner, then hashed and stored from one encoding (the
    # hash and the write encoded it apart: three in all). The input: hashed and stored
    # from one encoding when the node is readied (the hash encoded it inside a list of
    # its own), encoded again when the node's completion rewrites its snapshot.
    assert times == (2, 2)
