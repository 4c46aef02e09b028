"""The committed generated code matches ``proto/ax/v1/ax.proto``; the seed layout holds."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from google.protobuf.descriptor import FieldDescriptor

from proto.ax.v1 import ax_pb2, ax_pb2_grpc

ROOT = Path(__file__).resolve().parents[1]
PROTO_DIR = ROOT / "proto" / "ax" / "v1"
GENERATED = ("ax_pb2.py", "ax_pb2.pyi", "ax_pb2_grpc.py")


@pytest.fixture(scope="module")
def regenerated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Run ``scripts/gen-proto`` into a temporary directory; return its ``proto/ax/v1``."""
    out = tmp_path_factory.mktemp("gen-proto")
    env = {**os.environ, "PYTHON": sys.executable}
    proc = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gen-proto"), str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False,
    )
    assert proc.returncode == 0, f"scripts/gen-proto failed:\n{proc.stdout}\n{proc.stderr}"
    return out / "proto" / "ax" / "v1"


@pytest.mark.parametrize("name", GENERATED)
def test_generated_code_is_up_to_date(regenerated: Path, name: str) -> None:
    fresh = (regenerated / name).read_bytes()
    committed = (PROTO_DIR / name).read_bytes()
    assert fresh == committed, (
        f"proto/ax/v1/{name} is out of date with ax.proto (or was edited by hand); "
        "run scripts/gen-proto and commit the result"
    )


def test_generated_modules_import_each_other_from_the_repo_root() -> None:
    source = (PROTO_DIR / "ax_pb2_grpc.py").read_text(encoding="utf-8")
    assert "from proto.ax.v1 import ax_pb2" in source
    assert ax_pb2_grpc.AxServiceStub is not None


# (number, name, type) of the seed's TaskSnapshot, section 3.3 of seed 003.
SEED_FIELDS = [
    (1, "task_id", FieldDescriptor.TYPE_STRING),
    (2, "node_id", FieldDescriptor.TYPE_STRING),
    (3, "status", FieldDescriptor.TYPE_STRING),
    (4, "retry_count", FieldDescriptor.TYPE_INT32),
    (5, "last_updated", FieldDescriptor.TYPE_MESSAGE),
    (6, "input_params", FieldDescriptor.TYPE_MESSAGE),
    (7, "output_json", FieldDescriptor.TYPE_STRING),
    (8, "next_hops", FieldDescriptor.TYPE_MESSAGE),
]


@pytest.mark.parametrize(("number", "name", "type_"), SEED_FIELDS)
def test_task_snapshot_keeps_the_seed_field_numbers(number: int, name: str, type_: int) -> None:
    field = ax_pb2.TaskSnapshot.DESCRIPTOR.fields_by_number[number]
    assert field.name == name
    assert field.type == type_


def test_task_snapshot_seed_field_shapes() -> None:
    fields = ax_pb2.TaskSnapshot.DESCRIPTOR.fields_by_name
    assert fields["last_updated"].message_type.full_name == "google.protobuf.Timestamp"
    params = fields["input_params"].message_type
    assert params.GetOptions().map_entry
    assert params.fields_by_name["key"].type == FieldDescriptor.TYPE_STRING
    assert params.fields_by_name["value"].type == FieldDescriptor.TYPE_STRING
    hops = fields["next_hops"]
    assert hops.is_repeated
    assert hops.message_type.full_name == "ax.v1.TaskSnapshot.NextHop"
    hop_fields = {f.number: (f.name, f.type) for f in hops.message_type.fields}
    assert hop_fields == {
        1: ("target_node_id", FieldDescriptor.TYPE_STRING),
        2: ("is_taken", FieldDescriptor.TYPE_BOOL),
    }


def test_field_numbers_below_nine_belong_to_the_seed_only() -> None:
    numbers = {f.number for f in ax_pb2.TaskSnapshot.DESCRIPTOR.fields}
    assert {n for n in numbers if n <= 8} == {n for n, _, _ in SEED_FIELDS}
    assert min(numbers - {n for n, _, _ in SEED_FIELDS}) == 9


def test_services_expose_the_designed_methods() -> None:
    services = ax_pb2.DESCRIPTOR.services_by_name
    assert set(services["AxService"].methods_by_name) == {
        "SubmitTask", "GetTask", "ListTasks", "GetEvents", "WatchTask", "Decide",
        "CancelTask", "RetryTask", "ForkTask", "ValidateDag", "ResumeNode",
    }
    assert set(services["ExecutorService"].methods_by_name) == {
        "Claim", "Heartbeat", "Progress", "Checkpoint", "Complete", "EffectBegin",
        "EffectDone", "EffectGet", "GetRun", "Take", "CompleteStream",
    }
    watch = services["AxService"].methods_by_name["WatchTask"]
    assert watch.server_streaming
    assert watch.output_type.full_name == "ax.v1.Event"
    stream = services["ExecutorService"].methods_by_name["CompleteStream"]
    assert stream.client_streaming and stream.server_streaming
    assert stream.input_type.fields_by_name["request"].message_type.full_name == \
        "ax.v1.CompleteRequest"
    assert stream.output_type.fields_by_name["reply"].message_type.full_name == \
        "ax.v1.CompleteReply"
