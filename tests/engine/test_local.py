"""The embedded engine end to end: SDK, gates, payload discipline, outages, admin ops."""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from pathlib import Path
from typing import Any

import pytest

import axengine as ax
from axengine import codec
from axengine.config import AxConfig
from axengine.dag import load_dag_text
from axengine.engine import EngineConfig, NodeState, RuleConfig
from axengine.local import LocalSession
from executors.contract import NodeContext, NodeRequest, Outcome, Success

ROOT = Path(__file__).resolve().parents[2]
FINANCIAL = ROOT / "dags" / "financial_risk_assessment.yaml"
ACME = {"pdf_url": str(ROOT / "dags" / "inputs" / "acme_annual_report.pdf")}
GLOBEX = {"pdf_url": str(ROOT / "dags" / "inputs" / "globex_annual_report.pdf")}
MEDIUM_PATH = ["parse_pdf", "extract_metrics", "assess_risk", "send_medium_risk_email",
               "log_completion"]


def session(home: Path, **options: Any) -> LocalSession:
    return LocalSession(AxConfig(home=home), **options)


def test_sdk_runs_the_financial_dag(tmp_path: Path) -> None:
    result = ax.run(FINANCIAL, ACME, home=tmp_path)
    assert result.status == "SUCCEEDED"
    assert list(result.path) == MEDIUM_PATH
    assert result.outputs["assess_risk"] == "medium_risk"
    assert result.outputs["extract_metrics"]["debt_to_equity"] == pytest.approx(2.4)
    assert result.states["send_high_risk_email"] == "SKIPPED"
    assert len(list((tmp_path / "mail").glob("*.eml"))) == 1


def test_async_variant_and_idempotent_submit(tmp_path: Path) -> None:
    async def main() -> None:
        first = await ax.arun(FINANCIAL, ACME, home=tmp_path, idempotency_key="report-1")
        again = await ax.arun(FINANCIAL, ACME, home=tmp_path, idempotency_key="report-1")
        assert first.task_id == again.task_id and again.status == "SUCCEEDED"

    asyncio.run(main())
    # The second run found the committed task: nothing ran twice.
    assert len(list((tmp_path / "mail").glob("*.eml"))) == 1


def test_high_risk_gate_pauses_then_decision_routes(tmp_path: Path) -> None:
    paused = ax.run(FINANCIAL, GLOBEX, home=tmp_path)
    assert paused.status == "PAUSED"
    assert list(paused.waiting) == ["send_high_risk_email"]
    assert paused.states["notify_high_risk"] == "PENDING"

    async def decide() -> Any:
        async with session(tmp_path) as s:
            await s.engine.decide(paused.task_id, "send_high_risk_email", decision="approve",
                                  by="alice", comment="numbers checked")
            return await s.wait(paused.task_id), await s.engine.get_task(paused.task_id)

    result, view = asyncio.run(decide())
    assert result.status == "SUCCEEDED"
    assert list(result.path)[-3:] == ["send_high_risk_email", "notify_high_risk",
                                      "log_completion"]
    decision = view.snapshots["send_high_risk_email"].decision
    assert decision["by"] == "alice" and decision["comment"] == "numbers checked"
    assert decision["at"] > 0


def test_gate_timeout_takes_the_default_route(tmp_path: Path) -> None:
    dag = load_dag_text("""
name: gated
nodes:
  review:
    type: human_gateway
    description: approve?
    timeout: 0.5
    next:
      - {condition: "{{ output.decision == 'approve' }}", target: ship}
      - {condition: "{{ output.decision == 'reject' }}", target: drop}
  ship: {type: tool_call, tool: echo, input: shipped}
  drop: {type: tool_call, tool: echo, input: dropped}
""")

    async def main() -> Any:
        async with session(tmp_path, reconcile_interval=0.1) as s:
            task = await s.submit(dag, {})
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                view = await s.engine.get_task(task)
                if view.task.status.final:
                    return view
                await asyncio.sleep(0.05)
            raise AssertionError("gate never timed out")

    view = asyncio.run(main())
    gate = view.snapshots["review"]
    assert gate.decision["decision"] == "reject" and gate.decision["by"] == "ax:gate-timeout"
    assert view.snapshots["drop"].state is NodeState.SUCCEEDED
    assert view.snapshots["ship"].state is NodeState.SKIPPED


