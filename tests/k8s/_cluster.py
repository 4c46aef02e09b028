"""The stand-in's cluster: the API verbs on Jobs, Pods and Secrets, a Job controller, a
scheduler and a kubelet that runs each Pod's container as a local process group.

Everything here runs under the store lock (``Store.cond``); API calls come from HTTP
handler threads, timers from :class:`~tests.k8s._store.Timers`, exits from one reaper
thread per process. Like a real control plane, the Job POST returns before its Pod
exists: the controller works on the timer thread, so a client sees the same races.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from tests.k8s import _objects as o
from tests.k8s._api import (
    JSON,
    ApiFailure,
    Kind,
    Requirement,
    already_exists,
    bad_request,
    invalid,
    not_found,
    now,
    required,
    schema_errors,
    selected,
)
from tests.k8s._store import Store, Timers

JOBS = Kind("Job", "batch", "v1", "jobs")
PODS = Kind("Pod", "", "v1", "pods")
SECRETS = Kind("Secret", "", "v1", "secrets")
KINDS = {k.plural: k for k in (JOBS, PODS, SECRETS)}

#: The warning a real server sends when a batch/v1 Job is deleted without a policy.
ORPHAN_WARNING = ('299 - "child pods are preserved by default when jobs are deleted; set '
                  'propagationPolicy=Background to remove them or set '
                  'propagationPolicy=Orphan to suppress this warning"')


@dataclass
class PodRun:
    """The kubelet's record of one pod: its directory, process and exit."""

    namespace: str
    name: str
    job_uid: str | None
    root: Path
    shown: str = ""                       #: the last status written, to skip repeats
    proc: subprocess.Popen[bytes] | None = None
    argv: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    started_at: str | None = None
    exit_code: int | None = None
    oom: bool = False
    gone: bool = False                    #: removed before its process ever ran
    kill_timer: Any = None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.exit_code is None

    @property
    def log(self) -> Path:
        return self.root / "log"


@dataclass
class JobRun:
    namespace: str
    name: str
    pod: str | None = None
    deadline: Any = None
    deadline_exceeded: bool = False
    finished: bool = False
    deleted: bool = False


