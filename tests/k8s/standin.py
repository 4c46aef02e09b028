"""A TEST DOUBLE of the Kubernetes API: the subset the ax kubernetes runner uses, served over
HTTP on loopback so the real client library (lightkube) is exercised end to end. It is not
a Kubernetes: no nodes, no containers, no images, no RBAC. Each Job's container command runs
as a local process group of the test's own user.

Starting it
    Tests take the ``kube`` fixture (``tests/k8s/conftest.py``): the stand-in, or a real
    cluster when ``AX_K8S_CONTEXT`` names a kubeconfig context (see *Real cluster* below).
    ``k8s_standin`` is always the stand-in. Outside pytest::

        with KubeStandIn(tmp_path) as kube:          # binds 127.0.0.1:<free port>
            client = lightkube.AsyncClient(config=kube.config())
            # or KubeConfig.from_file(kube.kubeconfig); kube.url is http://127.0.0.1:PORT

    ``kube.kubeconfig`` is a minimal kubeconfig (cluster ``server: http://127.0.0.1:PORT``,
    an empty user: no auth, context ``standin``, namespace ``default``).

What it serves (the wire format of a v1.37 API server)
    - ``batch/v1`` jobs: create, get, list, watch, delete, deletecollection.
    - ``v1`` pods (made by Jobs only): get, list, watch, delete, deletecollection, ``log``
      (``follow``, ``tailLines``, ``container``).
    - ``v1`` secrets: create, get, list, watch, delete.
    - ``labelSelector`` (``=``, ``==``, ``!=``, ``in``, ``notin``, exists, ``!``) and
      ``fieldSelector`` (``metadata.name``, ``metadata.namespace``, pods' ``status.phase``
      and ``spec.nodeName``, jobs' ``status.successful``); ``limit``/``continue``;
      ``dryRun=All``; ``/version``, ``/readyz``. Any namespace exists.
    - Errors are ``Status`` objects with real reasons and messages: 400 BadRequest, 403
      Forbidden (``forbid``), 404 NotFound, 405 MethodNotAllowed (PUT, PATCH, pod create),
      409 AlreadyExists, 410 Expired, 422 Invalid with ``details.causes[].field``.
    - Every object written is checked against the strict v1.37 JSON schema of
      ``kubernetes_validate`` (incoming ones too, see below).

resourceVersion and watch
    One counter for all objects; every write bumps it. A list carries the counter in
    ``metadata.resourceVersion``. A watch without ``resourceVersion`` (or ``"0"``) first
    sends ADDED for what exists; from ``N`` it replays the history after ``N``; below what
    ``compact()`` kept it sends one ERROR event whose object is a 410 ``Expired`` Status, as
    the watch cache does (lightkube raises ``ApiError``; with ``on_error_retry`` it relists).
    ``timeoutSeconds`` ends a stream cleanly; ``drop_watches()`` ends every open stream
    abruptly (no terminating chunk: httpx raises ``RemoteProtocolError``).

Jobs and their pods
    A Job POST returns before its Pod exists (the controller runs on its own thread). The
    Pod is ``<job>-<5 chars>`` with labels ``job-name``, ``controller-uid`` and their
    ``batch.kubernetes.io/`` twins, and an ownerReference to the Job. It is scheduled
    (``spec.nodeName``), then its container starts: ``phase: Running``; Job ``active: 1``,
    ``ready: 1``, ``startTime``. On exit 0: pod Succeeded, container terminated ``Completed``;
    the Job gets ``SuccessCriteriaMet`` then ``Complete`` (two writes, as 1.31+ servers do),
    ``succeeded: 1``, ``completionTime``. On a non-zero exit or a kill: pod Failed, reason
    ``Error`` (``OOMKilled`` after ``oom_next``), exit code ``128+signal`` when signalled;
    the Job gets ``FailureTarget`` then ``Failed``, reason ``BackoffLimitExceeded``,
    ``failed: 1``. ``activeDeadlineSeconds`` (from the Job's start, pending or not): the
    Job gets ``FailureTarget`` reason ``DeadlineExceeded``, its pod is deleted gracefully,
    then ``Failed`` ``DeadlineExceeded``. A missing executable: terminated ``StartError``,
    exit 128.

    Deleting a Job: ``propagationPolicy=Background`` removes the Job, then deletes its pods;
    ``Foreground`` marks the Job (``deletionTimestamp``, finalizer ``foregroundDeletion``),
    deletes the pods and removes the Job when they are gone; unset means ``Orphan`` for
    batch/v1 Jobs, exactly as a real server (pods keep running, ownerReferences dropped, and
    the same ``Warning`` header). Deleting a running pod is graceful: ``deletionTimestamp``,
    SIGTERM to its process group, SIGKILL after the grace period (``gracePeriodSeconds`` or
    the pod's ``terminationGracePeriodSeconds``, default 30), terminated status, DELETED. A
    pod that is not running, or ``gracePeriodSeconds=0``, goes at once. A Job whose pod is
    deleted or killed fails (backoffLimit 0: no replacement pod).

How a container runs here
    ``command + args`` (``$(VAR)`` expanded as the kubelet does) as a new session (its own
    process group) with **exactly** the container's environment: ``env`` values,
    ``valueFrom.secretKeyRef``, ``valueFrom.fieldRef`` (name, namespace, uid, labels,
    annotations, nodeName, podIP) and ``envFrom.secretRef``; nothing else: no PATH, HOME,
    HOSTNAME or KUBERNETES_* (an image would supply the first ones). ``python``/``python3``
    (any path) become the test interpreter ``sys.executable``. The working directory is a
    fresh ``<root>/pods/<ns>.<pod>/work`` (``workingDir`` is ignored); stdout and stderr
    go to one log, as a container runtime does.

    Volumes: ``secret`` (``items``, ``defaultMode``/``mode``, ``optional``) and
    ``emptyDir`` are materialized under ``<root>/pods/<ns>.<pod>/volumes/<volume>/``. Every
    ``volumeMounts[].mountPath`` maps to that directory (``subPath`` appended) and **a
    value that equals a mountPath, or starts with ``mountPath + "/"``, is rewritten to the
    local path** in env values, ``command`` and ``args`` (longest mountPath first). So
    ``AX_TOKEN_FILE=/var/run/ax/token`` with a Secret mounted at ``/var/run/ax`` reaches
    the process as ``<pod root>/volumes/token/token``. A path built inside the program, or
    embedded in a longer argument (``--token=/var/run/ax/token``), is not rewritten.

    A referenced Secret or key that is missing keeps the pod Pending with the kubelet's
    reasons (``CreateContainerConfigError`` for env, ``ContainerCreating`` for a volume,
    checked first; the ``FailedMount`` text a real cluster puts in an Event is the waiting
    ``message`` here); creating the Secret later lets it start.

Incoming objects are refused as a real server would, and stricter where it helps
    422 Invalid, naming each field: unknown fields anywhere and wrong types (the strict
    v1.37 schema; a real server with the default ``fieldValidation=Warn`` would drop
    unknown fields with a Warning, with ``Strict`` answer 400), names that are not DNS-1123
    subdomains, Job names over 63 characters (the generated ``job-name`` label value, field
    ``spec.template.labels``), bad label keys/values and annotation keys, a missing or bad
    ``restartPolicy``, duplicate/invalid container or volume names, mounts of undeclared
    volumes, env names with ``=``. 409 AlreadyExists for an existing name. A
    ``resourceVersion`` on create is 400. Jobs the stand-in cannot simulate faithfully are
    refused with 422 and reason ``FieldValueNotSupported`` ("not supported by the
    Kubernetes stand-in") rather than run wrongly: ``backoffLimit`` other than 0 (unset
    included: the server default is 6; ax Jobs always set 0), ``completions``/
    ``parallelism`` other than 1, ``suspend``, Indexed mode, pod failure/success policies,
    a manual selector, ``restartPolicy: OnFailure``, init or several containers, volumes
    other than secret/emptyDir, configMap or resource env sources, and a container without
    ``command`` whose image has no ``image_entrypoint()``.

Knobs (methods; each takes effect for pods not yet running)
    ``fail_image_pull(image, failing=True)`` pods of that image wait with ``ErrImagePull``
    then ``ImagePullBackOff``; ``failing=False`` lets them start. ``unschedulable(on)``
    new pods stay Pending with ``PodScheduled=False``, reason ``Unschedulable``.
    ``hold_starts(on)`` / ``release()`` pods wait in ``ContainerCreating``.
    ``oom_next(job_name_prefix | predicate(pod))`` the next matching pod is SIGKILLed right
    after it starts and reported ``OOMKilled``, exit 137. ``kill_pod(name, signal)``
    signals a running pod's process group. ``compact()``, ``drop_watches()``.
    ``forbid(verb, resource, message=None)`` / ``allow(...)`` answer 403 (a quota refusal
    is ``forbid("create", "jobs", "exceeded quota: ...")``). ``image_entrypoint(image,
    argv)`` the ENTRYPOINT of an image, for containers that only give ``args``.

Accessors
    ``requests(verb=, resource=, method=, status=)`` every request received
    (:class:`RequestRecord`: method, path, query, parsed body, answered status, verb,
    resource, namespace, name); ``objects(resource, namespace)``; ``process(pod)``
    (:class:`PodProcess`: pid, argv, env, cwd, log, exit code, running);
    ``resource_version``; ``wait_until(predicate, timeout)`` blocks until a predicate of
    the stand-in's state holds, re-checked on every change (no sleeping).

Not implemented
    PUT/PATCH/apply, pods created directly, ConfigMaps, ServiceAccounts and tokens,
    Namespaces (any name works), ResourceQuota and RBAC (``forbid`` fakes their answers),
    events, bookmarks, ``sendInitialEvents``, watch events for objects leaving a label
    selector, pod ``activeDeadlineSeconds``, ``ttlSecondsAfterFinished`` (accepted, never
    enforced), pod finalizers, resource limits (no cgroups: only ``oom_next`` makes OOM),
    ``securityContext`` and ``readOnlyRootFilesystem`` (accepted, not enforced), log
    ``timestamps``/``sinceSeconds``, paging snapshots (each page is read afresh).

Real cluster
    With ``AX_K8S_CONTEXT=<context>`` (and ``KUBECONFIG`` if not ``~/.kube/config``) the
    ``kube`` fixture yields a :class:`RealCluster` with the same ``kubeconfig``,
    ``context``, ``namespace`` (``AX_K8S_NAMESPACE``, default ``default``), ``url``,
    ``config()``, ``client()`` and ``python_image`` (``AX_K8S_PYTHON_IMAGE``: an image
    with ax installed). Its knobs and accessors skip the test, naming the knob: a test that
    needs a fault injected or the request log is a stand-in test. Nothing else changes, so
    the same test runs against both; it must create its own uniquely named objects and
    delete them (with ``propagationPolicy=Background``).
"""

