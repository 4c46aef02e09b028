"""OpenTelemetry tracing (docs/tracing.md): derived ids, the OTEL_* settings, one task
span and one span per node attempt in the task's trace, the W3C ``traceparent`` on
``http_request`` and model calls, and ax unchanged without the ``otel`` extra."""

from __future__ import annotations

import asyncio
import hashlib
import importlib.util
import json
import logging
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from axengine import tracing
from axengine.config import AxConfig
from axengine.local import LocalSession, RunResult
from axengine.records import Event, TaskRecord, TaskStatus
from axengine.tracing import NoTracing, Tracing, TracingSettings
from executors.contract import NodeRequest, attempt_span_id, task_span_id, task_trace_id
from executors.llm import llm_call
from tests.executors.local_http import Reply, serve
from tests.fake_openai import fake_openai

ROOT = Path(__file__).resolve().parents[1]
FINANCIAL = ROOT / "dags" / "financial_risk_assessment.yaml"
ACME = {"pdf_url": str(ROOT / "dags" / "inputs" / "acme_annual_report.pdf")}
METRICS = {"revenue_growth": 0.05, "net_profit_margin": 0.2, "debt_to_equity": 0.5}
KEY = "sk-test-tracing-0123456789"
TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-01\Z")


def _sha(text: str) -> bytes:
    return hashlib.sha256(text.encode()).digest()


def _hex(value: int, digits: int) -> str:
    return f"{value:0{digits}x}"


def _header(headers: dict[str, str], name: str) -> list[str]:
    """Every value of header ``name`` (HTTP header names are case-insensitive)."""
    return [v for k, v in headers.items() if k.lower() == name]


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """This process traces into memory, synchronously, while the test runs."""
    exporter = InMemorySpanExporter()
    traced = Tracing([exporter], batch=False)
    previous = tracing.install(traced)
    try:
        yield exporter
    finally:
        tracing.install(previous)
        traced.shutdown()


def _run(home: Path, dag: Any, input: Any, *,
         runner: str = "thread") -> tuple[RunResult, list[Event]]:
    async def main() -> tuple[RunResult, list[Event]]:
        async with LocalSession(AxConfig(home=home), reconcile_interval=0.5,
                                runner=runner) as session:
            task_id = await session.submit(dag, input)
            result = await session.wait(task_id, timeout=60)
            return result, list(await session.engine.events(task_id))

    return asyncio.run(main())


def _split(finished: Any) -> tuple[ReadableSpan, dict[tuple[str, int, int], ReadableSpan]]:
    """The one task span and the attempt spans by (node, attempt, fence)."""
    task_spans = [s for s in finished if s.name.startswith("ax task ")]
    assert len(task_spans) == 1, [s.name for s in finished]
    attempts: dict[tuple[str, int, int], ReadableSpan] = {}
    for span in finished:
        if span.name.startswith("ax node "):
            attrs = span.attributes
            key = (attrs["ax.node.id"], attrs["ax.attempt"], attrs["ax.fence"])
            assert key not in attempts, f"two spans for attempt {key}"
            attempts[key] = span
    assert len(attempts) + 1 == len(finished), [s.name for s in finished]
    return task_spans[0], attempts


# ---------------------------------------------------------------------- pure


def test_ids_are_derived_from_the_task_and_the_attempt() -> None:
    digest = _sha("t-42")
    assert task_trace_id("t-42") == digest[:16].hex()
    assert task_span_id("t-42") == digest[16:24].hex()
    assert attempt_span_id("t-42", "parse_pdf", 2, 5) == _sha("t-42/parse_pdf/2/5")[:8].hex()
    request = NodeRequest(task_id="t-42", node_id="parse_pdf", node_type="tool_call",
                          attempt=2, fence=5, config={}, input=None)
    match = TRACEPARENT.match(request.traceparent)
    assert match is not None, request.traceparent
    assert match.groups() == (digest[:16].hex(), _sha("t-42/parse_pdf/2/5")[:8].hex())
    # Every run of a node has its own span: the fence moves on a takeover.
    fenced = NodeRequest(task_id="t-42", node_id="parse_pdf", node_type="tool_call",
                         attempt=2, fence=6, config={}, input=None)
    assert fenced.traceparent != request.traceparent
    assert fenced.traceparent[:36] == request.traceparent[:36]  # same trace