def _big_handler(size: int) -> Any:
    payload = hashlib.sha256(b"seed").hexdigest() * (size // 64)

    def handle(request: NodeRequest, ctx: NodeContext) -> Outcome:
        return Success({"report": payload})

    return handle, payload


def test_five_mib_output_goes_to_the_blob_store(tmp_path: Path) -> None:
    dag = load_dag_text("""
name: big
nodes:
  render: {type: tool_call, tool: echo, input: x}
""")
    handler, payload = _big_handler(5 * 1024 * 1024)

    async def main() -> Any:
        async with session(tmp_path, handler=handler) as s:
            task = await s.submit(dag, {})
            await s.wait(task)
            return await s.engine.snapshot(task, "render"), await s.engine.get_task(task)

    stored, view = asyncio.run(main())
    assert len(codec.encode_snapshot(stored)) < 16 * 1024, stored
    assert stored.output is None and stored.output_ref is not None
    assert stored.output_ref.size > 5 * 1024 * 1024
    output = view.snapshots["render"].output
    original = json.dumps({"report": payload}, sort_keys=True, separators=(",", ":")).encode()
    assert json.dumps(output, sort_keys=True, separators=(",", ":")).encode() == original
    assert hashlib.sha256(original).hexdigest() == stored.output_ref.sha256


def test_tampered_blob_is_an_error_not_data(tmp_path: Path) -> None:
    handler, _ = _big_handler(128 * 1024)
    dag = load_dag_text("name: b\nnodes:\n  n: {type: tool_call, tool: echo, input: x}\n")

    async def main() -> Any:
        async with session(tmp_path, handler=handler) as s:
            task = await s.submit(dag, {})
            await s.wait(task)
            ref = (await s.engine.snapshot(task, "n")).output_ref
            blob = next((tmp_path / "blobs").rglob(ref.sha256))
            blob.write_bytes(blob.read_bytes()[:-10] + b"0123456789")
            await s.engine.get_task(task)

    from axengine.errors import BlobError

    with pytest.raises(BlobError):
        asyncio.run(main())


def test_model_outage_keeps_nodes_waiting_without_spending_attempts(tmp_path: Path) -> None:
    down_until = time.time() + 2.0
    dag = load_dag_text(f"""
name: outage
nodes:
  classify:
    type: llm_call
    model: moderation-v1
    prompt: "Return one of: APPROVED, REJECTED, MANUAL. Content: hello"
    retry: 1
    simulate: {{unavailable_until: {down_until}}}
""")
    config = EngineConfig(rules=RuleConfig(unavailable_delay=0.2))
    seen: list[tuple[str, int, str]] = []

    async def main() -> Any:
        settings = {"llm_circuit_cooldown": 0.3}
        async with LocalSession(AxConfig(home=tmp_path, handler_settings=settings),
                                engine_config=config, reconcile_interval=0.1) as s:
            task = await s.submit(dag, {})
            while time.time() < down_until - 0.3:
                snap = (await s.engine.get_task(task)).snapshots["classify"]
                seen.append((snap.state.value, snap.attempt, snap.evidence))
                await asyncio.sleep(0.1)
            result = await s.wait(task, timeout=60)
            return result, await s.engine.get_task(task), await s.engine.events(task)

    result, view, events = asyncio.run(main())
    # While down: never a pass, never more than the attempt being made, evidence kept.
    assert all(state in ("WAITING", "RUNNING") for state, _, _ in seen)
    assert all(attempt <= 1 for _, attempt, _ in seen)
    assert any(state == "WAITING" and "model:moderation-v1" in evidence
               for state, _, evidence in seen)
    unavailable = [e for e in events if e.kind == "unavailable"]
    assert len(unavailable) >= 2
    # Recovered: succeeded within its budget of 2 attempts although it was tried many times.
    assert result.status == "SUCCEEDED"
    assert view.snapshots["classify"].attempt == 1
    assert view.snapshots["classify"].output == {"text": "APPROVED"}


def test_cancel_and_retry_from_a_node(tmp_path: Path) -> None:
    dag = load_dag_text("""
name: admin
nodes:
  a: {type: tool_call, tool: echo, input: "{{ input.v }}", next: b}
  b: {type: tool_call, tool: echo, input: "{{ nodes.a.output }}", retry: 0, next: c}
  c: {type: tool_call, tool: echo, input: done}
""")
    calls: list[str] = []

    def handler(request: NodeRequest, ctx: NodeContext) -> Outcome:
        from executors.contract import Failure

        calls.append(request.node_id)
        if request.node_id == "b" and request.input != "fixed":
            return Failure("bad input", retryable=False)
        return Success(request.input)

    async def main() -> Any:
        async with session(tmp_path, handler=handler) as s:
            task = await s.submit(dag, {"v": "x"})
            failed = await s.wait(task)
            await s.engine.retry(task, "b", input_override="fixed", by="ops")
            fixed = await s.wait(task)
            ran = list(calls)
            other = await s.submit(dag, {"v": "y"})
            await s.engine.cancel(other, by="ops")
            return failed, fixed, ran, await s.result(other)

    failed, fixed, ran, cancelled = asyncio.run(main())
    assert failed.status == "FAILED" and failed.states["c"] == "SKIPPED"
    assert fixed.status == "SUCCEEDED" and fixed.outputs["b"] == "fixed"
    assert ran == ["a", "b", "b", "c"]  # the retry did not re-run the committed "a"
    assert cancelled.status == "CANCELLED"
    assert all(state in ("CANCELLED", "SUCCEEDED") for state in cancelled.states.values())


def test_fenced_out_run_stops_waiting_for_a_handler_that_ignores_cancellation(
        tmp_path: Path) -> None:
    """A worker whose fence went stale frees its slot at the next heartbeat, even if the
    handler never looks at ``ctx.cancelled``; the late result is never committed."""
    import threading

    from axengine.worker import Worker

    release = threading.Event()
    dag = load_dag_text("name: s\nnodes:\n  n: {type: tool_call, tool: echo, input: x, "
                        "timeout: 60}\n")

    def stubborn(request: NodeRequest, ctx: NodeContext) -> Outcome:
        release.wait(30)
        return Success("late")

    async def main() -> Any:
        # The session's own executor serves a lane nobody uses: it stays idle.
        async with session(tmp_path, concurrency=1, lanes=("nobody",)) as s:
            task = await s.submit(dag, {})
            worker = Worker(engine=s.engine, queue=s.process.queue, handler=stubborn,
                            concurrency=1, lease_seconds=0.6)
            from axengine.queue import WorkItem

            run = asyncio.create_task(worker.process(WorkItem(task, "n")))
            for _ in range(500):  # until the worker has claimed the node
                if (await s.engine.get_task(task)).snapshots["n"].state is NodeState.RUNNING:
                    break
                await asyncio.sleep(0.01)
            else:
                raise AssertionError("the worker never claimed the node")
            await s.engine.cancel(task, by="test")  # bumps the fence: the run is stale
            started = time.monotonic()
            answer = await asyncio.wait_for(run, timeout=10)
            waited = time.monotonic() - started
            release.set()
            return answer, waited, await s.engine.get_task(task)

    answer, waited, view = asyncio.run(main())
    assert answer == "stale"
    assert waited < 30  # freed at the next heartbeat (0.2 s), not at the 60 s node timeout
    assert view.snapshots["n"].state is NodeState.CANCELLED
    assert view.snapshots["n"].output is None


PARSE_ONLY = load_dag_text("""\
name: parse_only
nodes:
  parse:
    type: tool_call
    tool: pdf_parser
    input: "{{ input.pdf_url }}"
""")


@pytest.mark.parametrize(("submitted_by", "status"), [("local", "success"),
                                                       ("mallory", "failed")])
def test_local_trust_is_lent_only_to_locally_submitted_tasks(
        tmp_path: Path, submitted_by: str, status: str) -> None:
    """An ``ax run`` on a store an ``ax server`` also writes picks up the server's tasks
    (its reconciler queues every WAITING node); those still run under api trust."""
    async def main() -> Any:
        async with session(tmp_path) as s:
            result = await s.engine.submit(PARSE_ONLY, ACME, submitted_by=submitted_by)
            return await s.wait(result.task_id, timeout=30)

    output = asyncio.run(main()).outputs["parse"]
    assert output["status"] == status, output
    if status == "failed":
        assert "input_root" in output["error"]
        assert "text" not in output


@pytest.mark.parametrize("output", [{"x": float("nan")}, {"tags": {"a", "b"}}, [float("inf")]])
def test_an_output_the_store_cannot_hold_fails_the_node_clearly(tmp_path: Path,
                                                                output: Any) -> None:
    """A handler's output that is not JSON fails the node with the reason; before, the
    commit raised and the node stayed RUNNING until its lease ran out, attempt after
    attempt."""
    dag = load_dag_text("name: s\nnodes:\n  n: {type: tool_call, tool: echo, input: x}\n")

    def returns(request: NodeRequest, ctx: NodeContext) -> Outcome:
        return Success(output)

    async def main() -> ax.RunResult:
        async with session(tmp_path, handler=returns) as s:
            return await s.wait(await s.submit(dag, {}), timeout=20)

    result = asyncio.run(main())
    assert result.status == "FAILED"
    assert result.errors["n"].startswith("output of node 'n': ")
    assert "JSON" in result.errors["n"]