from __future__ import annotations

import http.client
import os
import signal as signals
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, NoReturn

import pytest
import yaml
from lightkube import AsyncClient, KubeConfig
from lightkube.config.kubeconfig import SingleConfig

from tests.k8s import _api
from tests.k8s._api import JSON
from tests.k8s._cluster import KINDS, Cluster
from tests.k8s._http import Api, RequestRecord, Server

__all__ = ["KNOBS", "KubeStandIn", "PodProcess", "RealCluster", "RequestRecord"]

#: Image name the stand-in's tests use (any name works: ``python`` runs ``sys.executable``).
DEFAULT_PYTHON_IMAGE = "python:3.11-slim"
#: How long :meth:`KubeStandIn.start` waits for the server to answer ``/readyz``.
READY_TIMEOUT_SECONDS = 5.0


@dataclass(frozen=True)
class PodProcess:
    """The local process that runs a pod's container."""

    namespace: str
    pod: str
    pid: int | None          #: None while the pod has not started
    argv: list[str]
    env: dict[str, str]
    cwd: Path
    log: Path
    exit_code: int | None    #: 128+N when killed by signal N
    running: bool


class KubeStandIn:
    """The stand-in; see the module docstring for what it serves and its knobs."""

    is_real = False
    context = "standin"

    def __init__(self, root: Path, *, namespace: str = "default",
                 python_image: str = DEFAULT_PYTHON_IMAGE, check_schema: bool = True) -> None:
        """Args:
            root: a directory of its own (kubeconfig, pod directories).
            namespace: the kubeconfig context's namespace.
            python_image: what tests put in ``image`` for a Python container.
            check_schema: check every object the stand-in writes against the schema.
        """
        self.root = root
        self.namespace = namespace
        self.python_image = python_image
        self.kubeconfig = root / "kubeconfig.yaml"
        self._cluster = Cluster(root, check_schema=_api.check_schema if check_schema else None)
        self._cond = self._cluster.cond
        self._api = Api(self._cluster)
        self._server: Server | None = None

    # --- lifecycle -------------------------------------------------------------------------

    def start(self) -> KubeStandIn:
        self.root.mkdir(parents=True, exist_ok=True)
        self._server = Server(self._api)  # bound and listening from here on
        self._cluster.timers.start()
        self._server.start()
        self.kubeconfig.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": self.context,
            "clusters": [{"name": self.context, "cluster": {"server": self.url}}],
            "users": [{"name": self.context, "user": {}}],
            "contexts": [{"name": self.context, "context": {
                "cluster": self.context, "user": self.context, "namespace": self.namespace}}],
        }))
        self._wait_ready()
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_SECONDS
        while True:
            connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=1)
            try:
                connection.request("GET", "/readyz")
                if connection.getresponse().status == 200:
                    return
            except OSError:
                if time.monotonic() > deadline:
                    raise
            finally:
                connection.close()

    def stop(self) -> None:
        """Kill every pod process, end every stream, join every thread; then raise what
        went wrong inside the stand-in, if anything did."""
        self._cluster.stop()
        if self._server is not None:
            self._server.close()
        if self._cluster.errors:
            raise ExceptionGroup("the Kubernetes stand-in failed internally",
                                 list(self._cluster.errors))

    def __enter__(self) -> KubeStandIn:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    @property
    def port(self) -> int:
        assert self._server is not None, "start() the stand-in first"
        return self._server.port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def config(self) -> SingleConfig:
        """lightkube's configuration from :attr:`kubeconfig`."""
        config = KubeConfig.from_file(self.kubeconfig).get(self.context)
        assert config is not None
        return config

    def client(self, **kwargs: Any) -> AsyncClient:
        """A lightkube ``AsyncClient`` on this stand-in (use ``async with``)."""
        return AsyncClient(config=self.config(), **kwargs)

    # --- knobs -----------------------------------------------------------------------------

    def fail_image_pull(self, image: str, failing: bool = True) -> None:
        """Pods of ``image`` wait in ``ImagePullBackOff`` until called with ``failing=False``."""
        with self._cond:
            if failing:
                self._cluster.failing_images.add(image)
            else:
                self._cluster.failing_images.discard(image)
                self._cluster.sync_pending()

    def unschedulable(self, on: bool = True) -> None:
        """New pods stay Pending, ``PodScheduled`` False ``Unschedulable``, until off."""
        with self._cond:
            self._cluster.unschedulable = on
            self._cluster.sync_pending()

    def hold_starts(self, on: bool = True) -> None:
        """Scheduled pods wait in ``ContainerCreating`` until :meth:`release`."""
        with self._cond:
            self._cluster.held = on
            self._cluster.sync_pending()

    def release(self) -> None:
        self.hold_starts(False)

    def oom_next(self, match: str | Callable[[JSON], bool]) -> None:
        """The next pod whose Job name starts with ``match`` (or for which ``match(pod)``
        is true) is killed right after it starts and reported ``OOMKilled``, exit 137."""
        def by_job_name(pod: JSON) -> bool:
            return str(pod["metadata"]["labels"].get("job-name", "")).startswith(str(match))

        with self._cond:
            self._cluster.oom.append(match if callable(match) else by_job_name)

    def kill_pod(self, name: str, sig: int = signals.SIGKILL, *,
                 namespace: str | None = None) -> None:
        """Send ``sig`` to a running pod's process group (exit code 128+sig, ``Error``)."""
        with self._cond:
            run = self._cluster.pods.get((namespace or self.namespace, name))
            if run is None or not run.running or run.proc is None:
                raise LookupError(f"pod {name!r} has no running process")
            os.killpg(run.proc.pid, sig)

    def compact(self) -> int:
        """Drop the watch history up to now; returns the compacted resourceVersion."""
        with self._cond:
            return self._cluster.store.compact()

    def drop_watches(self) -> int:
        """End every open watch stream abruptly; returns how many were open."""
        with self._cond:
            store = self._cluster.store
            store.drops += 1
            store.cond.notify_all()
            return store.watching

    def forbid(self, verb: str, resource: str, message: str | None = None) -> None:
        """Answer ``verb`` on ``resource`` (e.g. "create", "jobs") with 403 Forbidden."""
        if resource not in KINDS:
            raise ValueError(f"unknown resource {resource!r}: one of {sorted(KINDS)}")
        with self._cond:
            self._api.forbidden[(verb, resource)] = message

    def allow(self, verb: str, resource: str) -> None:
        with self._cond:
            self._api.forbidden.pop((verb, resource), None)

    def image_entrypoint(self, image: str, argv: list[str]) -> None:
        """The ENTRYPOINT of ``image``, run when a container gives no ``command``."""
        with self._cond:
            self._cluster.entrypoints[image] = list(argv)

    # --- accessors -------------------------------------------------------------------------

    def requests(self, *, verb: str | None = None, resource: str | None = None,
                 method: str | None = None, status: int | None = None) -> list[RequestRecord]:
        """Requests received so far, oldest first, filtered by the given fields."""
        with self._cond:
            return [r for r in self._api.records
                    if verb in (None, r.verb) and resource in (None, r.resource)
                    and method in (None, r.method) and status in (None, r.status)]

    def objects(self, resource: str, namespace: str | None = None) -> list[JSON]:
        """The current objects of a resource (copies), by name."""
        with self._cond:
            return self._cluster.store.list(resource, namespace)

    def process(self, pod: str, *, namespace: str | None = None) -> PodProcess:
        """The process of a pod, kept after the pod is deleted."""
        with self._cond:
            run = self._cluster.pods[(namespace or self.namespace, pod)]
            return PodProcess(run.namespace, run.name, run.proc.pid if run.proc else None,
                              list(run.argv), dict(run.env), run.root / "work", run.log,
                              run.exit_code, run.running)

    @property
    def resource_version(self) -> int:
        with self._cond:
            return self._cluster.store.rv

    def wait_until(self, predicate: Callable[[], bool], timeout: float = 10.0) -> None:
        """Block until ``predicate()`` holds; it is re-checked after every change."""
        with self._cond:
            if not self._cond.wait_for(predicate, timeout):
                raise TimeoutError(f"the stand-in never reached {predicate} in {timeout}s")