class Cluster:
    """State and behaviour; :class:`~tests.k8s.standin.KubeStandIn` is its public face."""

    def __init__(self, root: Path, *, check_schema: Callable[[JSON], None] | None) -> None:
        self.root = root
        self.store = Store(check_schema)
        self.cond = self.store.cond
        self.errors: list[Exception] = []
        self.timers = Timers(self.cond, self.guarded)
        self.pods: dict[tuple[str, str], PodRun] = {}
        self.jobs: dict[str, JobRun] = {}          # by uid
        self.failing_images: set[str] = set()
        self.unschedulable = False
        self.held = False
        self.oom: list[Callable[[JSON], bool]] = []
        self.entrypoints: dict[str, list[str]] = {}
        self._reapers: list[threading.Thread] = []

    def guarded(self, fn: Callable[[], None]) -> None:
        """Run a controller step; a bug in it is kept and raised at stop, not swallowed."""
        with self.cond:
            try:
                fn()
            except Exception as exc:
                self.errors.append(exc)

    def stop(self) -> None:
        with self.cond:
            self.store.closed = True
            for run in self.pods.values():
                if run.running:
                    _signal_group(run, signal.SIGKILL)
            self.cond.notify_all()
        self.timers.stop()
        for thread in self._reapers:
            thread.join()

    # --- API verbs -------------------------------------------------------------------------

    def create(self, kind: Kind, namespace: str, body: Any, dry_run: bool) -> JSON:
        if kind is PODS:
            raise ApiFailure(405, "MethodNotAllowed",
                             "the Kubernetes stand-in creates pods only from Jobs")
        obj = _checked_body(kind, namespace, body)
        meta = obj["metadata"]
        if not meta.get("name"):
            if not meta.get("generateName"):
                raise invalid(kind, "", [required("metadata.name",
                                                  "name or generateName is required")])
            meta["name"] = o.generate_name(meta["generateName"])
        name = meta["name"]
        if meta.get("resourceVersion"):
            raise bad_request("resourceVersion should not be set on objects to be created")
        if causes := schema_errors(obj):
            raise invalid(kind, name, causes)
        if kind is JOBS and not ((obj.get("spec") or {}).get("template") or {}).get("spec"):
            raise invalid(kind, name, [required("spec.template.spec.containers")])
        meta["namespace"] = namespace
        uid, at = str(uuid.uuid4()), now()
        if kind is JOBS:
            obj = o.default_job(obj, uid=uid, at=at)
            causes = o.validate_job(obj, self.entrypoints)
        else:
            obj = o.default_secret(obj, uid=uid, at=at)
            causes = o.validate_secret(obj)
        if causes:
            raise invalid(kind, name, causes)
        with self.cond:
            if self.store.get(kind.plural, namespace, name) is not None:
                raise already_exists(kind, name)
            if dry_run:
                return obj
            stored = self.store.put(kind.plural, obj)
            if kind is JOBS:
                self.jobs[uid] = JobRun(namespace, name)
                self.timers.call_soon(functools.partial(self._sync_job, uid))
            else:
                self.sync_pending()
            return stored

    def get(self, kind: Kind, namespace: str, name: str) -> JSON:
        with self.cond:
            obj = self.store.get(kind.plural, namespace, name)
        if obj is None:
            raise not_found(kind, name)
        return obj

    def select(self, kind: Kind, namespace: str | None, labels: list[Requirement],
             fields: list[Requirement], limit: int | None, token: str | None) -> JSON:
        """A ``…List``; ``limit``/``continue`` page by name (each page is read afresh)."""
        with self.cond:
            rv = self.store.rv
            items = [obj for obj in self.store.list(kind.plural, namespace)
                     if selected(obj, labels, fields)]
        meta: JSON = {"resourceVersion": str(rv)}
        if token:
            rv_text, _, after = token.partition(":")
            meta["resourceVersion"] = rv_text
            items = [i for i in items if i["metadata"]["name"] > after]
        if limit and len(items) > limit:
            items = items[:limit]
            meta["continue"] = f"{meta['resourceVersion']}:{items[-1]['metadata']['name']}"
        for item in items:  # a real list's items carry no kind/apiVersion
            item.pop("kind", None)
            item.pop("apiVersion", None)
        return {"kind": f"{kind.kind}List", "apiVersion": kind.api_version, "metadata": meta,
                "items": items}

    def watch(self, kind: Kind, namespace: str | None, labels: list[Requirement],
              fields: list[Requirement], since: int | None,
              timeout: float | None) -> Iterator[tuple[str, JSON]]:
        deadline = None if timeout is None else time.monotonic() + timeout
        return self.store.watch(kind.plural, namespace,
                                lambda obj: selected(obj, labels, fields), since, deadline)

    def delete(self, kind: Kind, namespace: str, name: str, *, propagation: str | None,
               grace: int | None, dry_run: bool) -> tuple[JSON, list[str]]:
        """The answer body and the ``Warning`` headers."""
        with self.cond:
            obj = self.store.get(kind.plural, namespace, name)
            if obj is None:
                raise not_found(kind, name)
            success = {"kind": "Status", "apiVersion": "v1", "metadata": {},
                       "status": "Success", "details": {
                           "name": name, "group": kind.group, "kind": kind.plural,
                           "uid": obj["metadata"]["uid"]}}
            if dry_run:
                return success, []
            if kind is PODS:
                return self.delete_pod(namespace, name, grace), []
            if kind is SECRETS:
                self.store.remove(kind.plural, namespace, name)
                return success, []
            if propagation not in (None, "Orphan", "Background", "Foreground"):
                raise bad_request(f"unknown propagationPolicy {propagation!r}")
            # batch/v1 Jobs default to orphaning their pods (kept for compatibility).
            warnings = [ORPHAN_WARNING] if propagation is None else []
            job = self._delete_job(obj, propagation or "Orphan")
            return (job if job is not None else success), warnings

    def log(self, namespace: str, name: str, container: str | None) -> PodRun:
        """The run whose output a ``pods/log`` GET reads, or the error a kubelet gives."""
        with self.cond:
            pod = self.get(PODS, namespace, name)
            run = self.pods.get((namespace, name))
            spec_name = pod["spec"]["containers"][0]["name"]
            if container not in (None, spec_name):
                raise bad_request(f"container {container} is not valid for pod {name}")
            if run is None or run.proc is None:
                state = (pod["status"].get("containerStatuses") or [{}])[0].get("state", {})
                reason = state.get("waiting", {}).get("reason", "ContainerCreating")
                if reason in ("ErrImagePull", "ImagePullBackOff"):
                    reason = "trying and failing to pull image"
                raise bad_request(f'container "{spec_name}" in pod "{name}" is waiting to '
                                  f"start: {reason}")
            return run

    # --- Job controller --------------------------------------------------------------------

    def _sync_job(self, uid: str) -> None:
        run = self.jobs.get(uid)
        if run is None or run.pod is not None or run.deleted:
            return
        job = self.store.get("jobs", run.namespace, run.name)
        if job is None or "deletionTimestamp" in job["metadata"]:
            return
        name = o.generate_name(run.name + "-")
        while (run.namespace, name) in self.pods:
            name = o.generate_name(run.name + "-")
        self.store.put("pods", o.pod_for_job(job, name, uid=str(uuid.uuid4()), at=now()))
        run.pod = name
        self.pods[(run.namespace, name)] = PodRun(
            run.namespace, name, uid, self.root / "pods" / f"{run.namespace}.{name}")
        job["status"] = o.job_started(now())
        self.store.put("jobs", job)
        if (seconds := job["spec"].get("activeDeadlineSeconds")) is not None:
            run.deadline = self.timers.call_later(
                seconds, functools.partial(self._deadline_exceeded, uid))
        self.timers.call_soon(functools.partial(self._sync_pod, run.namespace, name))

    def _deadline_exceeded(self, uid: str) -> None:
        run = self.jobs.get(uid)
        if run is None or run.finished or run.deleted:
            return
        run.deadline_exceeded = True
        job = self.store.get("jobs", run.namespace, run.name)
        if job is None:
            return
        pod = self.pods.get((run.namespace, run.pod or ""))
        interim, _, reason, message = o.DEADLINE
        status = job["status"]
        status.setdefault("conditions", []).append(
            o.condition(interim, "True", now(), reason, message))
        status.update(active=0, ready=0, terminating=1 if pod and pod.running else 0)
        self.store.put("jobs", job)
        if pod is not None and self.store.get("pods", pod.namespace, pod.name) is not None:
            self.delete_pod(pod.namespace, pod.name, None)
        else:
            self._pod_done(uid, None)

    def _pod_done(self, uid: str | None, exit_code: int | None) -> None:
        """The job's pod ended (``exit_code`` None: it never ran): finish the Job."""
        run = self.jobs.get(uid or "")
        if run is None or run.finished or run.deleted:
            return
        job = self.store.get("jobs", run.namespace, run.name)
        if job is None:
            return
        if "deletionTimestamp" in job["metadata"]:
            self._finish_foreground(job)
            return
        if run.deadline_exceeded:
            terminal = o.DEADLINE
        else:
            terminal = o.SUCCEEDED if exit_code == 0 else o.BACKOFF_LIMIT
        interim, final, reason, message = terminal
        at, status = now(), job["status"]
        status.update(active=0, ready=0, terminating=0)
        status["succeeded" if terminal is o.SUCCEEDED else "failed"] = 1
        conditions = status.setdefault("conditions", [])
        if not any(c["type"] == interim for c in conditions):
            conditions.append(o.condition(interim, "True", at, reason, message))
            job = self.store.put("jobs", job)
            status, conditions = job["status"], job["status"]["conditions"]
        conditions.append(o.condition(final, "True", at, reason, message))
        if terminal is o.SUCCEEDED:
            status["completionTime"] = at
        self.store.put("jobs", job)
        run.finished = True
        if run.deadline is not None:
            run.deadline.cancel()

    def _delete_job(self, job: JSON, propagation: str) -> JSON | None:
        """Delete a Job; returns the Job if it lingers (Foreground), else None."""
        meta = job["metadata"]
        namespace, uid = meta["namespace"], meta["uid"]
        run = self.jobs[uid]
        if run.deadline is not None:
            run.deadline.cancel()
        pods = self._pods_of(namespace, uid)
        if propagation == "Foreground":
            if "deletionTimestamp" not in meta:
                meta["deletionTimestamp"] = now()
                meta["deletionGracePeriodSeconds"] = 0
                meta["finalizers"] = [*meta.get("finalizers", []), "foregroundDeletion"]
                job = self.store.put("jobs", job)
            for pod in pods:
                self.timers.call_soon(functools.partial(self._collect, namespace,
                                                        pod["metadata"]["name"]))
            if not pods:
                self._finish_foreground(job)
            return job
        run.deleted = True
        self.store.remove("jobs", namespace, meta["name"])
        for pod in pods:
            if propagation == "Orphan":
                pod["metadata"].pop("ownerReferences", None)
                self.store.put("pods", pod)
                self.pods[(namespace, pod["metadata"]["name"])].job_uid = None
            else:  # the garbage collector deletes dependents after the owner is gone
                self.timers.call_soon(functools.partial(self._collect, namespace,
                                                        pod["metadata"]["name"]))
        return None

    def _collect(self, namespace: str, name: str) -> None:
        """The garbage collector deleting a dependent pod of a deleted Job."""
        self.delete_pod(namespace, name, None)

    def _finish_foreground(self, job: JSON) -> None:
        meta = job["metadata"]
        if not self._pods_of(meta["namespace"], meta["uid"]):
            self.jobs[meta["uid"]].deleted = True
            self.store.remove("jobs", meta["namespace"], meta["name"])

    def _pods_of(self, namespace: str, uid: str) -> list[JSON]:
        return [pod for pod in self.store.list("pods", namespace)
                if any(ref["uid"] == uid for ref in pod["metadata"].get("ownerReferences", []))]

    # --- scheduler and kubelet -------------------------------------------------------------

    def sync_pending(self) -> None:
        """Re-run the kubelet for pods not started (a knob or a Secret changed)."""
        for (namespace, name), run in sorted(self.pods.items()):
            if run.proc is None and not run.gone:
                self.timers.call_soon(functools.partial(self._sync_pod, namespace, name))

    def _show(self, pod: JSON, run: PodRun, shown: str, status: JSON) -> None:
        if run.shown != shown:
            run.shown = shown
            pod["status"] = status
            self.store.put("pods", pod)

    def _sync_pod(self, namespace: str, name: str) -> None:
        run = self.pods.get((namespace, name))
        pod = self.store.get("pods", namespace, name)
        if (run is None or pod is None or run.proc is not None
                or "deletionTimestamp" in pod["metadata"]):
            return
        at = now()
        if not pod["spec"].get("nodeName"):
            if self.unschedulable:
                self._show(pod, run, "Unschedulable", o.pod_unschedulable(pod, at))
                return
            pod["spec"]["nodeName"] = o.NODE_NAME  # the binding and the kubelet's first look
            self._show(pod, run, "ContainerCreating", o.pod_waiting(pod, at, "ContainerCreating"))
            pod = self.store.get("pods", namespace, name) or pod
        image = pod["spec"]["containers"][0]["image"]
        if image in self.failing_images:
            for reason, message in (
                    ("ErrImagePull", f'Failed to pull image "{image}": the Kubernetes '
                                     "stand-in was told to fail it (fail_image_pull)"),
                    ("ImagePullBackOff", f'Back-off pulling image "{image}"')):
                if run.shown != "ImagePullBackOff":
                    self._show(pod, run, reason, o.pod_waiting(pod, at, reason, message))
                    pod = self.store.get("pods", namespace, name) or pod
            return
        if self.held:
            self._show(pod, run, "ContainerCreating", o.pod_waiting(pod, at, "ContainerCreating"))
            return
        secrets = {s["metadata"]["name"]: s for s in self.store.list("secrets", namespace)}
        try:
            launch = o.plan_launch(pod, secrets, run.root, python=sys.executable,
                                   entrypoints=self.entrypoints)
        except o.NotStartable as exc:
            self._show(pod, run, f"{exc.reason}: {exc.message}",
                       o.pod_waiting(pod, at, exc.reason, exc.message))
            return
        self._start(pod, run, launch)

    def _start(self, pod: JSON, run: PodRun, launch: o.Launch) -> None:
        for directory in launch.dirs:
            directory.mkdir(parents=True, exist_ok=True)
        for path, data, mode in launch.files:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
            path.chmod(mode)
        run.argv, run.env, at = launch.argv, launch.env, now()
        with run.log.open("wb") as log:
            try:
                run.proc = subprocess.Popen(
                    launch.argv, env=launch.env, cwd=launch.cwd, stdin=subprocess.DEVNULL,
                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            except OSError as exc:  # what a runtime reports for a missing executable
                run.exit_code = 128
                pod["status"] = o.pod_terminated(
                    pod, at, exit_code=128, reason="StartError", started_at=None,
                    container_id=None, message=f"exec: {launch.argv[0]!r}: {exc.strerror}")
                self.store.put("pods", pod)
                self._pod_done(run.job_uid, 128)
                return
        run.started_at = at
        container_id = f"standin://{run.proc.pid}"
        run.shown = "Running"
        pod["status"] = o.pod_running(pod, at, container_id)
        self.store.put("pods", pod)
        job_run = self.jobs.get(run.job_uid or "")
        if job_run is not None and not job_run.finished:
            job = self.store.get("jobs", job_run.namespace, job_run.name)
            if job is not None:
                job["status"]["ready"] = 1
                self.store.put("jobs", job)
        reaper = threading.Thread(target=self._reap, args=(run, run.proc),
                                  name=f"k8s-standin-reap-{run.name}", daemon=True)
        self._reapers.append(reaper)
        reaper.start()
        for index, matches in enumerate(self.oom):
            if matches(pod):
                del self.oom[index]
                run.oom = True
                _signal_group(run, signal.SIGKILL)
                break

    def _reap(self, run: PodRun, proc: subprocess.Popen[bytes]) -> None:
        returncode = proc.wait()
        self.guarded(functools.partial(self._exited, run, returncode))

    def _exited(self, run: PodRun, returncode: int) -> None:
        code = 128 - returncode if returncode < 0 else returncode
        run.exit_code = code
        if run.kill_timer is not None:
            run.kill_timer.cancel()
        _signal_group(run, signal.SIGKILL)  # the runtime stops the whole container
        reason = "OOMKilled" if run.oom else ("Completed" if code == 0 else "Error")
        pod = self.store.get("pods", run.namespace, run.name)
        if pod is not None:
            pod["status"] = o.pod_terminated(
                pod, now(), exit_code=code, reason=reason, started_at=run.started_at,
                container_id=f"standin://{run.proc.pid}" if run.proc else None)
            self.store.put("pods", pod)
            if "deletionTimestamp" in pod["metadata"]:
                self._remove_pod(run)
        self._pod_done(run.job_uid, code)

    def delete_pod(self, namespace: str, name: str, grace: int | None) -> JSON:
        """Graceful for a running pod (SIGTERM, then SIGKILL after the grace period);
        immediate otherwise, or with ``gracePeriodSeconds=0``."""
        pod = self.store.get("pods", namespace, name)
        run = self.pods.get((namespace, name))
        if pod is None or run is None:
            return pod or {}
        if grace is None:
            grace = pod["spec"].get("terminationGracePeriodSeconds", o.DEFAULT_GRACE_SECONDS)
        if run.running and grace > 0:
            meta = pod["metadata"]
            if "deletionTimestamp" not in meta:
                at = datetime.now(UTC) + timedelta(seconds=grace)
                meta["deletionTimestamp"] = at.strftime("%Y-%m-%dT%H:%M:%SZ")
                meta["deletionGracePeriodSeconds"] = grace
                pod = self.store.put("pods", pod)
                _signal_group(run, signal.SIGTERM)
                run.kill_timer = self.timers.call_later(
                    grace, functools.partial(_signal_group, run, signal.SIGKILL))
            return pod
        if run.running:
            _signal_group(run, signal.SIGKILL)  # its exit finds the pod gone
        removed = self._remove_pod(run)
        if run.proc is None:
            run.gone = True
            self._pod_done(run.job_uid, None)
        return removed

    def _remove_pod(self, run: PodRun) -> JSON:
        removed = self.store.remove("pods", run.namespace, run.name)
        job_run = self.jobs.get(run.job_uid or "")
        job = job_run and self.store.get("jobs", job_run.namespace, job_run.name)
        if job and "deletionTimestamp" in job["metadata"]:
            self._finish_foreground(job)
        return removed


def _signal_group(run: PodRun, sig: int) -> None:
    """Signal the pod's process group (its container), if it still has members."""
    if run.proc is None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(run.proc.pid, sig)


def _checked_body(kind: Kind, namespace: str, body: Any) -> JSON:
    if not isinstance(body, dict) or not isinstance(body.get("metadata", {}), dict):
        raise bad_request(f"the body of the request was in an unknown format - accepted "
                          f"media types include: application/json; expected a {kind.kind}")
    obj = dict(body)
    obj.setdefault("apiVersion", kind.api_version)
    obj.setdefault("kind", kind.kind)
    obj["metadata"] = dict(obj.get("metadata") or {})
    if (obj["apiVersion"], obj["kind"]) != (kind.api_version, kind.kind):
        raise bad_request(f"the API version in the data ({obj['apiVersion']}) does not match "
                          f"the expected API version ({kind.api_version})")
    if obj["metadata"].get("namespace") not in (None, namespace):
        raise bad_request("the namespace of the provided object does not match the "
                          "namespace sent on the request")
    return obj
