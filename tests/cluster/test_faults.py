"""Fault tests with real processes: each runs 100 tasks of the financial DAG through the
REST API on real etcd and Redis with two executors, breaks something mid-run, and then
checks that nothing was lost or repeated:

- every task SUCCEEDED;
- every succeeded node has exactly one ``committed`` event, carrying the fence of its
  last claim, and the fences of every node only go up;
- exactly one email per task in the mailbox (the outbox never repeats a send).

The faults: SIGKILL executors mid-node (restarting them), SIGKILL the API right after a
commit and before the enqueue (``AX_FAULT_POINT=after-commit:N``), ``FLUSHALL`` on
Redis, a stop/start of etcd on its data dir, and an executor paused (SIGSTOP) past its
lease whose late result must be refused as stale.

One topology serves the module; each scenario leaves it healthy for the next.
"""

from __future__ import annotations

import re
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.topology import (
    REPO,
    Audit,
    Proc,
    Topology,
    audit,
    batch_progress,
    submit_batch,
    wait_until,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(240)]

FINANCIAL = REPO / "dags" / "financial_risk_assessment.yaml"
EMAIL_NODE = "send_medium_risk_email"
N_TASKS = 100
#: A batch must finish within this (seconds); a healthy batch takes about 15 s here.
BATCH_TIMEOUT = 150.0
#: Lease of the executors: short, so a paused executor is fenced out quickly.
LEASE = 2.0

SLEEP_DAG = """\
name: paused_worker
nodes:
  nap:
    type: tool_call
    tool: sleep
    input: "{{ .input.seconds }}"
    timeout: 60
    retry: 3
    lane: fast  # served before the financial batch's nodes when it is handed over
"""


@pytest.fixture(scope="module")
def topo() -> Iterator[Topology]:
    # The simulated model answers after 0.2 s, so an executor is nearly always mid-node.
    with Topology(executors=2, concurrency=4, lease=LEASE, grace=2.0,
                  executor_settings={"simulate": {"latency": 0.2}}) as topology:
        yield topology


@pytest.fixture
def client(topo: Topology) -> Iterator[Any]:
    # Patient: the API or etcd may be down for a while during a scenario.
    with topo.client(retry_for=60) as c:
        yield c


