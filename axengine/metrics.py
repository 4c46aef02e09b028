"""Prometheus metrics of an ax process (DESIGN §5), one registry per process.

Where each metric comes from:

- ``ax_snapshot_write_seconds``: :class:`TimedStore`, a thin wrapper around the state
  store that times every ``txn`` the engine makes (:meth:`AxMetrics.wrap_store`, applied
  where the store is built: :func:`axengine.wiring.build_runtime`).
- ``ax_node_outcomes_total``, ``ax_lease_expiries_total``, ``ax_retries_exhausted_total``,
  ``ax_tasks_finished_total``: the engine's commit listener. Events carry their kind but
  not the node type, and listeners are synchronous, so the listener only records
  ``(dag hash, events)``; :meth:`AxMetrics.drain` resolves node types through the
  engine's DAG cache later (on every scrape and periodically by the server).
  ``stale`` and ``already-done`` answers write nothing, hence no event: the adapters
  that call ``complete`` report them with :meth:`AxMetrics.complete_answer`.
- ``ax_llm_tokens_total``: the ``_llm.usage`` an LLM node puts in its (object) output,
  read from the outcome by :meth:`AxMetrics.llm_usage` where ``complete`` is called (the
  gRPC ``Complete`` and the in-process executor's ``observe``), only when the answer is
  ``committed``, so a retried or repeated complete never counts twice.
- ``ax_stall_verdicts_total{action}``: the same listener, from the events of the
  blocking verdicts (``stall_note``, ``stall_warning``, ``stall_extended``) and the
  fences whose reason is a verdict's evidence (docs/blocking.md).
- ``ax_queue_depth`` and ``ax_oldest_waiting_seconds``: read from the queue and, through
  the engine, the store on every scrape (:meth:`AxMetrics.refresh`), so they are right
  across replicas.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from axengine.errors import NotFound
from axengine.records import Event, NodeState, TaskRecord
from axengine.store import Compare, Op, StateStore, StoreWrapper, TxnResult
from executors.contract import Success

__all__ = ["CONTENT_TYPE_LATEST", "AxMetrics", "TimedStore"]

log = logging.getLogger("axengine.metrics")

#: Listener records kept until the next drain; older ones are dropped (and counted).
MAX_PENDING = 100_000
#: Unfinished tasks read per scrape to find the oldest WAITING node.
OLDEST_WAITING_SCAN = 5_000
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
#: Longest model label kept (longer names are cut; the label set stays bounded).
MAX_MODEL_LABEL = 100


@dataclass(frozen=True)
class _Pending:
    dag_hash: str
    task_id: str
    events: tuple[Event, ...] = ()
    answer: tuple[str, str] | None = None  # (node_id, complete answer)


class TimedStore(StoreWrapper):
    """A :class:`StateStore` that times ``txn`` into a histogram and delegates the rest."""

    def __init__(self, inner: StateStore, histogram: Histogram) -> None:
        super().__init__(inner)
        self._histogram = histogram

    async def txn(self, compares: Sequence[Compare], success: Sequence[Op],
                  failure: Sequence[Op] = ()) -> TxnResult:
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
                                    "Age of the oldest due WAITING node", registry=r)
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
        self.llm_tokens = Counter("ax_llm_tokens_total",
                                  "LLM tokens of committed outcomes", ["model", "kind"],
                                  registry=r)
        self.stall_verdicts = Counter("ax_stall_verdicts_total",
                                      "Blocking verdicts recorded on running nodes",
                                      ["action"], registry=r)
        self.dropped = Counter("ax_metrics_dropped_total",
                               "Listener records dropped before a drain", registry=r)
        self._pending: deque[_Pending] = deque()
        self._max_pending = max_pending
        self.lanes: set[str] = {"default", "fast"}

    # ------------------------------------------------------------------ feeding

    def wrap_store(self, store: StateStore) -> StateStore:
        """``store`` with every transaction timed into ``ax_snapshot_write_seconds``
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
                self.node_outcomes.labels(types.get(node_id, "unknown"), outcome).inc()
            for event in item.events:
                self._count(event, types.get(event.node_id, "unknown"))
        return count

    async def _node_types(self, engine: Any, item: _Pending) -> dict[str, str]:
        dag_hash = item.dag_hash
        if not dag_hash:
            try:
                dag_hash = (await engine.task_record(item.task_id)).dag_hash
            except NotFound:
                return {}
        dag = await engine.get_dag(dag_hash)
        self.lanes.update(node.lane for node in dag.nodes.values())
        return {nid: node.type for nid, node in dag.nodes.items()}

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
        """Read the queue depth per lane and the oldest due WAITING node."""
        for lane in sorted(self.lanes):
            self.queue_depth.labels(lane).set(await engine.queue.depth(lane))
        now = engine.clock()
        oldest = 0.0
        scanned = 0
        for task in await engine.unfinished_tasks():
            if not task.counts.get("ACTIVE"):
                continue
            scanned += 1
            if scanned > OLDEST_WAITING_SCAN:
                break
            for snap in await engine.snapshots(task.task_id):
                if snap.state is NodeState.WAITING and snap.not_before <= now and snap.ready_at:
                    # Due since it became ready, or since its backoff ended.
                    oldest = max(oldest, now - max(snap.ready_at, snap.not_before))
        self.oldest_waiting.set(oldest)

    async def render(self, engine: Any) -> bytes:
        """Drain, refresh (a failing backend leaves the gauges as they were) and return
        the Prometheus text exposition."""
        await self.drain(engine)
        try:
            await self.refresh(engine)
        except Exception as exc:
            log.warning("metrics: cannot read the queue or the store: %r", exc)
        return bytes(generate_latest(self.registry))
