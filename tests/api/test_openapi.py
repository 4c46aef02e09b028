"""The OpenAPI document describes every answer, matches the wire JSON, and matches the
route table of ``docs/api.md``. No server: the application object is enough."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from axengine import wire
from axengine.api import _models as models
from axengine.api._rest import create_app
from axengine.dag import load_dag_text
from axengine.errors import Conflict, DagError, DagProblem
from axengine.metrics import AxMetrics
from axengine.records import Event, NextHop, NodeState, Snapshot, TaskRecord

DOCS = Path(__file__).resolve().parents[2] / "docs" / "api.md"
_METHODS = {"get", "post", "put", "patch", "delete"}
#: A row of the route table: | `METHOD` | `/path` | role | answer |
_ROW = re.compile(r"^\| `([A-Z]+)` \| `(/[^`]*)` \|")


@pytest.fixture(scope="module")
def spec() -> dict[str, Any]:
    app = create_app(engine=None, auth=None, metrics=AxMetrics())  # type: ignore[arg-type]
    return app.openapi()


def _operations(spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f"{method.upper()} {path}": op for path, item in spec["paths"].items()
            for method, op in item.items() if method in _METHODS}


def test_every_success_answer_has_a_schema(spec: dict[str, Any]) -> None:
    missing = []
    for route, op in _operations(spec).items():
        ok = {code: answer for code, answer in op["responses"].items() if code.startswith("2")}
        schemas = [media.get("schema") for answer in ok.values()
                   for media in answer.get("content", {}).values()]
        if not schemas or not all(schemas):
            missing.append(route)
    assert missing == [], f"routes without a 2xx schema: {missing}"


def test_errors_are_described_by_the_error_body(spec: dict[str, Any]) -> None:
    assert "ErrorBody" in spec["components"]["schemas"]
    for route, op in _operations(spec).items():
        assert "422" not in op["responses"], f"{route}: 422 is never sent (it is a 400)"
        if " /v1/" not in route:
            continue
        for code in ("4XX", "5XX"):
            content = op["responses"][code]["content"]
            assert content == {"application/json": {"schema": {
                "$ref": "#/components/schemas/ErrorBody"}}}, route


def test_streams_declare_their_media_types(spec: dict[str, Any]) -> None:
    ops = _operations(spec)
    watch = ops["GET /v1/tasks/{task_id}/watch"]["responses"]["200"]
    assert list(watch["content"]) == ["text/event-stream"]
    assert "event: end" in watch["description"]
    metrics = ops["GET /metrics"]["responses"]["200"]
    assert [m.split(";")[0] for m in metrics["content"]] == ["text/plain"]


def test_docs_route_table_lists_exactly_the_routes(spec: dict[str, Any]) -> None:
    documented = {f"{m.group(1)} {m.group(2)}" for line in DOCS.read_text().splitlines()
                  if (m := _ROW.match(line))}
    served = set(_operations(spec))
    assert not served - documented, f"not in docs/api.md: {sorted(served - documented)}"
    assert not documented - served, f"in docs/api.md only: {sorted(documented - served)}"


# ---------------------------------------------------------------------------- wire JSON


def _same_fields(model: type[BaseModel], body: dict[str, Any]) -> None:
    assert set(model.model_fields) == set(body), model.__name__
    model.model_validate(body)


def test_reply_models_match_the_wire_json() -> None:
    dag = load_dag_text("name: w\nnodes:\n  a: {type: tool_call, tool: echo}\n")
    task = wire.task_json(TaskRecord("t-1", dag.hash, "w", input={"x": [1]},
                                     counts={"SUCCEEDED": 1}))
    node = wire.node_json(Snapshot("t-1", "a", NodeState.PAUSED, output=None,
                                   next_hops=(NextHop("b", False),),
                                   decision={"decision": "approve", "by": "alice"}),
                          "human_gateway")
    event = wire.event_json(Event("t-1", "e-1", "claimed", 1.5, seq=3, node_id="a"))
    problem = wire.problem_json(DagProblem("bad", node="a", field="type"))
    _same_fields(models.TaskJson, task)
    _same_fields(models.NodeJson, node)
    _same_fields(models.TaskWithNodes, task | {"nodes": {"a": node}})
    _same_fields(models.EventJson, event)
    _same_fields(models.ProblemJson, problem)
    _same_fields(models.DagReply, wire.dag_json(dag))
    models.ErrorBody.model_validate(wire.error_body(Conflict("taken")))
    models.ErrorBody.model_validate(wire.error_body(DagError([DagProblem("bad")])))
    models.ErrorBody.model_validate(wire.error_body(RuntimeError("bug")))


def test_listing_models_match_their_writers() -> None:
    from axengine.api import _ops as ops
    from axengine.engine._reads import Approval, DagInfo

    info = ops.dag_info_json(DagInfo("ab12cd34", "w", 3, 7))
    _same_fields(models.DagInfoJson, info)
    models.DagPage.model_validate({"dags": [info], "next_page_token": None})
    approval = ops.approval_json(Approval(TaskRecord("t-1", "ab12cd34", "w", submitted_by="u"),
                                          "review", "check it", {"x": 1}, 10.0, 20.0))
    _same_fields(models.ApprovalJson, approval)
    models.ApprovalPage.model_validate({"approvals": [approval], "next_page_token": "t"})
