"""OpenTelemetry spans of tasks and node attempts, optional (docs/tracing.md).

ax is stateless and runs a task across many processes (the API, executors, node
processes, Kubernetes Job pods), so no process can hand a span context to the next one
in memory, and storing one in every record would put tracing on the commit path.
Instead every id is *derived* from what every process already knows
(:func:`executors.contract.task_trace_id` and its siblings):

- the task's **trace id** and its **task span id** from the task id;
- a node attempt's **span id** from task, node, attempt and fence.

Who emits what:

- **task span** (``ax task <dag>``, the root of the trace): the engine commit listener
  (:meth:`Tracing.on_commit`) of the process that commits the task's final transition,
  from ``created_at`` to ``finished_at``. It is attached where engines are built
  (:func:`axengine.wiring.build_runtime`).
- **node-attempt span** (``ax node <node id>``, a child of the task span): the worker,
  around the runner's run of the attempt (:meth:`Tracing.attempt`), whatever the runner
  (a thread, a node process, a Kubernetes Job).
- the **W3C traceparent** of the attempt (:attr:`executors.contract.NodeRequest.traceparent`)
  goes out with ``http_request`` calls and model calls. It needs no SDK: downstream
  services correlate on the task's trace id even where ax records nothing.

Tracing is on when the ``otel`` extra is installed (``pip install 'axengine[otel]'``)
*and* the standard environment asks for an exporter (:class:`TracingSettings`, read once
per process by :func:`current`). Without either, :func:`current` is a
:class:`NoTracing` whose methods do nothing, and nothing of OpenTelemetry is imported.

ax keeps its own ``TracerProvider`` (never the global one): its ids come from the
derivation above, which a provider configured elsewhere would not know.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from executors.contract import (
    Failure,
    NodeRequest,
    Paused,
    Unavailable,
    attempt_span_id,
    task_span_id,
    task_trace_id,
)

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.sdk.trace.id_generator import IdGenerator
    from opentelemetry.trace import Span

    from axengine.records import Event, TaskRecord

__all__ = [
    "DEFAULT_SERVICE_NAME",
    "AttemptSpan",
    "NoTracing",
    "Tracing",
    "TracingSettings",
    "build",
    "current",
    "install",
]

log = logging.getLogger("axengine.tracing")

#: ``service.name`` of ax's spans unless ``OTEL_SERVICE_NAME`` says otherwise.
DEFAULT_SERVICE_NAME = "ax"
#: Exporter names ``OTEL_TRACES_EXPORTER`` may list (``none`` turns tracing off).
EXPORTERS = ("otlp", "console")
#: OTLP protocols; ``http/protobuf`` is the one the ``otel`` extra installs.
OTLP_PROTOCOLS = ("http/protobuf", "grpc")
#: Longest error message kept as a span's status description.
MAX_STATUS = 500

_INSTALL_HINT = "pip install 'axengine[otel]'"


@dataclass(frozen=True, kw_only=True)
class TracingSettings:
    """What the standard OpenTelemetry environment asks of this process.

    Attributes:
        exporters: ``otlp`` and/or ``console``; empty: tracing is off.
        endpoint: URL the OTLP exporter sends to ("": the exporter's default,
            ``http://localhost:4318/v1/traces``).
        protocol: ``http/protobuf`` or ``grpc`` (the latter needs
            ``opentelemetry-exporter-otlp-proto-grpc``).
        service_name: ``service.name`` of the spans.
    """

    exporters: tuple[str, ...] = ()
    endpoint: str = ""
    protocol: str = "http/protobuf"
    service_name: str = DEFAULT_SERVICE_NAME

    @property
    def enabled(self) -> bool:
        return bool(self.exporters)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> TracingSettings:
        """Read ``OTEL_SDK_DISABLED``, ``OTEL_TRACES_EXPORTER``,
        ``OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT``, ``OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL``
        and ``OTEL_SERVICE_NAME``.

        Unlike the SDK's own default (``otlp`` always), tracing stays off until either
        ``OTEL_TRACES_EXPORTER`` names an exporter or an OTLP endpoint is set: having
        the extra installed must not make every ``ax run`` send to localhost:4318.
        """
        env = environ if environ is not None else os.environ

        def get(name: str) -> str:
            return env.get(name, "").strip()

        protocol = (get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
                    or get("OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf").lower()
        endpoint = get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        base = get("OTEL_EXPORTER_OTLP_ENDPOINT")
        if not endpoint and base:
            # The generic endpoint is a base URL for every signal over HTTP (the spec
            # appends the signal's path); gRPC takes it as it is.
            endpoint = base if protocol == "grpc" else base.rstrip("/") + "/v1/traces"
        names = tuple(dict.fromkeys(
            n.strip().lower() for n in get("OTEL_TRACES_EXPORTER").split(",") if n.strip()))
        if not names and endpoint:
            names = ("otlp",)
        if get("OTEL_SDK_DISABLED").lower() == "true" or "none" in names:
            names = ()
        return cls(exporters=names, endpoint=endpoint, protocol=protocol,
                   service_name=get("OTEL_SERVICE_NAME") or DEFAULT_SERVICE_NAME)


# ---------------------------------------------------------------------- no-op


class _NoSpan:
    """What :meth:`NoTracing.attempt` yields: takes the outcome, records nothing."""

    def outcome(self, outcome: Any, *, stale: bool = False) -> None:
        """Record how the attempt ended (here: nothing)."""


_NO_SPAN = _NoSpan()


class NoTracing:
    """Tracing off (no extra, or not configured): every method does nothing."""

    enabled = False

    def attach(self, engine: Any) -> None:
        """Listen to ``engine``'s commits for task spans (here: nothing)."""

    def on_commit(self, task: TaskRecord, events: Sequence[Event]) -> None:
        """Engine commit listener (here: nothing)."""

    @contextlib.contextmanager
    def attempt(self, request: NodeRequest) -> Iterator[_NoSpan | AttemptSpan]:
        """The span of one node attempt, open while the block runs (here: none)."""
        yield _NO_SPAN

    def flush(self, timeout: float = 5.0) -> bool:
        """Export the spans still buffered (here: there are none)."""
        return True

    def shutdown(self) -> None:
        """Flush and stop exporting (here: nothing to stop)."""


# ---------------------------------------------------------------------- with the SDK

#: The ids the next span started through ax's provider gets (see :func:`_derived_ids`).
_NEXT_IDS: ContextVar[tuple[int, int] | None] = ContextVar("ax_next_span_ids", default=None)


@contextlib.contextmanager
def _ids(trace_id: str, span_id: str) -> Iterator[None]:
    token = _NEXT_IDS.set((int(trace_id, 16), int(span_id, 16)))
    try:
        yield
    finally:
        _NEXT_IDS.reset(token)


def _derived_ids() -> IdGenerator:
    """An id generator that hands out the derived ids set by :func:`_ids` (the SDK asks
    its provider's generator for a span's ids; there is no other public way to choose
    them), and random ones otherwise."""
    from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator

    class DerivedIds(IdGenerator):
        def __init__(self) -> None:
            self._random = RandomIdGenerator()

        def generate_span_id(self) -> int:
            ids = _NEXT_IDS.get()
            return ids[1] if ids is not None else self._random.generate_span_id()

        def generate_trace_id(self) -> int:
            ids = _NEXT_IDS.get()
            return ids[0] if ids is not None else self._random.generate_trace_id()

    return DerivedIds()


def _ns(seconds: float) -> int:
    return round(seconds * 1e9)


class AttemptSpan:
    """The open span of one node attempt (see :meth:`Tracing.attempt`)."""

    def __init__(self, span: Span) -> None:
        self._span = span

    def outcome(self, outcome: Any, *, stale: bool = False) -> None:
        """Record how the attempt ended: ``ax.outcome`` is the outcome's type
        (``success``, ``failure``, ``unavailable``, ``paused``, or ``reported`` for a run
        that committed its own outcome); a :class:`Failure` sets the error status.

        Args:
            outcome: What the runner returned.
            stale: The run was fenced out: its outcome is discarded.
        """
        from opentelemetry.trace import Status, StatusCode

        span = self._span
        span.set_attribute("ax.outcome", type(outcome).__name__.lower())
        span.set_attribute("ax.stale", stale)
        if isinstance(outcome, Failure):
            span.set_attribute("ax.retryable", outcome.retryable)
            span.set_status(Status(StatusCode.ERROR, outcome.message[:MAX_STATUS]))
        elif isinstance(outcome, Unavailable):
            span.set_attribute("ax.dependency", outcome.dependency)
            span.add_event("unavailable", {"evidence": outcome.evidence[:MAX_STATUS]})
        elif isinstance(outcome, Paused):
            span.set_attribute("ax.pause_reason", outcome.reason[:MAX_STATUS])
        answer = getattr(outcome, "answer", None)  # a run that reported by itself
        if isinstance(answer, str):
            span.set_attribute("ax.answer", answer)


class Tracing:
    """ax's spans through its own ``TracerProvider`` (see the module docstring).

    Args:
        exporters: Where spans go (an OTLP exporter, a console one, a test's
            ``InMemorySpanExporter``).
        service_name: ``service.name`` of the spans (``OTEL_RESOURCE_ATTRIBUTES`` adds
            to the resource as the SDK reads it).
        batch: Export in the background in batches (False: synchronously as each span
            ends, what tests want).
    """

    enabled = True

    def __init__(self, exporters: Sequence[SpanExporter], *,
                 service_name: str = DEFAULT_SERVICE_NAME, batch: bool = True) -> None:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
        from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased

        from axengine import __version__

        # No sampler from the environment: a task span sampled out in one process while
        # its attempts are recorded in others would leave orphans. Sample in the
        # collector (tail sampling sees whole traces).
        self.provider: TracerProvider = TracerProvider(
            resource=Resource.create({"service.name": service_name}),
            sampler=ParentBased(ALWAYS_ON), id_generator=_derived_ids())
        for exporter in exporters:
            self.provider.add_span_processor(
                BatchSpanProcessor(exporter) if batch else SimpleSpanProcessor(exporter))
        self._tracer = self.provider.get_tracer("axengine", __version__)

    def attach(self, engine: Any) -> None:
        """Emit the task span when ``engine`` commits a task's final transition."""
        engine.add_listener(self.on_commit)

    def on_commit(self, task: TaskRecord, events: Sequence[Event]) -> None:
        """Engine commit listener: the task span, once the task is final. Never raises:
        tracing must not fail a commit's caller."""
        if not task.status.final:
            return
        # The event the engine writes with the status change: a later commit on a final
        # task (a late complete answered already-done) does not emit the span again.
        if not any(e.kind == "task_" + task.status.lower() for e in events):
            return
        try:
            self.emit_task(task)
        except Exception:
            log.warning("tracing: cannot emit the span of task %s", task.task_id,
                        exc_info=True)

    def emit_task(self, task: TaskRecord) -> None:
        """Emit the span of ``task`` (final) from ``created_at`` to ``finished_at``."""
        from opentelemetry.context import Context
        from opentelemetry.trace import SpanKind, Status, StatusCode

        start = _ns(task.created_at)
        end = max(start, _ns(task.finished_at or task.updated_at))
        attributes = {
            "ax.task.id": task.task_id,
            "ax.dag.name": task.dag_name,
            "ax.dag.hash": task.dag_hash,
            "ax.task.status": task.status.value,
        }
        # An empty context: the task span is a root even when the caller (an app
        # embedding ax.run) has a span of its own active.
        with _ids(task_trace_id(task.task_id), task_span_id(task.task_id)):
            span = self._tracer.start_span(f"ax task {task.dag_name}", context=Context(),
                                           kind=SpanKind.INTERNAL, attributes=attributes,
                                           start_time=start)
        if task.status.value in ("FAILED", "DEAD"):
            span.set_status(Status(StatusCode.ERROR, f"task {task.status.value}"))
        span.end(end_time=end)

    @contextlib.contextmanager
    def attempt(self, request: NodeRequest) -> Iterator[_NoSpan | AttemptSpan]:
        """The span of one node attempt, a child of the task span, open while the block
        runs; the block reports the outcome on the yielded :class:`AttemptSpan`."""
        from opentelemetry.trace import (
            NonRecordingSpan,
            SpanContext,
            SpanKind,
            Status,
            StatusCode,
            TraceFlags,
            set_span_in_context,
        )

        trace_id = task_trace_id(request.task_id)
        parent = NonRecordingSpan(SpanContext(
            trace_id=int(trace_id, 16), span_id=int(task_span_id(request.task_id), 16),
            is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED)))
        attributes: dict[str, str | int] = {
            "ax.task.id": request.task_id,
            "ax.node.id": request.node_id,
            "ax.node.type": request.node_type,
            "ax.attempt": request.attempt,
            "ax.fence": request.fence,
        }
        span_id = attempt_span_id(request.task_id, request.node_id, request.attempt,
                                  request.fence)
        with _ids(trace_id, span_id):
            span = self._tracer.start_span(
                f"ax node {request.node_id}", context=set_span_in_context(parent),
                kind=SpanKind.INTERNAL, attributes=attributes)
        try:
            yield AttemptSpan(span)
        except Exception as exc:
            span.record_exception(exc)
            span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
            raise
        except BaseException:
            # Cancelled (the executor stops): not the node's failure.
            span.set_attribute("ax.outcome", "interrupted")
            raise
        finally:
            span.end()

    def flush(self, timeout: float = 5.0) -> bool:
        """Export the spans still buffered; False when ``timeout`` ran out."""
        return self.provider.force_flush(int(timeout * 1000))

    def shutdown(self) -> None:
        """Flush and stop exporting."""
        self.provider.shutdown()