@pytest.mark.parametrize(("env", "expected"), [
    ({}, TracingSettings()),
    ({"OTEL_TRACES_EXPORTER": "console"}, TracingSettings(exporters=("console",))),
    ({"OTEL_TRACES_EXPORTER": " OTLP , console,otlp", "OTEL_SERVICE_NAME": "ax-api"},
     TracingSettings(exporters=("otlp", "console"), service_name="ax-api")),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318/"},
     TracingSettings(exporters=("otlp",), endpoint="http://collector:4318/v1/traces")),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318",
      "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://t:4318/custom"},
     TracingSettings(exporters=("otlp",), endpoint="http://t:4318/custom")),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
     TracingSettings(exporters=("otlp",), endpoint="http://c:4317", protocol="grpc")),
    ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"},
     TracingSettings(endpoint="http://c:4318/v1/traces")),
    ({"OTEL_TRACES_EXPORTER": "console", "OTEL_SDK_DISABLED": "true"}, TracingSettings()),
])
def test_settings_from_the_standard_environment(env: dict[str, str],
                                                expected: TracingSettings) -> None:
    settings = TracingSettings.from_env(env)
    assert settings == expected
    assert settings.enabled == bool(expected.exporters)


def test_build_follows_the_settings(caplog: pytest.LogCaptureFixture) -> None:
    assert isinstance(tracing.build(TracingSettings()), NoTracing)
    console = tracing.build(TracingSettings(exporters=("console",)))
    assert isinstance(console, Tracing)
    console.shutdown()
    otlp = tracing.build(TracingSettings(exporters=("otlp",), endpoint="http://c:4318/v1/traces"))
    assert isinstance(otlp, Tracing)
    otlp.shutdown()
    with caplog.at_level(logging.WARNING, logger="axengine.tracing"):
        unknown = tracing.build(TracingSettings(exporters=("zipkin",)))
    assert isinstance(unknown, NoTracing)
    assert "'zipkin'" in caplog.text and "otlp, console" in caplog.text


def test_the_task_span_is_emitted_once_at_the_final_transition(
        spans: InMemorySpanExporter) -> None:
    traced = tracing.current()
    assert isinstance(traced, Tracing)
    task = TaskRecord(task_id="t-1", dag_hash="h", dag_name="d", created_at=100.0,
                      updated_at=103.0, finished_at=102.5, status=TaskStatus.DEAD)
    final = Event(task_id="t-1", event_id="e1", kind="task_dead", at=102.5, state="DEAD")
    running = TaskRecord(task_id="t-1", dag_hash="h", dag_name="d", created_at=100.0)
    traced.on_commit(running, [Event(task_id="t-1", event_id="e0", kind="claimed", at=101)])
    traced.on_commit(task, [final])
    # A later commit on the final task (a late complete): no second span.
    traced.on_commit(task, [Event(task_id="t-1", event_id="e2", kind="progress", at=104)])
    (span,) = spans.get_finished_spans()
    assert span.name == "ax task d"
    assert span.parent is None
    assert _hex(span.context.trace_id, 32) == task_trace_id("t-1")
    assert _hex(span.context.span_id, 16) == task_span_id("t-1")
    assert (span.start_time, span.end_time) == (100_000_000_000, 102_500_000_000)
    assert span.status.status_code is StatusCode.ERROR
    assert dict(span.attributes or {}) == {"ax.task.id": "t-1", "ax.dag.name": "d",
                                           "ax.dag.hash": "h", "ax.task.status": "DEAD"}


# ---------------------------------------------------------------------- end to end


