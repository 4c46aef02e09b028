"""The ``kubernetes`` runner end to end: etcd + Redis + ``ax api`` + ``ax executor --runner
kubernetes`` against the Kubernetes API stand-in of ``tests/k8s`` (real HTTP, lightkube on
the wire, each Job's container — ``python -m axengine.runners.job_entry`` — a local
process). Every fault case checks that nothing is lost and nothing is committed twice,
and prints its figures (``record_property("summary", …)``).

Also the pure reading of Kubernetes facts (:func:`read_job`), without servers.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from lightkube import Client as KubeClient
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.batch_v1 import Job
from lightkube.resources.core_v1 import Pod, Secret
from lightkube.types import CascadeType

from axengine.engine import ClaimResult
from axengine.runners import job_entry
from axengine.runners.job import JobSettings, build_job, job_name, label_value
from axengine.runners.kubernetes import KubernetesRunner, read_job
from axengine.worker.grpc_client import GrpcEngineClient
from executors.contract import Failure, NodeRequest, Success
from tests.k8s.standin import KubeStandIn
from tests.topology import REPO, Topology, audit, wait_until

IMAGE = "ax:test"
NAMESPACE = "ax-jobs"
EXECUTOR_ID = "k8s-exec-0"
FINANCIAL = REPO / "dags" / "financial_risk_assessment.yaml"
# The example's input names its PDF relative to the repository; a pod's working
# directory is its own, so the test names the same file absolutely.
FINANCIAL_INPUT = {"pdf_url": str(REPO / "dags" / "inputs" / "acme_annual_report.pdf")}
ACME_PATH = ["parse_pdf", "extract_metrics", "assess_risk", "send_medium_risk_email",
             "log_completion"]
MAIL_DAG = """\
name: k8s_mail_{latency}
nodes:
  prepare:
    type: tool_call
    tool: echo
    input: {{n: "{{{{ .input.n }}}}"}}
    next: mail
  mail:
    type: tool_call
    tool: send_email
    input:
      to: risk-team@example.com
      subject: "report {{{{ .input.n }}}}"
      body: "prepared {{{{ .nodes.prepare.output.n }}}}"
    simulate: {{latency: {latency}}}
    timeout: 60
    retry: 2
"""
SLEEP_DAG = """\
name: k8s_sleep
nodes:
  nap:
    type: tool_call
    tool: sleep
    input: "{{ .input.seconds }}"
    timeout: 60
