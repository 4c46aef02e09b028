"""gRPC SubmitTask requests edited at random: the DAG's YAML text and the input's JSON
text edited character by character, labels, priority and deadline set to edge values.
Each request is accepted or refused with a status that names the caller's mistake —
never UNKNOWN or INTERNAL — and the server answers the next request. A seeded sample."""

from __future__ import annotations

import json
import random
from typing import Any

import grpc

from proto.ax.v1 import ax_pb2 as pb
from tests.api.conftest import GATE_YAML, ServerFactory
from tests.api.test_grpc import TOKEN, Stubs

EDITS = 150
INPUT = json.dumps({"text": "g", "items": [1, 2.5, {"deep": [True, None]}]})
#: Characters an edit inserts: YAML and JSON syntax, template markup, odd code points.
ALPHABET = [*":{}[]-,#&*!|>'\"\\ \n\t%@`?", "{{", "}}", "{%", "\ud800", "\u2028", "\x00",
            "é", "9" * 400]
#: The refusals a caller's mistake may get.
REFUSED = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.PERMISSION_DENIED,
           grpc.StatusCode.ALREADY_EXISTS, grpc.StatusCode.FAILED_PRECONDITION,
           grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.NOT_FOUND}


def _edit_text(text: str, rng: random.Random) -> str:
    """``text`` with one to three characters deleted, replaced or inserted."""
    chars = list(text)
    for _ in range(rng.randint(1, 3)):
        at = rng.randrange(len(chars) + 1)
        kind = rng.choice(("delete", "replace", "insert"))
        if kind == "delete" and at < len(chars):
            del chars[at]
        elif kind == "replace" and at < len(chars):
            chars[at] = rng.choice(ALPHABET)
        else:
            chars.insert(at, rng.choice(ALPHABET))
    return "".join(chars)


def _request(rng: random.Random, i: int) -> tuple[str, dict[str, Any]]:
    fields: dict[str, Any] = {"dag_yaml": GATE_YAML, "input_json": INPUT,
                              "idempotency_key": f"edit-{i}"}
    part = rng.choice(("dag_yaml", "input_json", "labels", "deadline_seconds", "priority"))
    if part in ("dag_yaml", "input_json"):
        fields[part] = _edit_text(fields[part], rng)
    elif part == "labels":
        fields["labels"] = {rng.choice(["team", "", "ax.x", "a" * 300, "é\u2028"]):
                            rng.choice(["risk", "", "\x00", "b" * 3000, "{{ 1 }}"])}
    elif part == "deadline_seconds":
        fields["deadline_seconds"] = rng.choice(
            [float("nan"), float("inf"), -1.0, 1e308, 5e-324, 86_400.0])
    else:
        fields["priority"] = rng.choice([-(2**31), -1, 0, 2**31 - 1])
    return part, fields


def test_an_edited_submit_is_accepted_or_refused_by_status(api_server: ServerFactory) -> None:
    server = api_server("embedded", worker=False, reconcile_interval=3600.0)
    stubs = Stubs(server.grpc_address)
    rng = random.Random("ax-grpc-submit-mutations")
    seen: dict[str, int] = {}
    try:
        for i in range(EDITS):
            part, fields = _request(rng, i)
            try:
                stubs.ax.SubmitTask(pb.SubmitTaskRequest(**fields), metadata=TOKEN["admin"])
                outcome = "OK"
            except grpc.RpcError as exc:
                code = exc.code()
                assert code in REFUSED, (part, fields.get(part), code, exc.details())
                assert exc.details(), (part, code)
                outcome = code.name
            except ValueError:
                # A text protobuf cannot carry (a lone surrogate): refused by the
                # client library before anything is sent.
                outcome = "not sendable"
            seen[outcome] = seen.get(outcome, 0) + 1
        assert seen.get("OK", 0) > 0 and seen.get("INVALID_ARGUMENT", 0) > 0, seen
        # Still serving.
        stubs.ax.SubmitTask(pb.SubmitTaskRequest(dag_yaml=GATE_YAML, input_json=INPUT),
                            metadata=TOKEN["admin"])
    finally:
        stubs.close()
