"""Finding 11: idempotency keys were global across principals, and a world-readable
tokens file was accepted silently.

Keys are now scoped to the submitting principal (``/ax/idempotency/{principal}/{key}``):
another principal reusing a key gets its own task — never the first one's id, never a
409 that reveals the key is in use. ``ax api`` refuses a tokens file group or others can
access unless ``--allow-insecure-tokens-file`` is given.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.security.conftest import http
from tests.topology import REPO, Topology

pytestmark = [pytest.mark.integration, pytest.mark.slow]

DAG = {"name": "idem_probe", "nodes": {"work": {"type": "tool_call", "tool": "echo",
                                                "input": {"x": 1}}}}


def test_idempotency_keys_are_scoped_per_principal(topology: Topology) -> None:
    key = "shared-key-f11"
    with http(topology, "submitter") as first, http(topology, "submitter2") as second:
        mine = first.post("/v1/tasks", json={"dag": DAG, "idempotency_key": key})
        assert mine.status_code == 201, mine.text
        # The same key and payload from another principal: its own, new task.
        theirs = second.post("/v1/tasks", json={"dag": DAG, "idempotency_key": key})
        assert theirs.status_code == 201, theirs.text
        assert theirs.json()["task_id"] != mine.json()["task_id"]
        # Another payload under the same key is not a conflict for another principal.
        other = second.post("/v1/tasks", json={"dag": {**DAG, "name": "idem_other"},
                                               "idempotency_key": key + "-2"})
        assert other.status_code == 201, other.text
        squat = first.post("/v1/tasks", json={"dag": {**DAG, "name": "idem_other"},
                                              "idempotency_key": key + "-2"})
        assert squat.status_code == 201, squat.text
        # Within one principal the key still deduplicates.
        again = first.post("/v1/tasks", json={"dag": DAG, "idempotency_key": key})
        assert again.status_code == 200 and again.json()["task_id"] == mine.json()["task_id"]
        task = first.get(f"/v1/tasks/{theirs.json()['task_id']}").json()
        assert task["submitted_by"] == "topology-submitter2"


def _tokens_file(tmp_path: Path, mode: int) -> Path:
    path = tmp_path / "tokens.yaml"
    path.write_text(json.dumps({"tokens": [
        {"name": "t", "token": "a-token-long-enough-0123", "roles": ["submit"]}]}))
    path.chmod(mode)
    return path


def _ax_api(tmp_path: Path, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "axengine.cli", "api", "--store",
         f"sqlite:///{tmp_path / 'ax.db'}", "--queue", "memory://", "--blobs",
         str(tmp_path / "blobs"), "--http", "127.0.0.1:0", "--grpc", "off",
         "--tokens", str(tmp_path / "tokens.yaml"), *extra],
        cwd=REPO, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def test_world_readable_tokens_file_is_refused(tmp_path: Path) -> None:
    tokens = _tokens_file(tmp_path, 0o644)
    proc = _ax_api(tmp_path)
    output, _ = proc.communicate(timeout=60)
    assert proc.returncode != 0
    assert str(tokens) in output and f"chmod 600 {tokens}" in output


def test_insecure_tokens_file_is_accepted_with_the_override(tmp_path: Path) -> None:
    _tokens_file(tmp_path, 0o644)
    proc = _ax_api(tmp_path, "--allow-insecure-tokens-file", "--log-level", "warning")
    try:
        assert proc.stdout is not None
        seen = []
        for line in proc.stdout:
            seen.append(line)
            if "ax: ready" in line:
                break
        assert any("ax: ready" in line for line in seen), "".join(seen)
        assert any("allow-insecure-tokens-file" in line for line in seen), "".join(seen)
    finally:
        proc.terminate()
        proc.communicate(timeout=30)
