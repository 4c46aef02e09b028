"""The Python SDK: ``ax.run(dag, input)`` on the embedded engine.

    import axengine as ax
    result = ax.run("dags/financial_risk_assessment.yaml",
                    {"pdf_url": "dags/inputs/acme_annual_report.pdf"})
    print(result.status, result.path)

Runs are durable in ``.ax/`` (or ``home=``); ``resume(task_id)`` continues a run that
was interrupted. ``arun``/``aresume`` are the async variants.

Many runs in one process (a loop, a test suite, a service) open the engine once, so the
store, the executor and the DAGs read from files are set up once::

    with ax.open(home=".ax") as engine:
        for report in reports:
            result = engine.run("dags/financial_risk_assessment.yaml", {"pdf_url": report})

    async with ax.aopen(home=".ax") as engine:       # the same, in an event loop
        result = await engine.run(dag, input)
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from axengine.config import AxConfig
from axengine.dag import Dag
from axengine.errors import InputError
from axengine.limits import canonical_json
from axengine.local import LocalSession, RunResult, load_any_dag
from axengine.lru import DAG_CACHE_ENTRIES, Lru

__all__ = ["AsyncEmbedded", "Embedded", "aopen", "aresume", "arun", "open", "resume", "run"]

DagLike = str | Path | Dag | Mapping[str, Any]


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


class AsyncEmbedded:
    """An embedded engine kept open for many runs (``async with ax.aopen(...)``).

    The store, the in-process executor and the reconciler start once; a DAG file is
    read and validated once (again when the file changes), a DAG mapping once per
    content (again when it is changed).
    """

    def __init__(self, home: str | Path | None = None, *, concurrency: int = 4) -> None:
        self._session = LocalSession(_config(home), concurrency=concurrency)
        #: Validated DAGs by ``(path, mtime_ns, size)`` of their file or by the
        #: canonical JSON of their mapping.
        self._dags: Lru[tuple[str, int, int] | str, Dag] = Lru(DAG_CACHE_ENTRIES)
        self._open = False

    async def __aenter__(self) -> AsyncEmbedded:
        await self._session.__aenter__()
        self._open = True
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Stop the executor and close the store (nodes in flight are handed back)."""
        if self._open:
            self._open = False
            await self._session.__aexit__(None, None, None)

    def _dag(self, dag: DagLike) -> Dag:
        key: tuple[str, int, int] | str
        if isinstance(dag, Dag):
            return dag
        if isinstance(dag, Mapping):
            try:
                key = canonical_json(dag)
            except InputError:
                return load_any_dag(dag)  # the loader's error names the field
        else:
            path = os.fspath(dag)
            try:
                st = os.stat(path)
            except OSError:
                return load_any_dag(dag)  # the loader's error names the file
            key = (os.path.abspath(path), st.st_mtime_ns, st.st_size)
        found = self._dags.get(key)
        if found is None:
            found = load_any_dag(dag)
            self._dags.put(key, found)
        return found

    async def run(self, dag: DagLike, input: Any = None, *,
                  decide: Mapping[str, str] | None = None, idempotency_key: str = "",
                  labels: Mapping[str, str] | None = None,
                  timeout: float | None = None) -> RunResult:
        """Run ``dag`` on ``input`` to the end (as :func:`arun`)."""
        if not self._open:
            raise RuntimeError("the engine is closed: use it inside `async with ax.aopen()`")
        task_id = await self._session.submit(self._dag(dag),
                                             input if input is not None else {},
                                             idempotency_key=idempotency_key,
                                             labels=labels or {})
        return await self._session.wait(task_id, decide=decide, decided_by="sdk",
                                        timeout=timeout)

    async def resume(self, task_id: str, *, decide: Mapping[str, str] | None = None,
                     timeout: float | None = None) -> RunResult:
        """Continue a run from the store (as :func:`aresume`)."""
        if not self._open:
            raise RuntimeError("the engine is closed: use it inside `async with ax.aopen()`")
        return await self._session.wait(task_id, decide=decide, decided_by="sdk",
                                        timeout=timeout)


class Embedded:
    """:class:`AsyncEmbedded` for synchronous code (``with ax.open(...)``): it owns an
    event loop, which runs while a call runs."""

    def __init__(self, home: str | Path | None = None, *, concurrency: int = 4) -> None:
        self._runner = asyncio.Runner()
        self._engine = AsyncEmbedded(home, concurrency=concurrency)
        try:
            self._runner.run(self._engine.__aenter__())
        except BaseException:
            self._runner.close()
            raise

    def __enter__(self) -> Embedded:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        """Stop the executor, close the store and the event loop; idempotent."""
        try:
            self._runner.run(self._engine.aclose())
        finally:
            self._runner.close()

    def run(self, dag: DagLike, input: Any = None, *,
            decide: Mapping[str, str] | None = None, idempotency_key: str = "",
            labels: Mapping[str, str] | None = None,
            timeout: float | None = None) -> RunResult:
        """Run ``dag`` on ``input`` to the end (as :func:`run`)."""
        return self._runner.run(self._engine.run(
            dag, input, decide=decide, idempotency_key=idempotency_key, labels=labels,
            timeout=timeout))

    def resume(self, task_id: str, *, decide: Mapping[str, str] | None = None,
               timeout: float | None = None) -> RunResult:
        """Continue a run from the store (as :func:`resume`)."""
        return self._runner.run(self._engine.resume(task_id, decide=decide,
                                                    timeout=timeout))


def open(home: str | Path | None = None, *, concurrency: int = 4) -> Embedded:
    """Open the embedded engine for many runs: ``with ax.open(home) as engine:
    engine.run(dag, input)``. Close it (or leave the ``with``) when done."""
    return Embedded(home, concurrency=concurrency)


def aopen(home: str | Path | None = None, *, concurrency: int = 4) -> AsyncEmbedded:
    """The async :func:`open`: ``async with ax.aopen(home) as engine: await
    engine.run(dag, input)``."""
    return AsyncEmbedded(home, concurrency=concurrency)
