"""The ``subprocess`` runner: nodes in processes of their own, stopped for sure.

Node processes run ``tests.runners.handlers`` (named in the runner's settings, which no
DAG reaches) or the real handlers. The suite runs as root in CI: node processes then
run as ``nobody``, which is what keeps the executor's token file out of their reach.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import shutil
import signal
import stat
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from axengine.cli import main as ax
from axengine.config import AxConfig
from axengine.dag import load_dag_text
from axengine.engine import NodeState
from axengine.errors import InputError
from axengine.local import LocalSession
from axengine.runners import (
    RUNNER_NAMES,
    SubprocessRunner,
    SubprocessSettings,
    make_runners,
)
from axengine.runners._confinement import NodeUser, unreachable
from axengine.runners.subprocess import node_limits
from axengine.worker import RunContext
from executors.contract import Failure, NodeRequest, Success, Unavailable
from executors.run_node import (
    outcome_from_json,
    outcome_to_json,
    request_from_json,
    request_to_json,
)

#: Most tests start node processes (and an embedded engine): the full lane.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
DAG = str(ROOT / "dags" / "financial_risk_assessment.yaml")
ACME = json.dumps({"pdf_url": str(ROOT / "dags" / "inputs" / "acme_annual_report.pdf")})
AS_ROOT = os.geteuid() == 0
GRACE = 0.5
T = TypeVar("T")


@pytest.fixture
def home() -> Iterator[Path]:
    """A home the node user can reach: pytest's ``tmp_path`` is private to root (0700),
    so a node running as ``nobody`` could not write the mailbox under it."""
    path = Path(tempfile.mkdtemp(prefix="ax-runner-test-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def runner(handler: str = "executors.handlers:handle", **settings: Any) -> SubprocessRunner:
    settings.setdefault("grace_seconds", GRACE)
    return SubprocessRunner(SubprocessSettings(handler=handler, **settings))


def session(home: Path, node_runner: SubprocessRunner, **options: Any) -> LocalSession:
    return LocalSession(AxConfig(home=home), runner="subprocess",
                        runners={"subprocess": node_runner}, **options)


async def until(check: Callable[[], Awaitable[T]], what: str, timeout: float = 15.0) -> T:
    """Poll ``check`` until it returns something true (bounded)."""
    end = time.monotonic() + timeout
    while True:
        value = await check()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"gave up waiting for {what}")
        await asyncio.sleep(0.02)


def _stat_fields(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return text.rsplit(")", 1)[1].split()  # state, ppid, pgrp, ...


def alive(pid: int) -> bool:
    """Running (a zombie waiting for init to reap it is dead)."""
    fields = _stat_fields(pid)
    return fields is not None and fields[0] not in ("Z", "X")


def group_members(pgid: int) -> list[int]:
    """Live processes of the process group ``pgid``."""
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = _stat_fields(int(entry.name))
            if fields is not None and int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
                members.append(int(entry.name))
    return members


async def reported_pids(s: LocalSession, task_id: str) -> tuple[int, int]:
    """The node process's pid and its grandchild's, from its progress marker."""
    async def marker() -> str | None:
        for event in await s.engine.events(task_id):
            if event.kind == "progress" and event.detail.startswith("pids "):
                return event.detail
        return None

    _, node_pid, helper_pid = (await until(marker, "the node's pids")).split()
    return int(node_pid), int(helper_pid)


def assert_gone(node_pid: int, helper_pid: int) -> None:
    assert not alive(node_pid) and not alive(helper_pid)
    assert group_members(node_pid) == []


LOOP = load_dag_text("""
name: loop
nodes:
  n: {type: tool_call, tool: echo, input: x, timeout: 60, retry: 0}
