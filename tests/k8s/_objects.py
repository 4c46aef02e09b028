"""The objects the stand-in writes, as pure functions of what it was given: API-server
defaulting and validation of Jobs and Secrets, the Pod a Job controller creates, the
statuses a kubelet and a Job controller report, and the plan to run a Pod's container as
a local process (environment, volumes, the mountPath rewrite).

Only :mod:`tests.k8s.standin` calls these; it owns the state, the clock and the processes.
"""

from __future__ import annotations

import base64
import binascii
import copy
import os
import random
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from tests.k8s._api import (
    JSON,
    Cause,
    bad_request,
    bad_value,
    dns1123_label,
    dns1123_subdomain,
    label_value,
    metadata,
    required,
    unsupported,
)

#: Labels the Job controller puts on its pods (both spellings, as real 1.27+ servers do).
JOB_NAME_LABELS = ("batch.kubernetes.io/job-name", "job-name")
UID_LABELS = ("batch.kubernetes.io/controller-uid", "controller-uid")
#: The node every pod lands on, and the address it reports.
NODE_NAME = "standin-node"
HOST_IP = "127.0.0.1"
#: Default ``terminationGracePeriodSeconds`` of a pod.
DEFAULT_GRACE_SECONDS = 30
#: Characters of the random suffix of generated names (``names.SimpleNameGenerator``).
_SUFFIX_CHARS = "bcdfghjklmnpqrstvwxz2456789"
_PYTHON = re.compile(r"python(3(\.\d+)?)?")
_ENV_NAME = re.compile(r"[\x21-\x3c\x3e-\x7e]+")  # printable ASCII but '=' (1.30+ rule)
_SECRET_KEY = re.compile(r"[-._a-zA-Z0-9]+")


def generate_name(base: str) -> str:
    return base[:58] + "".join(random.choices(_SUFFIX_CHARS, k=5))


def condition(kind: str, status: str, at: str, reason: str | None = None,
              message: str | None = None) -> JSON:
    cond: JSON = {"type": kind, "status": status, "lastProbeTime": None,
                  "lastTransitionTime": at}
    if reason:
        cond["reason"] = reason
    if message:
        cond["message"] = message
    return cond


# --- Jobs ----------------------------------------------------------------------------------


def default_job(obj: JSON, *, uid: str, at: str) -> JSON:
    """The Job as the server stores it: generated selector and pod labels, defaults."""
    job = copy.deepcopy(obj)
    meta, spec = job["metadata"], job["spec"]
    name = meta["name"]
    template_meta = spec["template"].setdefault("metadata", {})
    labels = template_meta.setdefault("labels", {})
    if not meta.get("labels") and labels:
        meta["labels"] = dict(labels)  # SetDefaults_Job: before the generated labels
    for key in UID_LABELS:
        labels[key] = uid
    for key in JOB_NAME_LABELS:
        labels[key] = name
    meta.update(uid=uid, creationTimestamp=at, generation=1)
    spec["selector"] = {"matchLabels": {UID_LABELS[0]: uid}}
    spec_defaults: JSON = {"completions": 1, "parallelism": 1, "suspend": False,
                           "completionMode": "NonIndexed",
                           "podReplacementPolicy": "TerminatingOrFailed"}
    job["spec"] = spec = {**spec_defaults, **spec}
    pod_defaults: JSON = {"dnsPolicy": "ClusterFirst", "schedulerName": "default-scheduler",
                          "securityContext": {},
                          "terminationGracePeriodSeconds": DEFAULT_GRACE_SECONDS}
    spec["template"]["spec"] = pod_spec = {**pod_defaults, **spec["template"]["spec"]}
    for container in pod_spec["containers"]:
        image = container.get("image", "")
        latest = ":" not in image.rsplit("/", 1)[-1] or image.endswith(":latest")
        container.setdefault("imagePullPolicy", "Always" if latest else "IfNotPresent")
        container.setdefault("terminationMessagePath", "/dev/termination-log")
        container.setdefault("terminationMessagePolicy", "File")
        container.setdefault("resources", {})
    job["status"] = {}
    return job


