"""The ``kubernetes`` runner: each claimed node runs as a ``batch/v1`` Job.

The executor claims the node as for any runner; :class:`KubernetesRunner` creates the
Job of that claim (:func:`axengine.runners.job.build_job`: one Job per task, node and
fence), follows the Job and its pod, and turns what the cluster says into the node's
outcome. The pod runs :mod:`axengine.runners.job_entry`: it fetches the run with
``GetRun`` under the claim's fence, runs the handler, heartbeats, records progress and
effects, and commits its own outcome through the API — so a Job that completed is
:class:`~axengine.worker.Reported`, and the executor acks without completing. While
the Job runs the executor heartbeats too (the worker does, whatever the runner), with
the same fence: either keeps the lease alive.

**Kubernetes facts → outcomes** (:func:`read_job` reads them; the full table is in
``docs/executors.md``): Job ``Complete`` → ``Reported(answer)`` (the answer from the pod
log's result line, ``unknown`` without one); image pull errors (``ErrImagePull``,
``ImagePullBackOff``, ``InvalidImageName``), ``Unschedulable`` and a create refused
``403`` "exceeded quota" → ``Unavailable("kubernetes:…")`` (Job deleted: WAITING, no
attempt spent); ``OOMKilled`` or a non-zero exit → ``Failure(retryable=True)`` naming
it; ``DeadlineExceeded`` → ``timed_out``; a stopped run (``ctx.wait_stopped()``: fenced
out, cancelled, handed back) → Job deleted with ``propagationPolicy: Background``,
``stopped(ctx)``. Kubernetes never retries (``backoffLimit: 0``): attempts are the
engine's, under fences.

**Following Jobs.** One list + watch of ``ax-managed=true`` Jobs and one of their pods
per runner (:class:`_Informer`), shared by every run, each keeping the latest object by
name. A ``410 Gone`` (the watch's version was compacted away), an error or a dropped
stream makes it relist: the cache becomes the current state and the watch continues
from the list's version. Runs derive their fact from that state, never from the event
stream, so a transition made while the stream was down is seen on the relist.

**Adoption.** Creating a Job that exists (``409 AlreadyExists``) adopts it: the Job
named for this task, node and fence was created by this claim (a create whose reply was
lost and that was retried) — its labels are checked and it is followed, never started a
second time. After an executor *crash* nothing needs adopting, and this is why: the
executor dies, its lease stops being renewed by it, but the pod keeps heartbeating
under the same fence, so the node stays RUNNING with a live lease and is never
reclaimed while the pod lives (a reclaim would bump the fence and get a new Job). The
dead executor's queue item is recovered by another executor (or the restarted one),
whose claim answers ``not-claimable`` (a live lease): it acks. The pod completes and
commits by itself — one Job, one committed outcome, the outbox begun once. If the pod
dies too, the lease lapses and the reconciler fences the node out: the next claim has a
new fence and a new Job, and the dead pod's late calls are ``stale``.

Caveat: the reconciler also voids the lease of an owner it *sees* dead — a worker id
``w:<host>:<pid>:…`` naming its own host and a PID that is gone. An executor on the same
host as ``ax api`` with the default worker id would therefore have its Jobs fenced out
when it dies (nothing is committed twice, the Jobs are rerun). In a cluster the API
and executors run in different pods (hosts), and ``--id`` names an executor; the tests
give executors an ``--id``.

**Garbage collection** (:meth:`KubernetesRunner.collect_garbage`, once when the first
run starts and every ``gc_interval`` seconds until :meth:`close`): an unfinished
``ax-managed`` Job whose fence the control plane no longer holds (``GetRun`` answers
stale: it was taken over, cancelled, or its executor gave it up) is deleted; a finished
Job is deleted once it is older than the settings' ``ttl_seconds_after_finished`` (the
cluster's TTL controller does it first where it runs). Jobs this runner is following
are left to their run.

**Why lightkube.** An asyncio client (the executor is one event loop), typed models of
the whole API (``Job``, ``Pod``), list/watch with ``resourceVersion``, and a small
httpx-family transport like ax's own clients; maintained. The official ``kubernetes``
client is synchronous (threads per watch), and ``kubernetes_asyncio`` is a generated
dict-shaped client with a heavier dependency tree.

Verified against the Kubernetes API stand-in of ``tests/k8s`` (real HTTP, lightkube on
the wire, pods as local processes), not against a real cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol, cast

import httpx2
from lightkube import ApiError, AsyncClient, ConfigError, KubeConfig
from lightkube.resources.batch_v1 import Job
from lightkube.resources.core_v1 import Pod
from lightkube.types import CascadeType

from axengine.activity import ActivitySample
from axengine.engine import ClaimResult
from axengine.errors import AxError, InputError, NotFound
from axengine.runners._kube_facts import JobFact, finished_at, name_of, read_job
from axengine.runners.job import MANAGED_LABEL, JobSettings, build_job, load_job_settings
from axengine.runners.job_entry import EXIT_STALE, result_of_log
from axengine.worker import Reported, RunContext
from axengine.worker._runner import stopped, timed_out
from executors.contract import Failure, NodeRequest, Outcome, Unavailable

__all__ = [
    "KUBERNETES",
    "JobFact",
    "KubeOptions",
    "KubernetesRunner",
    "RunLookup",
    "read_job",
]

log = logging.getLogger("axengine.runners.kubernetes")

#: Name of this runner (the ``runner:`` of a node, ``ax executor --runner``).
KUBERNETES = "kubernetes"
#: Seconds between two garbage collections (and after the first, at the first run).
DEFAULT_GC_INTERVAL = 60.0
#: Seconds the run waits past the node's timeout for Kubernetes' own
#: ``activeDeadlineSeconds`` to fire before it deletes the Job itself.
DEADLINE_SLACK = 15.0
#: Attempts at creating a Job while the API server is unreachable or answers 5xx.
CREATE_ATTEMPTS = 4
#: Lines of the pod log read for the result line and a failure's last words.
LOG_TAIL = 40
#: Pause between relists after a failing list (the API server is down).
RELIST_BACKOFF = 1.0
#: Seconds a watch lasts before the server ends it and it resumes (client-go's
#: reflectors use 5 to 10 minutes).
DEFAULT_WATCH_TIMEOUT = 300
#: Seconds a failed Job waits for its pod's exit code to reach the pod cache.
POD_STATUS_LAG = 2.0
#: Where the handler settings Secret is mounted in the pod (``AX_SETTINGS_FILE``).
SETTINGS_DIR = "/var/run/secrets/ax-settings"
#: Key of the handler settings (JSON) in that Secret.
SETTINGS_KEY = "settings.json"


class RunLookup(Protocol):
    """The control-plane read the runner needs: the run a fence holds (the engine's
    :meth:`~axengine.engine.Engine.get_run`, or ``GrpcEngineClient.get_run``)."""

    async def get_run(self, task_id: str, node_id: str, *, fence: int
                      ) -> ClaimResult | None: ...


# ---------------------------------------------------------------------- informers


class _Informer:
    """List + watch of one kind labelled ``ax-managed=true`` in a namespace; keeps the
    latest object by name and wakes every waiter on each change.

    The watch starts at the list's ``resourceVersion``; every ``watch_timeout`` seconds
    the server ends it cleanly and lightkube resumes it from the last version seen (a
    silently dead connection is noticed that way). A ``410 Gone`` (that version was
    compacted away), any other error, or a dropped stream makes it relist: the cache is
    replaced by the current state, so nothing that happened meanwhile is missed.
    """

    def __init__(self, client: AsyncClient, kind: type[Job] | type[Pod], namespace: str,
                 changed: Callable[[], None], *, watch_timeout: int) -> None:
        self.client = client
        self.kind = kind
        self.namespace = namespace
        self.watch_timeout = watch_timeout
        self.objects: dict[str, Any] = {}
        self.synced = False
        #: Lists after the first (a 410, a dropped stream, an error), and the 410s.
        self.relists = 0
        self.expired = 0
        self._changed = changed

    async def run(self) -> None:
        labels: dict[str, Any] = {MANAGED_LABEL: "true"}
        first = True
        while True:
            try:
                listing = self.client.list(self.kind, namespace=self.namespace, labels=labels)
                fresh = {name_of(obj): obj async for obj in listing}
                version = listing.resourceVersion
            except (httpx2.HTTPError, OSError) as exc:
                log.warning("listing %s in %s failed (%s); again in %.0fs",
                            self.kind.__name__, self.namespace, exc, RELIST_BACKOFF)
                await asyncio.sleep(RELIST_BACKOFF)
                continue
            self.objects = fresh
            if not first:
                self.relists += 1
            first = False
            self.synced = True
            self._changed()
            try:
                async for event, obj in self.client.watch(
                        self.kind, namespace=self.namespace, labels=labels,
                        resource_version=version, server_timeout=self.watch_timeout):
                    name = name_of(obj)
                    if event == "DELETED":
                        self.objects.pop(name, None)
                    else:
                        self.objects[name] = obj
                    self._changed()
                why = "the watch ended"
            except ApiError as exc:
                if exc.status.code == 410:
                    self.expired += 1
                why = f"the watch failed: {exc.status.code} {exc.status.reason}"
            except (httpx2.HTTPError, OSError) as exc:
                why = f"the watch stream dropped: {type(exc).__name__}"
            log.info("%s watch in %s: %s; relisting", self.kind.__name__, self.namespace, why)


# ---------------------------------------------------------------------- the runner


@dataclass(frozen=True, kw_only=True)
class KubeOptions:
    """How an executor's kubernetes runner is configured (``ax executor --runner
    kubernetes`` options).

    Attributes:
        job_config: The Job settings file (``--job-settings``, YAML, see
            :func:`~axengine.runners.job.load_job_settings`); None: the defaults.
        context: Kubeconfig context (``--kube-context``); None: the current one.
        kubeconfig: Kubeconfig file; None: ``$KUBECONFIG`` or ``~/.kube/config`` (or
            the in-cluster service account when neither is given).
        settings_secret: Secret holding the pods' handler settings
            (``--pod-settings-secret``, see :class:`KubernetesRunner`).
    """

    job_config: str | None = None
    context: str | None = None
    kubeconfig: str | None = None
    settings_secret: str | None = None


@dataclass
class _Flight:
    """A run this runner follows."""

    name: str
    labels: dict[str, str] = field(default_factory=dict)
    #: The informer saw the Job at least once (its absence then means it is gone).
    seen: bool = False


class KubernetesRunner:
    """Runs each claimed node as a Kubernetes Job (see the module docstring).

    Args:
        settings: How Jobs are built (namespace, image, API address, token Secret...).
        client: A lightkube ``AsyncClient`` (default: one from ``kubeconfig`` /
            ``context``, else in-cluster, ``$KUBECONFIG`` or ``~/.kube/config``).
        kubeconfig: Path of a kubeconfig file.
        context: Context of the kubeconfig to use (default: its current context).
        control: Where the runner asks whether a fence still holds and reads a run's
            DAG hash (``GrpcEngineClient`` or ``Engine``); default: the engine client
            of the first run's context.
        gc_interval: Seconds between garbage collections.
        pending_grace: Seconds a pod may stay unschedulable (a cluster autoscaler
            adding a node) before the run is handed back.
        watch_timeout: Seconds after which the server ends a watch cleanly and it is
            resumed from the last version seen.
        settings_secret: Name of a Secret whose ``settings.json`` key holds the
            handler settings of node pods (JSON: tool policy, mail, LLM endpoint and
            key — a Secret, since it may hold credentials); mounted read-only, named by
            ``AX_SETTINGS_FILE``. The Job settings' ``settings_configmap`` is the other
            way (not both); with neither, pods run with the handlers' defaults.
    """

    name = KUBERNETES
    #: A Job keeps its own lease and commits through the API: an executor that shuts
    #: down leaves it running (no work lost in a rolling restart).
    detached = True

    @classmethod
    def from_options(cls, options: KubeOptions) -> KubernetesRunner:
        """The runner an executor's options describe.

        Raises:
            InputError: The Job settings file cannot be read or is invalid.
        """
        settings = load_job_settings(options.job_config) if options.job_config \
            else JobSettings()
        if options.settings_secret and getattr(settings, "settings_configmap", None):
            raise InputError(f"{options.job_config}: settings_configmap and a pod settings "
                             "Secret both give the pods' handler settings; keep one")
        runner = cls(settings, kubeconfig=options.kubeconfig, context=options.context,
                     settings_secret=options.settings_secret)
        runner.client  # noqa: B018 -- a bad kubeconfig or context fails at start, not per run
        return runner

    def activity(self, ctx: RunContext) -> ActivitySample | None:
        """None: the executor cannot see a pod's counters. The Job's own worker runs the
        handler in a thread and sends that thread's CPU with its own heartbeats."""
        return None

    def __init__(self, settings: JobSettings, *, client: AsyncClient | None = None,
                 kubeconfig: str | os.PathLike[str] | None = None,
                 context: str | None = None, control: RunLookup | None = None,
                 gc_interval: float = DEFAULT_GC_INTERVAL,
                 pending_grace: float = 0.0, watch_timeout: int = DEFAULT_WATCH_TIMEOUT,
                 settings_secret: str | None = None) -> None:
        self.settings = settings
        self._client = client
        self._kubeconfig = kubeconfig
        self._context = context
        self.control = control
        self.gc_interval = gc_interval
        self.pending_grace = pending_grace
        self.settings_secret = settings_secret
        self.watch_timeout = watch_timeout
        self._started = False
        self._change = asyncio.Event()
        self._informers: dict[str, _Informer] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._flights: dict[str, _Flight] = {}
        #: Jobs created, adopted (409 on create) and deleted by this runner.
        self.created = 0
        self.adopted = 0
        self.deleted = 0

    # ------------------------------------------------------------------ plumbing

    @property
    def client(self) -> AsyncClient:
        """The lightkube client (built on first use)."""
        if self._client is None:
            config = None
            if self._kubeconfig is not None or self._context is not None:
                try:
                    kube = (KubeConfig.from_file(self._kubeconfig) if self._kubeconfig
                            else KubeConfig.from_env())
                except (ConfigError, OSError) as exc:
                    raise InputError(f"kubeconfig: {exc}") from exc
                config = kube.get(context_name=self._context)
                if config is None:
                    raise InputError(f"kubeconfig has no context {self._context!r}")
            try:
                self._client = AsyncClient(config=config, namespace=self.settings.namespace)
            except ConfigError as exc:
                raise InputError(f"no Kubernetes configuration: {exc}; give a kubeconfig "
                                 "(--kube-context, $KUBECONFIG) or run in a cluster") from exc
        return self._client

    @property
    def relists(self) -> int:
        """Relists of the Job and pod watches since the runner started."""
        return sum(i.relists for i in self._informers.values())

    @property
    def expired(self) -> int:
        """Watches answered ``410 Gone`` (their version was compacted away)."""
        return sum(i.expired for i in self._informers.values())

    def _changed(self) -> None:
        """Wake every run waiting for a change (each re-reads the caches)."""
        change, self._change = self._change, asyncio.Event()
        change.set()

    async def _start(self) -> None:
        if self._started:
            return
        self._started = True
        for key, kind in (("jobs", Job), ("pods", Pod)):
            informer = _Informer(self.client, kind, self.settings.namespace, self._changed,
                                 watch_timeout=self.watch_timeout)
            self._informers[key] = informer
            self._tasks.append(asyncio.create_task(informer.run(), name=f"ax-k8s-{key}"))
        self._tasks.append(asyncio.create_task(self._collector(), name="ax-k8s-gc"))

    async def close(self) -> None:
        """Stop following Jobs (the Jobs themselves are left to their pods and GC)."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
        if self._client is not None:
            await self._client.close()

    def _lookup(self, ctx: RunContext | None) -> RunLookup | None:
        if self.control is None and ctx is not None:
            self.control = ctx.engine  # every EngineClient answers get_run
        return self.control

    # ------------------------------------------------------------------ a run

    async def run(self, request: NodeRequest, ctx: RunContext, *,
                  timeout: float) -> Outcome | Reported:
        await self._start()
        lookup = self._lookup(ctx)
        dag_hash = ""
        if lookup is not None:
            try:
                run = await lookup.get_run(request.task_id, request.node_id,
                                           fence=request.fence)
            except AxError as exc:
                if not exc.retryable:
                    raise
                # Only the DAG label is missing; the pod asks again anyway.
                log.warning("get_run %s/%s: %s", request.task_id, request.node_id, exc)
            else:
                if run is None:
                    ctx.mark_stale()
                    return stopped(ctx)
                dag_hash = run.dag_hash
        try:
            manifest = build_job(request, settings=self.settings, dag_hash=dag_hash)
        except InputError as exc:
            return Failure(str(exc), retryable=False)
        _for_this_run(manifest, lease_seconds=ctx.lease_seconds,
                      settings_secret=self.settings_secret)
        name = manifest["metadata"]["name"]
        self._flights[name] = flight = _Flight(name, dict(manifest["metadata"]["labels"]))
        try:
            refused = await self._create(manifest, request)
            if refused is not None:
                return refused
            if ctx.cancelled:
                await self._delete(name, "the run was stopped while the Job was created")
                return stopped(ctx)
            return await self._follow(flight, request, ctx, timeout)
        finally:
            self._flights.pop(name, None)

    async def _create(self, manifest: dict[str, Any], request: NodeRequest
                      ) -> Outcome | None:
        """Create the Job (adopting one of this claim that exists); an outcome when the
        cluster refuses it."""
        name = manifest["metadata"]["name"]
        evidence = ""
        for attempt in range(CREATE_ATTEMPTS):
            if attempt:
                await asyncio.sleep(0.25 * 2 ** attempt)
            try:
                await self.client.create(cast(Job, Job.from_dict(manifest)))
                self.created += 1
                log.info("job %s created for %s/%s fence %d", name, request.task_id,
                         request.node_id, request.fence)
                return None
            except ApiError as exc:
                code, message = exc.status.code or 0, exc.status.message or ""
                if code == 409:
                    return await self._adopt(manifest, request)
                if code == 403 and "exceeded quota" in message:
                    return Unavailable("kubernetes:quota", f"job {name}: {message}")
                if code in (400, 422):  # this node's Job is invalid: retrying cannot help
                    return Failure(f"kubernetes refused job {name}: {code} {message}",
                                   retryable=False)
                if code < 500 and code != 429:
                    # 401, 403, 404: the deployment (RBAC, namespace), not the node.
                    return Unavailable("kubernetes:api", f"creating job {name}: {code} "
                                       f"{message}")
                evidence = f"{code} {message}"
            except (httpx2.TransportError, OSError) as exc:
                evidence = f"{type(exc).__name__}: {exc}"
        return Unavailable("kubernetes:api", f"creating job {name}: {evidence}")

    async def _adopt(self, manifest: dict[str, Any], request: NodeRequest) -> Outcome | None:
        name = manifest["metadata"]["name"]
        try:
            existing = await self.client.get(Job, name, namespace=self.settings.namespace)
        except (httpx2.HTTPError, OSError) as exc:
            return Unavailable("kubernetes:api", f"reading job {name} to adopt it: {exc}")
        want = manifest["metadata"]["labels"]
        have = dict(existing.metadata.labels or {}) if existing.metadata else {}
        notes = dict(existing.metadata.annotations or {}) if existing.metadata else {}
        if any(have.get(k) != want[k] for k in ("ax-task", "ax-node", "ax-fence")) or \
                notes.get("ax-task-id", request.task_id) != request.task_id or \
                notes.get("ax-node-id", request.node_id) != request.node_id:
            return Failure(f"job {name} exists for another run (labels {have}); not "
                           "adopted", retryable=True)
        self.adopted += 1
        log.info("job %s of %s/%s fence %d exists: adopted", name, request.task_id,
                 request.node_id, request.fence)
        return None

    def _fact(self, flight: _Flight) -> JobFact | None:
        """The fact of ``flight``'s Job as the caches hold it; None until both caches
        are listed and the Job was seen once (the create can beat the watch)."""
        jobs, pods = self._informers["jobs"], self._informers["pods"]
        if not (jobs.synced and pods.synced):
            return None
        job = jobs.objects.get(flight.name)
        flight.seen = flight.seen or job is not None
        if not flight.seen:
            return None
        return read_job(job, [p for p in pods.objects.values() if _labelled(p, flight)])

    async def _follow(self, flight: _Flight, request: NodeRequest, ctx: RunContext,
                      timeout: float) -> Outcome | Reported:
        started = ctx.clock.monotonic()
        fact_task = asyncio.ensure_future(self._settled(flight))
        stop = ctx.stopped_future()
        deadline = ctx.clock.timer(timeout + DEADLINE_SLACK)
        waiting: set[asyncio.Future[Any]] = {fact_task, stop, deadline}
        try:
            await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in (stop, deadline):
                waiter.cancel()
        fact = fact_task.result() if fact_task.done() else None
        if fact is None:
            fact_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await fact_task
        if fact is not None and fact.kind == "complete":
            # Committed by the pod: that stands, whatever stopped meanwhile.
            return await self._outcome(fact, flight, request, ctx, started, timeout)
        if fact is None and ctx.released and not ctx.cancelled:
            # The executor is leaving: the Job keeps its lease and commits by itself.
            return Reported("released")
        if fact is not None and not ctx.cancelled and await self._fence_lost(request, fact):
            # The pod, or the engine, knew before this executor's next heartbeat did.
            ctx.mark_stale()
        if ctx.cancelled:
            await self._delete(flight.name, "its run was stopped (fenced out, cancelled "
                               "or handed back)")
            return stopped(ctx)
        if fact is None:
            await self._delete(flight.name, "past the node's timeout")
            return timed_out(ctx.clock.monotonic() - started, timeout)
        return await self._outcome(fact, flight, request, ctx, started, timeout)

    async def _fence_lost(self, request: NodeRequest, fact: JobFact) -> bool:
        """Whether a run that ended without committing lost its fence meanwhile (a
        cancel, a takeover): its Job is then deleted like any stopped run's, and its
        outcome is not reported. An exit 3 of the pod says so itself."""
        if fact.exit_code == EXIT_STALE:
            return True
        if fact.kind in ("image-pull", "unschedulable"):
            return False  # nothing ran; the hand-back itself is fenced
        lookup = self._lookup(None)
        if lookup is None:
            return False
        try:
            return await lookup.get_run(request.task_id, request.node_id,
                                        fence=request.fence) is None
        except NotFound:
            return True
        except AxError as exc:
            if exc.retryable:
                return False  # the complete that follows is fenced anyway
            raise

    async def _settled(self, flight: _Flight) -> JobFact:
        """The first fact that ends the run: anything but ``running``. Two facts wait a
        little for a better one: an unschedulable pod (``pending_grace``: an autoscaler
        may add a node) and a failed Job whose pod's exit code is not known yet (the pod
        watch can lag the Job watch by a moment: :data:`POD_STATUS_LAG`)."""
        loop = asyncio.get_running_loop()
        since: dict[str, float] = {}
        while True:
            # Taken before reading: a change after the read sets this very event.
            change = self._change
            fact = self._fact(flight)
            if fact is not None and fact.kind != "running":
                grace = (self.pending_grace if fact.kind == "unschedulable" else
                         POD_STATUS_LAG if fact.kind == "failed" and fact.exit_code is None
                         else 0.0)
                left = grace - (loop.time() - since.setdefault(fact.kind, loop.time()))
                if left <= 0:
                    return fact
                loop.call_later(left, self._changed)
            elif fact is not None:
                since.clear()
            await change.wait()

    async def _outcome(self, fact: JobFact, flight: _Flight, request: NodeRequest,
                       ctx: RunContext, started: float, timeout: float
                       ) -> Outcome | Reported:
        name = flight.name
        if fact.kind == "complete":
            result = await self._result(fact.pod)
            answer = str(result["answer"]) if result else "unknown"
            log.info("job %s complete: %s", name, answer)
            return Reported(answer)
        if fact.kind == "deadline":
            return timed_out(ctx.clock.monotonic() - started, timeout)
        if fact.kind in ("image-pull", "unschedulable"):
            await self._delete(name, fact.kind)
            return Unavailable(f"kubernetes:{fact.kind}", f"job {name}: {fact.detail}")
        if fact.kind == "gone":
            return Failure(f"job {name} was deleted outside ax before it finished",
                           retryable=True)
        if fact.kind == "oom":
            limit = _memory_limit(request, self.settings)
            return Failure(f"job {name}: the container was OOMKilled (exit "
                           f"{fact.exit_code}) over its memory limit {limit}; raise the "
                           "node's resources.limits.memory", retryable=True,
                           details={"exit_code": fact.exit_code, "oom_killed": True})
        words = ""
        if fact.pod:
            result = await self._result(fact.pod)
            words = f"; it said: {result.get('error') or result}" if result else ""
        return Failure(f"job {name}: the container exited {fact.exit_code} "
                       f"({fact.detail}){words}", retryable=True,
                       details={"exit_code": fact.exit_code})

    async def _result(self, pod: str) -> dict[str, Any] | None:
        """The result line of ``pod``'s log, or None when it cannot be read."""
        if not pod:
            return None
        try:
            lines = [line async for line in self.client.log(
                pod, namespace=self.settings.namespace, tail_lines=LOG_TAIL)]
        except (httpx2.HTTPError, OSError) as exc:
            log.info("log of pod %s unreadable: %s", pod, exc)
            return None
        return result_of_log("".join(lines))

    async def _delete(self, name: str, why: str) -> bool:
        """Delete a Job and its pods (Background propagation); False when it was gone
        or the API refused (a Job left behind is garbage collection's: its fence no
        longer holds)."""
        try:
            await self.client.delete(Job, name, namespace=self.settings.namespace,
                                     cascade=CascadeType.BACKGROUND)
        except ApiError as exc:
            if exc.status.code != 404:
                log.warning("deleting job %s (%s) failed: %s", name, why, exc)
            return False
        except (httpx2.TransportError, OSError) as exc:
            log.warning("deleting job %s (%s) failed: %s", name, why, exc)
            return False
        self.deleted += 1
        log.info("job %s deleted: %s", name, why)
        return True

    # ------------------------------------------------------------------ garbage

    async def _collector(self) -> None:
        while True:
            try:
                await self.collect_garbage()
            except (AxError, httpx2.HTTPError, OSError) as exc:
                log.warning("job garbage collection failed: %s", exc)
            await asyncio.sleep(self.gc_interval)

    async def collect_garbage(self) -> dict[str, int]:
        """Delete ``ax-managed`` Jobs whose fence no longer holds (unfinished ones) and
        finished ones older than the TTL; return how many of each."""
        lookup = self._lookup(None)
        now = datetime.now(UTC)
        done = {"stale": 0, "expired": 0}
        labels: dict[str, Any] = {MANAGED_LABEL: "true"}
        async for job in self.client.list(Job, namespace=self.settings.namespace,
                                          labels=labels):
            name = name_of(job)
            if not name or name in self._flights:
                continue
            finished = finished_at(job)
            if finished is not None:
                age = (now - finished).total_seconds()
                if age > self.settings.ttl_seconds_after_finished and \
                        await self._delete(name, f"finished {age:.0f}s ago (past the TTL)"):
                    done["expired"] += 1
                continue
            if lookup is not None and not await self._holds(lookup, job) and \
                    await self._delete(name, "its fence no longer holds the node"):
                done["stale"] += 1
        return done

    @staticmethod
    async def _holds(lookup: RunLookup, job: Job) -> bool:
        meta = job.metadata
        labels = dict(meta.labels or {}) if meta else {}
        notes = dict(meta.annotations or {}) if meta else {}
        try:
            fence = int(labels.get("ax-fence", "0"))
        except ValueError:
            return True  # not a Job this version of ax made: leave it to people
        task_id, node_id = notes.get("ax-task-id"), notes.get("ax-node-id")
        if not task_id or not node_id or fence <= 0:
            return True
        try:
            return await lookup.get_run(task_id, node_id, fence=fence) is not None
        except NotFound:
            return False