def test_financial_run_is_one_trace_with_the_model_call_in_it(
        spans: InMemorySpanExporter, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        record_property: Any) -> None:
    """The seed's DAG against a fake OpenAI endpoint: one task span, one span per node
    attempt parented under it, and the model call carries the llm attempt's span."""
    llm_call.reset()

    def answer(body: dict[str, Any]) -> str:
        return json.dumps(METRICS)

    with fake_openai(answer, require_key=KEY) as api:
        monkeypatch.setenv("OPENAI_BASE_URL", api.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", KEY)
        try:
            result, events = _run(tmp_path, FINANCIAL, ACME)
        finally:
            llm_call.reset()
        (call,) = api.completions
    assert result.status == "SUCCEEDED", result.errors
    task_span, attempts = _split(spans.get_finished_spans())
    trace = task_trace_id(result.task_id)

    claimed = {(e.node_id, e.attempt, e.fence) for e in events if e.kind == "claimed"}
    assert set(attempts) == claimed
    assert {node for node, _, _ in attempts} == {
        "parse_pdf", "extract_metrics", "send_low_risk_email", "log_completion"}

    assert task_span.name == "ax task financial_risk_assessment"
    assert task_span.parent is None
    assert _hex(task_span.context.trace_id, 32) == trace
    assert _hex(task_span.context.span_id, 16) == task_span_id(result.task_id)
    assert dict(task_span.attributes or {}) == {
        "ax.task.id": result.task_id, "ax.dag.name": "financial_risk_assessment",
        "ax.dag.hash": task_span.attributes["ax.dag.hash"],  # type: ignore[index]
        "ax.task.status": "SUCCEEDED"}
    assert len(str(task_span.attributes["ax.dag.hash"])) == 64  # type: ignore[index]
    assert task_span.status.status_code is StatusCode.UNSET

    types = {"parse_pdf": "tool_call", "extract_metrics": "llm_call",
             "send_low_risk_email": "tool_call", "log_completion": "tool_call"}
    for (node, attempt, fence), span in attempts.items():
        assert _hex(span.context.trace_id, 32) == trace
        assert span.parent is not None
        assert _hex(span.parent.span_id, 16) == task_span_id(result.task_id)
        assert _hex(span.context.span_id, 16) == attempt_span_id(result.task_id, node,
                                                                 attempt, fence)
        assert dict(span.attributes or {}) == {
            "ax.task.id": result.task_id, "ax.node.id": node, "ax.node.type": types[node],
            "ax.attempt": attempt, "ax.fence": fence, "ax.outcome": "success",
            "ax.stale": False}
        assert span.status.status_code is StatusCode.UNSET
        assert span.start_time is not None and span.end_time is not None
        assert task_span.start_time is not None and task_span.end_time is not None
        assert task_span.start_time <= span.start_time <= span.end_time <= task_span.end_time

    (llm_key,) = [k for k in attempts if k[0] == "extract_metrics"]
    (header,) = _header(call.headers, "traceparent")
    assert header == f"00-{trace}-{attempt_span_id(result.task_id, *llm_key)}-01"
    record_property("summary", f"1 task span + {len(attempts)} attempt spans in trace "
                    f"{trace}; model call traceparent {header}")


def test_http_request_carries_the_attempt_and_a_failure_is_an_error(
        spans: InMemorySpanExporter, tmp_path: Path) -> None:
    """Two entry nodes: ``call`` reaches the test's server (which gets the attempt's
    traceparent), ``broken`` fails for good, so the task and its span fail too."""
    with serve({"/hook": lambda _: Reply(200, b"ok")}) as srv:
        dag = {"name": "traced_http", "nodes": {
            "call": {"type": "tool_call", "tool": "http_request",
                     "input": {"url": f"{srv.url}/hook", "headers": {"X-Test": "1"}}},
            "broken": {"type": "tool_call", "tool": "http_request",
                       "input": "ftp://example.invalid/x"},
        }}
        result, _ = _run(tmp_path, dag, {})
        (seen,) = srv.seen
    assert result.status in ("FAILED", "DEAD"), result.states
    task_span, attempts = _split(spans.get_finished_spans())
    trace = task_trace_id(result.task_id)
    assert {node for node, _, _ in attempts} == {"call", "broken"}

    (call_key,) = [k for k in attempts if k[0] == "call"]
    assert _header(seen.headers, "traceparent") == [
        f"00-{trace}-{_hex(attempts[call_key].context.span_id, 16)}-01"]
    assert _header(seen.headers, "x-test") == ["1"]

    assert task_span.attributes["ax.task.status"] == result.status  # type: ignore[index]
    assert task_span.status.status_code is StatusCode.ERROR
    (broken,) = [s for k, s in attempts.items() if k[0] == "broken"]
    assert broken.status.status_code is StatusCode.ERROR
    assert "ftp" in (broken.status.description or "")
    assert broken.attributes["ax.outcome"] == "failure"  # type: ignore[index]
    assert broken.attributes["ax.retryable"] is False  # type: ignore[index]
    assert attempts[call_key].status.status_code is StatusCode.UNSET


def test_a_node_process_sends_the_span_its_executor_records(
        spans: InMemorySpanExporter, tmp_path: Path) -> None:
    """With the subprocess runner the handler runs in a node process that records
    nothing; the header it sends still names the span the executor recorded."""
    with serve({"/hook": lambda _: Reply(200, b"ok")}) as srv:
        dag = {"name": "traced_subprocess", "nodes": {"call": {
            "type": "tool_call", "tool": "http_request", "input": f"{srv.url}/hook"}}}
        result, _ = _run(tmp_path, dag, {}, runner="subprocess")
        (seen,) = srv.seen
    assert result.status == "SUCCEEDED", result.errors
    task_span, attempts = _split(spans.get_finished_spans())
    ((key, span),) = attempts.items()
    assert key == ("call", 1, 1)
    assert _header(seen.headers, "traceparent") == [
        f"00-{task_trace_id(result.task_id)}-{_hex(span.context.span_id, 16)}-01"]
    assert span.context.trace_id == task_span.context.trace_id


def test_a_traceparent_set_by_the_dag_is_kept(tmp_path: Path) -> None:
    mine = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    with serve({"/hook": lambda _: Reply(200, b"ok")}) as srv:
        dag = {"name": "own_trace", "nodes": {"call": {
            "type": "tool_call", "tool": "http_request",
            "input": {"url": f"{srv.url}/hook", "headers": {"TraceParent": mine}}}}}
        result, _ = _run(tmp_path, dag, {})
        (seen,) = srv.seen
    assert result.status == "SUCCEEDED"
    assert _header(seen.headers, "traceparent") == [mine]


# ---------------------------------------------------------------------- without the extra


def _block_opentelemetry(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make ``import opentelemetry...`` fail as if the extra were not installed."""
    for name in [n for n in sys.modules if n == "opentelemetry" or
                 n.startswith("opentelemetry.")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, "opentelemetry", None)


def test_without_opentelemetry_the_module_imports_and_does_nothing(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    _block_opentelemetry(monkeypatch)
    with pytest.raises(ImportError):
        import opentelemetry.sdk.trace  # noqa: F401
    # A fresh copy of the module, imported while the extra is missing.
    spec = importlib.util.spec_from_file_location("ax_tracing_without_otel",
                                                  ROOT / "axengine" / "tracing.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # dataclasses look it up
    spec.loader.exec_module(module)
    with caplog.at_level(logging.WARNING, logger="axengine.tracing"):
        off = module.build(module.TracingSettings(exporters=("console", "otlp")))
    assert isinstance(off, module.NoTracing)
    assert "pip install 'axengine[otel]'" in caplog.text
    request = NodeRequest(task_id="t", node_id="n", node_type="tool_call", attempt=1,
                          fence=1, config={}, input=None)
    with off.attempt(request) as span:
        span.outcome(object(), stale=True)
    off.on_commit(TaskRecord(task_id="t", dag_hash="h", dag_name="d",
                             status=TaskStatus.SUCCEEDED),
                  [Event(task_id="t", event_id="e", kind="task_succeeded", at=1)])
    assert off.flush() is True


def test_ax_runs_unchanged_without_the_extra_and_still_propagates(tmp_path: Path) -> None:
    """``ax.run`` in a Python where ``opentelemetry`` cannot be imported, with tracing
    asked for: it warns once, runs, and the http_request still carries the derived
    traceparent."""
    script = """
import json, sys
sys.modules["opentelemetry"] = None  # as if the otel extra were not installed
import axengine as ax
result = ax.run(json.loads(sys.argv[1]), {}, home=sys.argv[2], timeout=60)
print(json.dumps({"task_id": result.task_id, "status": result.status,
                  "otel": sorted(m for m in sys.modules if m.startswith("opentelemetry."))}))
"""
    with serve({"/hook": lambda _: Reply(200, b"ok")}) as srv:
        dag = {"name": "no_otel", "nodes": {"call": {
            "type": "tool_call", "tool": "http_request", "input": f"{srv.url}/hook"}}}
        env = {**os.environ, "OTEL_TRACES_EXPORTER": "console"}
        done = subprocess.run([sys.executable, "-c", script, json.dumps(dag), str(tmp_path)],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
        seen = list(srv.seen)
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    assert answer["status"] == "SUCCEEDED"
    assert answer["otel"] == []
    assert done.stderr.count("pip install 'axengine[otel]'") == 1, done.stderr
    assert '"trace_id"' not in done.stderr  # no console span was printed
    (request,) = seen
    (header,) = _header(request.headers, "traceparent")
    match = TRACEPARENT.match(header)
    assert match is not None and match.group(1) == task_trace_id(answer["task_id"])
    assert match.group(2) == attempt_span_id(answer["task_id"], "call", 1, 1)
