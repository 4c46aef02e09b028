"""What a Job and its pods say, as the kubernetes runner reads it: pure functions of
lightkube's typed models (no I/O), so the reading of every Kubernetes fact is tested on
values (``tests/runners/test_kubernetes.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from lightkube.resources.batch_v1 import Job
from lightkube.resources.core_v1 import Pod

__all__ = ["IMAGE_PULL_REASONS", "JobFact", "finished_at", "name_of", "read_job"]

#: Waiting reasons of a container whose image cannot be pulled.
IMAGE_PULL_REASONS = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName"})


def name_of(obj: Job | Pod) -> str:
    """An object's name ("" when it has none)."""
    return str(obj.metadata.name) if obj.metadata and obj.metadata.name else ""


@dataclass(frozen=True)
class JobFact:
    """What the cluster says about one run's Job, as ax reads it.

    Attributes:
        kind: ``running``, ``complete``, ``failed``, ``oom``, ``deadline``,
            ``image-pull``, ``unschedulable`` or ``gone``.
        detail: The cluster's words (reason: message).
        exit_code: The container's exit code, when it terminated.
        pod: The pod the fact comes from ("" when none).
    """

    kind: str
    detail: str = ""
    exit_code: int | None = None
    pod: str = ""


def _condition(conditions: Any, kind: str) -> Any:
    for cond in conditions or ():
        if cond.type == kind and cond.status == "True":
            return cond
    return None


def _words(reason: str | None, message: str | None) -> str:
    return ": ".join(part for part in (reason, message) if part) or "no reason given"


def _pod_fact(pod: Pod) -> JobFact | None:
    """The fact a single pod states on its own, or None while it just runs."""
    name = name_of(pod)
    status = pod.status
    if status is None:
        return None
    for cs in status.containerStatuses or ():
        state = cs.state
        if state is None:
            continue
        if state.waiting is not None and state.waiting.reason in IMAGE_PULL_REASONS:
            return JobFact("image-pull", f"image {cs.image}: "
                           f"{_words(state.waiting.reason, state.waiting.message)}", pod=name)
        term = state.terminated
        if term is not None and (term.exitCode != 0 or status.phase == "Failed"):
            kind = "oom" if term.reason == "OOMKilled" else "failed"
            return JobFact(kind, _words(term.reason, term.message), term.exitCode, pod=name)
        if term is not None and status.phase == "Succeeded":
            return JobFact("complete", _words(term.reason, term.message), 0, pod=name)
    if status.phase == "Succeeded":
        return JobFact("complete", "pod succeeded", 0, pod=name)
    if status.phase == "Failed":
        return JobFact("failed", _words(status.reason, status.message), pod=name)
    scheduled = next((c for c in status.conditions or () if c.type == "PodScheduled"), None)
    if scheduled is not None and scheduled.status == "False" and \
            scheduled.reason == "Unschedulable":
        return JobFact("unschedulable", _words(scheduled.reason, scheduled.message), pod=name)
    return None


def read_job(job: Job | None, pods: list[Pod]) -> JobFact:
    """The fact a Job and its pods state (pure: the runner's whole reading of the
    cluster, unit-tested on models). A pod's terminal state is read before the Job's
    condition catches up; the Job's condition decides when the pod is gone."""
    if job is None:
        return JobFact("gone", "the Job no longer exists")
    status = job.status
    conditions = status.conditions if status is not None else None
    facts = [fact for pod in pods if (fact := _pod_fact(pod)) is not None]
    # Kubernetes 1.31+ sets SuccessCriteriaMet / FailureTarget first and Complete /
    # Failed once the pod is gone; either one decides.
    if (_condition(conditions, "Complete") or _condition(conditions, "SuccessCriteriaMet")
            ) is not None:
        pod = next((f.pod for f in facts if f.kind == "complete"), "")
        return JobFact("complete", "job complete", 0, pod=pod or _newest(pods))
    failed = _condition(conditions, "Failed") or _condition(conditions, "FailureTarget")
    if failed is not None and failed.reason == "DeadlineExceeded":
        return JobFact("deadline", _words(failed.reason, failed.message))
    for kind in ("oom", "failed", "complete", "image-pull", "unschedulable"):
        found = next((f for f in facts if f.kind == kind), None)
        if found is not None:
            return found
    if failed is not None:
        return JobFact("failed", _words(failed.reason, failed.message), pod=_newest(pods))
    return JobFact("running")


def _newest(pods: list[Pod]) -> str:
    names = [p.metadata.name for p in pods if p.metadata and p.metadata.name]
    return names[-1] if names else ""


def finished_at(job: Job) -> datetime | None:
    """When a Job reached Complete or Failed (None while it runs)."""
    status = job.status
    if status is None:
        return None
    for kind in ("Complete", "Failed"):
        cond = _condition(status.conditions, kind)
        if cond is not None:
            return status.completionTime or cond.lastTransitionTime or datetime.now(UTC)
    return None