def validate_job(job: JSON, entrypoints: Mapping[str, list[str]]) -> list[Cause]:
    """What the API server's Job validation refuses, then what the stand-in cannot run.

    ``job`` is defaulted (:func:`default_job`), so the generated ``job-name`` label is
    checked as a label value: a Job name over 63 characters fails as it does for real.
    """
    meta, spec = job["metadata"], job["spec"]
    template = spec["template"]
    pod_spec = template["spec"]
    causes = dns1123_subdomain("metadata.name", meta["name"])
    causes += metadata("metadata", meta)
    generated = {*JOB_NAME_LABELS, *UID_LABELS}
    template_meta = template["metadata"]
    causes += metadata("spec.template.metadata", {**template_meta, "labels": {
        k: v for k, v in (template_meta.get("labels") or {}).items() if k not in generated}})
    causes += label_value("spec.template.labels", meta["name"])  # the job-name label
    for key in ("activeDeadlineSeconds", "backoffLimit"):
        if spec.get(key) is not None and spec[key] < 0:
            causes.append(bad_value(f"spec.{key}", spec[key],
                                    "must be greater than or equal to 0"))
    policy = pod_spec.get("restartPolicy")
    if policy not in ("Never", "OnFailure"):
        causes.append(required("spec.template.spec.restartPolicy",
                               'valid values: "OnFailure", "Never"') if policy is None else
                      bad_value("spec.template.spec.restartPolicy", policy,
                                'supported values: "OnFailure", "Never"'))
    causes += _validate_pod_spec("spec.template.spec", pod_spec)
    return causes or _unsupported_job(job, entrypoints)


def _validate_pod_spec(where: str, pod_spec: JSON) -> list[Cause]:
    causes: list[Cause] = []
    volumes = [v["name"] for v in pod_spec.get("volumes") or []]
    for i, volume in enumerate(pod_spec.get("volumes") or []):
        causes += dns1123_label(f"{where}.volumes[{i}].name", volume["name"])
        if volumes.count(volume["name"]) > 1:
            causes.append(Cause(f"{where}.volumes[{i}].name",
                                f'Duplicate value: "{volume["name"]}"', "FieldValueDuplicate"))
        if "secret" in volume and not volume["secret"].get("secretName"):
            causes.append(required(f"{where}.volumes[{i}].secret.secretName"))
    if not pod_spec.get("containers"):
        return [*causes, required(f"{where}.containers")]
    names = [c["name"] for c in pod_spec["containers"]]
    for i, container in enumerate(pod_spec["containers"]):
        at = f"{where}.containers[{i}]"
        causes += dns1123_label(f"{at}.name", container["name"])
        if names.count(container["name"]) > 1:
            causes.append(Cause(f"{at}.name", f'Duplicate value: "{container["name"]}"',
                                "FieldValueDuplicate"))
        if not container.get("image"):
            causes.append(required(f"{at}.image"))
        for j, var in enumerate(container.get("env") or []):
            if not _ENV_NAME.fullmatch(var["name"]):
                causes.append(bad_value(f"{at}.env[{j}].name", var["name"],
                                        "a valid environment variable name must consist only "
                                        "of printable ASCII characters other than '='"))
        paths: list[str] = []
        for j, mount in enumerate(container.get("volumeMounts") or []):
            if mount["name"] not in volumes:
                causes.append(Cause(f"{at}.volumeMounts[{j}].name",
                                    f'Not found: "{mount["name"]}"', "FieldValueNotFound"))
            if not mount.get("mountPath"):
                causes.append(required(f"{at}.volumeMounts[{j}].mountPath"))
            elif mount["mountPath"] in paths:
                causes.append(bad_value(f"{at}.volumeMounts[{j}].mountPath",
                                        mount["mountPath"], "must be unique"))
            paths.append(mount.get("mountPath", ""))
    return causes


