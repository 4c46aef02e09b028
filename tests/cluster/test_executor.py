"""``ax executor`` processes and their gRPC client against a real ``ax api``.

Two topologies: ``cluster`` (API + two executors: the financial DAG end to end) and
``bare`` (API, no executor: the test drives the ExecutorService itself with
:class:`GrpcEngineClient`, or starts one executor of its own to shut it down).
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from axengine.config import AxConfig
from axengine.dag import load_dag_mapping
from axengine.errors import ApiUnavailable, Forbidden, NotFound, Unauthorized
from axengine.records import NodeState
from axengine.wiring import build_runtime
from axengine.worker import _process
from axengine.worker._process import Executor, ShutdownReport
from axengine.worker.grpc_client import GrpcEngineClient
from executors.contract import Failure, NodeContext, NodeRequest, Outcome, Success, Unavailable
from tests.topology import REPO, Topology, audit, submit_batch, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

FINANCIAL = REPO / "dags" / "financial_risk_assessment.yaml"
ACME_PATH = ["parse_pdf", "extract_metrics", "assess_risk", "send_medium_risk_email",
             "log_completion"]
SLEEP_DAG = """\
name: executor_sleep
nodes:
  nap:
    type: tool_call
    tool: sleep
    input: "{{ .input.seconds }}"
    timeout: 120
    retry: 3
"""


@pytest.fixture(scope="module")
def cluster() -> Iterator[Topology]:
    with Topology(executors=2, concurrency=4, lease=5.0) as topo:
        yield topo


@pytest.fixture(scope="module")
def bare() -> Iterator[Topology]:
    with Topology(executors=0, lease=5.0) as topo:
        yield topo


@pytest.fixture
def bare_client(bare: Topology) -> Iterator[Any]:
    with bare.client() as client:
        yield client


def node(client: Any, task_id: str, node_id: str) -> dict[str, Any]:
    return dict(client.get(task_id)["nodes"][node_id])


# ---------------------------------------------------------------------- cluster


def test_financial_dag_completes_through_the_api_and_two_executors(cluster: Topology) -> None:
    with cluster.client() as client:
        ids = submit_batch(client, FINANCIAL, 12, tag="two-executors")
        results = [client.wait(t, timeout=90) for t in ids]
        assert [r.status for r in results] == ["SUCCEEDED"] * len(ids)
        assert all(list(r.path) == ACME_PATH for r in results)
        found = audit(client, ids, cluster)
        assert found.problems(ids, email_nodes=["send_medium_risk_email"]) == []
        assert found.total_commits == len(ids) * len(ACME_PATH)
        # Four nodes run on executors; the API decides the condition itself.
        assert found.claims == len(ids) * 4
        workers = {e.actor for t in ids for e in client.events(t) if e.kind == "claimed"}
    assert workers == {cluster.worker_id(0), cluster.worker_id(1)}
    # Every queue item was acknowledged: by its executor once its node ran, or by the
    # API with the push after the commit that claimed it for an executor's slot.
    wait_until(lambda: not cluster.queued(), 10, what="no item left in Redis")


def test_a_map_and_a_loop_run_through_the_api_and_two_executors(cluster: Topology) -> None:
    """dags/report_digest.yaml: a 9-item map whose items the two executors share, and a
    loop that drafts twice; each item and each visit committed once, under its fence."""
    from collections import Counter

    with cluster.client() as client:
        ids = submit_batch(client, REPO / "dags" / "report_digest.yaml", 4, tag="map-loop")
        results = [client.wait(t, timeout=90) for t in ids]
        assert [r.status for r in results] == ["SUCCEEDED"] * len(ids)
        items = [f"summarise_sections[{i}]" for i in range(9)]
        for result in results:
            assert [n for n in result.path if "[" not in n] == [
                "parse_report", "summarise_sections", "draft_digest", "review_digest",
                "draft_digest", "review_digest", "publish_digest"]
            assert sorted(n for n in result.path if "[" in n) == sorted(items)
            assert len(result.outputs["summarise_sections"]) == 9
            assert result.states["draft_digest#1"] == "SUCCEEDED"
        found = audit(client, ids, cluster)
        assert found.fence_violations == []
        for task_id, result in zip(ids, results, strict=True):
            commits = Counter({n: c for (t, n), c in found.commits.items() if t == task_id})
            assert commits == Counter(result.path)
        workers = {e.actor for t in ids for e in client.events(t)
                   if e.kind == "claimed" and "[" in e.node_id}
    assert workers == {cluster.worker_id(0), cluster.worker_id(1)}


def test_each_executor_announces_its_worker_id(cluster: Topology) -> None:
    host = os.uname().nodename
    for index, proc in enumerate(cluster.executors):
        assert re.fullmatch(rf"w:{re.escape(host)}:{proc.pid}:[0-9a-f]{{6}}",
                            cluster.worker_id(index))
    named = cluster.add_executor(worker_id="exec-named", grace=1.0)
    try:
        assert cluster.worker_id(named) == "exec-named"
        assert "serving api " + cluster.grpc_target in cluster.executors[named].output()
    finally:
        code = cluster.executors[named].stop(signal.SIGTERM)
    assert code == 0
    assert "ax executor: worker exec-named stopped (graceful)" in \
        cluster.executors[named].output()


CHAIN_DAG = """\
name: executor_take_chain
nodes:
  first:
    type: tool_call
    tool: echo
    input: "{{ .input.n }}"
    next: [second]
  second:
    type: tool_call
    tool: echo
    input: "{{ .nodes.first.output }}"