""")


# ------------------------------------------------------------------------ the example


def test_the_financial_example_completes_in_node_processes(
        home: Path, capsys: pytest.CaptureFixture[str],
        record_property: Callable[[str, object], None]) -> None:
    started = time.monotonic()
    assert ax(["run", DAG, "--input", ACME, "--home", str(home), "--runner", "subprocess"]) == 0
    took = time.monotonic() - started
    out = capsys.readouterr().out
    assert ("path: parse_pdf -> extract_metrics -> assess_risk -> send_medium_risk_email"
            " -> log_completion") in out
    assert "SUCCEEDED" in out
    mails = list((home / "mail").glob("*.eml"))
    assert len(mails) == 1
    owner = mails[0].stat().st_uid
    if AS_ROOT:  # written by the node process, as the node user
        assert owner == 65534
    record_property("summary", f"financial example, --runner subprocess: {took:.2f}s, "
                    f"mail written by uid {owner}")


def test_unreachable_names_the_directory_the_node_user_may_not_enter(
        home: Path) -> None:
    nobody = NodeUser("nobody", 65534, 65534, switch=True)
    private = home / "private"
    (private / "deep").mkdir(parents=True)
    private.chmod(0o700)
    assert unreachable(str(home / "mail"), nobody) is None
    why = unreachable(str(private / "deep" / "mail"), nobody)
    assert why == (f"{private} is mode 0700 (owner uid {os.geteuid()}), which user nobody "
                   "may not enter")
    owner = NodeUser("me", os.geteuid(), os.getegid(), switch=False)
    assert unreachable(str(private / "deep" / "mail"), owner) is None


@pytest.mark.skipif(not AS_ROOT, reason="nodes switch to another user only under root")
def test_a_mailbox_the_node_user_cannot_reach_fails_once_and_clearly(
        home: Path, capsys: pytest.CaptureFixture[str],
        caplog: pytest.LogCaptureFixture) -> None:
    """Under root, nodes run as nobody: a home inside a private (0700) directory is out
    of their reach. The runner says so, and the mail node fails at once, not retried."""
    private = home / "private"
    private.mkdir(mode=0o700)
    with caplog.at_level("WARNING", logger="axengine"):
        code = ax(["run", DAG, "--input", ACME, "--home", str(private / "home"),
                   "--runner", "subprocess", "--json"])
    result = json.loads(capsys.readouterr().out)
    assert code == 1 and result["states"]["send_medium_risk_email"] == "FAILED"
    error = result["errors"]["send_medium_risk_email"]
    assert "the mailbox directory is not writable by this node process (uid 65534)" in error
    assert "set handlers.mail_dir (or --home)" in error
    assert f"{private} is mode 0700" in caplog.text and "cannot reach" in caplog.text


def test_the_choices_and_what_a_node_may_ask() -> None:
    assert RUNNER_NAMES[:2] == ("thread", "subprocess")
    with pytest.raises(InputError, match="known runners: thread, subprocess"):
        make_runners(["nope"])
    with pytest.raises(InputError, match="by import path"):
        make_runners(["subprocess"], handler=lambda request, ctx: Success(None))
    assert make_runners(["thread"]) == {}
    request = NodeRequest(task_id="t", node_id="n", node_type="tool_call", attempt=1, fence=1,
                          config={"resources": {"limits": {"memory": "256Mi",
                                                           "cpu": "500m"}}}, input=None)
    limits = node_limits(request, 30.0, SubprocessSettings())
    assert (limits.memory_bytes, limits.cpu_seconds) == (256 << 20, 15)
    default = node_limits(NodeRequest("t", "n", "tool_call", 1, 1, {}, None), 30.0,
                          SubprocessSettings())
    assert (default.memory_bytes, default.cpu_seconds) == (1 << 30, 30)
    bad = NodeRequest("t", "n", "tool_call", 1, 1, {"resources": {"limits": {"memory": "lots"}}},
                      None)
    with pytest.raises(InputError, match=r"resources\.limits\.memory 'lots'"):
        node_limits(bad, 30.0, SubprocessSettings())


def test_requests_and_outcomes_cross_the_channel_unchanged() -> None:
    request = NodeRequest(task_id="t-1", node_id="n", node_type="llm_call", attempt=2,
                          fence=7, config={"model": "sim-small", "prompt": "hi"},
                          input={"a": [1, 2.5, None]}, labels={"team": "risk"},
                          input_revision="abc")
    assert request_from_json(json.loads(json.dumps(request_to_json(request)))) == request
    for outcome in (Success({"x": [1]}), Failure("no", retryable=False, details={"k": 1}),
                    Unavailable(dependency="model:m", evidence="503"),
                    Unavailable(dependency="model:m", evidence="429", retry_after=12.5)):
        assert outcome_from_json(json.loads(json.dumps(outcome_to_json(outcome)))) == outcome


# ------------------------------------------------------------------------ the kill


def test_a_node_past_its_timeout_is_killed_with_its_group(
        home: Path, record_property: Callable[[str, object], None]) -> None:
    dag = load_dag_text("name: loop\nnodes:\n  n: {type: tool_call, tool: echo, input: x, "
                        "timeout: 1, retry: 0}\n")

    async def main() -> Any:
        async with session(home, runner("tests.runners.handlers:loop_forever")) as s:
            task = await s.submit(dag, {})
            pids = await reported_pids(s, task)
            result = await s.wait(task, timeout=20)
            return result, pids

    result, (node_pid, helper_pid) = asyncio.run(main())
    assert result.status == "DEAD"  # its only attempt timed out
    assert re.fullmatch(r"attempts exhausted \(1/1\): timed out after 1\.\ds \(timeout 1s\); "
                        r"killed the node process group \(SIGTERM, then SIGKILL after 0\.5s "
                        r"grace\)", result.errors["n"]), result.errors["n"]
    assert_gone(node_pid, helper_pid)
    record_property("summary", f"timeout: {result.errors['n']}")


def test_a_node_past_its_timeout_saves_a_checkpoint_in_its_grace_and_the_next_run_gets_it(
        home: Path, record_property: Callable[[str, object], None]) -> None:
    dag = load_dag_text("name: pages\nnodes:\n  n: {type: tool_call, tool: echo, input: x, "
                        "timeout: 1, retry: 1}\n")

    async def main() -> Any:
        async with session(home, runner("tests.runners.handlers:resumable")) as s:
            task = await s.submit(dag, {})
            result = await s.wait(task, timeout=20)
            return result, await s.engine.events(task)

    result, events = asyncio.run(main())
    assert result.status == "SUCCEEDED"
    pages = result.outputs["n"]["resumed_from"]["pages"]
    assert pages > 0
    retry = next(e for e in events if e.kind == "retry")
    assert re.match(r"timed out after 1\.\ds \(timeout 1s\), resumable: the next run gets its "
                    r"checkpoint; killed the node process group \(SIGTERM; the node exited "
                    r"within the 0\.5s grace", retry.detail), retry.detail
    assert [e.kind for e in events].count("checkpoint") == 1
    record_property("summary", f"timeout with a checkpoint: {retry.detail[:90]}...; the "
                    f"second run resumed from {pages} pages")


def test_a_cancelled_node_is_killed_within_its_grace(
        home: Path, caplog: pytest.LogCaptureFixture,
        record_property: Callable[[str, object], None]) -> None:
    caplog.set_level(logging.WARNING, logger="axengine.runners.subprocess")

    async def main() -> Any:
        async with session(home, runner("tests.runners.handlers:loop_forever"),
                           lease_seconds=0.6) as s:
            task = await s.submit(LOOP, {})
            node_pid, helper_pid = await reported_pids(s, task)
            await s.engine.cancel(task, by="test")  # bumps the fence: the run is stale
            cancelled = time.monotonic()

            async def gone() -> bool:
                return not alive(node_pid) and not group_members(node_pid)

            await until(gone, "the node's process group to go")
            waited = time.monotonic() - cancelled
            return (node_pid, helper_pid), waited, await s.engine.get_task(task)

    (node_pid, helper_pid), waited, view = asyncio.run(main())
    assert_gone(node_pid, helper_pid)
    # The next heartbeat (every 0.2 s) sees the stale fence; then the 0.5 s grace.
    assert waited < GRACE + 3
    assert view.snapshots["n"].state is NodeState.CANCELLED
    assert view.snapshots["n"].output is None
    kills = [r.getMessage() for r in caplog.records if f"(pid {node_pid})" in r.getMessage()]
    assert kills and kills[0].endswith(
        "fenced out: another worker owns the node; killed the node process group (SIGTERM, "
        "then SIGKILL after 0.5s grace)")
    record_property("summary", f"cancel: group gone {waited:.2f}s after the cancel")


def test_a_stale_fence_stops_the_run_and_its_outcome_records_the_kill(home: Path) -> None:
    node_runner = runner("tests.runners.handlers:loop_forever")

    async def main() -> Any:
        # The session's executor serves a lane nobody uses: the test runs the node.
        async with session(home, node_runner, lanes=("nobody",)) as s:
            task = await s.submit(LOOP, {})
            claim = await s.engine.claim(task, "n", worker="test-worker", lease_seconds=30)
            ctx = RunContext(loop=asyncio.get_running_loop(), engine=s.engine,
                             request=claim.request, lease_seconds=0.6, settings={})
            run = asyncio.create_task(node_runner.run(claim.request, ctx, timeout=60))
            pids = await reported_pids(s, task)
            # Another worker takes the node over: the run's next heartbeat is stale.
            assert await s.engine.expire(task, "n", owner_dead=True) == "committed"
            outcome = await asyncio.wait_for(run, timeout=10)
            return outcome, pids, ctx.stale

    outcome, (node_pid, helper_pid), stale = asyncio.run(main())
    assert stale
    assert isinstance(outcome, Failure) and outcome.retryable
    assert outcome.message == ("fenced out: another worker owns the node; killed the node "
                               "process group (SIGTERM, then SIGKILL after 0.5s grace)")
    assert_gone(node_pid, helper_pid)


def test_activity_samples_the_node_process_group_while_it_runs(home: Path) -> None:
    node_runner = runner("tests.runners.handlers:loop_forever")

    async def main() -> Any:
        async with session(home, node_runner, lanes=("nobody",)) as s:
            task = await s.submit(LOOP, {})
            claim = await s.engine.claim(task, "n", worker="test-worker", lease_seconds=30)
            ctx = RunContext(loop=asyncio.get_running_loop(), engine=s.engine,
                             request=claim.request, lease_seconds=30, settings={})
            run = asyncio.create_task(node_runner.run(claim.request, ctx, timeout=60))
            pids = await reported_pids(s, task)
            during = await asyncio.to_thread(node_runner.activity, ctx)
            ctx.cancel()
            await asyncio.wait_for(run, timeout=10)
            return pids, during, node_runner.activity(ctx)

    (node_pid, helper_pid), during, after = asyncio.run(main())
    assert during is not None and during.source.startswith(f"pgrp {node_pid} (")
    assert during.cpu_seconds is not None  # the group's CPU (node and its sleep helper)
    assert after is None  # the run ended: no stale pid is sampled
    assert_gone(node_pid, helper_pid)


def test_shutting_the_executor_down_leaves_no_node_process(home: Path) -> None:
    """A node still running when the session closes is handed back (WAITING, no attempt
    spent) and its process group is killed before the session is gone."""
    async def main() -> Any:
        async with session(home, runner("tests.runners.handlers:loop_forever"),
                           lease_seconds=0.6, grace_seconds=0.2) as s:
            task = await s.submit(LOOP, {})
            pids = await reported_pids(s, task)
        async with LocalSession(AxConfig(home=home), lanes=("nobody",),
                                reconcile_interval=60) as s:
            return pids, await s.engine.get_task(task)

    (node_pid, helper_pid), view = asyncio.run(main())
    assert_gone(node_pid, helper_pid)
    assert view.snapshots["n"].state is NodeState.WAITING
    assert "executor:shutdown" in (view.snapshots["n"].evidence or "")


# ------------------------------------------------------------------------ crashes


def test_a_node_past_its_memory_limit_fails_clearly_and_the_executor_keeps_serving(
        home: Path, record_property: Callable[[str, object], None]) -> None:
    dag = load_dag_text("""