"""


# ---------------------------------------------------------------------- the cluster


class KubeTopology:
    """The topology plus the stand-in and one kubernetes executor."""

    def __init__(self, topology: Topology, kube: KubeStandIn) -> None:
        self.topology = topology
        self.kube = kube

    @property
    def executor(self) -> Any:
        return self.topology.executors[0]

    def jobs_created(self, task_id: str) -> list[Any]:
        """Create requests (any answer) of the Jobs of one task, oldest first."""
        return [r for r in self.kube.requests(verb="create", resource="jobs")
                if (r.body or {}).get("metadata", {}).get("annotations", {})
                .get("ax-task-id") == task_id]

    def deletes(self, names: set[str]) -> list[Any]:
        return [r for r in self.kube.requests(verb="delete", resource="jobs")
                if r.name in names]

    def pods_of(self, task_id: str, node_id: str, *, phase: str | None = None) -> list[Any]:
        return [p for p in self.kube.objects("pods", NAMESPACE)
                if p["metadata"]["labels"].get("ax-task") == label_value(task_id)
                and p["metadata"]["labels"].get("ax-node") == label_value(node_id)
                and phase in (None, p.get("status", {}).get("phase"))]

    def running_pod(self, task_id: str, node_id: str, timeout: float = 20) -> str:
        pods = wait_until(lambda: self.pods_of(task_id, node_id, phase="Running"), timeout,
                          what=f"a running pod of {task_id}/{node_id}")
        return str(pods[0]["metadata"]["name"])


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeTopology]:
    root = tmp_path_factory.mktemp("k8s-runner")
    with KubeStandIn(root / "k8s", namespace=NAMESPACE, python_image=IMAGE) as kube, \
            Topology(executors=0, lease=6.0, reconcile_interval=0.5) as topo:
        # (6 s: the pods heartbeat their leases; under three test workers on two cores a
        # 3 s lease lapsed once and the node got a second Job.)
        settings = {"mail_dir": str(topo.mail_dir),
                    "input_root": str(REPO / "dags" / "inputs")}
        with KubeClient(config=kube.config()) as client:
            client.create(Secret(metadata=ObjectMeta(name="ax-job-token", namespace=NAMESPACE),
                                 stringData={"token": topo.executor_token}))
            client.create(Secret(metadata=ObjectMeta(name="ax-pod-settings",
                                                     namespace=NAMESPACE),
                                 stringData={"settings.json": json.dumps(settings)}))
        job_config = root / "job-settings.yaml"
        job_config.write_text(yaml.safe_dump({
            "namespace": NAMESPACE, "api_address": topo.grpc_target, "default_image": IMAGE,
            "token_secret": "ax-job-token", "ttl_seconds_after_finished": 600}))
        index = topo.add_executor(start=False, worker_id=EXECUTOR_ID)
        proc = topo.executors[index]
        proc.argv += ["--runner", "kubernetes", "--job-config", str(job_config),
                      "--kube-context", kube.context, "--pod-settings-secret",
                      "ax-pod-settings"]
        proc.env["KUBECONFIG"] = str(kube.kubeconfig)
        topo.start_executor(index)
        yield KubeTopology(topo, kube)


@pytest.fixture
def k8s_standin(tmp_path: Any) -> Iterator[KubeStandIn]:
    """The stand-in alone (no ax servers), for the runner driven in-process; named as
    ``tests/k8s``'s fixture so the suite marks its tests alike."""
    with KubeStandIn(tmp_path / "k8s", namespace=NAMESPACE, python_image=IMAGE) as kube:
        yield kube


@pytest.fixture
def client(cluster: KubeTopology) -> Iterator[Any]:
    with cluster.topology.client() as c:
        yield c


def commits(client: Any, task_id: str) -> Counter[str]:
    return Counter(e.node_id for e in client.events(task_id) if e.kind == "committed")


def emails(cluster: KubeTopology, task_id: str) -> int:
    return sum(1 for h in cluster.topology.emails()
               if h.get("X-Ax-Idempotency-Key", "").split(":")[1:2] == [task_id])


# ---------------------------------------------------------------------- acceptance