"""


def test_an_idle_executor_takes_a_new_tasks_first_node_in_the_submits_transaction(
        cluster: Topology) -> None:
    # Executors with a slot free wait at the API (Take): a submit there claims its
    # first node for one of them in its own transaction. The claim then carries the
    # submit's clock: the same `at` as `submitted` (through the queue, a Claim of its
    # own comes later). The first task may find no Take waiting yet.
    with cluster.client() as client:
        taken = []
        for n in range(6):
            task_id = client.submit(CHAIN_DAG, {"n": n}).task_id
            result = client.wait(task_id, timeout=60)
            assert result.status == "SUCCEEDED" and result.outputs["second"] == n
            events = client.events(task_id)
            submitted = next(e.at for e in events if e.kind == "submitted")
            claimed = [e.at for e in events if e.kind == "claimed" and e.node_id == "first"]
            assert len(claimed) == 1, events  # claimed once: no second attempt
            taken.append(claimed[0] == submitted)
    assert sum(taken[1:]) == 5, taken


def _api_metric(topology: Topology, name: str, **labels: str) -> float | None:
    """One sample of the API server's ``/metrics``."""
    text = httpx.get(f"{topology.api_url}/metrics", timeout=10).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return float(sample.value)
    return None


def test_a_take_waits_for_a_submit_and_runs_its_claim_under_the_fence(
        bare: Topology, bare_client: Any) -> None:
    claimed_before = _api_metric(bare, "ax_api_takes_total", result="claimed") or 0.0
    async def scenario() -> dict[str, Any]:
        seen: dict[str, Any] = {}
        async with GrpcEngineClient(bare.grpc_target, token=bare.executor_token) as c:
            # Nothing submitted: the wait ends with no claim.
            began = time.monotonic()
            seen["idle"] = await c.take(worker="w-take", lanes=["default"],
                                        wait_seconds=0.3)
            seen["idle_took"] = time.monotonic() - began
            # A lane the task's node is not in: the submit goes through the queue.
            other = asyncio.ensure_future(c.take(worker="w-fast", lanes=["fast"],
                                                 wait_seconds=1.0, lease_seconds=5))
            take = asyncio.ensure_future(c.take(worker="w-take", lanes=["default"],
                                                wait_seconds=20, lease_seconds=5))
            await asyncio.to_thread(wait_until, lambda: _api_metric(
                bare, "ax_api_takes_waiting") == 2, 10, what="two Takes waiting at the API")
            seen["task"] = await asyncio.to_thread(
                lambda: bare_client.submit(CHAIN_DAG, {"n": 7}).task_id)
            claim = seen["claim"] = await take
            seen["other"] = await other
            request = claim.request
            seen["late"] = await c.complete(request.task_id, request.node_id,
                                            fence=request.fence - 1, outcome=Success(0))
            seen["done"] = await c.complete(request.task_id, request.node_id,
                                            fence=request.fence, outcome=Success(7))
        return seen

    seen = asyncio.run(scenario())
    assert seen["idle"] is None and seen["idle_took"] >= 0.3
    claim = seen["claim"]
    assert claim is not None and claim.result == "claimed"
    assert (claim.request.task_id, claim.request.node_id) == (seen["task"], "first")
    assert claim.request.input == 7 and claim.request.fence >= 1
    # Not for the Take of the fast lane, which went on waiting and ended empty.
    assert seen["other"] is None
    assert seen["late"] == "stale" and seen["done"] == "committed"
    snap = node(bare_client, seen["task"], "first")
    assert snap["state"] == NodeState.SUCCEEDED and snap["owner"] == "w-take"
    assert snap["output"] == 7
    # Claimed in the submit's transaction: the same clock as `submitted`.
    events = bare_client.events(seen["task"])
    assert next(e.at for e in events if e.kind == "claimed") == \
        next(e.at for e in events if e.kind == "submitted")
    assert _api_metric(bare, "ax_api_takes_total", result="claimed") == claimed_before + 1
    assert _api_metric(bare, "ax_api_takes_waiting") == 0