name: misbehave
nodes:
  n:
    type: tool_call
    tool: echo
    input: "{{ input }}"
    retry: 0
    resources: {limits: {memory: 256Mi}}
""")

    async def main() -> dict[str, Any]:
        async with session(home, runner("tests.runners.handlers:misbehave")) as s:
            results = {}
            for name, task_input in [
                ("oom", {"do": "allocate", "mib": 512}),
                ("sigkill", {"do": "signal", "signal": int(signal.SIGKILL)}),
                ("exit", {"do": "exit", "code": 3}),
                ("fine", {"do": "allocate", "mib": 16}),
            ]:
                results[name] = await s.wait(await s.submit(dag, task_input), timeout=20)
            return results

    results = asyncio.run(main())
    errors = {name: result.errors.get("n", "") for name, result in results.items()}
    assert {name: result.status for name, result in results.items()} == {
        "oom": "DEAD", "sigkill": "DEAD", "exit": "DEAD", "fine": "SUCCEEDED"}
    # Each its only attempt (retry: 0); every crash is retryable, so it names the attempts.
    assert errors["oom"].startswith("attempts exhausted (1/1): node process ran out of memory "
                                    "(limit 256 MiB): ")
    assert errors["sigkill"].startswith("attempts exhausted (1/1): node process was killed by "
                                        "SIGKILL")
    assert errors["exit"] == (
        "attempts exhausted (1/1): node process exited with code 3 without reporting an "
        "outcome; last stderr: about to leave without a word")
    # The same executor, after all that: the next node runs.
    assert results["fine"].status == "SUCCEEDED"
    assert results["fine"].outputs["n"] == {"allocated_mib": 16}
    record_property("summary", " || ".join(f"{k}: {v}" for k, v in errors.items() if v))


# ------------------------------------------------------------------------ isolation


def test_a_node_cannot_read_the_executors_token_or_environment(
        home: Path, monkeypatch: pytest.MonkeyPatch,
        record_property: Callable[[str, object], None]) -> None:
    secret = "tok-" + os.urandom(8).hex()
    monkeypatch.setenv("AX_API_TOKEN", secret)
    monkeypatch.setenv("FAKE_CLOUD_CREDENTIALS", secret)
    monkeypatch.setenv("LANG", "C.UTF-8")
    secrets_dir = home / "secrets"
    secrets_dir.mkdir(mode=0o755)
    token_file = secrets_dir / "token"
    token_file.write_text(secret + "\n")
    token_file.chmod(0o600)
    dag = load_dag_text("name: snoop\nnodes:\n  n: {type: tool_call, tool: echo, "
                        "input: '{{ input }}'}\n")

    async def main() -> Any:
        async with session(home, runner("tests.runners.handlers:snoop")) as s:
            return await s.wait(await s.submit(dag, {"token_file": str(token_file)}),
                                timeout=20)

    result = asyncio.run(main())
    assert result.status == "SUCCEEDED", result.errors
    seen = result.outputs["n"]
    env = seen["env"]
    record_property("summary", f"node saw env {sorted(env)}, uid {seen['uid']}, token file "
                    f"{seen['token_file']!r}, executor environ {seen['executor_environ']!r}")
    # Only the allow-list (Python itself may add LC_CTYPE when it coerces the C locale).
    assert set(env) <= {"PATH", "LANG", "LC_ALL", "TZ", "HOME", "PYTHONPATH", "LC_CTYPE"}
    assert env["LANG"] == "C.UTF-8"
    assert not any(key.startswith("AX_") for key in env)
    assert secret not in json.dumps(seen["env"])
    assert env["HOME"] != os.environ.get("HOME") and not Path(env["HOME"]).exists()
    assert seen["pgid_is_pid"] and seen["sigterm_handled"]
    if not AS_ROOT:
        pytest.skip("the executor is not root: node processes run as its own user, so the "
                    "token file and /proc/<executor>/environ are readable by design; only "
                    "the environment part is asserted")
    assert seen["uid"] == 65534 and 0 not in seen["groups"]
    assert seen["token_file"] == "refused: PermissionError"
    assert seen["executor_environ"] == "refused: PermissionError"
    assert secret not in json.dumps(seen)
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600  # untouched


# ------------------------------------------------------------------------ the context


def test_heartbeats_progress_and_effects_reach_the_engine_under_the_fence(home: Path) -> None:
    dag = load_dag_text("""