def test_the_financial_dag_succeeds_through_jobs(cluster: KubeTopology, client: Any,
                                                  record_property: Any) -> None:
    started = time.monotonic()
    task = client.submit(FINANCIAL, FINANCIAL_INPUT).task_id
    result = client.wait(task, timeout=25)
    took = time.monotonic() - started
    assert result.status == "SUCCEEDED", client.get(task)
    assert list(result.path) == ACME_PATH
    found = audit(client, [task], cluster.topology)
    assert found.problems([task], email_nodes=["send_medium_risk_email"]) == []
    created = cluster.jobs_created(task)
    # One Job per node an executor runs (the condition is the API's); none twice.
    nodes = [r.body["metadata"]["annotations"]["ax-node-id"] for r in created]
    assert sorted(nodes) == sorted(["parse_pdf", "extract_metrics",
                                    "send_medium_risk_email", "log_completion"])
    assert all(r.status == 201 for r in created)
    claimed_by = {e.actor for e in client.events(task) if e.kind == "claimed"}
    assert claimed_by == {EXECUTOR_ID}
    job = created[0].body
    env = {v["name"]: v.get("value") for v in
           job["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["AX_LEASE_SECONDS"] == f"{cluster.topology.lease:g}"
    assert env["AX_SETTINGS_FILE"].endswith("settings.json")
    assert job["metadata"]["labels"]["ax-dag"] == client.get(task)["dag_hash"][:63]
    record_property("summary", f"financial DAG SUCCEEDED in {took:.1f}s through "
                    f"{len(created)} Jobs, {found.total_commits} commits, "
                    f"{found.emails[task]} email")


# ---------------------------------------------------------------------- faults


def test_executor_sigkill_while_its_jobs_run(cluster: KubeTopology, client: Any,
                                             record_property: Any) -> None:
    tasks = [client.submit(MAIL_DAG.format(latency=4), {"n": i}).task_id for i in range(2)]
    for task in tasks:
        cluster.running_pod(task, "mail")
    cluster.topology.kill_executor(0)
    killed_at = time.monotonic()
    # The pods keep heartbeating under their fences: the nodes stay RUNNING, leased.
    cluster.topology.start_executor(0)
    results = [client.wait(t, timeout=25) for t in tasks]
    took = time.monotonic() - killed_at
    assert [r.status for r in results] == ["SUCCEEDED"] * 2
    found = audit(client, tasks, cluster.topology)
    assert found.problems(tasks, email_nodes=["mail"]) == []
    for task in tasks:
        mail_jobs = [r for r in cluster.jobs_created(task)
                     if r.body["metadata"]["annotations"]["ax-node-id"] == "mail"]
        assert len(mail_jobs) == 1, "a second Job for the same node"
        assert emails(cluster, task) == 1
        mail = client.get(task)["nodes"]["mail"]
        assert (mail["attempt"], mail["fence"]) == (1, 1)
    # No lease lapsed, nothing was claimed again; the dead executor's items were acked.
    assert found.lease_expiries == 0 and found.claims == 4
    wait_until(lambda: not {i for i in cluster.topology.queued() if i[0] in tasks}, 10,
               what="the dead executor's items acked")
    record_property("summary", f"executor SIGKILLed with 2 mail Jobs running; their pods "
                    f"committed {took:.1f}s later: 1 Job, 1 commit, 1 email per node, "
                    f"{found.lease_expiries} lease expiries, {found.claims} claims for 4 "
                    "nodes, queue empty")


def test_executor_sigterm_leaves_its_jobs_running(cluster: KubeTopology, client: Any,
                                                  record_property: Any) -> None:
    """A rolling restart: SIGTERM stops the executor at once, without waiting its grace
    or deleting Jobs; the pods commit by themselves; nothing runs twice."""
    task = client.submit(MAIL_DAG.format(latency=4), {"n": 20}).task_id
    pod = cluster.running_pod(task, "mail")
    executor = cluster.executor
    stopping = time.monotonic()
    code = executor.stop(signal.SIGTERM)
    stopped_in = time.monotonic() - stopping
    assert code == 0, executor.output()[-2000:]
    output = executor.output()
    # The mail Job, and perhaps the prepare Job whose commit it was reading.
    assert re.search(r"stopped \(graceful, left [12] running\)", output), output[-2000:]
    # The Job was not deleted and its pod goes on: it commits with the first fence.
    assert not cluster.deletes({r.name for r in cluster.jobs_created(task)})
    try:
        result = client.wait(task, timeout=25)
    finally:
        cluster.topology.start_executor(0)
    assert result.status == "SUCCEEDED"
    mail = client.get(task)["nodes"]["mail"]
    assert (mail["attempt"], mail["fence"]) == (1, 1)
    assert emails(cluster, task) == 1
    assert cluster.kube.process(pod).exit_code == 0
    record_property("summary", f"executor SIGTERMed with a 4 s mail Job running: stopped in "
                    f"{stopped_in:.1f}s (grace {cluster.topology.grace:g}s not waited), Job "
                    f"not deleted, its pod committed (attempt 1, fence 1), 1 email")


def test_a_pod_killed_137_fails_the_attempt_and_the_retry_succeeds(
        cluster: KubeTopology, client: Any, record_property: Any) -> None:
    task = client.submit(MAIL_DAG.format(latency=3), {"n": 10}).task_id
    pod = cluster.running_pod(task, "mail")
    cluster.kube.kill_pod(pod, 9, namespace=NAMESPACE)
    result = client.wait(task, timeout=25)
    assert result.status == "SUCCEEDED"
    events = client.events(task)
    retries = [e for e in events if e.kind == "retry" and e.node_id == "mail"]
    assert len(retries) == 1 and "exited 137" in retries[0].detail
    mail_jobs = [r for r in cluster.jobs_created(task)
                 if r.body["metadata"]["annotations"]["ax-node-id"] == "mail"]
    assert [r.body["metadata"]["labels"]["ax-fence"] for r in mail_jobs] == ["1", "2"]
    assert commits(client, task) == Counter({"prepare": 1, "mail": 1})
    assert emails(cluster, task) == 1
    assert client.get(task)["nodes"]["mail"]["attempt"] == 2
    record_property("summary", f"pod {pod} SIGKILLed (exit 137): '{retries[0].detail}'; "
                    f"retried under fence 2 → SUCCEEDED, 2 Jobs, 1 commit, 1 email")


def test_oom_killed_pod_is_a_retryable_failure(cluster: KubeTopology, client: Any,
                                               record_property: Any) -> None:
    # Armed before the submit: the executor may start the pod before submit() returns
    # (the tests of this module run one at a time, so the next "nap" pod is this task's).
    cluster.kube.oom_next(lambda pod: pod["metadata"]["labels"].get("ax-node")
                          == label_value("nap"))
    task = client.submit(SLEEP_DAG, {"seconds": 0.2}).task_id
    result = client.wait(task, timeout=25)
    assert result.status == "SUCCEEDED"
    retry = next(e for e in client.events(task) if e.kind == "retry")
    assert "OOMKilled (exit 137)" in retry.detail and "512Mi" in retry.detail
    assert commits(client, task) == Counter({"nap": 1})
    said = retry.detail.split(": ", 1)[1]
    record_property("summary", f"OOMKilled → '{said}' → retried, SUCCEEDED, 1 commit")


def test_image_pull_error_keeps_the_node_waiting_without_spending_attempts(
        cluster: KubeTopology, client: Any, record_property: Any) -> None:
    kube = cluster.kube
    kube.fail_image_pull(IMAGE)
    try:
        task = client.submit(SLEEP_DAG, {"seconds": 0.2}).task_id
        wait_until(lambda: any(e.kind == "unavailable" for e in client.events(task)), 20,
                   what="the node handed back as unavailable")
        node = client.get(task)["nodes"]["nap"]
        assert node["state"] == "WAITING" and "ImagePull" in node["evidence"]
    finally:
        kube.fail_image_pull(IMAGE, failing=False)
    result = client.wait(task, timeout=25)
    assert result.status == "SUCCEEDED"
    events = client.events(task)
    unavailable = [e for e in events if e.kind == "unavailable"]
    created = cluster.jobs_created(task)
    names = {r.body["metadata"]["name"] for r in created}
    deleted = cluster.deletes(names)
    assert len(deleted) >= len(unavailable) >= 1
    assert all(r.query.get("propagationPolicy") == "Background" for r in deleted)
    committed = next(e for e in events if e.kind == "committed")
    assert client.get(task)["nodes"]["nap"]["attempt"] == 1  # no attempt spent
    assert commits(client, task) == Counter({"nap": 1})
    record_property("summary", f"image pull failing: {len(unavailable)} hand-back(s) "
                    f"(WAITING, attempt stays 1), {len(deleted)} Job(s) deleted "
                    f"(Background); recovered → SUCCEEDED under fence {committed.fence}")


def test_refusals_on_create_and_scheduling_hand_the_node_back(
        cluster: KubeTopology, client: Any, record_property: Any) -> None:
    kube = cluster.kube
    kube.forbid("create", "jobs", 'jobs "x" is forbidden: exceeded quota: ax-quota, '
                "requested: count/jobs.batch=1, used: count/jobs.batch=10, limited: "
                "count/jobs.batch=10")
    try:
        quota = client.submit(SLEEP_DAG, {"seconds": 0.1}).task_id
        wait_until(lambda: any(e.kind == "unavailable" for e in client.events(quota)), 20,
                   what="a quota hand-back")
    finally:
        kube.allow("create", "jobs")
    kube.unschedulable(True)
    try:
        pending = client.submit(SLEEP_DAG, {"seconds": 0.1}).task_id
        wait_until(lambda: any(e.kind == "unavailable" for e in client.events(pending)), 20,
                   what="an unschedulable hand-back")
    finally:
        kube.unschedulable(False)
    for task in (quota, pending):
        assert client.wait(task, timeout=25).status == "SUCCEEDED"
        assert client.get(task)["nodes"]["nap"]["attempt"] == 1
        assert commits(client, task) == Counter({"nap": 1})
    evidence = {t: [e.detail for e in client.events(t) if e.kind == "unavailable"]
                for t in (quota, pending)}
    assert all("kubernetes:quota" in d and "exceeded quota" in d for d in evidence[quota])
    assert all("kubernetes:unschedulable" in d and "Unschedulable" in d
               for d in evidence[pending])
    record_property("summary", f"quota 403 → {len(evidence[quota])} hand-back(s), "
                    f"Unschedulable → {len(evidence[pending])}; attempts unspent, both "
                    "SUCCEEDED with 1 commit")


def test_a_stale_fence_deletes_the_job_and_its_late_completion_is_refused(
        cluster: KubeTopology, client: Any, record_property: Any) -> None:
    task = client.submit(SLEEP_DAG, {"seconds": 30}).task_id
    pod = cluster.running_pod(task, "nap")
    created = cluster.jobs_created(task)
    assert len(created) == 1
    job = created[0].body
    name = job["metadata"]["name"]
    fence = int(job["metadata"]["labels"]["ax-fence"])
    client.cancel(task, reason="fence the Job out")
    started = time.monotonic()
    deleted = wait_until(lambda: cluster.deletes({name}), 15, what=f"job {name} deleted")
    stopped_in = time.monotonic() - started
    assert [r.query.get("propagationPolicy") for r in deleted] == ["Background"]
    cluster.kube.wait_until(lambda: not cluster.kube.process(
        pod, namespace=NAMESPACE).running, timeout=15)
    assert not [j for j in cluster.kube.objects("jobs", NAMESPACE)
                if j["metadata"]["name"] == name]

    # The late completion of the fenced-out run, and the container started again.
    async def late() -> str:
        async with GrpcEngineClient(cluster.topology.grpc_target,
                                    token=cluster.topology.executor_token) as c:
            return await c.complete(task, "nap", fence=fence, outcome=Success({"slept": 30}))

    answer = asyncio.run(late())
    assert answer == "stale"
    env = {v["name"]: v["value"] for v in job["spec"]["template"]["spec"]["containers"][0]
           ["env"]}
    token_file = cluster.topology.root / "executor.token"
    rerun = subprocess.run(
        [sys.executable, "-m", "axengine.runners.job_entry"], cwd=REPO, text=True,
        capture_output=True, timeout=20,
        env={"PATH": os.environ.get("PATH", ""), **env, "AX_TOKEN_FILE": str(token_file),
             "AX_SETTINGS_FILE": ""})
    assert rerun.returncode == job_entry.EXIT_STALE, rerun.stderr
    assert client.get(task)["nodes"]["nap"]["state"] == "CANCELLED"
    assert not commits(client, task)
    record_property("summary", f"cancel → Job {name} deleted (Background) "
                    f"{stopped_in:.1f}s later, pod gone; late Complete(fence {fence}): {answer}; "
                    f"container re-run exit {rerun.returncode}")


def test_dropped_watches_and_410_relist_without_missing_a_transition(
        cluster: KubeTopology, client: Any, record_property: Any) -> None:
    kube = cluster.kube
    task = client.submit(SLEEP_DAG, {"seconds": 2}).task_id
    pod = cluster.running_pod(task, "nap")
    lists_before = len(kube.requests(verb="list", resource="jobs"))
    dropped = kube.drop_watches()
    kube.compact()
    # The pod finishes while the watches are being re-established against a compacted
    # history: its Complete is only learnt by relisting.
    kube.wait_until(lambda: not kube.process(pod, namespace=NAMESPACE).running, 15)
    kube.compact()
    dropped += kube.drop_watches()
    result = client.wait(task, timeout=20)
    assert result.status == "SUCCEEDED"
    assert commits(client, task) == Counter({"nap": 1})
    assert len(cluster.jobs_created(task)) == 1
    relists = len(kube.requests(verb="list", resource="jobs")) - lists_before
    assert relists >= 1
    log = [line for line in cluster.executor.output().splitlines() if "relisting" in line]
    gone = sum("410" in line for line in log)
    record_property("summary", f"{dropped} watch streams dropped and history compacted "
                    f"twice; {relists} Job relist(s); executor relisted {len(log)} times "
                    f"({gone} after a 410); the Job's completion seen, 1 commit, no "
                    "second Job")


# ---------------------------------------------------------------------- adoption, GC


class FakeControl:
    """The control plane's answer to ``get_run``: the fences that hold."""

    def __init__(self, holding: set[tuple[str, str, int]]) -> None:
        self.holding = holding
        self.asked: list[tuple[str, str, int]] = []

    async def get_run(self, task_id: str, node_id: str, *, fence: int) -> ClaimResult | None:
        self.asked.append((task_id, node_id, fence))
        if (task_id, node_id, fence) in self.holding:
            return ClaimResult("claimed", dag_hash="d" * 64)
        return None


def request_of(task_id: str, node_id: str, fence: int) -> NodeRequest:
    return NodeRequest(task_id=task_id, node_id=node_id, node_type="tool_call", attempt=fence,
                       fence=fence, config={"tool": "sleep", "timeout": 30}, input=1)


def test_create_adopts_its_own_claims_job_and_gc_deletes_stale_and_expired_jobs(
        k8s_standin: KubeStandIn, record_property: Any) -> None:
    settings = JobSettings(namespace=NAMESPACE, api_address="127.0.0.1:9",
                           default_image=IMAGE, ttl_seconds_after_finished=0)

    async def scenario(kube: KubeStandIn) -> dict[str, Any]:
        seen: dict[str, Any] = {}
        control = FakeControl({("t-gc", "n", 2)})
        runner = KubernetesRunner(settings, client=kube.client(), control=control)
        try:
            # A finished Job: its pod cannot reach the API and is killed.
            done = build_job(request_of("t-old", "n", 1), settings=settings, dag_hash="d")
            await runner._create(done, request_of("t-old", "n", 1))
            pod = wait_until(lambda: [p["metadata"]["name"] for p in kube.objects(
                "pods", NAMESPACE) if p.get("status", {}).get("phase") == "Running"], 15,
                what="the old Job's pod running")[0]
            kube.kill_pod(pod, 9, namespace=NAMESPACE)
            kube.wait_until(lambda: any(c["type"] == "Failed" for j in kube.objects(
                "jobs", NAMESPACE) for c in j.get("status", {}).get("conditions", [])))
            kube.hold_starts(True)
            for fence in (1, 2):
                manifest = build_job(request_of("t-gc", "n", fence), settings=settings,
                                     dag_hash="d")
                seen[f"create{fence}"] = await runner._create(manifest,
                                                              request_of("t-gc", "n", fence))
            # The same claim creating again (its first reply was lost): adopted.
            again = build_job(request_of("t-gc", "n", 2), settings=settings, dag_hash="d")
            seen["again"] = await runner._create(again, request_of("t-gc", "n", 2))
            # A Job under this claim's name that another run made: never adopted.
            other = build_job(request_of("t-gc", "n", 3), settings=settings, dag_hash="d")
            other["metadata"]["labels"]["ax-fence"] = "4"
            async with kube.client() as direct:
                await direct.create(Job.from_dict(other))
            seen["foreign"] = await runner._create(
                build_job(request_of("t-gc", "n", 3), settings=settings, dag_hash="d"),
                request_of("t-gc", "n", 3))
            seen["gc"] = await runner.collect_garbage()
            seen["left"] = sorted(j["metadata"]["labels"]["ax-fence"] + "/" +
                                  j["metadata"]["annotations"]["ax-task-id"]
                                  for j in kube.objects("jobs", NAMESPACE))
            seen["counts"] = (runner.created, runner.adopted, runner.deleted)
        finally:
            kube.release()
            await runner.close()
        return seen

    kube = k8s_standin
    with KubeClient(config=kube.config()) as client:
        client.create(Secret(metadata=ObjectMeta(name="ax-job-token", namespace=NAMESPACE),
                             stringData={"token": "t"}))
    seen = asyncio.run(scenario(kube))
    deletes = kube.requests(verb="delete", resource="jobs")
    assert (seen["create1"], seen["create2"], seen["again"]) == (None, None, None)
    assert isinstance(seen["foreign"], Failure) and "not adopted" in seen["foreign"].message
    assert seen["gc"] == {"stale": 2, "expired": 1}
    assert seen["left"] == ["2/t-gc"]
    assert seen["counts"] == (3, 1, 3)
    assert {r.query.get("propagationPolicy") for r in deletes} == {"Background"}
    record_property("summary", f"created {seen['counts'][0]}, adopted {seen['counts'][1]} "
                    f"(409 of its own claim), refused 1 foreign Job; GC deleted "
                    f"{seen['gc']['stale']} stale + {seen['gc']['expired']} expired, kept "
                    "the one whose fence holds")


def test_a_410_after_compaction_relists_and_the_cache_stays_true(
        k8s_standin: KubeStandIn, record_property: Any) -> None:
    settings = JobSettings(namespace=NAMESPACE, api_address="127.0.0.1:9",
                           default_image=IMAGE)

    async def scenario(kube: KubeStandIn) -> dict[str, Any]:
        runner = KubernetesRunner(settings, client=kube.client(), watch_timeout=1)

        async def until(condition: Any, what: str) -> None:
            async with asyncio.timeout(15):
                while True:
                    change = runner._change  # set by the informers on every change
                    if condition():
                        return
                    await change.wait()

        def cached() -> set[str]:
            return set(runner._informers["jobs"].objects)

        names = [job_name(f"t-{i}", "n", 1) for i in range(3)]
        try:
            await runner._start()
            async with kube.client() as direct:
                await direct.create(Job.from_dict(build_job(
                    request_of("t-0", "n", 1), settings=settings, dag_hash="d")))
                await until(lambda: cached() == {names[0]}, "job 0 cached")
                # Writes the Job watch does not see move the version on; compacting
                # then leaves the watch's last version behind: its next resume is a 410.
                await direct.create(Secret(metadata=ObjectMeta(name="bump",
                                                               namespace=NAMESPACE)))
                kube.compact()
                await until(lambda: runner.expired >= 1, "a 410")
                await direct.delete(Job, names[0], namespace=NAMESPACE,
                                    cascade=CascadeType.BACKGROUND)
                for i in (1, 2):
                    await direct.create(Job.from_dict(build_job(
                        request_of(f"t-{i}", "n", 1), settings=settings, dag_hash="d")))
                await until(lambda: cached() == set(names[1:]), "the cache after")
            return {"expired": runner.expired, "relists": runner.relists,
                    "cached": sorted(cached())}
        finally:
            await runner.close()

    kube = k8s_standin
    kube.hold_starts(True)
    seen = asyncio.run(scenario(kube))
    watches = kube.requests(verb="watch", resource="jobs")
    assert seen["expired"] >= 1 and seen["relists"] >= 1
    assert seen["cached"] == sorted(job_name(f"t-{i}", "n", 1) for i in (1, 2))
    resumed = [r for r in watches if r.query.get("resourceVersion")]
    record_property("summary", f"{len(watches)} Job watches ({len(resumed)} with a "
                    f"resourceVersion), {seen['expired']} answered 410 → "
                    f"{seen['relists']} relist(s); cache = the cluster's Jobs")


# ---------------------------------------------------------------------- pure facts


def _job(**status: Any) -> Job:
    return Job.from_dict({"metadata": {"name": "ax-t-n-1-abc"}, "status": status})


def _pod(phase: str, *, state: dict[str, Any] | None = None,
         conditions: list[dict[str, Any]] | None = None) -> Pod:
    status: dict[str, Any] = {"phase": phase, "conditions": conditions or []}
    if state is not None:
        status["containerStatuses"] = [{"name": "node", "image": IMAGE, "imageID": "",
                                        "ready": False, "restartCount": 0, "state": state}]
    return Pod.from_dict({"metadata": {"name": "ax-t-n-1-abc-xyz12"}, "status": status})


def _cond(kind: str, reason: str = "", message: str = "") -> dict[str, Any]:
    return {"type": kind, "status": "True", "reason": reason, "message": message}


@pytest.mark.parametrize(("job", "pods", "kind", "exit_code"), [
    (_job(), [_pod("Pending")], "running", None),
    (_job(), [_pod("Running", state={"running": {}})], "running", None),
    (_job(conditions=[_cond("SuccessCriteriaMet")]), [], "complete", 0),
    (_job(conditions=[_cond("Complete")]),
     [_pod("Succeeded", state={"terminated": {"exitCode": 0, "reason": "Completed"}})],
     "complete", 0),
    (_job(), [_pod("Succeeded", state={"terminated": {"exitCode": 0}})], "complete", 0),
    (_job(), [_pod("Failed", state={"terminated": {"exitCode": 137, "reason": "Error"}})],
     "failed", 137),
    (_job(conditions=[_cond("Failed", "BackoffLimitExceeded")]),
     [_pod("Failed", state={"terminated": {"exitCode": 137, "reason": "OOMKilled"}})],
     "oom", 137),
    (_job(conditions=[_cond("FailureTarget", "DeadlineExceeded")]),
     [_pod("Running", state={"running": {}})], "deadline", None),
    (_job(conditions=[_cond("Failed", "BackoffLimitExceeded")]), [], "failed", None),
    (_job(), [_pod("Pending", state={"waiting": {"reason": "ImagePullBackOff",
                                                 "message": "back-off pulling"}})],
     "image-pull", None),
    (_job(), [_pod("Pending", state={"waiting": {"reason": "InvalidImageName"}})],
     "image-pull", None),
    (_job(), [_pod("Pending", state={"waiting": {"reason": "ContainerCreating"}})],
     "running", None),
    (_job(), [_pod("Pending", conditions=[{"type": "PodScheduled", "status": "False",
                                           "reason": "Unschedulable", "message": "0/1"}])],
     "unschedulable", None),
    (None, [], "gone", None),
])
def test_read_job_maps_kubernetes_facts(job: Job | None, pods: list[Pod], kind: str,
                                        exit_code: int | None) -> None:
    fact = read_job(job, pods)
    assert (fact.kind, fact.exit_code) == (kind, exit_code)