# ---------------------------------------------------------------------- protocol


def test_a_late_worker_is_fenced_out_and_a_repeat_is_already_done(
        bare: Topology, bare_client: Any) -> None:
    task = bare_client.submit(SLEEP_DAG, {"seconds": 5}).task_id

    async def scenario() -> dict[str, Any]:
        seen: dict[str, Any] = {}
        async with GrpcEngineClient(bare.grpc_target, token=bare.executor_token) as a, \
                GrpcEngineClient(bare.grpc_target, token=bare.executor_token) as b:
            first = await a.claim(task, "nap", worker="worker-a", lease_seconds=1.0)
            seen["first"] = first
            seen["b_early"] = await b.claim(task, "nap", worker="worker-b")
            seen["a_beat"] = await a.heartbeat(task, "nap", fence=first.request.fence,
                                               lease_seconds=1.0)
            end = time.monotonic() + 20
            second = await b.claim(task, "nap", worker="worker-b", lease_seconds=30)
            while second.result != "claimed" and time.monotonic() < end:
                await asyncio.sleep(0.1)  # polling the condition: A's lease has run out
                second = await b.claim(task, "nap", worker="worker-b", lease_seconds=30)
            seen["second"] = second
            out = Success({"slept": 5})
            seen["a_beat_late"] = await a.heartbeat(task, "nap", fence=first.request.fence)
            seen["a_late"] = await a.complete(task, "nap", fence=first.request.fence,
                                              outcome=out)
            seen["b_done"] = await b.complete(task, "nap", fence=second.request.fence,
                                              outcome=out)
            seen["b_again"] = await b.complete(task, "nap", fence=second.request.fence,
                                               outcome=out)
        return seen

    seen = asyncio.run(scenario())
    first, second = seen["first"], seen["second"]
    assert first.result == "claimed"
    assert (first.request.node_type, first.request.input, first.request.attempt) == (
        "tool_call", 5, 1)
    assert first.request.config["tool"] == "sleep" and first.timeout == 120
    assert seen["b_early"].result == "not-claimable"
    assert seen["a_beat"] == "ok"
    assert second.result == "claimed" and second.request.fence > first.request.fence
    assert (seen["a_beat_late"], seen["a_late"]) == ("stale", "stale")
    assert (seen["b_done"], seen["b_again"]) == ("committed", "already-done")
    events = bare_client.events(task)
    commits = [e for e in events if e.kind == "committed"]
    assert [(e.node_id, e.fence, e.actor) for e in commits] == [
        ("nap", second.request.fence, "worker-b")]
    assert bare_client.get(task)["status"] == "SUCCEEDED"


def test_outcomes_unavailable_refunds_and_failure_backs_off(
        bare: Topology, bare_client: Any) -> None:
    task = bare_client.submit(SLEEP_DAG, {"seconds": 1}).task_id

    async def scenario() -> tuple[str, str, Any]:
        async with GrpcEngineClient(bare.grpc_target, token=bare.executor_token) as c:
            claim = await c.claim(task, "nap", worker="w-out", lease_seconds=10)
            handed = await c.complete(task, "nap", fence=claim.request.fence,
                                      outcome=Unavailable("executor:shutdown", "test"))
            end = time.monotonic() + 20
            again = await c.claim(task, "nap", worker="w-out", lease_seconds=10)
            while again.result != "claimed" and time.monotonic() < end:
                await asyncio.sleep(0.2)  # the unavailable delay
                again = await c.claim(task, "nap", worker="w-out", lease_seconds=10)
            failed = await c.complete(task, "nap", fence=again.request.fence,
                                      outcome=Failure("boom", retryable=True))
            backoff = await c.claim(task, "nap", worker="w-out")
            return handed, failed, (again, backoff)

    try:
        handed, failed, (again, backoff) = asyncio.run(scenario())
        assert (handed, failed) == ("committed", "committed")
        assert again.request.attempt == 1  # the hand-back spent no attempt
        assert backoff.result == "not-claimable" and backoff.reason == "backoff"
        assert backoff.retry_after > 0
        snap = node(bare_client, task, "nap")
        assert snap["state"] == "WAITING" and snap["error"] == "boom"
        kinds = [e.kind for e in bare_client.events(task)]
        assert kinds.count("unavailable") == 1 and kinds.count("retry") == 1
    finally:
        bare_client.cancel(task)