@dataclass
class Disruptor:
    """Runs fault actions in a thread while a batch runs; records what happened."""

    actions: list[tuple[str, Callable[[], bool]]]
    done: list[str] = field(default_factory=list)
    errors: list[BaseException] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        try:
            for name, action in self.actions:
                while not self.stop.is_set():
                    if action():
                        self.done.append(name)
                        break
                    self.stop.wait(0.05)
        except BaseException as exc:  # reported by the test, not lost in the thread
            self.errors.append(exc)

    def __enter__(self) -> Disruptor:
        self._thread = threading.Thread(target=self.run, name="disruptor", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self._thread.join(60)
        assert not self._thread.is_alive(), "the disruptor did not stop"


def run_batch(topo: Topology, client: Any, tag: str,
              actions: list[tuple[str, Callable[[], bool]]], *, chunks: int = 1,
              after_chunk: Callable[[int], None] | None = None) -> tuple[Audit, float]:
    """Submit the batch (in ``chunks``, calling ``after_chunk(i)`` after each) while
    ``actions`` run in a thread; wait; audit; return the audit and the seconds taken."""
    started = time.monotonic()
    with Disruptor(actions) as disruptor:
        ids: list[str] = []
        size = N_TASKS // chunks
        for i in range(chunks):
            ids += submit_batch(client, FINANCIAL, size, tag=tag, first=i * size)
            if after_chunk is not None:
                after_chunk(i)
        wait_until(lambda: batch_progress(client, tag) == (N_TASKS, N_TASKS),
                   BATCH_TIMEOUT, interval=0.25, what=f"batch {tag} finished")
    elapsed = time.monotonic() - started
    assert disruptor.errors == []
    found = audit(client, ids, topo)
    assert found.problems(ids, email_nodes=[EMAIL_NODE]) == []
    assert found.total_commits == N_TASKS * 5
    return found, elapsed


def report(name: str, found: Audit, elapsed: float, **figures: Any) -> None:
    extra = ", ".join(f"{k} {v}" for k, v in figures.items())
    print(f"\n[{name}] {N_TASKS} tasks SUCCEEDED in {elapsed:.1f}s: {found.total_commits} "
          f"commits (1 per node), {found.claims} claims, {found.lease_expiries} lease "
          f"expiries, {found.handed_back} unavailable, {sum(found.emails.values())} "
          f"emails; {extra}")


def progress_at_least(client: Any, tag: str, final: int) -> Callable[[], bool]:
    return lambda: batch_progress(client, tag)[0] >= final


def in_flight(proc: Proc) -> int:
    """Nodes the executor's current run claimed and has not finished, from its log."""
    out = proc.output()
    claimed = len(re.findall(r" claimed \S+ fence=", out))
    ended = len(re.findall(r" (?:complete|heartbeat|progress) \S+ fence=\d+\b.*?"
                           r"(?:committed|stale|already-done)", out))
    return claimed - ended


#: Attempts of the financial DAG's worker nodes (retry: 2).
LAST_ATTEMPT = 3


def attempts_claimed_for(client: Any, tag: str, worker: str) -> list[int]:
    """Attempts of the nodes of batch ``tag`` RUNNING for ``worker``, as the API has them:
    with the claims the executor has not heard of yet (made for it in a submit's or a
    completion's transaction whose answer is on its way), which its log cannot show."""
    running = client.list_tasks(label=f"batch={tag}", status="RUNNING", limit=10_000)
    return [node["attempt"] for task in running
            for node in client.get(task.task_id)["nodes"].values()
            if node["state"] == "RUNNING" and node["owner"] == worker]


def in_flight_attempts(proc: Proc) -> list[int]:
    """Attempt numbers of the nodes the executor's current run is running, from its log."""
    out = proc.output()
    claimed = {(m[0], m[1]): int(m[2]) for m in
               re.findall(r" claimed (\S+) fence=(\d+) attempt=(\d+)", out)}
    for m in re.findall(r" (?:complete|heartbeat|progress) (\S+) fence=(\d+)\b", out):
        claimed.pop((m[0], m[1]), None)
    return list(claimed.values())


def test_executors_sigkilled_mid_node_lose_and_repeat_nothing(topo: Topology,
                                                              client: Any) -> None:
    kills: list[int] = []

    def killable(index: int) -> bool:
        proc = topo.executors[index]
        if in_flight(proc) <= 0:
            return False  # wait until it is running something
        # A node whose every attempt dies with its worker is indistinguishable from a
        # poison node: on its last attempt a kill makes it DEAD by design (the attempt
        # budget). Only kill where a retry remains, in what the executor runs and in
        # what was claimed for it and is on its way to it.
        if max(in_flight_attempts(proc), default=0) >= LAST_ATTEMPT:
            return False
        held = attempts_claimed_for(client, "kill", topo.worker_id(index))
        return max(held, default=0) < LAST_ATTEMPT

    def kill(preferred: int) -> Callable[[], bool]:
        def action() -> bool:
            # The preferred executor, or the other one if it has nothing to kill in: a
            # restarted executor can be slow to start on a loaded machine, and its peer
            # may then run a whole chunk alone.
            for index in (preferred, 1 - preferred):
                if killable(index):
                    proc = topo.executors[index]
                    topo.kill_executor(index)
                    kills.append(in_flight(proc))
                    topo.start_executor(index)
                    return True
            return False
        return action

    def pause(seconds: float) -> Callable[[], bool]:
        until: list[float] = []

        def action() -> bool:
            if not until:
                until.append(time.monotonic() + seconds)
            return time.monotonic() >= until[0]
        return action

    actions: list[tuple[str, Callable[[], bool]]] = []
    for i in range(12):
        actions += [(f"kill-{i}", kill(i % 2)), (f"pause-{i}", pause(0.3))]

    chunks = 5

    def one_more_kill(chunk: int) -> None:
        # Pace the submissions so kills land throughout the batch, however fast it runs:
        # the next chunk goes in after a kill, or once this one is done without one (on a
        # loaded machine a restarting executor can leave its peer to run a whole chunk
        # before the next kill finds a node to kill in).
        submitted = (chunk + 1) * (N_TASKS // chunks)
        wait_until(lambda: len(kills) > chunk or
                   batch_progress(client, "kill")[0] >= submitted, 90,
                   what=f"kill {chunk + 1} or chunk {chunk + 1} done")

    found, elapsed = run_batch(topo, client, "kill", actions, chunks=chunks,
                               after_chunk=one_more_kill)
    assert len(kills) >= 3
    # Killed mid-node: those nodes were fenced out and claimed again.
    assert found.lease_expiries >= 1
    assert found.claims > N_TASKS * 4
    report("SIGKILL executors", found, elapsed, kills=len(kills),
           **{"nodes in flight at the kills": sum(kills)})


def test_api_killed_between_commit_and_enqueue_is_repaired_by_the_reconciler(
        topo: Topology, client: Any) -> None:
    assert topo.api is not None
    api = topo.api
    # First death: executors paused, so the API's only commits are submissions; the 30th
    # commits its task and dies before enqueueing the entry node. Two more deaths then
    # land on whatever commit comes (claims, completions readying successors...).
    first = 30
    plan = [f"after-commit:{first}", "after-commit:200", "after-commit:200"]
    deaths: list[int | None] = []
    queued_at_first_death: set[tuple[str, str]] = set()

    def die_then_restart() -> bool:
        if api.alive():
            return False
        deaths.append(api.returncode)
        if len(deaths) == 1:
            queued_at_first_death.update(topo.queued())
            topo.resume_executor(0)
            topo.resume_executor(1)
        fault = plan[len(deaths)] if len(deaths) < len(plan) else None
        topo.start_api({"AX_FAULT_POINT": fault} if fault else None)
        return True

    # The API stops while the executors can still answer its goodbye: a paused gRPC
    # client holds the server's graceful stop for its whole grace (10 s).
    api.stop()
    topo.pause_executor(0)
    topo.pause_executor(1)
    try:
        topo.start_api({"AX_FAULT_POINT": plan[0]})
        found, elapsed = run_batch(topo, client, "api-kill",
                                   [(f"death-{i}", die_then_restart) for i in range(3)])
    finally:
        topo.resume_executor(0)
        topo.resume_executor(1)
        if not api.alive() or len(deaths) < len(plan):
            topo.restart_api()  # leave a healthy API without the fault for the next test
    assert deaths == [-signal.SIGKILL] * 3
    assert api.alive()
    # The 30th task was committed but its entry node never reached Redis; only the
    # reconciler of the restarted API can have enqueued it, and it finished.
    ids = sorted(client.list_tasks(label="batch=api-kill", limit=1000),
                 key=lambda t: t.created_at)
    entry = [(t.task_id, "parse_pdf") in queued_at_first_death for t in ids[:first]]
    assert entry == [True] * (first - 1) + [False]
    assert ids[first - 1].status.value == "SUCCEEDED"
    report("SIGKILL API after commit", found, elapsed, **{
        "API deaths": len(deaths), "entry nodes orphaned by the first death": entry.count(False)})


def test_redis_flushall_mid_run_is_rebuilt_from_etcd(topo: Topology, client: Any) -> None:
    flushes: list[int] = []

    def flush() -> bool:
        flushes.append(batch_progress(client, "flush")[0])
        topo.flush_redis()
        return True

    found, elapsed = run_batch(topo, client, "flush", [
        ("flush-1-wait", progress_at_least(client, "flush", 10)), ("flush-1", flush),
        ("flush-2-wait", progress_at_least(client, "flush", 50)), ("flush-2", flush),
    ])
    assert len(flushes) == 2
    assert all(done < N_TASKS for done in flushes), "a flush came after the batch finished"
    report("Redis FLUSHALL", found, elapsed, flushes=len(flushes),
           **{"tasks final at the flushes": flushes})


def test_etcd_restarted_mid_run_loses_nothing(topo: Topology, client: Any) -> None:
    restarts: list[float] = []
    done_at_restart: list[int] = []

    def restart() -> bool:
        done_at_restart.append(batch_progress(client, "etcd")[0])
        started = time.monotonic()
        topo.restart_etcd()
        restarts.append(round(time.monotonic() - started, 2))
        return True

    found, elapsed = run_batch(topo, client, "etcd", [
        ("restart-1-wait", progress_at_least(client, "etcd", 10)), ("restart-1", restart),
        ("restart-2-wait", progress_at_least(client, "etcd", 50)), ("restart-2", restart),
    ])
    assert len(restarts) == 2
    assert all(done < N_TASKS for done in done_at_restart), "a restart came after the batch"
    report("etcd restart", found, elapsed, restarts=len(restarts),
           **{"etcd down (s)": restarts, "tasks final at the restarts": done_at_restart})


def test_a_paused_executor_past_its_lease_is_refused_as_stale(topo: Topology,
                                                              client: Any) -> None:
    # Executor 1 out of the way, so the sleep node surely runs on executor 0.
    assert topo.executors[1].stop(signal.SIGTERM) == 0
    paused = topo.worker_id(0)
    task = client.submit(SLEEP_DAG, {"seconds": 4}).task_id
    wait_until(lambda: client.get(task)["nodes"]["nap"]["owner"] == paused, 30,
               what="the sleep node claimed by executor 0")
    resumed = False
    started = time.monotonic()
    try:
        topo.pause_executor(0)
        topo.start_executor(1)
        other = topo.worker_id(1)
        ids = submit_batch(client, FINANCIAL, N_TASKS, tag="paused")
        # The lease runs out, the reconciler bumps the fence, executor 1 claims the node.
        wait_until(lambda: client.get(task)["nodes"]["nap"]["owner"] == other, 60,
                   what="the sleep node taken over by executor 1")
        topo.resume_executor(0)
        resumed = True
        wait_until(lambda: batch_progress(client, "paused") == (N_TASKS, N_TASKS),
                   BATCH_TIMEOUT, interval=0.25, what="batch paused finished")
        result = client.wait(task, timeout=60)
        elapsed = time.monotonic() - started
    finally:
        if not resumed:
            topo.resume_executor(0)
    assert result.status == "SUCCEEDED"
    events = client.events(task)
    claims = [(e.fence, e.actor) for e in events if e.kind == "claimed"]
    assert claims[0] == (1, paused)
    assert claims[-1][1] == other and claims[-1][0] > 1
    assert [e.kind for e in events].count("lease_expired") >= 1
    commits = [(e.fence, e.actor) for e in events if e.kind == "committed"]
    assert commits == [claims[-1]]
    # The paused worker woke up and was told its fence is stale: nothing it did counted.
    log = topo.executors[0].output()
    assert re.search(rf"(?:heartbeat|progress|complete) {task}/nap fence=1\b.*: stale", log)
    assert not re.search(rf"complete {task}/nap fence=1 \S+: committed", log)
    found = audit(client, ids, topo)
    assert found.problems(ids, email_nodes=[EMAIL_NODE]) == []
    stale_lines = len(re.findall(r": stale", log))
    report("paused executor", found, elapsed, **{
        "sleep node claims (fence, worker)": claims, "committed at fence": commits[0][0],
        "stale answers to the paused executor": stale_lines})