#: Names a :class:`RealCluster` answers with a skip.
KNOBS = ("fail_image_pull", "unschedulable", "hold_starts", "release", "oom_next",
         "kill_pod", "compact", "drop_watches", "forbid", "allow", "image_entrypoint",
         "requests", "objects", "process", "resource_version", "wait_until")


@dataclass
class RealCluster:
    """A real cluster picked by ``AX_K8S_CONTEXT``: the stand-in's attributes, no knobs."""

    kubeconfig: Path
    context: str
    namespace: str
    python_image: str
    is_real = True

    @property
    def url(self) -> str:
        return self.config().cluster.server

    def config(self) -> SingleConfig:
        config = KubeConfig.from_file(self.kubeconfig).get(self.context)
        assert config is not None
        return config

    def client(self, **kwargs: Any) -> AsyncClient:
        return AsyncClient(config=self.config(), namespace=self.namespace, **kwargs)

    def __getattr__(self, name: str) -> Any:
        if name == "resource_version":  # a property on the stand-in
            pytest.skip(f"{name} needs the Kubernetes stand-in (AX_K8S_CONTEXT is set)")
        if name in KNOBS:
            def skip(*args: Any, **kwargs: Any) -> NoReturn:
                pytest.skip(f"{name}() needs the Kubernetes stand-in; this run targets the "
                            f"real cluster of context {self.context!r} (AX_K8S_CONTEXT)")
            return skip
        raise AttributeError(name)
