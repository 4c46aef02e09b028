"""Prometheus metrics of an ax process (DESIGN §5), one registry per process.

Every metric, with its labels and how to read it: docs/observability.md. Where each
comes from:

- ``ax_snapshot_write_seconds``: :class:`TimedStore`, a thin wrapper around the state
  store that times every ``txn`` the engine makes that may write (:meth:`AxMetrics.wrap_store`,
  applied where the store is built: :func:`axengine.wiring.build_runtime`); transactions
  that only read, e.g. a reconciler pass's batches of snapshots, are not writes.
- ``ax_node_outcomes_total``, ``ax_lease_expiries_total``, ``ax_retries_exhausted_total``,
  ``ax_tasks_finished_total``: the engine's commit listener. Events carry their kind but
  not the node type, and listeners are synchronous, so the listener only records
  ``(dag hash, events)``; :meth:`AxMetrics.drain` resolves node types through the
  engine's DAG cache later (on every scrape and periodically by the server).
  ``stale`` and ``already-done`` answers write nothing, hence no event: the adapters
  that call ``complete`` report them with :meth:`AxMetrics.complete_answer`.
- ``ax_llm_tokens_total``: the ``_llm.usage`` an LLM node puts in its (object) output,
  read from the outcome by :meth:`AxMetrics.llm_usage` where ``complete`` is called (the
  gRPC ``Complete``, the in-process executor's ``observe`` and, in ``ax executor``,
  :meth:`AxMetrics.executed`), only when the answer is ``committed``, so a retried or
  repeated complete never counts twice. The API and an ``ax executor`` each count the
  outcomes they see, in their own registries.
- ``ax_stall_verdicts_total{action}``: the same listener, from the events of the
  blocking verdicts (``stall_note``, ``stall_warning``, ``stall_extended``) and the
  fences whose reason is a verdict's evidence (docs/blocking.md).
- ``ax_queue_depth``, ``ax_nodes`` and ``ax_oldest_waiting_seconds``: read from the
  queue and, through the engine, the store on every scrape (:meth:`AxMetrics.refresh`),
  so they are right across replicas. Only unfinished tasks are read (the engine's status
  index), so a scrape costs the same however many tasks have finished.
- ``ax_node_run_seconds``: the worker, when a runner returns (:meth:`AxMetrics.node_ran`,
  given to the executor as ``observe_run``), in the process that runs the executor.
- ``ax_llm_request_seconds``: the model provider, process-wide
  (:mod:`executors.metrics`); included in every registry.
- ``process_*``, ``python_*``: prometheus_client's process, platform and GC collectors.

A process without a REST listener (``ax executor``) serves its registry with
:class:`MetricsServer`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST, start_wsgi_server

from axengine.dag import base_id
from axengine.errors import InputError, NotFound
from axengine.records import COMPOSITE_OWNERS, Event, NodeState, Snapshot, TaskRecord
from axengine.store import Compare, Delete, Op, Put, StateStore, StoreWrapper, TxnResult
from executors.contract import NodeRequest, Success
from executors.metrics import LLM_REQUEST_SECONDS, MAX_LABEL

__all__ = ["CONTENT_TYPE_LATEST", "AxMetrics", "MetricsServer", "TimedStore"]

log = logging.getLogger("axengine.metrics")

#: Listener records kept until the next drain; older ones are dropped (and counted).
MAX_PENDING = 100_000
#: DAGs whose node types the metrics keep (a drain resolves each commit's node type).
MAX_DAG_TYPES = 256
#: Tasks with waiting or running nodes whose snapshots one scrape reads (``ax_nodes``
#: running/waiting and ``ax_oldest_waiting_seconds``); beyond it those gauges undercount.
OLDEST_WAITING_SCAN = 5_000
#: Buckets of the REST request duration (seconds).
REQUEST_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                   10.0, 30.0)
#: Buckets of the store write latency (seconds): etcd commits take milliseconds.
WRITE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                 2.5, 5.0)

#: Task events that mean the task reached a final status.
_FINAL_TASK_EVENTS = {"task_succeeded", "task_failed", "task_dead", "task_cancelled"}
#: Events of blocking verdicts short of a fence, by ``ax_stall_verdicts_total`` action.
_STALL_EVENTS = {"stall_note": "note", "stall_warning": "warn", "stall_extended": "extend"}
#: How every blocking verdict's evidence begins (axengine.blocking.judge): a fence on a
#: verdict is a ``lease_expired`` (or, on the last attempt, ``dead``/``failed``) event
#: whose reason starts so.
_STALL_EVIDENCE = "no progress for "
#: ``_llm.usage`` keys counted by ``ax_llm_tokens_total``, by ``kind`` label.
_TOKEN_KINDS = {"prompt": "prompt_tokens", "completion": "completion_tokens"}
#: Longest model or tool label kept (longer names are cut; the label set stays bounded).
MAX_MODEL_LABEL = MAX_LABEL
#: Buckets of node run durations (seconds): tools take milliseconds, models seconds,
#: vendor jobs and people minutes to hours.
RUN_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
               600.0, 1800.0, 3600.0)
#: ``ax_nodes`` states, by the node state they count.
_NODE_GAUGES = {NodeState.RUNNING: "running", NodeState.WAITING: "waiting",
                NodeState.PAUSED: "paused"}
#: The node states a scrape reads from the snapshots (paused ones come from the counters).
_SCANNED = frozenset({NodeState.RUNNING, NodeState.WAITING})


@dataclass(frozen=True)
class _Pending:
    dag_hash: str
    task_id: str
    events: tuple[Event, ...] = ()
    answer: tuple[str, str] | None = None  # (node_id, complete answer)


class TimedStore(StoreWrapper):
    """A :class:`StateStore` that times each ``txn`` with a write in either branch into
    a histogram, and delegates the rest (read-only transactions included)."""

    def __init__(self, inner: StateStore, histogram: Histogram) -> None:
        super().__init__(inner)
        self._histogram = histogram

    async def txn(self, compares: Sequence[Compare], success: Sequence[Op],
                  failure: Sequence[Op] = ()) -> TxnResult:
        if not any(isinstance(op, Put | Delete) for op in (*success, *failure)):
            return await self.inner.txn(compares, success, failure)
        started = time.perf_counter()
        result = "error"
        try:
            answer = await self.inner.txn(compares, success, failure)
            result = "committed" if answer.succeeded else "conflict"
            return answer
        finally:
            self._histogram.labels(result).observe(time.perf_counter() - started)


class AxMetrics:
    """The metrics of one process, in their own :class:`CollectorRegistry`.

    Args:
        registry: Registry to register in (default: a new one).
        max_pending: Listener records kept between drains.
    """

    def __init__(self, *, registry: CollectorRegistry | None = None,
                 max_pending: int = MAX_PENDING) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.write_seconds = Histogram(
            "ax_snapshot_write_seconds", "Latency of state store transactions",
            ["result"], buckets=WRITE_BUCKETS, registry=r)
        self.queue_depth = Gauge("ax_queue_depth", "Items waiting per lane", ["lane"],
                                 registry=r)
        self.oldest_waiting = Gauge("ax_oldest_waiting_seconds",
                                    "Age of the oldest due WAITING node per lane", ["lane"],
                                    registry=r)
        self.nodes = Gauge("ax_nodes", "Nodes of unfinished tasks by state", ["state"],
                           registry=r)
        self.node_run_seconds = Histogram(
            "ax_node_run_seconds", "Time a handler ran in this process",
            ["node_type", "target"], buckets=RUN_BUCKETS, registry=r)
        self.node_outcomes = Counter("ax_node_outcomes_total", "Attempt outcomes",
                                     ["node_type", "outcome"], registry=r)
        self.lease_expiries = Counter("ax_lease_expiries_total",
                                      "Leases that expired (owner fenced out)", registry=r)
        self.retries_exhausted = Counter("ax_retries_exhausted_total",
                                         "Nodes that went DEAD", ["node_type"], registry=r)
        self.tasks_finished = Counter("ax_tasks_finished_total",
                                      "Tasks reaching a final status", ["status"], registry=r)
        self.requests = Counter("ax_api_requests_total", "REST requests",
                                ["method", "route", "code"], registry=r)
        self.request_seconds = Histogram(
            "ax_api_request_seconds", "REST request duration until the answer ends "
            "(watch streams: until they end)", ["method", "route"], buckets=REQUEST_BUCKETS,
            registry=r)
        self.llm_tokens = Counter("ax_llm_tokens_total",
                                  "LLM tokens of committed outcomes", ["model", "kind"],
                                  registry=r)
        self.stall_verdicts = Counter("ax_stall_verdicts_total",
                                      "Blocking verdicts recorded on running nodes",
                                      ["action"], registry=r)
        self.takes_waiting = Gauge(
            "ax_api_takes_waiting",
            "Executors' Takes waiting at this API server for a submit", registry=r)
        self.takes = Counter(
            "ax_api_takes_total", "Executors' Takes ended at this API server, by result "
            "(claimed: a submit claimed a first node for it; empty: its wait ended; lost: "
            "it ended while a submit claimed for it)", ["result"], registry=r)
        self.dropped = Counter("ax_metrics_dropped_total",
                               "Listener records dropped before a drain", registry=r)
        r.register(LLM_REQUEST_SECONDS)
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        GCCollector(registry=r)
        self._pending: deque[_Pending] = deque()
        self._max_pending = max_pending
        #: Node id → node type, by DAG hash (at most MAX_DAG_TYPES DAGs).
        self._types: dict[str, dict[str, str]] = {}
        self.lanes: set[str] = {"default", "fast"}

    # ------------------------------------------------------------------ feeding

    def wrap_store(self, store: StateStore) -> StateStore:
        """``store`` with every writing transaction timed into ``ax_snapshot_write_seconds``
        (give the engine the wrapped store)."""
        if isinstance(store, TimedStore):
            return store
        return TimedStore(store, self.write_seconds)

    def attach(self, engine: Any) -> None:
        """Listen to the engine's commits (its store is timed by :meth:`wrap_store`)."""
        engine.add_listener(self.on_commit)

    def _push(self, item: _Pending) -> None:
        if len(self._pending) >= self._max_pending:
            self._pending.popleft()
            self.dropped.inc()
        self._pending.append(item)

    def on_commit(self, task: TaskRecord, events: Sequence[Event]) -> None:
        """Engine listener: remember the events; node types are resolved at drain."""
        if events:
            self._push(_Pending(task.dag_hash, task.task_id, tuple(events)))

    def complete_answer(self, task_id: str, node_id: str, answer: str) -> None:
        """Record a ``complete`` answer that wrote nothing (``stale``, ``already-done``)."""
        if answer in ("stale", "already-done"):
            self._push(_Pending("", task_id, answer=(node_id, answer)))

    def llm_usage(self, outcome: Any) -> None:
        """Count the tokens of a :class:`Success` whose object output carries
        ``_llm: {"model", "usage": {"prompt_tokens", "completion_tokens"}}``. Call it only
        for a ``committed`` answer (see :meth:`completed`); anything malformed is ignored."""
        if not isinstance(outcome, Success) or not isinstance(outcome.output, dict):
            return
        llm = outcome.output.get("_llm")
        if not isinstance(llm, dict):
            return
        model, usage = llm.get("model"), llm.get("usage")
        if not isinstance(model, str) or not model or not isinstance(usage, dict):
            return
        for kind, key in _TOKEN_KINDS.items():
            tokens = usage.get(key)
            # bool is an int: refuse it; negative or non-integer counts are malformed.
            if isinstance(tokens, int) and not isinstance(tokens, bool) and tokens > 0:
                self.llm_tokens.labels(model[:MAX_MODEL_LABEL], kind).inc(tokens)

    def completed(self, task_id: str, node_id: str, answer: str, outcome: Any) -> None:
        """Everything a ``complete`` call tells: its answer (:meth:`complete_answer`) and,
        when ``committed``, the outcome's LLM usage (:meth:`llm_usage`)."""
        self.complete_answer(task_id, node_id, answer)
        if answer == "committed":
            self.llm_usage(outcome)

    def executed(self, task_id: str, node_id: str, answer: str, outcome: Any) -> None:
        """The ``observe`` of an executor that does not hold the engine (``ax
        executor``): the LLM usage of a ``committed`` outcome. Answers and outcomes are
        counted by the API, whose listener sees every commit; the API counts the tokens
        too, in its own registry, so one process never counts them twice."""
        if answer == "committed":
            self.llm_usage(outcome)

    def node_ran(self, request: NodeRequest, seconds: float) -> None:
        """The ``observe_run`` of an executor: one run of ``seconds``, by node type and
        target (the tool or the model; "" for other node types)."""
        config = request.config
        target = config.get("tool") or config.get("model") or ""
        self.node_run_seconds.labels(request.node_type,
                                     str(target)[:MAX_MODEL_LABEL]).observe(seconds)

    def track_lanes(self, lanes: Iterable[str]) -> None:
        """Lanes whose depth is reported (``default`` and ``fast`` always are)."""
        self.lanes.update(lanes)

    # ------------------------------------------------------------------ collecting

    async def drain(self, engine: Any) -> int:
        """Turn the recorded events into counter increments; returns how many records."""
        count = 0
        while self._pending:
            item = self._pending.popleft()
            count += 1
            try:
                types = await self._node_types(engine, item)
            except Exception:  # a DAG we cannot read must not stop the metrics
                log.warning("metrics: cannot resolve the DAG of task %s", item.task_id,
                            exc_info=True)
                types = {}
            if item.answer is not None:
                node_id, answer = item.answer
                outcome = answer.replace("-", "_")
                self.node_outcomes.labels(types.get(base_id(node_id), "unknown"),
                                          outcome).inc()
            for event in item.events:
                self._count(event, types.get(base_id(event.node_id), "unknown"))
        return count

    async def _node_types(self, engine: Any, item: _Pending) -> dict[str, str]:
        dag_hash = item.dag_hash
        if not dag_hash:
            try:
                dag_hash = (await engine.task_record(item.task_id)).dag_hash
            except NotFound:
                return {}
        types = self._types.get(dag_hash)
        if types is None:
            # Once per DAG (DAGs are stored by content hash and never change): a commit
            # of a 10,000-node DAG's node must not walk its 10,000 nodes again.
            dag = await engine.get_dag(dag_hash)
            self.lanes.update(node.lane for node in dag.nodes.values())
            types = {nid: node.type for nid, node in dag.nodes.items()}
            if len(self._types) >= MAX_DAG_TYPES:
                del self._types[next(iter(self._types))]  # the one seen first
            self._types[dag_hash] = types
        return types

    def _count(self, event: Event, node_type: str) -> None:
        kind = event.kind
        if kind in ("lease_expired", "dead", "failed") and \
                event.detail.startswith(_STALL_EVIDENCE):
            # A fence on a blocking verdict: its reason is the verdict's evidence.
            self.stall_verdicts.labels("fence").inc()
        if kind in ("committed", "decided"):
            self.node_outcomes.labels(node_type, "committed").inc()
        elif kind == "unavailable":
            self.node_outcomes.labels(node_type, "unavailable").inc()
        elif kind in ("retry", "failed", "dead"):
            timed_out = "timed out" in event.detail
            self.node_outcomes.labels(node_type, "timeout" if timed_out else "failed").inc()
            if kind == "dead":
                self.retries_exhausted.labels(node_type).inc()
        elif kind == "lease_expired":
            self.lease_expiries.inc()
        elif kind in _STALL_EVENTS:
            self.stall_verdicts.labels(_STALL_EVENTS[kind]).inc()
        elif kind in _FINAL_TASK_EVENTS:
            self.tasks_finished.labels(event.state).inc()

    async def refresh(self, engine: Any) -> None:
        """Read the queue depth per lane, the nodes of unfinished tasks by state and the
        oldest due WAITING node per lane. Finished tasks are never read: paused nodes
        come from the task records' counters, the rest from the snapshots of tasks with
        a waiting or running node (at most :data:`OLDEST_WAITING_SCAN` of them)."""
        for lane in sorted(self.lanes):
            self.queue_depth.labels(lane).set(await engine.queue.depth(lane))
        now = engine.clock()
        states = dict.fromkeys(_NODE_GAUGES.values(), 0)
        oldest: dict[str, float] = {}
        active: list[TaskRecord] = []
        for task in await engine.unfinished_tasks():
            states["paused"] += task.counts.get(NodeState.PAUSED.value, 0)
            # Waiting and running nodes share one counter ("ACTIVE"): the snapshots
            # tell them apart.
            if task.counts.get("ACTIVE") and len(active) < OLDEST_WAITING_SCAN:
                active.append(task)
        async for task, snaps in engine.snapshots_each(active, states=_SCANNED):
            lanes = await self._node_lanes(engine, task)
            for snap in snaps:
                if snap.owner not in COMPOSITE_OWNERS:  # (its instances count)
                    states[_NODE_GAUGES[snap.state]] += 1
                age = waiting_age(snap, now)
                if age is not None:
                    lane = lanes.get(base_id(snap.node_id), "default")
                    oldest[lane] = max(oldest.get(lane, 0.0), age)
        for state, count in states.items():
            self.nodes.labels(state).set(count)
        self.lanes.update(oldest)
        for lane in sorted(self.lanes):
            self.oldest_waiting.labels(lane).set(oldest.get(lane, 0.0))

    async def _node_lanes(self, engine: Any, task: TaskRecord) -> dict[str, str]:
        try:
            dag = await engine.get_dag(task.dag_hash)
        except NotFound:
            return {}
        return {nid: node.lane for nid, node in dag.nodes.items()}

    async def render(self, engine: Any) -> bytes:
        """Drain, refresh (a failing backend leaves the gauges as they were) and return
        the Prometheus text exposition."""
        await self.drain(engine)
        try:
            await self.refresh(engine)
        except Exception as exc:
            log.warning("metrics: cannot read the queue or the store: %r", exc)
        return bytes(generate_latest(self.registry))