def _unsupported_job(job: JSON, entrypoints: Mapping[str, list[str]]) -> list[Cause]:
    """Valid Jobs the stand-in cannot simulate faithfully: refused, never half-run."""
    spec = job["spec"]
    pod_spec = spec["template"]["spec"]
    causes = []
    if spec.get("backoffLimit") != 0:
        causes.append(unsupported("spec.backoffLimit", "each Job runs its pod once, so "
                                  "backoffLimit must be 0 (ax Jobs always set 0; the "
                                  "server default is 6)"))
    for key, allowed in (("completions", 1), ("parallelism", 1), ("suspend", False),
                         ("completionMode", "NonIndexed"), ("manualSelector", None),
                         ("podFailurePolicy", None), ("successPolicy", None),
                         ("backoffLimitPerIndex", None), ("maxFailedIndexes", None),
                         ("managedBy", None)):
        if spec.get(key, allowed) != allowed:
            causes.append(unsupported(f"spec.{key}", f"only {allowed!r} (or unset)"))
    if pod_spec.get("restartPolicy") != "Never":
        causes.append(unsupported("spec.template.spec.restartPolicy", 'only "Never"'))
    for key in ("initContainers", "ephemeralContainers", "activeDeadlineSeconds"):
        if pod_spec.get(key):
            causes.append(unsupported(f"spec.template.spec.{key}", "not simulated"))
    if len(pod_spec["containers"]) != 1:
        causes.append(unsupported("spec.template.spec.containers", "exactly one container"))
    for i, volume in enumerate(pod_spec.get("volumes") or []):
        if not ({"secret", "emptyDir"} & set(volume)):
            causes.append(unsupported(f"spec.template.spec.volumes[{i}]",
                                      "only secret and emptyDir volumes"))
    container = pod_spec["containers"][0]
    at = "spec.template.spec.containers[0]"
    if not container.get("command") and container.get("image") not in entrypoints:
        causes.append(unsupported(f"{at}.command", "the stand-in runs container.command; "
                                  "without it, register the image's ENTRYPOINT with "
                                  "image_entrypoint()"))
    for j, var in enumerate(container.get("env") or []):
        source = set(var.get("valueFrom") or {})
        if source - {"secretKeyRef", "fieldRef"}:
            causes.append(unsupported(f"{at}.env[{j}].valueFrom",
                                      "only secretKeyRef and fieldRef"))
    for j, source in enumerate(container.get("envFrom") or []):
        if "secretRef" not in source:
            causes.append(unsupported(f"{at}.envFrom[{j}]", "only secretRef"))
    return causes


def job_started(at: str) -> JSON:
    return {"startTime": at, "active": 1, "ready": 0, "terminating": 0,
            "uncountedTerminatedPods": {}}


#: Terminal conditions of a Job: the interim one (1.31+) and the final one.
SUCCEEDED = ("SuccessCriteriaMet", "Complete", "CompletionsReached",
             "Reached expected number of succeeded pods")
BACKOFF_LIMIT = ("FailureTarget", "Failed", "BackoffLimitExceeded",
                 "Job has reached the specified backoff limit")
DEADLINE = ("FailureTarget", "Failed", "DeadlineExceeded",
            "Job was active longer than specified deadline")


# --- Secrets -------------------------------------------------------------------------------


def default_secret(obj: JSON, *, uid: str, at: str) -> JSON:
    """``stringData`` folded into ``data`` (base64), ``type`` defaulted; 400 on bad base64."""
    secret = copy.deepcopy(obj)
    data = secret.get("data") or {}
    for key, value in data.items():
        try:
            base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise bad_request(f"Secret in version \"v1\" cannot be handled as a Secret: "
                              f"illegal base64 data in data[{key!r}]") from exc
    for key, value in (secret.pop("stringData", None) or {}).items():
        data[key] = base64.b64encode(value.encode()).decode()
    secret["data"] = data
    secret.setdefault("type", "Opaque")
    secret["metadata"].update(uid=uid, creationTimestamp=at)
    return secret


def validate_secret(secret: JSON) -> list[Cause]:
    causes = dns1123_subdomain("metadata.name", secret["metadata"]["name"])
    causes += metadata("metadata", secret["metadata"])
    for key in sorted(secret["data"]):
        if len(key) > 253 or not _SECRET_KEY.fullmatch(key):
            causes.append(bad_value(f"data[{key}]", key,
                                    "a valid config key must consist of alphanumeric "
                                    "characters, '-', '_' or '.'"))
    return causes


# --- Pods ----------------------------------------------------------------------------------


def pod_for_job(job: JSON, name: str, *, uid: str, at: str) -> JSON:
    """The Pod the Job controller creates from the template, owned by the Job."""
    template, meta = job["spec"]["template"], job["metadata"]
    pod_meta: JSON = {
        "name": name, "generateName": meta["name"][:58] + "-", "namespace": meta["namespace"],
        "uid": uid, "creationTimestamp": at,
        "labels": dict(template["metadata"]["labels"]),
        "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": meta["name"],
                             "uid": meta["uid"], "controller": True,
                             "blockOwnerDeletion": True}]}
    if template["metadata"].get("annotations"):
        pod_meta["annotations"] = dict(template["metadata"]["annotations"])
    return {"apiVersion": "v1", "kind": "Pod", "metadata": pod_meta,
            "spec": copy.deepcopy(template["spec"]),
            "status": {"phase": "Pending", "qosClass": _qos(template["spec"])}}


