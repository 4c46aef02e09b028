"""The ``batch/v1`` Job the Kubernetes runner creates for one claimed node run.

Pure functions from a :class:`~executors.contract.NodeRequest` and the deployment's
:class:`JobSettings` to a plain manifest (a ``dict``, no client library), so the same
code serves the runner, ``ax k8s job`` and the schema tests. Seed 003 §3.4 gives the
shape; what this module adds, and why:

- **One Job per (task, node, fence)**, named by :func:`job_name`: an executor that
  crashed after creating a Job and claims again under the same fence finds the same
  name (``409 AlreadyExists``) and adopts the Job instead of starting a second run; a new
  claim (fence + 1) gets a new Job.
- **Kubernetes never retries** (``backoffLimit: 0``, ``restartPolicy: Never``): attempts
  are the engine's, counted under fences. ``activeDeadlineSeconds`` is the node
  ``timeout``; ``ttlSecondsAfterFinished`` lets the cluster collect finished Jobs.
- **The pod holds no executor credentials in its spec**: the token it reports with is a
  file of a Secret volume (``AX_TOKEN_FILE``), never an environment variable or an
  argument (both show in ``kubectl describe`` and ``ps``); no service-account token is
  mounted. Non-root, read-only root filesystem, no privilege escalation, every
  capability dropped, the runtime's seccomp profile; ``/tmp`` is an ``emptyDir``.
- **No input in the manifest**: the pod fetches the rendered input from the API with its
  fence, so a Job never carries task data (or its size) into the cluster's store.

Settings come from a YAML file (``load_job_settings``; ``deploy/k8s/job-settings.yaml``
ships one as a ConfigMap); its format is in ``docs/deployment.md`` (Kubernetes).
"""

from __future__ import annotations

import difflib
import hashlib
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from axengine.config import DEFAULT_PREFIX
from axengine.dag import DEFAULT_TIMEOUT, RESOURCE_NAMES, RESOURCE_SECTIONS, parse_quantity
from axengine.errors import InputError
from executors.contract import NodeRequest

__all__ = [
    "ENTRY_COMMAND",
    "EXECUTOR_NODE_TYPES",
    "MANAGED_LABEL",
    "TOKEN_FILE",
    "JobSettings",
    "build_job",
    "job_name",
    "label_value",
    "load_job_settings",
    "parse_selector",
]

#: Command of the Job's container: the entry point that fetches the input, runs the
#: handler and reports through the API under the claim's fence.
ENTRY_COMMAND: tuple[str, ...] = ("python", "-m", "axengine.runners.job_entry")
#: Label every ax Job and pod carries (``ax-managed: "true"``); the NetworkPolicy of
#: node pods and ``kubectl get jobs -l ax-managed=true`` select on it.
MANAGED_LABEL = "ax-managed"
#: Node types that run in a Job (conditions and gates are decided by the API server).
EXECUTOR_NODE_TYPES: tuple[str, ...] = ("tool_call", "llm_call")
#: Where the pod finds its API token (a read-only Secret volume).
TOKEN_DIR = "/var/run/secrets/ax"
TOKEN_FILE = f"{TOKEN_DIR}/token"
#: Bound of the writable ``/tmp`` (the root filesystem is read-only).
TMP_SIZE_LIMIT = "1Gi"
#: Where the handler settings ConfigMap is mounted (``settings_configmap``).
SETTINGS_DIR = "/etc/ax/handler"
SETTINGS_KEY = "settings.json"
#: Key of the settings file in a ConfigMap manifest (``deploy/k8s/job-settings.yaml``).
CONFIGMAP_KEY = "job-settings.yaml"
#: Container name inside the Job's pod.
CONTAINER = "node"

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?\Z")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z")
_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?\Z")
_SECRET_KEY = re.compile(r"[-._a-zA-Z0-9]+\Z")
_HOST_PORT = re.compile(r"[A-Za-z0-9.\-\[\]:]+:[0-9]{1,5}\Z")
_PULL_POLICIES = ("Always", "IfNotPresent", "Never")
_HASH_CHARS = 10


