"""Finding 3: local files through tool inputs — ``pdf_url`` = ``/etc/passwd``,
``/proc/self/environ``, ``../..``, ``~root/...`` was read by the executor, its sha256
returned (an existence and content oracle), PDFs anywhere on disk came back as text,
and the executor log printed file bytes.

Replayed as ``submitter`` against executors whose ``input_root`` is a directory of this
module: only the report inside it is read; every other path — existing or not, through
``..``, ``~``, a symlink leading out, a FIFO, ``/proc`` — gets one and the same refusal,
and nothing of any of those files shows up in outputs, errors, events or logs.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.security.attack import everything_about, run_tool
from tests.security.conftest import all_logs
from tests.topology import REPO, Topology

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPORT = REPO / "dags" / "inputs" / "acme_annual_report.pdf"


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The executors' ``input_root``: one real report."""
    root = tmp_path_factory.mktemp("input-root")
    shutil.copy(REPORT, root / "report.pdf")
    return root


@pytest.fixture(scope="module")
def topology(inputs: Path) -> Iterator[Topology]:
    """The conftest's topology, with the input root of this module."""
    with Topology(executors=2, lease=5.0,
                  executor_settings={"input_root": str(inputs)}) as topo:
        yield topo


def test_only_files_under_input_root_are_read(topology: Topology, inputs: Path,
                                              canary_file: Path, tmp_path: Path,
                                              record_property: Any) -> None:
    secret = canary_file.read_text().strip()
    fifo_inside, fifo_outside = inputs / "pipe.pdf", tmp_path / "pipe.pdf"
    os.mkfifo(fifo_inside)
    os.mkfifo(fifo_outside)
    link = inputs / "link.pdf"
    link.symlink_to(canary_file)
    (inputs / "dir").symlink_to(canary_file.parent)
    attacks = [
        str(canary_file), canary_file.as_uri(), str(tmp_path / "missing.pdf"),
        "/etc/passwd", "file:///etc/passwd", "/proc/self/environ", "/proc/1/environ",
        "../../etc/passwd", f"{inputs}/../../../../etc/passwd", "~root/.bashrc", "~/.bashrc",
        str(fifo_inside), str(fifo_outside), str(link), str(inputs / "dir" / canary_file.name),
        "/dev/zero", {"pdf_url": "/etc/shadow"}, {"path": str(REPORT)},
    ]
    try:
        nodes = run_tool(topology, "pdf_parser", [str(inputs / "report.pdf"), *attacks])
    finally:
        for path in (fifo_inside, link, inputs / "dir"):
            path.unlink()
    allowed, refused = nodes[0], nodes[1:]
    assert allowed["state"] == "SUCCEEDED"
    assert allowed["output"]["status"] == "success", allowed
    assert "Revenue growth: 8.0%" in allowed["output"]["text"]

    errors = set()
    for node in refused:
        output = node["output"]
        assert node["state"] == "SUCCEEDED" and output["status"] == "failed", node
        assert set(output) == {"status", "error", "source"}, node  # no sha256, no size
        errors.add(output["error"])
    # One message for everything refused: nothing tells existing from missing files.
    assert len(errors) == 1, errors
    message = errors.pop()
    assert "input_root" in message

    seen = everything_about(topology, [str(n["task_id"]) for n in nodes])
    logs = all_logs(topology)
    digests = [hashlib.sha256(canary_file.read_bytes()).hexdigest(),
               hashlib.sha256(Path("/etc/passwd").read_bytes()).hexdigest()]
    for leak in (secret, "root:x:0:", *digests):
        assert leak not in seen, leak
        assert leak not in logs, leak
    record_property("summary", f"{len(refused)} paths refused with one message {message!r}; "
                    "the report under input_root parsed; no canary text or sha256 in "
                    "outputs, events or logs")