def _qos(pod_spec: JSON) -> str:
    resources = [c.get("resources") or {} for c in pod_spec["containers"]]
    if not any(r.get("requests") or r.get("limits") for r in resources):
        return "BestEffort"
    if all(r.get("limits") and r.get("requests", r["limits"]) == r["limits"]
           for r in resources):
        return "Guaranteed"
    return "Burstable"


def _container_status(pod: JSON, state: JSON, *, ready: bool = False,
                      container_id: str | None = None) -> JSON:
    container = pod["spec"]["containers"][0]
    status: JSON = {"name": container["name"], "image": container["image"],
                    "imageID": "", "ready": ready, "restartCount": 0,
                    "started": "running" in state, "state": state, "lastState": {}}
    if container_id:
        status.update(containerID=container_id,
                      imageID=f"standin://{container['image']}")
    return status


def pod_unschedulable(pod: JSON, at: str) -> JSON:
    return {"phase": "Pending", "qosClass": pod["status"]["qosClass"], "conditions": [
        condition("PodScheduled", "False", at, "Unschedulable",
                  "0/1 nodes are available: 1 node(s) were unschedulable. preemption: 0/1 "
                  "nodes are available: 1 Preemption is not helpful for scheduling.")]}


def _scheduled(pod: JSON, at: str, phase: str, ready: bool) -> JSON:
    name = pod["spec"]["containers"][0]["name"]
    unready = (None, None) if ready else ("ContainersNotReady",
                                          f"containers with unready status: [{name}]")
    return {"phase": phase, "qosClass": pod["status"]["qosClass"],
            "hostIP": HOST_IP, "hostIPs": [{"ip": HOST_IP}],
            "podIP": HOST_IP, "podIPs": [{"ip": HOST_IP}],
            "startTime": pod["status"].get("startTime", at),
            "conditions": [
                condition("PodReadyToStartContainers", "True", at),
                condition("Initialized", "True", at),
                condition("Ready", "True" if ready else "False", at, *unready),
                condition("ContainersReady", "True" if ready else "False", at, *unready),
                condition("PodScheduled", "True", at)]}


def pod_waiting(pod: JSON, at: str, reason: str, message: str | None = None) -> JSON:
    waiting: JSON = {"reason": reason}
    if message:
        waiting["message"] = message
    status = _scheduled(pod, at, "Pending", False)
    status["containerStatuses"] = [_container_status(pod, {"waiting": waiting})]
    return status


def pod_running(pod: JSON, at: str, container_id: str) -> JSON:
    status = _scheduled(pod, at, "Running", True)
    status["containerStatuses"] = [_container_status(
        pod, {"running": {"startedAt": at}}, ready=True, container_id=container_id)]
    return status


def pod_terminated(pod: JSON, at: str, *, exit_code: int, reason: str,
                   started_at: str | None, container_id: str | None,
                   message: str | None = None) -> JSON:
    status = _scheduled(pod, at, "Succeeded" if exit_code == 0 else "Failed", False)
    for cond in status["conditions"]:
        if cond["type"] in ("Ready", "ContainersReady", "PodReadyToStartContainers"):
            cond.update(status="False", reason="PodCompleted")
            cond.pop("message", None)
    terminated: JSON = {"exitCode": exit_code, "reason": reason, "finishedAt": at}
    if started_at:
        terminated["startedAt"] = started_at
    if container_id:
        terminated["containerID"] = container_id
    if message:
        terminated["message"] = message
    status["containerStatuses"] = [_container_status(
        pod, {"terminated": terminated}, container_id=container_id)]
    return status


# --- running a pod's container as a process ------------------------------------------------


class NotStartable(Exception):
    """The container cannot start yet; ``reason`` is the waiting reason a kubelet reports."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass
class Launch:
    """Everything needed to start one container as a local process."""

    argv: list[str]
    env: dict[str, str]
    cwd: Path
    mounts: dict[str, Path]                       #: mountPath -> local path
    dirs: list[Path] = field(default_factory=list)
    files: list[tuple[Path, bytes, int]] = field(default_factory=list)


def _expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes ``$(VAR)`` expansion: known names replaced, ``$$`` escapes, rest kept."""
    return re.sub(r"\$\$|\$\(([^()]*)\)",
                  lambda m: "$" if m[0] == "$$" else env.get(m[1], m[0]), text)


def _rewrite(value: str, mounts: Mapping[str, Path]) -> str:
    """A value that is a mountPath, or a path under one, points into the local volume."""
    for path in sorted(mounts, key=len, reverse=True):
        if value == path or value.startswith(path + "/"):
            return str(mounts[path]) + value[len(path):]
    return value