def test_side_effect_outbox_over_grpc(bare: Topology, bare_client: Any) -> None:
    task = bare_client.submit(SLEEP_DAG, {"seconds": 1}).task_id
    key = f"test:{task}:nap"

    async def scenario() -> dict[str, Any]:
        seen: dict[str, Any] = {}
        async with GrpcEngineClient(bare.grpc_target, token=bare.executor_token) as a, \
                GrpcEngineClient(bare.grpc_target, token=bare.executor_token) as b:
            claimed = await a.claim(task, "nap", worker="w-a", lease_seconds=3)
            seen["before"] = await a.effect_get(key)
            fence_a = claimed.request.fence
            seen["begin"] = await a.effect_begin(key, task_id=task, node_id="nap",
                                                 fence=fence_a)
            seen["again"] = await a.effect_begin(key, task_id=task, node_id="nap",
                                                 fence=fence_a)
            seen["done"] = await a.effect_done(key, {"message_id": "m-1"}, task_id=task,
                                               node_id="nap", fence=fence_a)
            seen["after"] = await a.effect_get(key)
            end = time.monotonic() + 20
            taken = await b.claim(task, "nap", worker="w-b", lease_seconds=30)
            while taken.result != "claimed" and time.monotonic() < end:
                await asyncio.sleep(0.1)  # polling the condition: a's lease has run out
                taken = await b.claim(task, "nap", worker="w-b", lease_seconds=30)
            seen["taken"] = taken.result
            seen["stale"] = await a.effect_begin(f"{key}:2", task_id=task, node_id="nap",
                                                 fence=fence_a)
            seen["stale_done"] = await a.effect_done(key, {"message_id": "m-late"},
                                                     task_id=task, node_id="nap",
                                                     fence=fence_a)
            seen["b_view"] = await b.effect_get(key)
            seen["b_new"] = await b.effect_begin(f"{key}:2", task_id=task, node_id="nap",
                                                 fence=taken.request.fence)
        return seen

    try:
        seen = asyncio.run(scenario())
    finally:
        bare_client.cancel(task)
    assert seen["before"] is None
    assert (seen["begin"], seen["again"]) == ("NEW", "SENDING")
    assert seen["after"].state == "DONE" and seen["after"].result == {"message_id": "m-1"}
    assert (seen["after"].task_id, seen["after"].node_id) == (task, "nap")
    assert seen["taken"] == "claimed"
    assert seen["done"] == "ok"
    assert (seen["stale"], seen["stale_done"]) == ("stale", "stale")
    assert seen["b_view"] == seen["after"]  # the late done changed nothing
    assert seen["b_new"] == "NEW"  # a's refused begin changed nothing


def test_grpc_errors_map_to_ax_errors(bare: Topology) -> None:
    async def call(token: str, task: str = "t-missing") -> Any:
        async with GrpcEngineClient(bare.grpc_target, token=token, retry_for=1) as c:
            return await c.claim(task, "nap", worker="w")

    with pytest.raises(Unauthorized):
        asyncio.run(call("not-a-token"))
    with pytest.raises(Forbidden, match="executor"):
        asyncio.run(call(bare.admin_token))
    with pytest.raises(NotFound):
        asyncio.run(call(bare.executor_token))


