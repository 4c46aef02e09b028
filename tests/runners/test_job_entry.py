"""``GetRun`` and the Job container's entry point (``python -m axengine.runners.job_entry``)
against a real ``ax api`` on etcd + Redis, with no executor: the test claims as the
executor would, then starts the entry point with the environment a Job gives it.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from axengine.engine import ClaimResult
from axengine.errors import InputError, NotFound
from axengine.runners import job_entry
from axengine.worker.grpc_client import GrpcEngineClient
from tests.topology import REPO, Topology, wait_until

MAIL_DAG = """\
name: job_entry_mail
nodes:
  mail:
    type: tool_call
    tool: send_email
    input:
      to: risk-team@example.com
      subject: "report {{ .input.n }}"
      body: "hello"
    simulate: {latency: 6}
    timeout: 30
"""
SLEEP_DAG = """\
name: job_entry_sleep
nodes:
  nap:
    type: tool_call
    tool: sleep
    input: "{{ .input.seconds }}"
    timeout: 60
"""


@pytest.fixture(scope="module")
def topology() -> Iterator[Topology]:
    with Topology(executors=0, lease=5.0) as topo:
        yield topo


@pytest.fixture
def client(topology: Topology) -> Iterator[Any]:
    with topology.client() as c:
        yield c


def claim(topology: Topology, task: str, node: str, *, lease: float) -> ClaimResult:
    async def go() -> ClaimResult:
        async with GrpcEngineClient(topology.grpc_target, token=topology.executor_token) as c:
            result: ClaimResult = await c.claim(task, node, worker="exec-test",
                                                lease_seconds=lease)
            return result

    result = asyncio.run(go())
    assert result.result == "claimed", result
    return result


def job_env(topology: Topology, run: ClaimResult, tmp: Path, **extra: str) -> dict[str, str]:
    """The environment ``build_job`` gives a container, plus the settings file."""
    assert run.request is not None
    settings = tmp / "settings.json"
    settings.write_text(json.dumps({"mail_dir": str(topology.mail_dir),
                                    "input_root": str(REPO / "dags" / "inputs")}))
    req = run.request
    return {
        "PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(REPO),
        "AX_TASK_ID": req.task_id, "AX_NODE_ID": req.node_id, "AX_FENCE": str(req.fence),
        "AX_ATTEMPT": str(req.attempt), "AX_SNAPSHOT_KEY": f"/ax/snapshots/{req.task_id}/"
        f"{req.node_id}", "AX_API": topology.grpc_target,
        "AX_TOKEN_FILE": str(topology.root / "executor.token"),
        "AX_SETTINGS_FILE": str(settings), **extra,
    }


def start_entry(env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "axengine.runners.job_entry"], env=env,
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def finish(proc: subprocess.Popen[str], timeout: float = 20) -> tuple[int, dict[str, Any], str]:
    out, err = proc.communicate(timeout=timeout)
    result = job_entry.result_of_log(out)
    assert result is not None, f"no result line\nstdout: {out}\nstderr: {err}"
    assert out.strip().splitlines()[-1].startswith("{"), "the result line must come last"
    return proc.returncode, result, err


def mails_for(topology: Topology, task: str) -> int:
    return sum(1 for h in topology.emails()
               if h.get("X-Ax-Idempotency-Key", "").split(":")[1:2] == [task])


# ---------------------------------------------------------------------- GetRun


def test_get_run_answers_what_the_claim_did_under_its_fence_only(
        topology: Topology, client: Any) -> None:
    submitted = client.submit(SLEEP_DAG, {"seconds": 3})
    task = submitted.task_id

    async def go() -> dict[str, Any]:
        seen: dict[str, Any] = {}
        async with GrpcEngineClient(topology.grpc_target, token=topology.executor_token) as c:
            seen["claim"] = claim_ = await c.claim(task, "nap", worker="w", lease_seconds=10)
            fence = claim_.request.fence
            seen["run"] = await c.get_run(task, "nap", fence=fence)
            seen["newer"] = await c.get_run(task, "nap", fence=fence + 1)
            try:
                await c.get_run(task, "nap", fence=0)
            except InputError as exc:
                seen["zero"] = exc
            try:
                await c.get_run(task, "no-such-node", fence=fence)
            except NotFound as exc:
                seen["unknown"] = exc
            await c.complete(task, "nap", fence=fence, outcome=job_entry_success())
            seen["after"] = await c.get_run(task, "nap", fence=fence)
        return seen

    seen = asyncio.run(go())
    claimed, run = seen["claim"], seen["run"]
    assert run == claimed  # request, timeout, lease, submitter and DAG hash alike
    assert claimed.dag_hash == submitted.dag_hash and claimed.submitted_by == "topology-admin"
    assert (run.request.input, run.request.config["tool"], run.timeout) == (3, "sleep", 60)
    assert (seen["newer"], seen["after"]) == (None, None)
    assert "fence is required" in str(seen["zero"])
    assert "no-such-node" in str(seen["unknown"])


def job_entry_success() -> Any:
    from executors.contract import Success

    return Success({"slept": 0})


# ---------------------------------------------------------------------- the entry point


def test_the_container_fetches_runs_heartbeats_and_commits_under_the_fence(
        topology: Topology, client: Any, tmp_path: Path,
        record_property: Any) -> None:
    task = client.submit(MAIL_DAG, {"n": 1}).task_id
    # A 5 s claim lease that only the container renews: the 6 s send outlives it (the
    # lease covers the container's start: ~1 s of imports, over 3 s on a loaded machine).
    run = claim(topology, task, "mail", lease=5.0)
    env = job_env(topology, run, tmp_path, AX_LEASE_SECONDS="1.5")
    started = time.monotonic()
    code, result, _ = finish(start_entry(env))
    took = time.monotonic() - started
    assert code == job_entry.EXIT_COMMITTED, (result, _)
    assert took > 5.0  # it did outlive the claim's lease
    assert result["answer"] == "committed" and result["outcome"] == "Success"
    assert (result["fence"], result["attempt"]) == (run.request.fence, 1)
    node = client.get(task)["nodes"]["mail"]
    assert node["state"] == "SUCCEEDED" and node["output"]["status"] == "sent"
    commits = [e for e in client.events(task) if e.kind == "committed"]
    assert [(e.node_id, e.fence) for e in commits] == [("mail", run.request.fence)]
    assert mails_for(topology, task) == 1

    # The same container started again (a Job re-run by hand, a late duplicate): the
    # fence no longer holds a RUNNING node, nothing runs, nothing is sent.
    again_code, again, err = finish(start_entry(env))
    assert again_code == job_entry.EXIT_STALE and again["answer"] == "stale"
    assert "is not current" in err
    assert mails_for(topology, task) == 1
    assert len([e for e in client.events(task) if e.kind == "committed"]) == 1
    record_property("summary", f"container run {took:.1f}s past a 5 s claim lease, "
                    f"1 commit, 1 email; re-run exit {again_code} (stale)")


def test_a_container_fenced_out_mid_run_commits_nothing(
        topology: Topology, client: Any, tmp_path: Path) -> None:
    task = client.submit(SLEEP_DAG, {"seconds": 30}).task_id
    # A claim lease that outlasts the container's start on a busy machine.
    run = claim(topology, task, "nap", lease=20.0)
    proc = start_entry(job_env(topology, run, tmp_path, AX_LEASE_SECONDS="1"))
    try:
        first_beat = client.get(task)["nodes"]["nap"]["heartbeat_at"]
        # The container's own heartbeats move heartbeat_at: it is running.
        wait_until(lambda: client.get(task)["nodes"]["nap"]["heartbeat_at"] > first_beat,
                   20, what="a heartbeat from the container")
    except BaseException:
        proc.kill()
        proc.communicate(timeout=10)
        raise
    client.cancel(task, reason="test")
    started = time.monotonic()
    code, result, _ = finish(proc)
    assert code == job_entry.EXIT_STALE and result["answer"] == "stale"
    assert time.monotonic() - started < 5
    assert "outcome" not in result  # stopped before any Complete
    assert client.get(task)["nodes"]["nap"]["state"] == "CANCELLED"
    assert not [e for e in client.events(task) if e.kind == "committed"]


def test_a_fence_that_does_not_hold_is_refused_at_start(
        topology: Topology, client: Any, tmp_path: Path) -> None:
    task = client.submit(SLEEP_DAG, {"seconds": 1}).task_id
    run = claim(topology, task, "nap", lease=5.0)
    assert run.request is not None
    env = job_env(topology, run, tmp_path, AX_FENCE=str(run.request.fence + 1))
    try:
        code, result, err = finish(start_entry(env))
    finally:
        client.cancel(task)
    assert code == job_entry.EXIT_STALE and result["answer"] == "stale"
    assert f"fence {run.request.fence + 1} of {task}/nap is not current" in err


# ---------------------------------------------------------------------- no servers


def test_missing_variables_and_a_token_in_the_environment_are_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert job_entry.main({}) == job_entry.EXIT_USAGE
    assert "missing environment variable(s) AX_TASK_ID" in capsys.readouterr().err
    base = {"AX_TASK_ID": "t", "AX_NODE_ID": "n", "AX_FENCE": "2", "AX_API": "127.0.0.1:1"}
    # A token in the environment is never read: the file is the only source.
    assert job_entry.main({**base, "AX_TOKEN": "secret"}) == job_entry.EXIT_USAGE
    assert "AX_TOKEN_FILE" in capsys.readouterr().err
    empty = tmp_path / "token"
    empty.write_text("# no token here\n")
    assert job_entry.main({**base, "AX_TOKEN_FILE": str(empty)}) == job_entry.EXIT_USAGE
    assert "holds no token" in capsys.readouterr().err
    assert job_entry.main({**base, "AX_FENCE": "x", "AX_TOKEN_FILE": str(empty)}) == \
        job_entry.EXIT_USAGE
    settings = tmp_path / "settings.json"
    settings.write_text("[1]")
    empty.write_text("tok\n")
    assert job_entry.main({**base, "AX_TOKEN_FILE": str(empty),
                           "AX_SETTINGS_FILE": str(settings)}) == job_entry.EXIT_USAGE
    assert "must hold a JSON object" in capsys.readouterr().err


def test_the_result_line_is_the_last_json_object_with_an_answer() -> None:
    log = "\n".join(["starting", '{"answer": "stale", "fence": 1}', "INFO done",
                     '{"not": "a result"}', '{"answer": "committed", "fence": 2}',
                     "2024 WARNING trailing log line", "{broken"])
    assert job_entry.result_of_log(log) == {"answer": "committed", "fence": 2}
    assert job_entry.result_of_log("no json at all\n") is None