def waiting_age(snap: Snapshot, now: float) -> float | None:
    """Seconds a WAITING node has been due at ``now``: since it became ready, or since
    its backoff ended (None: not WAITING, or not due yet)."""
    if snap.state is not NodeState.WAITING or not snap.ready_at or snap.not_before > now:
        return None
    return max(0.0, now - max(snap.ready_at, snap.not_before))


class MetricsServer:
    """``/metrics`` of a process without a REST listener (``ax executor``):
    prometheus_client's WSGI server on a thread of its own, serving ``registry`` as it
    is (such a process has no engine, so nothing is drained or refreshed on a scrape).

    ``start()`` binds (port 0 picks a free port) and returns the URL; ``close()`` stops
    the thread and closes the socket. Also a context manager.

    Args:
        registry: What to serve.
        host: Address to listen on.
        port: Port (0: any free one).
    """

    def __init__(self, registry: CollectorRegistry, *, host: str, port: int) -> None:
        self.registry = registry
        self.host = host
        self.port = port
        self._server: Any = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """Where it serves, with the real port (after :meth:`start`)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def start(self) -> str:
        """Bind and serve; return :attr:`url`.

        Raises:
            InputError: The address cannot be bound (in use, not local, unknown name).
        """
        try:
            self._server, self._thread = start_wsgi_server(
                self.port, addr=self.host, registry=self.registry)
        except OSError as exc:
            raise InputError(f"cannot serve metrics on {self.host}:{self.port}: "
                             f"{exc.strerror or exc}") from exc
        self.port = int(self._server.server_port)
        return self.url

    def close(self) -> None:
        """Stop serving and release the port; idempotent."""
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        if self._thread is not None:
            self._thread.join()

    def __enter__(self) -> MetricsServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