def _digest(*parts: str) -> str:
    # NUL-joined: ("a-b", "c") and ("a", "b-c") must not collide.
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:_HASH_CHARS]


def _slug(text: str, limit: int) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return slug[:limit].rstrip("-")


def job_name(task_id: str, node_id: str, fence: int) -> str:
    """The Job's name: ``ax-<task>-<node>-<fence>-<hash>``, a DNS-1123 label (≤ 63).

    Deterministic, so the Job of a claim is found again after an executor crash; the
    hash of the exact ids keeps names apart when the readable parts (lower-cased,
    shortened) coincide.
    """
    shown = str(fence) if len(str(fence)) <= 12 else ""  # the hash covers any fence
    tail = f"-{shown}-" if shown else "-"
    tail += _digest(task_id, node_id, str(fence))
    budget = 63 - len("ax") - len(tail)
    node = _slug(node_id, max(0, budget // 2 - 1))
    task = _slug(task_id, max(0, budget - len(node) - 2))
    parts = ["ax", *(p for p in (task, node) if p)]
    return "-".join(parts) + tail


def label_value(text: str) -> str:
    """``text`` as a valid label value: unchanged when it already is one, otherwise a
    readable prefix and a hash of the whole text (at most 63 characters)."""
    if len(text) <= 63 and _LABEL_VALUE.match(text):
        return text
    readable = re.sub(r"[^-A-Za-z0-9_.]+", "_", text)
    readable = readable[:63 - _HASH_CHARS - 1]
    readable = re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", readable)
    digest = _digest(text)
    return f"{readable}-{digest}" if readable else digest


def parse_selector(text: str) -> tuple[tuple[str, str | None], ...]:
    """An equality label selector (``ax-canary=true``, ``a=b,c``) as (key, value) pairs;
    a bare key (value None) matches any value of that label.

    Raises:
        ValueError: not an equality selector.
    """
    pairs: list[tuple[str, str | None]] = []
    for term in (t.strip() for t in text.split(",")):
        key, sep, value = term.partition("==" if "==" in term else "=")
        key, value = key.strip(), value.strip()
        if not key or "!" in key or not _valid_label_key(key):
            raise ValueError(f"{term!r} is not a label key or key=value term")
        if sep and not _LABEL_VALUE.match(value):
            raise ValueError(f"{value!r} is not a label value")
        pairs.append((key, value if sep else None))
    return tuple(pairs)


def _valid_label_key(key: str) -> bool:
    prefix, _, name = key.rpartition("/")
    if prefix and (len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix)):
        return False
    return 0 < len(name) <= 63 and bool(_LABEL_VALUE.match(name))


ResourceMap = Mapping[str, Mapping[str, str]]


@dataclass(frozen=True)
class JobSettings:
    """How the deployment wants node Jobs built (the ``--config`` / ConfigMap file).

    Attributes:
        namespace: Namespace the Jobs are created in.
        api_address: The API's gRPC ``host:port`` as pods see it.
        token_secret: Name of the Secret holding the token pods report with.
        token_key: Key of the token inside that Secret.
        default_image: Image of a node with no more specific entry in ``images``.
        images: Image by node type (``llm_call``, ``tool_call``) or by tool
            (``tool:<name>``, which wins over ``tool_call``).
        canary_selector: Equality selector on task labels (``ax-canary=true``); the
            nodes of a task it matches run ``canary_image`` (seed 003 §4.5).
        canary_image: The image under test; the canary is off while it is None.
        resources: Default ``requests``/``limits``; a node's own ``resources`` are
            merged over them.
        max_resources: Upper bound of any request or limit by resource (``cpu``,
            ``memory``); a node asking for more is refused before a Job is created.
        ttl_seconds_after_finished: Seconds a finished Job is kept before the cluster
            deletes it.
        service_account_name: Service account of node pods (its token is never
            mounted); the namespace's ``default`` when None.
        image_pull_policy: ``IfNotPresent``, ``Always`` or ``Never``.
        run_as_user: Non-root uid (and gid) of the container; the image's ``ax`` user.
        prefix: Store key prefix of the API (``AX_SNAPSHOT_KEY`` is under it).
        pod_labels: Extra labels of node pods (may not use the ``ax-`` labels).
        pod_annotations: Extra annotations of node pods.
        settings_configmap: ConfigMap holding the handlers' settings as JSON (key
            ``settings.json``: ``llm_base_url``, egress policy, ``smtp_url``... see
            ``docs/executors.md``), mounted read-only and named by
            ``AX_SETTINGS_FILE``; none when None.
    """

    namespace: str = "ax"
    api_address: str = "ax-api:50051"
    token_secret: str = "ax-job-token"
    token_key: str = "token"
    default_image: str = "ax:dev"
    images: Mapping[str, str] = field(default_factory=dict)
    canary_selector: tuple[tuple[str, str | None], ...] = ()
    canary_image: str | None = None
    resources: ResourceMap = field(default_factory=lambda: {
        "requests": {"cpu": "100m", "memory": "128Mi"},
        "limits": {"cpu": "1", "memory": "512Mi"},
    })
    max_resources: Mapping[str, str] = field(default_factory=lambda: {
        "cpu": "4", "memory": "8Gi"})
    ttl_seconds_after_finished: int = 3600
    service_account_name: str | None = None
    image_pull_policy: str = "IfNotPresent"
    run_as_user: int = 10001
    prefix: str = DEFAULT_PREFIX
    pod_labels: Mapping[str, str] = field(default_factory=dict)
    pod_annotations: Mapping[str, str] = field(default_factory=dict)
    settings_configmap: str | None = None

    def image_for(self, request: NodeRequest) -> str:
        """The canary image for a task the selector matches, else the most specific
        image: ``tool:<name>``, then the node type, then the default."""
        if self.canary_image and self.canary_selector and all(
                key in request.labels and (value is None or request.labels[key] == value)
                for key, value in self.canary_selector):
            return self.canary_image
        tool = request.config.get("tool")
        if request.node_type == "tool_call" and f"tool:{tool}" in self.images:
            return self.images[f"tool:{tool}"]
        return self.images.get(request.node_type, self.default_image)


def _check_resources(value: Any, where: str, problems: list[str]) -> dict[str, dict[str, str]]:
    if not isinstance(value, Mapping):
        problems.append(f"{where}: expected a mapping of requests/limits")
        return {}
    out: dict[str, dict[str, str]] = {}
    for section, items in value.items():
        if section not in RESOURCE_SECTIONS:
            problems.append(f"{where}.{section}: unknown key{_close(section, RESOURCE_SECTIONS)}")
        elif not isinstance(items, Mapping):
            problems.append(f"{where}.{section}: expected a mapping of cpu/memory")
        else:
            out[section] = _check_amounts(items, f"{where}.{section}", problems)
    requests, limits = out.get("requests", {}), out.get("limits", {})
    for name in sorted(set(requests) & set(limits)):
        if parse_quantity(requests[name]) > parse_quantity(limits[name]):
            problems.append(f"{where}.requests.{name}: {requests[name]} is more than "
                            f"{where}.limits.{name} {limits[name]}")
    return out


def _check_amounts(value: Mapping[str, Any], where: str, problems: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for name, amount in value.items():
        if name not in RESOURCE_NAMES:
            problems.append(f"{where}.{name}: unknown resource{_close(name, RESOURCE_NAMES)}")
            continue
        text = str(amount) if isinstance(amount, int | float) and not isinstance(
            amount, bool) else amount
        try:
            parse_quantity(text if isinstance(text, str) else "")
        except ValueError:
            problems.append(f"{where}.{name}: {amount!r} is not a non-negative Kubernetes "
                            f"quantity (e.g. 500m, 1, 256Mi, 1Gi)")
            continue
        out[name] = text
    return out


def _close(word: str, choices: tuple[str, ...]) -> str:
    close = difflib.get_close_matches(word, choices, n=1)
    return f" (did you mean {close[0]!r}?)" if close else f" (one of {', '.join(choices)})"


#: Settings given as one string: the pattern it must match and what that is, in words.
_TEXT_SETTINGS: Mapping[str, tuple[re.Pattern[str] | None, str]] = {
    "namespace": (_DNS_LABEL, "a namespace name (a DNS-1123 label)"),
    "api_address": (_HOST_PORT, "host:port"),
    "token_secret": (_DNS_SUBDOMAIN, "a Secret name"),
    "token_key": (_SECRET_KEY, "a key of a Secret"),
    "default_image": (None, "an image"),
    "prefix": (re.compile(r"/\S*\Z"), "a key prefix starting with /"),
    "service_account_name": (_DNS_SUBDOMAIN, "a ServiceAccount name"),
    "settings_configmap": (_DNS_SUBDOMAIN, "a ConfigMap name"),
    "image_pull_policy": (re.compile("(" + "|".join(_PULL_POLICIES) + r")\Z"),
                          f"one of {', '.join(_PULL_POLICIES)}"),
}
#: Settings given as an integer, with their least value.
_INT_SETTINGS: Mapping[str, int] = {"ttl_seconds_after_finished": 0, "run_as_user": 1}


def _settings_from(data: Mapping[str, Any], problems: list[str]) -> dict[str, Any]:
    """Check every key of a settings mapping; the values :class:`JobSettings` takes."""
    known = (*_TEXT_SETTINGS, *_INT_SETTINGS, "images", "canary", "resources",
             "max_resources", "pod_labels", "pod_annotations")
    out: dict[str, Any] = {}
    for key, value in data.items():
        if key in _TEXT_SETTINGS:
            pattern, what = _TEXT_SETTINGS[key]
            if isinstance(value, str) and value and (pattern is None or pattern.match(value)):
                out[key] = value
            else:
                problems.append(f"{key}: {value!r} is not {what}")
        elif key in _INT_SETTINGS:
            low = _INT_SETTINGS[key]
            if isinstance(value, int) and not isinstance(value, bool) and value >= low:
                out[key] = value
            else:
                problems.append(f"{key}: {value!r} is not an integer >= {low}")
        elif key == "canary":
            out.update(_canary(value, problems))
        elif key == "resources":
            out[key] = _check_resources(value, key, problems)
        elif key == "max_resources":
            if isinstance(value, Mapping):
                out[key] = _check_amounts(value, key, problems)
            else:
                problems.append(f"{key}: expected a mapping of cpu/memory")
        elif key in ("images", "pod_labels", "pod_annotations"):
            strings = _strings(key, value, problems)
            if strings is not None:
                out[key] = strings
        else:
            problems.append(f"{key}: unknown key{_close(str(key), known)}")
    return out


def _strings(key: str, value: Any, problems: list[str]) -> dict[str, str] | None:
    """A mapping of names to strings: image names, or labels and annotations of pods."""
    if not isinstance(value, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) and v for k, v in value.items()):
        problems.append(f"{key}: expected a mapping of names to non-empty strings")
        return None
    for name, text in value.items():
        if key == "images":
            if name not in EXECUTOR_NODE_TYPES and not re.match(r"tool:.+\Z", name):
                problems.append(f"images.{name}: expected llm_call, tool_call or tool:<name>")
        elif not _valid_label_key(name) or name.startswith("ax-"):
            problems.append(f"{key}.{name}: not a label key of your own (ax-* are ax's)")
        elif key == "pod_labels" and not _LABEL_VALUE.match(text):
            problems.append(f"{key}.{name}: {text!r} is not a label value")
    return dict(value)


def _canary(value: Any, problems: list[str]) -> dict[str, Any]:
    if not isinstance(value, Mapping) or set(value) - {"selector", "image"}:
        problems.append("canary: expected {selector: 'ax-canary=true', image: IMAGE}")
        return {}
    out: dict[str, Any] = {}
    selector, image = value.get("selector"), value.get("image")
    try:
        out["canary_selector"] = parse_selector(selector) if isinstance(selector, str) else ()
    except ValueError as exc:
        problems.append(f"canary.selector: {exc}")
    if not isinstance(selector, str) or not isinstance(image, str) or not image:
        problems.append("canary: needs both `selector` (e.g. ax-canary=true) and `image`")
    else:
        out["canary_image"] = image
    return out


def load_job_settings(path: str | os.PathLike[str]) -> JobSettings:
    """Read the Job settings file (YAML; every key optional, see ``docs/deployment.md``),
    or a ConfigMap manifest holding it under the key ``job-settings.yaml``.

    Raises:
        InputError: The file cannot be read, is not YAML, or has unknown keys or bad
            values (every problem listed, each naming the file and the key).
    """
    file = os.fspath(path)
    try:
        with open(file, encoding="utf-8") as fh:
            data = yaml.safe_load(fh)
    except OSError as exc:
        raise InputError(f"cannot read job settings {file}: {exc.strerror or exc}") from exc
    except yaml.YAMLError as exc:
        raise InputError(f"job settings {file} is not valid YAML: {exc}") from exc
    if isinstance(data, Mapping) and data.get("kind") == "ConfigMap":
        # deploy/k8s/job-settings.yaml as it is: the settings are its data key.
        text = (data.get("data") or {}).get(CONFIGMAP_KEY)
        if not isinstance(text, str):
            raise InputError(f"{file}: a ConfigMap without the key data.{CONFIGMAP_KEY}")
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise InputError(f"{file}: data.{CONFIGMAP_KEY} is not valid YAML: {exc}") \
                from exc
    if data is None:
        return JobSettings()
    if not isinstance(data, Mapping):
        raise InputError(f"{file}: job settings must be a mapping of keys to values")
    problems: list[str] = []
    values = _settings_from(data, problems)
    if problems:
        raise InputError("\n".join(f"{file}: {p}" for p in problems))
    return JobSettings(**values)


def _merged_resources(request: NodeRequest, settings: JobSettings) -> dict[str, dict[str, str]]:
    """The node's ``resources`` over the defaults. Where that puts a request above its
    limit, the value the node set wins and the other follows it (a node asking 2 cpu
    under a default limit of 1 gets a limit of 2), so the pod is never refused for it."""
    node: ResourceMap = request.config.get("resources") or {}
    merged = {section: {**settings.resources.get(section, {}), **node.get(section, {})}
              for section in RESOURCE_SECTIONS}
    requests, limits = merged["requests"], merged["limits"]
    for name in RESOURCE_NAMES:
        if name in requests and name in limits and \
                parse_quantity(requests[name]) > parse_quantity(limits[name]):
            if name in node.get("requests", {}):
                limits[name] = requests[name]
            else:
                requests[name] = limits[name]
    for section, amounts in merged.items():
        for name, amount in amounts.items():
            bound = settings.max_resources.get(name)
            if bound is not None and parse_quantity(amount) > parse_quantity(bound):
                raise InputError(
                    f"node {request.node_id!r}: resources.{section}.{name} {amount} is above "
                    f"the deployment's maximum {bound} (max_resources.{name} of the job "
                    f"settings)")
    return {section: amounts for section, amounts in merged.items() if amounts}


def _deadline(request: NodeRequest) -> int:
    """``activeDeadlineSeconds``: the node timeout, rounded up to whole seconds."""
    timeout = request.config.get("timeout")
    if not isinstance(timeout, int | float) or isinstance(timeout, bool) or timeout <= 0:
        timeout = DEFAULT_TIMEOUT.get(request.node_type, 300.0)
    return max(1, math.ceil(timeout))


def build_job(request: NodeRequest, *, settings: JobSettings, dag_hash: str) -> dict[str, Any]:
    """The ``batch/v1`` Job manifest that runs ``request`` (see the module docstring).

    Args:
        request: The claim's request (attempt, fence, node config, task labels).
        settings: The deployment's Job settings.
        dag_hash: Content hash of the task's DAG (labelled ``ax-dag``).

    Raises:
        InputError: The node is not one a Job runs (a condition or a gate), or asks
            for more resources than ``settings.max_resources`` allows.
    """
    if request.node_type not in EXECUTOR_NODE_TYPES:
        raise InputError(f"node {request.node_id!r} is a {request.node_type} node: the API "
                         f"server decides it, no Job runs it")
    name = job_name(request.task_id, request.node_id, request.fence)
    labels = {
        **settings.pod_labels,
        MANAGED_LABEL: "true",
        "ax-task": label_value(request.task_id),
        "ax-node": label_value(request.node_id),
        "ax-fence": str(request.fence),
        "ax-attempt": str(request.attempt),
        "ax-dag": label_value(dag_hash[:63]),
    }
    # Labels may be shortened to fit; the exact ids stay readable here.
    annotations = {**settings.pod_annotations, "ax-task-id": request.task_id,
                   "ax-node-id": request.node_id}
    env = {
        "AX_TASK_ID": request.task_id,
        "AX_NODE_ID": request.node_id,
        "AX_FENCE": str(request.fence),
        "AX_ATTEMPT": str(request.attempt),
        "AX_SNAPSHOT_KEY": f"{settings.prefix}/snapshots/{request.task_id}/{request.node_id}",
        "AX_API": settings.api_address,
        "AX_TOKEN_FILE": TOKEN_FILE,
    }
    mounts = [{"name": "ax-token", "mountPath": TOKEN_DIR, "readOnly": True},
              {"name": "tmp", "mountPath": "/tmp"}]
    volumes: list[dict[str, Any]] = [
        {"name": "ax-token", "secret": {
            "secretName": settings.token_secret,
            "items": [{"key": settings.token_key, "path": "token"}],
            "defaultMode": 0o440,
        }},
        {"name": "tmp", "emptyDir": {"sizeLimit": TMP_SIZE_LIMIT}},
    ]
    if settings.settings_configmap:
        env["AX_SETTINGS_FILE"] = f"{SETTINGS_DIR}/{SETTINGS_KEY}"
        mounts.append({"name": "ax-settings", "mountPath": SETTINGS_DIR, "readOnly": True})
        volumes.append({"name": "ax-settings", "configMap": {
            "name": settings.settings_configmap,
            "items": [{"key": SETTINGS_KEY, "path": SETTINGS_KEY}]}})
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": settings.image_for(request),
        "imagePullPolicy": settings.image_pull_policy,
        "command": list(ENTRY_COMMAND),
        "env": [{"name": k, "value": v} for k, v in env.items()],
        "securityContext": {
            "runAsNonRoot": True,
            "readOnlyRootFilesystem": True,
            "allowPrivilegeEscalation": False,
            "privileged": False,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "volumeMounts": mounts,
    }
    resources = _merged_resources(request, settings)
    if resources:
        container["resources"] = resources
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        # No $SERVICE_HOST/$SERVICE_PORT variables of every Service in the namespace.
        "enableServiceLinks": False,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": settings.run_as_user,
            "runAsGroup": settings.run_as_user,
            "fsGroup": settings.run_as_user,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
        "volumes": volumes,
    }
    if settings.service_account_name:
        pod_spec["serviceAccountName"] = settings.service_account_name
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": settings.namespace, "labels": labels,
                     "annotations": annotations},
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": _deadline(request),
            "ttlSecondsAfterFinished": settings.ttl_seconds_after_finished,
            "template": {
                "metadata": {"labels": dict(labels), "annotations": dict(annotations)},
                "spec": pod_spec,
            },
        },
    }