name: effects
nodes:
  render:
    type: tool_call
    tool: video_vendor
    input: {prompt: a cat, seconds: 2}
    simulate: {queue_seconds: 0.05, render_seconds: 0.3, poll_interval: 0.05}
    next: mail
  mail:
    type: tool_call
    tool: send_email
    input: {to: ops@example.com, subject: rendered, body: "{{ nodes.render.output.video_uri }}"}
""")

    async def main() -> Any:
        async with session(home, runner(), lease_seconds=3) as s:
            task = await s.submit(dag, {})
            result = await s.wait(task, timeout=20)
            view = await s.engine.get_task(task)
            records = {node: await s.engine.effect_get(
                f"{kind}:{task}:{node}:{view.snapshots[node].input_revision}")
                for node, kind in (("render", "video"), ("mail", "email"))}
            return result, await s.engine.events(task), records

    result, events, records = asyncio.run(main())
    assert result.status == "SUCCEEDED", result.errors
    assert result.outputs["mail"]["status"] == "sent"
    assert {node: r.state for node, r in records.items()} == {"render": "DONE", "mail": "DONE"}
    progress = [e for e in events if e.kind == "progress" and e.node_id == "render"]
    assert any(e.detail.startswith("vendor:rendering") for e in progress)
    assert {e.fence for e in progress} == {1}
    assert len(list((home / "mail").glob("*.eml"))) == 1


def test_a_stale_fence_makes_effect_begin_raise_in_the_node_and_nothing_is_sent(
        home: Path) -> None:
    dag = load_dag_text("name: m\nnodes:\n  mail: {type: tool_call, tool: send_email, "
                        "input: {to: ops@example.com, subject: hi, body: there}}\n")
    node_runner = runner(grace_seconds=5.0)

    async def main() -> Any:
        async with session(home, node_runner, lanes=("nobody",)) as s:
            task = await s.submit(dag, {})
            claim = await s.engine.claim(task, "mail", worker="test-worker", lease_seconds=30)
            # Taken over before the run starts: this attempt's fence is stale.
            assert await s.engine.expire(task, "mail", owner_dead=True) == "committed"
            ctx = RunContext(loop=asyncio.get_running_loop(), engine=s.engine,
                             request=claim.request, lease_seconds=30,
                             settings={"mail_dir": str(home / "mail")})
            outcome = await asyncio.wait_for(node_runner.run(claim.request, ctx, timeout=30),
                                             timeout=20)
            key = f"email:{task}:mail:{claim.request.input_revision}"
            return outcome, ctx.stale, await s.engine.effect_get(key)

    outcome, stale, record = asyncio.run(main())
    assert stale
    assert isinstance(outcome, Failure)
    # The node raises FencedOut at effect_begin. Whether the runner sees the stale
    # answer before the node reports (it stops the group) or after (the node's own
    # report) is a race; either way the run is stale and nothing is sent.
    assert outcome.message.startswith((
        "fenced out: another worker owns the node; killed the node process group (SIGTERM; "
        "the node exited within", "node 'mail' (tool_call) raised FencedOut")), outcome
    assert "raised FencedOut: effect email:" in outcome.message
    assert record is None or record.state == "NEW"
    assert list((home / "mail").glob("*.eml")) == []


def test_the_model_provider_variables_reach_llm_nodes_and_nothing_else_does() -> None:
    """OPENAI_BASE_URL/OPENAI_API_KEY are the nodes' own credentials (an llm_call node
    calls the model from its process); the executor's token and other variables stay
    out."""
    runner = SubprocessRunner(environ={
        "PATH": "/usr/bin", "OPENAI_BASE_URL": "http://127.0.0.1:9/v1",
        "OPENAI_API_KEY": "sk-node", "AX_TOKEN": "executor-token",
        "AWS_SECRET_ACCESS_KEY": "cloud", "HOME": "/root"})
    assert runner._env == {"PATH": "/usr/bin", "OPENAI_BASE_URL": "http://127.0.0.1:9/v1",
                           "OPENAI_API_KEY": "sk-node"}
