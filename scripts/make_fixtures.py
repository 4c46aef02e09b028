"""Record the snapshot fixtures of the financial DAG shipped in tests/data/fixtures/.

Each fixture is a task stopped at a telling point, exported with the same code as
``ax snapshot export``:

- ``financial_success.json``: parse_pdf and extract_metrics committed, assess_risk
  decided (medium risk); the email node is claimed by a worker that then "crashed".
- ``financial_timeout.json``: extract_metrics' first attempt timed out; it waits for
  its retry.
- ``financial_malformed_output.json``: the model answered prose instead of the JSON
  asked for; assess_risk cannot evaluate its expression, so it FAILED (a guard that
  cannot be checked is never a pass).

Run from the repository root: ``python scripts/make_fixtures.py``.
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
from pathlib import Path

from axengine.config import AxConfig
from axengine.fixtures import export_task
from axengine.local import load_any_dag
from axengine.wiring import build_runtime
from axengine.worker import RunContext
from executors.contract import Failure, Success
from executors.handlers import handle

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "data" / "fixtures"
DAG = ROOT / "dags" / "financial_risk_assessment.yaml"
INPUT = {"pdf_url": "dags/inputs/acme_annual_report.pdf"}


async def _run_node(engine, task_id: str, node_id: str, settings: dict) -> None:  # type: ignore[no-untyped-def]
    claim = await engine.claim(task_id, node_id, worker="fixture-recorder")
    assert claim.result == "claimed", claim
    ctx = RunContext(loop=asyncio.get_running_loop(), engine=engine, request=claim.request,
                     lease_seconds=30, settings=settings)
    outcome = await asyncio.to_thread(handle, claim.request, ctx)
    assert await engine.complete(task_id, node_id, fence=claim.request.fence,
                                 outcome=outcome) == "committed"


async def record(case: str, home: Path) -> dict:  # type: ignore[type-arg]
    runtime = build_runtime(AxConfig(home=home))
    engine = runtime.engine
    settings = {"mail_dir": str(home / "mail")}
    try:
        dag = load_any_dag(DAG)
        task_id = (await engine.submit(dag, INPUT, task_id=f"fixture-{case}")).task_id
        await _run_node(engine, task_id, "parse_pdf", settings)
        if case == "success":
            await _run_node(engine, task_id, "extract_metrics", settings)
            claim = await engine.claim(task_id, "send_medium_risk_email", worker="crashed-worker")
            assert claim.result == "claimed"
        else:
            claim = await engine.claim(task_id, "extract_metrics", worker="fixture-recorder")
            fence = claim.request.fence
            if case == "timeout":
                outcome = Failure("timed out after 120.0s (timeout 120s)", retryable=True)
            else:
                outcome = Success({"text": "Sorry, I could not find those figures."})
            assert await engine.complete(task_id, "extract_metrics", fence=fence,
                                         outcome=outcome) == "committed"
        return await export_task(engine, task_id)
    finally:
        await runtime.close()


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    for case, name in (("success", "financial_success"), ("timeout", "financial_timeout"),
                       ("malformed", "financial_malformed_output")):
        with tempfile.TemporaryDirectory() as home:
            data = asyncio.run(record(case, Path(home)))
        path = OUT / f"{name}.json"
        path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
        states = {s["node_id"]: s["state"] for s in data["snapshots"]}
        print(f"{path.relative_to(ROOT)}: {states}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
