"""``runner:`` and ``resources:``: what a node asks of the machine that runs it.

Quantities follow Kubernetes' grammar; both fields exist only on the node types that
run on an executor, are part of the DAG hash only when set, and reach the claim's
``NodeRequest.config`` like every other static field.
"""

from __future__ import annotations

import asyncio
import json
from decimal import Decimal
from pathlib import Path

import pytest

from axengine.dag import Dag, load_dag, load_dag_text, parse_quantity
from axengine.engine import Engine
from axengine.errors import DagError, DagProblem
from axengine.queue.inprocess import InProcessQueue
from axengine.store.embedded import SqliteStore

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = sorted((ROOT / "tests" / "data" / "fixtures").glob("*.json"))

RESOURCED = """
name: resourced
nodes:
  fetch:
    type: tool_call
    tool: echo
    input: "{{ .input.x }}"
    runner: kubernetes
    resources:
      requests: {cpu: 500m, memory: 256Mi}
      limits:
        cpu: 1
        memory: 1Gi
    next: ask
  ask:
    type: llm_call
    model: gpt-4o-mini
    prompt: "Say {{ .nodes.fetch.output }}"
    runner: subprocess
    resources:
      limits: {memory: 0.5Gi}
"""


def problems(text: str) -> list[DagProblem]:
    with pytest.raises(DagError) as info:
        load_dag_text(text)
    return info.value.problems


@pytest.mark.parametrize(("text", "value"), [
    ("1", Decimal(1)), ("0", Decimal(0)), ("500m", Decimal("0.5")), ("0.5", Decimal("0.5")),
    ("1.", Decimal(1)), (".5", Decimal("0.5")), ("+2", Decimal(2)),
    ("256Mi", Decimal(256 * 2**20)), ("1Gi", Decimal(2**30)), ("1Ki", Decimal(1024)),
    ("500M", Decimal(500_000_000)), ("2k", Decimal(2000)), ("1E", Decimal(10**18)),
    ("1e3", Decimal(1000)), ("1E3", Decimal(1000)), ("5e-3", Decimal("0.005")),
])
def test_kubernetes_quantities_are_read_as_kubernetes_reads_them(
        text: str, value: Decimal) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize("text", [
    "-1", "-500m", "1.5.3", "", " 1", "1 ", "1Gb", "1gi", "1K", "1mi", "m", "Gi", "e3",
    "1e", "1e3.5", "0x10", "1,5", "one", "1e1000",
])
def test_anything_else_is_not_a_quantity(text: str) -> None:
    with pytest.raises(ValueError, match=repr(text)):
        parse_quantity(text)


def test_fields_are_kept_as_quantity_strings_and_hashed_when_set() -> None:
    dag = load_dag_text(RESOURCED)
    fetch, ask = dag.nodes["fetch"], dag.nodes["ask"]

    assert fetch.runner == "kubernetes"
    assert fetch.resources == {"requests": {"cpu": "500m", "memory": "256Mi"},
                               "limits": {"cpu": "1", "memory": "1Gi"}}
    assert ask.runner == "subprocess"
    assert ask.resources == {"limits": {"memory": "0.5Gi"}}
    assert fetch.canonical()["resources"] == fetch.resources
    assert Dag.from_canonical(json.loads(dag.canonical_json())).hash == dag.hash
    changed = load_dag_text(RESOURCED.replace("cpu: 500m", "cpu: 250m"))
    assert changed.hash != dag.hash


def test_a_yaml_number_means_the_same_as_its_text() -> None:
    quoted = load_dag_text(RESOURCED.replace("cpu: 1\n", "cpu: '1'\n"))
    as_float = load_dag_text(RESOURCED.replace("cpu: 1\n", "cpu: 1.0\n"))

    assert quoted.hash == load_dag_text(RESOURCED).hash == as_float.hash


