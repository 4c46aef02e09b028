"""The Kubernetes stand-in, tested through lightkube's AsyncClient as the runner uses it.

Tests taking ``kube`` hold for a real cluster too (``AX_K8S_CONTEXT``); those taking
``k8s_standin`` test knobs, the request log or stand-in-only strictness.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import signal
import uuid
from collections.abc import AsyncIterable, Callable
from typing import Any

import httpx2
import pytest
from lightkube import ApiError
from lightkube.core.exceptions import ConditionError
from lightkube.models.batch_v1 import JobSpec
from lightkube.models.core_v1 import (
    Container,
    EnvVar,
    EnvVarSource,
    ObjectFieldSelector,
    PodSpec,
    PodTemplateSpec,
    SecretKeySelector,
    SecretVolumeSource,
    Volume,
    VolumeMount,
)
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.batch_v1 import Job
from lightkube.resources.core_v1 import Pod, Secret
from lightkube.types import CascadeType, on_error_retry

from tests.k8s._api import check_schema
from tests.k8s.standin import KubeStandIn, RealCluster

Kube = KubeStandIn | RealCluster
SLEEP = ["python", "-c", "import time; time.sleep(60)"]


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def make_job(kube: Kube, name: str, command: list[str], *,
             container: Container | None = None, volumes: list[Volume] | None = None,
             labels: dict[str, str] | None = None, image: str | None = None,
             **spec: Any) -> Job:
    container = container or Container(name="main", image=image or kube.python_image,
                                       command=command)
    return Job(
        metadata=ObjectMeta(name=name, labels=labels),
        spec=JobSpec(backoffLimit=0, template=PodTemplateSpec(spec=PodSpec(
            restartPolicy="Never", containers=[container], volumes=volumes)), **spec))


def condition(obj: Any, kind: str) -> str | None:
    """The reason of a True condition of ``kind``, "" when it has none, None if absent."""
    for cond in (obj.status.conditions if obj.status else None) or []:
        if cond.type == kind and cond.status == "True":
            return str(cond.reason or "")
    return None


async def until(stream: AsyncIterable[tuple[str, Any]],
                predicate: Callable[[str, Any], bool], timeout: float = 10.0) -> Any:
    """The first watched object for which ``predicate(event, obj)`` holds."""
    async with asyncio.timeout(timeout), contextlib.aclosing(stream) as events:  # type: ignore[type-var]
        async for event, obj in events:
            if predicate(event, obj):
                return obj
    raise AssertionError("the watch ended first")


async def job_pod(client: Any, job: str) -> Pod:
    pods = [pod async for pod in client.list(Pod, labels={"job-name": job})]
    assert len(pods) == 1, pods
    return pods[0]


def finished(_: str, job: Job) -> bool:
    return condition(job, "Complete") is not None or condition(job, "Failed") is not None


def pod_state(pod: Pod) -> Any:
    statuses = pod.status.containerStatuses if pod.status else None
    return statuses[0].state if statuses else None


# --- Jobs run as processes ---------------------------------------------------------------


def test_job_runs_to_complete_and_serves_its_log(kube: Kube) -> None:
    name = unique("hello")

    async def main() -> None:
        async with kube.client() as client:
            await client.create(make_job(kube, name, ["python", "-c", "print('hi')"]))
            seen: list[str] = []

            def complete(_: str, job: Job) -> bool:
                seen.extend(c.type for c in (job.status.conditions or []) if job.status)
                return condition(job, "Complete") is not None

            job = await until(client.watch(Job, fields={"metadata.name": name}), complete)
            assert job.status.succeeded == 1 and job.status.completionTime is not None
            assert "SuccessCriteriaMet" in seen
            pod = await job_pod(client, name)
            assert pod.metadata.labels["batch.kubernetes.io/job-name"] == name
            assert pod.metadata.ownerReferences[0].uid == job.metadata.uid
            assert pod.status.phase == "Succeeded"
            assert pod_state(pod).terminated.reason == "Completed"
            assert [line async for line in client.log(pod.metadata.name)] == ["hi\n"]
            await client.delete(Job, name, cascade=CascadeType.BACKGROUND)

    asyncio.run(main())


def test_nonzero_exit_fails_the_job(kube: Kube) -> None:
    name = unique("exit3")

    async def main() -> None:
        async with kube.client() as client:
            await client.create(make_job(kube, name, ["python", "-c", "raise SystemExit(3)"]))
            with pytest.raises(ConditionError):
                await client.wait(Job, name, for_conditions=["Complete"],
                                  raise_for_conditions=["Failed"])
            job = await client.get(Job, name)
            assert condition(job, "Failed") == "BackoffLimitExceeded"
            assert condition(job, "FailureTarget") == "BackoffLimitExceeded"
            assert job.status.failed == 1 and not job.status.active
            pod = await job_pod(client, name)
            assert pod.status.phase == "Failed"
            terminated = pod_state(pod).terminated
            assert (terminated.exitCode, terminated.reason) == (3, "Error")
            await client.delete(Job, name, cascade=CascadeType.BACKGROUND)

    asyncio.run(main())


def test_active_deadline_fails_the_job_and_kills_the_process(kube: Kube) -> None:
    name = unique("deadline")

    async def main() -> str:
        async with kube.client() as client:
            await client.create(make_job(kube, name, SLEEP, activeDeadlineSeconds=1))
            pod = await until(client.watch(Pod, labels={"job-name": name}),
                              lambda _, p: p.status.phase == "Running")
            job = await until(client.watch(Job, fields={"metadata.name": name}), finished)
            assert condition(job, "Failed") == "DeadlineExceeded"
            assert condition(job, "FailureTarget") == "DeadlineExceeded"
            assert job.status.failed == 1
            assert [pod async for pod in client.list(Pod, labels={"job-name": name})] == []
            await client.delete(Job, name, cascade=CascadeType.BACKGROUND)
            return str(pod.metadata.name)

    pod = asyncio.run(main())
    if isinstance(kube, KubeStandIn):
        process = kube.process(pod)
        assert not process.running and process.exit_code == 128 + signal.SIGTERM
        assert process.pid is not None
        with pytest.raises(ProcessLookupError):
            os.kill(process.pid, 0)


def test_log_follow_streams_until_the_process_exits(k8s_standin: KubeStandIn) -> None:
    kube = k8s_standin

    async def main() -> None:
        async with kube.client() as client:
            await client.create(make_job(kube, "follow", [
                "python", "-c", "print('one', flush=True); print('two')"]))
            pod = await until(client.watch(Pod, labels={"job-name": "follow"}),
                              lambda _, p: p.status.phase != "Pending")
            lines = [line async for line in client.log(pod.metadata.name, follow=True)]
            assert lines == ["one\n", "two\n"]
            tail = [line async for line in client.log(pod.metadata.name, tail_lines=1)]
            assert tail == ["two\n"]

    asyncio.run(main())


def test_missing_executable_is_a_start_error(k8s_standin: KubeStandIn) -> None:
    async def main() -> None:
        async with k8s_standin.client() as client:
            await client.create(make_job(k8s_standin, "noexec", ["/nonexistent/ax-node"]))
            await until(client.watch(Job, fields={"metadata.name": "noexec"}), finished)
            terminated = pod_state(await job_pod(client, "noexec")).terminated
            assert (terminated.exitCode, terminated.reason) == (128, "StartError")

    asyncio.run(main())


# --- what the API refuses ----------------------------------------------------------------


def test_create_twice_is_already_exists(kube: Kube) -> None:
    name = unique("twice")

    async def main() -> None:
        async with kube.client() as client:
            await client.create(make_job(kube, name, SLEEP))
            with pytest.raises(ApiError) as caught:
                await client.create(make_job(kube, name, SLEEP))
            assert (caught.value.status.code, caught.value.status.reason) == (409,
                                                                              "AlreadyExists")
            await client.delete(Job, name, cascade=CascadeType.BACKGROUND)

    asyncio.run(main())
    if isinstance(kube, KubeStandIn):
        assert len(kube.requests(verb="create", resource="jobs", status=201)) == 1


def test_get_of_a_missing_job_is_not_found(kube: Kube) -> None:
    async def main() -> None:
        async with kube.client() as client:
            with pytest.raises(ApiError) as caught:
                await client.get(Job, unique("missing"))
            assert (caught.value.status.code, caught.value.status.reason) == (404, "NotFound")

    asyncio.run(main())


class _ContainerWithTypo(Container, kw_only=True):
    """A container that sends a field Kubernetes does not have."""

    imagePullSecret: str | None = None  # sent when set (lightkube omits defaults)


async def _invalid(kube: Kube, job: Job) -> list[str]:
    """The fields a 422 Invalid answer names."""
    async with kube.client() as client:
        with pytest.raises(ApiError) as caught:
            await client.create(job)
    status = caught.value.status
    assert (status.code, status.reason) == (422, "Invalid"), status
    return [cause.field for cause in status.details.causes]


def test_unknown_field_is_invalid_naming_the_field(k8s_standin: KubeStandIn) -> None:
    container = _ContainerWithTypo(name="main", image="python", command=SLEEP,
                                   imagePullSecret="regcred")
    job = make_job(k8s_standin, "typo", SLEEP, container=container)
    fields = asyncio.run(_invalid(k8s_standin, job))
    assert fields == ["spec.template.spec.containers[0].imagePullSecret"]
    assert k8s_standin.objects("jobs") == []


def test_bad_label_value_and_long_name_are_invalid(kube: Kube) -> None:
    bad_label = make_job(kube, unique("label"), SLEEP, labels={"ax-task": "not valid!"})
    assert asyncio.run(_invalid(kube, bad_label)) == ["metadata.labels"]
    long_name = make_job(kube, "j" * 64, SLEEP)  # the job-name label value would be 64 long
    assert asyncio.run(_invalid(kube, long_name)) == ["spec.template.labels"]


def test_jobs_the_stand_in_cannot_simulate_are_refused(k8s_standin: KubeStandIn) -> None:
    job = make_job(k8s_standin, "retrying", SLEEP)
    job.spec.backoffLimit = 2
    assert asyncio.run(_invalid(k8s_standin, job)) == ["spec.backoffLimit"]


def test_forbid_answers_403(k8s_standin: KubeStandIn) -> None:
    k8s_standin.forbid("create", "jobs", "exceeded quota: ax, requested: count/jobs.batch=1")

    async def main() -> None:
        async with k8s_standin.client() as client:
            with pytest.raises(ApiError) as caught:
                await client.create(make_job(k8s_standin, "quota", SLEEP))
            assert caught.value.status.code == 403
            assert "exceeded quota" in caught.value.status.message

    asyncio.run(main())


# --- resourceVersion and watches ---------------------------------------------------------


def test_watch_replays_history_and_is_gone_after_compaction(k8s_standin: KubeStandIn) -> None:
    kube = k8s_standin
    kube.hold_starts()

    async def main() -> None:
        async with kube.client() as client:
            await client.create(make_job(kube, "first", SLEEP))
            listed = client.list(Job)
            assert [job.metadata.name async for job in listed] == ["first"]
            old = listed.resourceVersion
            await client.create(make_job(kube, "second", SLEEP))
            replay = client.watch(Job, resource_version=old)
            job = await until(replay, lambda event, _: event == "ADDED")
            assert job.metadata.name == "second"

            kube.compact()
            with pytest.raises(ApiError) as caught:
                await until(client.watch(Job, resource_version=old), lambda *_: True)
            assert caught.value.status.code == 410
            # lightkube's retry handler relists on 410: ADDED for all that exists.
            relisted: set[str] = set()
            await until(client.watch(Job, resource_version=old, on_error=on_error_retry),
                        lambda _, job: relisted.add(job.metadata.name) or len(relisted) == 2)

    asyncio.run(main())


def test_drop_watches_ends_streams_abruptly(k8s_standin: KubeStandIn) -> None:
    kube = k8s_standin

    async def main() -> None:
        async with kube.client() as client:
            await client.create(make_job(kube, "watched", ["python", "-c", "pass"]))
            async with contextlib.aclosing(client.watch(Job)) as events:  # type: ignore[type-var]
                assert (await anext(events))[0] == "ADDED"
                assert kube.drop_watches() == 1
                with pytest.raises(httpx2.RemoteProtocolError):
                    async with asyncio.timeout(10):
                        async for _ in events:
                            pass

    asyncio.run(main())


def test_watch_timeout_ends_the_stream(k8s_standin: KubeStandIn) -> None:
    async def main() -> None:
        async with httpx2.AsyncClient(base_url=k8s_standin.url) as http, asyncio.timeout(5), \
                http.stream("GET", "/apis/batch/v1/namespaces/default/jobs",
                            params={"watch": "true", "timeoutSeconds": "1"}) as response:
            assert response.status_code == 200
            assert [line async for line in response.aiter_lines()] == []

    asyncio.run(main())


def test_label_selectors_equality_in_and_not_equal(k8s_standin: KubeStandIn) -> None:
    kube = k8s_standin
    kube.hold_starts()

    async def main() -> None:
        async with kube.client() as client:
            for name, tier in (("a", "x"), ("b", "y"), ("c", "z")):
                await client.create(make_job(kube, name, SLEEP, labels={"tier": tier}))

            async def names(labels: dict[str, Any]) -> list[str]:
                return [job.metadata.name async for job in client.list(Job, labels=labels)]

            assert await names({"tier": "x"}) == ["a"]
            assert await names({"tier": ("x", "z")}) == ["a", "c"]
            from lightkube import operators
            assert await names({"tier": operators.not_equal("x")}) == ["b", "c"]
            pods = [p async for p in client.list(Pod, labels={"job-name": ("a", "b")})]
            assert sorted(p.metadata.labels["job-name"] for p in pods) == ["a", "b"]

    asyncio.run(main())


# --- fault knobs -------------------------------------------------------------------------


def test_image_pull_backoff_until_cleared(k8s_standin: KubeStandIn) -> None:
    kube = k8s_standin
    kube.fail_image_pull("ax/node:broken")

    async def main() -> None:
        async with kube.client() as client:
            await client.create(make_job(kube, "pull", ["python", "-c", "pass"],
                                         image="ax/node:broken"))
            pods = client.watch(Pod, labels={"job-name": "pull"})
            pod = await until(pods, lambda _, p: getattr(
                getattr(pod_state(p), "waiting", None), "reason", None) == "ImagePullBackOff")
            assert pod.status.phase == "Pending"
            with pytest.raises(ApiError) as caught:
                [line async for line in client.log(pod.metadata.name)]
            assert caught.value.status.code == 400
            kube.fail_image_pull("ax/node:broken", failing=False)
            await until(client.watch(Job, fields={"metadata.name": "pull"}),
                        lambda _, job: condition(job, "Complete") is not None)

    asyncio.run(main())


def test_unschedulable_until_off(k8s_standin: KubeStandIn) -> None:
    kube = k8s_standin
    kube.unschedulable()

    async def main() -> None:
        async with kube.client() as client:
            await client.create(make_job(kube, "nowhere", ["python", "-c", "pass"]))
            pod = await until(client.watch(Pod, labels={"job-name": "nowhere"}),
                              lambda _, p: bool(p.status.conditions))
            [scheduled] = pod.status.conditions
            assert (scheduled.type, scheduled.status, scheduled.reason) == (
                "PodScheduled", "False", "Unschedulable")
            kube.unschedulable(False)
            await until(client.watch(Job, fields={"metadata.name": "nowhere"}),
                        lambda _, job: condition(job, "Complete") is not None)

    asyncio.run(main())


def test_oom_next_kills_the_pod_as_oomkilled(k8s_standin: KubeStandIn) -> None:
    kube = k8s_standin
    kube.oom_next("hungry")

    async def main() -> None:
        async with kube.client() as client:
            await client.create(make_job(kube, "hungry-1", SLEEP))
            job = await until(client.watch(Job, fields={"metadata.name": "hungry-1"}),
                              finished)
            assert condition(job, "Failed") == "BackoffLimitExceeded"
            terminated = pod_state(await job_pod(client, "hungry-1")).terminated
            assert (terminated.exitCode, terminated.reason) == (137, "OOMKilled")

    asyncio.run(main())


def test_kill_pod_signals_the_process(k8s_standin: KubeStandIn) -> None:
    kube = k8s_standin

    async def main() -> None:
        async with kube.client() as client:
            await client.create(make_job(kube, "victim", SLEEP))
            pod = await until(client.watch(Pod, labels={"job-name": "victim"}),
                              lambda _, p: p.status.phase == "Running")
            kube.kill_pod(pod.metadata.name, signal.SIGTERM)
            job = await until(client.watch(Job, fields={"metadata.name": "victim"}), finished)
            assert condition(job, "Failed") == "BackoffLimitExceeded"
            terminated = pod_state(await job_pod(client, "victim")).terminated
            assert (terminated.exitCode, terminated.reason) == (143, "Error")

    asyncio.run(main())


def test_hold_starts_until_release(k8s_standin: KubeStandIn) -> None:
    kube = k8s_standin
    kube.hold_starts()

    async def main() -> None:
        async with kube.client() as client:
            await client.create(make_job(kube, "held", ["python", "-c", "pass"]))
            pod = await until(client.watch(Pod, labels={"job-name": "held"}), lambda _, p:
                              getattr(pod_state(p), "waiting", None) is not None)
            assert pod_state(pod).waiting.reason == "ContainerCreating"
            assert kube.process(pod.metadata.name).pid is None
            kube.release()
            await until(client.watch(Job, fields={"metadata.name": "held"}),
                        lambda _, job: condition(job, "Complete") is not None)

    asyncio.run(main())


# --- deletion ----------------------------------------------------------------------------


def test_background_delete_removes_pods_and_kills_the_process(
        k8s_standin: KubeStandIn) -> None:
    kube = k8s_standin

    async def main() -> str:
        async with kube.client() as client:
            await client.create(make_job(kube, "doomed", SLEEP))
            pod = await until(client.watch(Pod, labels={"job-name": "doomed"}),
                              lambda _, p: p.status.phase == "Running")
            watch = client.watch(Pod, labels={"job-name": "doomed"},
                                 resource_version=pod.metadata.resourceVersion)
            await client.delete(Job, "doomed", cascade=CascadeType.BACKGROUND)
            await until(watch, lambda event, _: event == "DELETED")
            assert [p async for p in client.list(Pod)] == []
            return str(pod.metadata.name)

    pod = asyncio.run(main())
    process = kube.process(pod)
    assert not process.running and process.exit_code == 128 + signal.SIGTERM
    assert process.pid is not None
    with pytest.raises(ProcessLookupError):
        os.kill(process.pid, 0)
    [delete] = kube.requests(verb="delete", resource="jobs")
    assert delete.query["propagationPolicy"] == "Background"


def test_delete_without_policy_orphans_the_pods(k8s_standin: KubeStandIn) -> None:
    """batch/v1 Jobs default to Orphan: the pod keeps running without its owner."""
    kube = k8s_standin

    async def main() -> None:
        async with kube.client() as client:
            await client.create(make_job(kube, "orphan", SLEEP))
            pod = await until(client.watch(Pod, labels={"job-name": "orphan"}),
                              lambda _, p: p.status.phase == "Running")
            await client.delete(Job, "orphan")
            kept = await client.get(Pod, pod.metadata.name)
            assert kept.status.phase == "Running" and not kept.metadata.ownerReferences
            assert kube.process(pod.metadata.name).running
            await client.delete(Pod, pod.metadata.name, grace_period=0)
            kube.wait_until(lambda: not kube.process(pod.metadata.name).running)

    asyncio.run(main())


def test_foreground_delete_waits_for_the_pods(k8s_standin: KubeStandIn) -> None:
    kube = k8s_standin

    async def main() -> None:
        async with kube.client() as client:
            await client.create(make_job(kube, "fg", SLEEP))
            await until(client.watch(Pod, labels={"job-name": "fg"}),
                        lambda _, p: p.status.phase == "Running")
            jobs = client.watch(Job, fields={"metadata.name": "fg"},
                                resource_version=str(kube.resource_version))
            await client.delete(Job, "fg", cascade=CascadeType.FOREGROUND)
            events = []
            await until(jobs, lambda event, job: events.append(
                (event, job.metadata.finalizers)) or event == "DELETED")
            assert events[0] == ("MODIFIED", ["foregroundDeletion"])
            assert kube.objects("pods") == []

    asyncio.run(main())


# --- Secrets, env and volumes ------------------------------------------------------------


def test_secret_volume_and_env_reach_the_process(k8s_standin: KubeStandIn) -> None:
    kube = k8s_standin
    # LC_CTYPE aside: Python's C-locale coercion (PEP 538) sets it in its own environ.
    reader = ("import os; print(open(os.environ['AX_TOKEN_FILE']).read());"
              "print(os.environ['AX_TOKEN'], os.environ['POD']);"
              "print(sorted(set(os.environ) - {'LC_CTYPE'}))")
    container = Container(
        name="main", image=kube.python_image, command=["python", "-c", reader],
        env=[EnvVar(name="AX_TOKEN_FILE", value="/var/run/ax/token"),
             EnvVar(name="AX_TOKEN", valueFrom=EnvVarSource(
                 secretKeyRef=SecretKeySelector(name="ax-token", key="token"))),
             EnvVar(name="POD", valueFrom=EnvVarSource(
                 fieldRef=ObjectFieldSelector(fieldPath="metadata.name")))],
        volumeMounts=[VolumeMount(name="token", mountPath="/var/run/ax", readOnly=True)])
    volumes = [Volume(name="token", secret=SecretVolumeSource(secretName="ax-token"))]

    async def main() -> str:
        async with kube.client() as client:
            await client.create(make_job(kube, "reader", [], container=container,
                                         volumes=volumes))
            pod = await until(client.watch(Pod, labels={"job-name": "reader"}), lambda _, p:
                              "not found" in str(getattr(pod_state(p), "waiting", None)))
            waiting = pod_state(pod).waiting  # the volume is mounted first, as kubelets do
            assert waiting.reason == "ContainerCreating"
            assert waiting.message == ('MountVolume.SetUp failed for volume "token" : '
                                       'secret "ax-token" not found')
            await client.create(Secret(metadata=ObjectMeta(name="ax-token"),
                                       data={"token": base64.b64encode(b"s3cret").decode()}))
            await until(client.watch(Job, fields={"metadata.name": "reader"}),
                        lambda _, job: condition(job, "Complete") is not None)
            log = [line async for line in client.log(pod.metadata.name)]
            assert log == ["s3cret\n", f"s3cret {pod.metadata.name}\n",
                           "['AX_TOKEN', 'AX_TOKEN_FILE', 'POD']\n"]
            return str(pod.metadata.name)

    pod = asyncio.run(main())
    env = kube.process(pod).env
    assert sorted(env) == ["AX_TOKEN", "AX_TOKEN_FILE", "POD"]  # exactly the container's
    assert env["AX_TOKEN_FILE"].endswith("/volumes/token/token")
    assert env["AX_TOKEN_FILE"].startswith(str(kube.root))


def test_kubeconfig_file_configures_lightkube(k8s_standin: KubeStandIn) -> None:
    from lightkube import AsyncClient, KubeConfig

    async def main() -> None:
        config = KubeConfig.from_file(k8s_standin.kubeconfig)
        async with AsyncClient(config=config) as client:
            assert [job async for job in client.list(Job)] == []

    asyncio.run(main())
    assert k8s_standin.config().cluster.server == k8s_standin.url


def test_real_cluster_handle_reads_its_context_and_skips_knobs(
        k8s_standin: KubeStandIn) -> None:
    """What ``kube`` is under AX_K8S_CONTEXT, pointed here at the stand-in's kubeconfig."""
    real = RealCluster(k8s_standin.kubeconfig, "standin", "default", "python:3.11-slim")
    assert real.url == k8s_standin.url

    async def main() -> None:
        async with real.client() as client:
            assert [job async for job in client.list(Job)] == []

    asyncio.run(main())
    with pytest.raises(pytest.skip.Exception, match="fail_image_pull"):
        real.fail_image_pull("x")
    with pytest.raises(pytest.skip.Exception, match="resource_version"):
        real.resource_version  # noqa: B018 - the access is the test


def test_objects_written_validate_against_the_schema() -> None:
    """The stand-in checks its writes itself; this pins that the check runs."""
    with pytest.raises(AssertionError, match="invalid Pod"):
        check_schema({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"},
                      "status": {"phase": 3}})
