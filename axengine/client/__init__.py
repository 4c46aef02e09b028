"""The SDK client of an ``ax api`` server (REST under ``/v1``, over httpx).

::

    import axengine as ax

    with ax.Client("http://127.0.0.1:8080", token=TOKEN) as client:
        result = client.run("dags/financial_risk_assessment.yaml",
                            {"pdf_url": "dags/inputs/acme_annual_report.pdf"})
        print(result.status, result.path)

:class:`Client` and :class:`AsyncClient` have the same methods; results are the same
types the embedded engine returns (:class:`~axengine.wire.RunResult`,
:class:`~axengine.records.Event`, the engine's ``TaskView``), so code moves between
``ax.run`` and a server without change. Both are thin shells over one sans-I/O core
(``_core.py``: requests, decoding through :mod:`axengine.wire`, error mapping, retries,
the wait loop and the event-stream parser), so they cannot behave differently: their
methods are the core's operations, whose signatures and docstrings are written once, on
``Core``.

Errors. An error answer is raised as the :class:`~axengine.errors.AxError` class its
``error.type`` names (``NotFound``, ``Conflict``, ``DagError`` with its problems...),
from the one table in :mod:`axengine.errors`; an unreachable server (connection refused
or dropped, a timeout, a proxy's 502/503/504) as
:class:`~axengine.errors.ApiUnavailable`.

Retries. A request that never reached the server (connection refused) is retried for
up to ``retry_for`` seconds, with jittered exponential backoff. A request that may have
reached it (connection dropped, 503) is retried only when repeating it is harmless:
reads, a submission with an idempotency key, a decision, a cancellation.

Importing this package loads neither the engine nor the DAG loader nor the template
sandbox (``tests/test_client_imports.py``); ``task_view`` loads them when called.
"""

from __future__ import annotations

from axengine.client._async import AsyncClient
from axengine.client._core import (
    DEFAULT_RETRY_FOR,
    DEFAULT_TIMEOUT,
    Submission,
    error_from_response,
)
from axengine.client._sync import Client

__all__ = [
    "DEFAULT_RETRY_FOR",
    "DEFAULT_TIMEOUT",
    "AsyncClient",
    "Client",
    "Submission",
    "error_from_response",
]