def _secret_data(secret: JSON) -> dict[str, bytes]:
    return {k: base64.b64decode(v) for k, v in (secret.get("data") or {}).items()}


def plan_launch(pod: JSON, secrets: Mapping[str, JSON], root: Path, *, python: str,
                entrypoints: Mapping[str, list[str]]) -> Launch:
    """How to run the pod's container here, or :class:`NotStartable` with the reason."""
    spec = pod["spec"]
    container = spec["containers"][0]
    volumes_dir = root / "volumes"
    launch = Launch(argv=[], env={}, cwd=root / "work", mounts={}, dirs=[root / "work"])
    for volume in spec.get("volumes") or []:
        where = volumes_dir / volume["name"]
        launch.dirs.append(where)
        if "secret" in volume:
            launch.files += _secret_files(volume, secrets, where)
    for mount in container.get("volumeMounts") or []:
        local = volumes_dir / mount["name"] / mount.get("subPath", "")
        launch.mounts[mount["mountPath"].rstrip("/") or "/"] = local
    env = launch.env
    for source in container.get("envFrom") or []:
        ref = source["secretRef"]
        secret = secrets.get(ref["name"])
        if secret is None:
            if ref.get("optional"):
                continue
            raise NotStartable("CreateContainerConfigError", f'secret "{ref["name"]}" not found')
        for key, data in sorted(_secret_data(secret).items()):
            env[source.get("prefix", "") + key] = data.decode()
    for var in container.get("env") or []:
        value = _env_value(pod, var, secrets, env)
        if value is not None:
            env[var["name"]] = value
    for name, text in env.items():
        env[name] = _rewrite(text, launch.mounts)
    command = container.get("command") or entrypoints[container["image"]]
    argv = [_rewrite(_expand(arg, env), launch.mounts)
            for arg in [*command, *container.get("args", [])]]
    if _PYTHON.fullmatch(os.path.basename(argv[0])):
        argv[0] = python
    launch.argv = argv
    return launch


def _secret_files(volume: JSON, secrets: Mapping[str, JSON],
                  where: Path) -> list[tuple[Path, bytes, int]]:
    source = volume["secret"]
    secret = secrets.get(source["secretName"])
    if secret is None:
        if source.get("optional"):
            return []
        raise NotStartable("ContainerCreating",
                           f'MountVolume.SetUp failed for volume "{volume["name"]}" : '
                           f'secret "{source["secretName"]}" not found')
    data = _secret_data(secret)
    mode = source.get("defaultMode", 0o644)
    items = source.get("items") or [{"key": k, "path": k} for k in sorted(data)]
    files = []
    for item in items:
        if item["key"] not in data:
            raise NotStartable("ContainerCreating",
                               f'MountVolume.SetUp failed for volume "{volume["name"]}" : '
                               f"references non-existent secret key: {item['key']}")
        files.append((where / item["path"], data[item["key"]], item.get("mode", mode)))
    return files


def _env_value(pod: JSON, var: JSON, secrets: Mapping[str, JSON],
               env: Mapping[str, str]) -> str | None:
    if "valueFrom" not in var:
        return _expand(var.get("value", ""), env)
    source = var["valueFrom"]
    if ref := source.get("secretKeyRef"):
        secret = secrets.get(ref["name"])
        data = _secret_data(secret) if secret else {}
        if ref["key"] in data:
            return data[ref["key"]].decode()
        if ref.get("optional"):
            return None
        namespace = pod["metadata"]["namespace"]
        raise NotStartable("CreateContainerConfigError",
                           f'secret "{ref["name"]}" not found' if secret is None else
                           f"couldn't find key {ref['key']} in Secret "
                           f"{namespace}/{ref['name']}")
    path = source["fieldRef"]["fieldPath"]
    meta = pod["metadata"]
    if m := re.fullmatch(r"metadata\.(labels|annotations)\['(.*)'\]", path):
        return str((meta.get(m[1]) or {}).get(m[2], ""))
    values: dict[str, str] = {
        "metadata.name": meta["name"], "metadata.namespace": meta["namespace"],
        "metadata.uid": meta["uid"], "spec.nodeName": pod["spec"].get("nodeName", ""),
        "spec.serviceAccountName": pod["spec"].get("serviceAccountName", ""),
        "status.hostIP": HOST_IP, "status.podIP": HOST_IP}
    if path not in values:
        raise NotStartable("CreateContainerConfigError",
                           f"unsupported fieldRef {path!r} in the Kubernetes stand-in")
    return values[path]