def _for_this_run(manifest: dict[str, Any], *, lease_seconds: float,
                  settings_secret: str | None) -> None:
    """Add what the pod needs from this executor to the Job ``build_job`` made: the lease
    the executor heartbeats with (the pod renews it alike) and the handler settings."""
    pod_spec = manifest["spec"]["template"]["spec"]
    container = pod_spec["containers"][0]
    env = container.setdefault("env", [])
    env.append({"name": "AX_LEASE_SECONDS", "value": f"{lease_seconds:g}"})
    if settings_secret:
        pod_spec.setdefault("volumes", []).append({"name": "ax-settings", "secret": {
            "secretName": settings_secret,
            "items": [{"key": SETTINGS_KEY, "path": SETTINGS_KEY}], "defaultMode": 0o440}})
        container.setdefault("volumeMounts", []).append(
            {"name": "ax-settings", "mountPath": SETTINGS_DIR, "readOnly": True})
        env.append({"name": "AX_SETTINGS_FILE", "value": f"{SETTINGS_DIR}/{SETTINGS_KEY}"})


def _labelled(pod: Pod, flight: _Flight) -> bool:
    labels = pod.metadata.labels if pod.metadata and pod.metadata.labels else {}
    return all(labels.get(k) == flight.labels.get(k) for k in ("ax-task", "ax-node",
                                                               "ax-fence"))


def _memory_limit(request: NodeRequest, settings: JobSettings) -> str:
    node: Mapping[str, Any] = request.config.get("resources") or {}
    return str(node.get("limits", {}).get("memory")
               or settings.resources.get("limits", {}).get("memory") or "none")
