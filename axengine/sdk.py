"""The Python SDK: ``ax.run(dag, input)`` on the embedded engine.

    import axengine as ax
    result = ax.run("dags/financial_risk_assessment.yaml",
                    {"pdf_url": "dags/inputs/acme_annual_report.pdf"})
    print(result.status, result.path)

Runs are durable in ``.ax/`` (or ``home=``); ``resume(task_id)`` continues a run that
was interrupted. ``arun``/``aresume`` are the async variants.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from axengine.config import AxConfig
from axengine.dag import Dag
from axengine.local import LocalSession, RunResult

__all__ = ["aresume", "arun", "resume", "run"]


def _config(home: str | Path | None) -> AxConfig:
    return AxConfig.from_env(home=home)


async def arun(
    dag: str | Path | Dag | Mapping[str, Any],
    input: Any = None,
    *,
    home: str | Path | None = None,
    decide: Mapping[str, str] | None = None,
    idempotency_key: str = "",
    labels: Mapping[str, str] | None = None,
    concurrency: int = 4,
    timeout: float | None = None,
) -> RunResult:
    """Run ``dag`` on ``input`` to the end (or to a gate nobody decided) and return the
    result. ``decide`` supplies gate decisions up front (``{"review": "approve"}``)."""
    async with LocalSession(_config(home), concurrency=concurrency) as session:
        task_id = await session.submit(dag, input if input is not None else {},
                                       idempotency_key=idempotency_key, labels=labels or {})
        return await session.wait(task_id, decide=decide, decided_by="sdk", timeout=timeout)


async def aresume(task_id: str, *, home: str | Path | None = None,
                  decide: Mapping[str, str] | None = None, concurrency: int = 4,
                  timeout: float | None = None) -> RunResult:
    """Continue an interrupted run from the store."""
    async with LocalSession(_config(home), concurrency=concurrency) as session:
        return await session.wait(task_id, decide=decide, decided_by="sdk", timeout=timeout)


def run(dag: str | Path | Dag | Mapping[str, Any], input: Any = None,
        **options: Any) -> RunResult:
    """Synchronous :func:`arun`."""
    return asyncio.run(arun(dag, input, **options))


def resume(task_id: str, **options: Any) -> RunResult:
    """Synchronous :func:`aresume`."""
    return asyncio.run(aresume(task_id, **options))