def test_client_rides_out_an_api_restart_and_gives_up_after_retry_for(
        bare: Topology, bare_client: Any) -> None:
    task = bare_client.submit(SLEEP_DAG, {"seconds": 1}).task_id
    bare.kill_api()
    restarter = threading.Thread(target=bare.start_api)

    async def scenario() -> tuple[str, float, int]:
        async with GrpcEngineClient(bare.grpc_target, token=bare.executor_token,
                                    retry_for=0.5) as short:
            started = time.monotonic()
            try:
                await short.claim(task, "nap", worker="w")
            except ApiUnavailable:
                gave_up = time.monotonic() - started
            else:
                raise AssertionError("a claim succeeded with the API down")
        async with GrpcEngineClient(bare.grpc_target, token=bare.executor_token,
                                    retry_for=60) as patient:
            restarter.start()
            claim = await patient.claim(task, "nap", worker="w", lease_seconds=30)
            await patient.complete(task, "nap", fence=claim.request.fence,
                                   outcome=Success({"slept": 1}))
            return claim.result, gave_up, patient.retries

    try:
        result, gave_up, retries = asyncio.run(scenario())
    finally:
        restarter.join(60)
    assert bare.api is not None and bare.api.alive()
    assert gave_up < 5
    assert result == "claimed" and retries > 0
    assert bare_client.get(task)["status"] == "SUCCEEDED"


# ---------------------------------------------------------------------- shutdown


def _running_on(client: Any, task: str, worker: str) -> bool:
    snap = node(client, task, "nap")
    return bool(snap["state"] == "RUNNING" and snap["owner"] == worker)


def test_sigterm_lets_a_node_finish_within_the_grace_period(
        bare: Topology, bare_client: Any) -> None:
    index = bare.add_executor(grace=20.0)
    proc = bare.executors[index]
    task = bare_client.submit(SLEEP_DAG, {"seconds": 1.5}).task_id
    wait_until(lambda: _running_on(bare_client, task, bare.worker_id(index)), 20,
               what="the node running on the executor")
    started = time.monotonic()
    assert proc.stop(signal.SIGTERM, timeout=30) == 0
    assert time.monotonic() - started < 10
    assert bare_client.get(task)["status"] == "SUCCEEDED"
    kinds = [e.kind for e in bare_client.events(task)]
    assert (kinds.count("claimed"), kinds.count("committed"), kinds.count("unavailable")) == (
        1, 1, 0)
    assert "stopped (graceful)" in proc.output()


def test_nodes_still_running_after_the_grace_are_handed_back_without_an_attempt(
        bare: Topology, bare_client: Any) -> None:
    index = bare.add_executor(grace=0.5)
    proc = bare.executors[index]
    worker = bare.worker_id(index)
    task = bare_client.submit(SLEEP_DAG, {"seconds": 3}).task_id
    wait_until(lambda: _running_on(bare_client, task, worker), 20,
               what="the node running on the executor")
    started = time.monotonic()
    assert proc.stop(signal.SIGTERM, timeout=30) == 0
    assert time.monotonic() - started < 8
    snap = node(bare_client, task, "nap")
    assert snap["state"] == "WAITING" and snap["attempt"] == 0
    assert snap["evidence"].startswith("executor:shutdown: executor " + worker)
    assert "handed back 1" in proc.output()
    assert re.search(rf"handed back {task}/nap fence=1: committed", proc.output())
    # Another executor runs it to the end: attempt 1 again, one commit.
    other = bare.add_executor(grace=20.0)
    try:
        result = bare_client.wait(task, timeout=60)
    finally:
        bare.executors[other].stop()
    assert result.status == "SUCCEEDED"
    events = bare_client.events(task)
    claims = [(e.attempt, e.actor) for e in events if e.kind == "claimed"]
    assert claims == [(1, worker), (1, bare.worker_id(other))]
    assert [e.kind for e in events].count("committed") == 1


def test_a_second_signal_ends_the_grace_period_at_once(
        bare: Topology, bare_client: Any) -> None:
    index = bare.add_executor(grace=60.0)
    proc = bare.executors[index]
    task = bare_client.submit(SLEEP_DAG, {"seconds": 60}).task_id
    try:
        wait_until(lambda: _running_on(bare_client, task, bare.worker_id(index)), 20,
                   what="the node running on the executor")
        started = time.monotonic()
        proc.send(signal.SIGTERM)
        proc.wait_for_line(r"get 60.0s to finish", timeout=10)
        proc.send(signal.SIGINT)
        assert proc.stop(signal.SIGTERM, timeout=30) == 0
        assert time.monotonic() - started < 10
        assert "second SIGINT; ending the grace period now" in proc.output()
        assert node(bare_client, task, "nap")["state"] == "WAITING"
    finally:
        bare_client.cancel(task)