def _exporter(name: str, settings: TracingSettings) -> SpanExporter:
    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        # stderr: ``ax run`` prints its result on stdout.
        return ConsoleSpanExporter(out=sys.stderr)
    if settings.protocol == "grpc":
        # Not in the extra (it brings grpcio's OTLP stubs): loaded by name when installed.
        grpc = importlib.import_module("opentelemetry.exporter.otlp.proto.grpc.trace_exporter")
        exporter: SpanExporter = grpc.OTLPSpanExporter(endpoint=settings.endpoint or None)
        return exporter
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    # Headers, certificates, compression and timeout: the exporter reads its own
    # OTEL_EXPORTER_OTLP_* variables.
    return OTLPSpanExporter(endpoint=settings.endpoint or None)


def build(settings: TracingSettings) -> Tracing | NoTracing:
    """The tracing ``settings`` ask for; :class:`NoTracing` (with a warning saying what
    to install or fix) when they ask for nothing or what they ask is not installed."""
    if not settings.enabled:
        return NoTracing()
    exporters: list[SpanExporter] = []
    for name in settings.exporters:
        if name not in EXPORTERS:
            log.warning("OTEL_TRACES_EXPORTER names %r, which ax does not know: use %s or "
                        "none", name, ", ".join(EXPORTERS))
            continue
        if name == "otlp" and settings.protocol not in OTLP_PROTOCOLS:
            log.warning("OTEL_EXPORTER_OTLP_PROTOCOL %r is not supported: use %s",
                        settings.protocol, " or ".join(OTLP_PROTOCOLS))
            continue
        try:
            exporters.append(_exporter(name, settings))
        except ImportError as exc:
            package = ("opentelemetry-exporter-otlp-proto-grpc"
                       if name == "otlp" and settings.protocol == "grpc" else None)
            hint = f"pip install {package}" if package else _INSTALL_HINT
            log.warning("tracing: the %s exporter is configured but cannot be loaded (%s); "
                        "ax runs without it: %s", name, exc, hint)
    if not exporters:
        return NoTracing()
    try:
        return Tracing(exporters, service_name=settings.service_name)
    except ImportError as exc:  # an exporter without the SDK (a partial install)
        log.warning("tracing: the OpenTelemetry SDK cannot be loaded (%s); ax runs "
                    "without it: %s", exc, _INSTALL_HINT)
        return NoTracing()


_current: Tracing | NoTracing | None = None
_lock = threading.Lock()


def current() -> Tracing | NoTracing:
    """This process's tracing, built from the environment on first use
    (:meth:`TracingSettings.from_env`, :func:`build`)."""
    global _current
    with _lock:
        if _current is None:
            _current = build(TracingSettings.from_env())
        return _current


def install(tracing: Tracing | NoTracing | None) -> Tracing | NoTracing | None:
    """Make ``tracing`` this process's (an app or a test with its own exporter); None:
    build it from the environment again on next use. Returns the one it replaces.
    Engines and workers take the tracing current when they are built."""
    global _current
    with _lock:
        previous, _current = _current, tracing
    return previous