def test_dags_without_the_fields_keep_their_hash() -> None:
    for node in load_dag(ROOT / "dags" / "financial_risk_assessment.yaml").nodes.values():
        assert "runner" not in node.canonical() and "resources" not in node.canonical()
    for path in FIXTURES:
        recorded = json.loads(path.read_text())
        dag = Dag.from_canonical(recorded["dag"])
        assert dag.hash == recorded["dag_hash"], path.name
    # The YAML those fixtures were recorded from (the example before its gate passed
    # the approved email on) still loads to the recorded hash.
    financial = next(p for p in FIXTURES if p.name == "financial_success.json")
    assert load_dag(ROOT / "tests" / "data" / "financial_risk_assessment_v1.yaml").hash == \
        json.loads(financial.read_text())["dag_hash"]


def test_an_empty_resources_mapping_is_no_resources() -> None:
    dag = load_dag_text("name: e\nnodes:\n  a: {type: tool_call, tool: echo, resources: {}}\n")

    assert dag.nodes["a"].resources is None
    assert "resources" not in dag.nodes["a"].canonical()


@pytest.mark.parametrize("node_type, body", [
    ("condition", "expression: \"{{ 'a' }}\""),
    ("human_gateway", "timeout: 60"),
])
@pytest.mark.parametrize("field_text", ["runner: kubernetes", "resources: {requests: {cpu: 1}}"])
def test_nodes_the_api_decides_take_neither_field(
        node_type: str, body: str, field_text: str) -> None:
    (problem,) = problems(f"name: x\nnodes:\n  n:\n    type: {node_type}\n    {body}\n"
                          f"    {field_text}\n")

    assert problem.code == "unknown-field"
    assert problem.line == 6
    assert f"{node_type} nodes do not run on an executor" in problem.message
    assert "tool_call and llm_call" in (problem.hint or "")


def test_every_resource_problem_is_reported_with_its_line() -> None:
    found = problems("""name: x
nodes:
  a:
    type: tool_call
    tool: echo
    runner: threads
    resources:
      requests:
        cpu: "-1"
        memory: 1.5.3
        gpu: 1
      limits:
        cpu: true
        memory: 128Mi
      lmits: {}
""")

    assert [(p.line, p.code, p.field) for p in found] == [
        (6, "bad-value", "runner"),
        (9, "bad-value", "resources.requests.cpu"),
        (10, "bad-value", "resources.requests.memory"),
        (11, "unknown-field", "resources.requests.gpu"),
        (13, "bad-value", "resources.limits.cpu"),
        (15, "unknown-field", "resources.lmits"),
    ]
    assert found[0].hint == "did you mean 'thread'?"
    assert found[5].hint == "did you mean 'limits'?"


def test_a_request_above_its_limit_is_refused() -> None:
    (problem,) = problems("name: x\nnodes:\n  a:\n    type: tool_call\n    tool: echo\n"
                          "    resources:\n      requests: {cpu: 1500m}\n"
                          "      limits: {cpu: 1}\n")

    assert (problem.code, problem.line) == ("bad-value", 7)
    assert "resources.requests.cpu 1500m is more than resources.limits.cpu 1" in \
        problem.message


def test_inline_mappings_are_checked_the_same_way() -> None:
    from axengine.dag import load_dag_mapping

    with pytest.raises(DagError) as info:
        load_dag_mapping({"name": "x", "nodes": {"a": {
            "type": "tool_call", "tool": "echo", "resources": {"requests": {"memory": "1GB"}},
        }}})

    (problem,) = info.value.problems
    assert (problem.field, problem.line) == ("resources.requests.memory", 0)


def test_both_fields_reach_the_claims_node_request(tmp_path: Path) -> None:
    dag = load_dag_text(RESOURCED)

    async def claim() -> dict[str, object]:
        store = SqliteStore(path=tmp_path / "ax.db")
        try:
            engine = Engine(store=store, queue=InProcessQueue(), blob_dir=tmp_path / "blobs")
            task = (await engine.submit(dag, {"x": 1})).task_id
            result = await engine.claim(task, "fetch", worker="w1")
            assert result.request is not None
            return dict(result.request.config)
        finally:
            await store.close()

    config = asyncio.run(claim())

    assert config["runner"] == "kubernetes"
    assert config["resources"] == {"requests": {"cpu": "500m", "memory": "256Mi"},
                                   "limits": {"cpu": "1", "memory": "1Gi"}}