def test_executors_survive_a_redis_outage(cluster: Topology) -> None:
    assert cluster.redis is not None
    procs = cluster.executors[:2]
    pids = [proc.pid for proc in procs]
    cluster.redis.stop()
    try:
        wait_until(lambda: all("queue error" in p.output() for p in procs), 30,
                   what="both executors seeing the queue down")
    finally:
        cluster.redis.start()  # empty: the reconciler re-enqueues from etcd
    with cluster.client() as client:
        ids = submit_batch(client, FINANCIAL, 4, tag="redis-outage")
        results = [client.wait(t, timeout=90) for t in ids]
    assert [r.status for r in results] == ["SUCCEEDED"] * 4
    assert [proc.pid for proc in procs] == pids
    assert all(proc.alive() for proc in procs)
    assert all("restarting the loop" in p.output() for p in procs)


def test_a_handler_that_ignores_cancellation_is_handed_back_then_abandoned(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """In process, on the embedded engine: the hand-back commits, the stuck run is
    cancelled after the settle time, and its late result can no longer count."""
    monkeypatch.setattr(_process, "SETTLE_SECONDS", 0.3)
    started, release = threading.Event(), threading.Event()

    def stubborn(request: NodeRequest, ctx: NodeContext) -> Outcome:
        started.set()
        release.wait(30)  # never looks at ctx.cancelled
        return Success("too late")

    dag = load_dag_mapping({"name": "stubborn", "nodes": {
        "work": {"type": "tool_call", "tool": "echo", "input": "x"}}})

    async def scenario() -> tuple[ShutdownReport, Any, str]:
        runtime = build_runtime(AxConfig(home=tmp_path))
        try:
            engine = runtime.engine
            task = (await engine.submit(dag, {})).task_id
            executor = Executor(engine=engine, queue=runtime.queue, handler=stubborn,
                                grace_seconds=0.2, poll_timeout=0.05)
            stop = asyncio.Event()
            running = asyncio.create_task(executor.run(stop))
            assert await asyncio.to_thread(started.wait, 10)
            stop.set()
            report = await asyncio.wait_for(running, 10)
            snap = (await engine.get_task(task)).snapshots["work"]
            late = await engine.complete(task, "work", fence=1, outcome=Success("too late"))
            return report, snap, late
        finally:
            release.set()
            await runtime.close()

    report, snap, late = asyncio.run(scenario())
    assert not report.graceful
    assert [(n, answer) for _, n, answer in report.handed_back] == [("work", "committed")]
    assert snap.state is NodeState.WAITING and snap.attempt == 0
    assert snap.evidence.startswith("executor:shutdown: executor w:")
    assert late == "stale"


def test_completions_go_over_one_stream_and_a_broken_stream_is_opened_again(
        bare: Topology, bare_client: Any) -> None:
    """The client completes over its ``CompleteStream``; when the API restarts, the
    stream breaks and the next completion is retried over a new one (a repeat is safe:
    it commits once)."""
    first = bare_client.submit(SLEEP_DAG, {"seconds": 1}).task_id
    second = bare_client.submit(SLEEP_DAG, {"seconds": 1}).task_id
    restarter = threading.Thread(target=bare.start_api)

    async def scenario() -> tuple[list[str], int, int]:
        async with GrpcEngineClient(bare.grpc_target, token=bare.executor_token,
                                    retry_for=60) as c:
            a = await c.claim(first, "nap", worker="w", lease_seconds=30)
            b = await c.claim(second, "nap", worker="w", lease_seconds=30)
            answers = [await c.complete(first, "nap", fence=a.request.fence,
                                        outcome=Success({"slept": 1}))]
            streams = c._completions
            assert streams is not None and streams.sent == 1
            bare.kill_api()
            restarter.start()
            answers.append(await c.complete(second, "nap", fence=b.request.fence,
                                            outcome=Success({"slept": 1})))
            return answers, streams.sent, c.retries

    try:
        answers, sent, retries = asyncio.run(scenario())
    finally:
        restarter.join(60)
    assert answers == ["committed", "committed"]
    assert sent >= 2 and retries > 0
    for task in (first, second):
        assert bare_client.get(task)["status"] == "SUCCEEDED"
        commits = [e for e in bare_client.events(task) if e.kind == "committed"]
        assert len(commits) == 1
