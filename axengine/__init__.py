"""ax: a durable DAG workflow engine for agentic work.

    import axengine as ax
    result = ax.run("dags/financial_risk_assessment.yaml", {"pdf_url": "..."})

    with ax.Client("http://127.0.0.1:8080", token=TOKEN) as client:   # an ax api server
        result = client.run("dags/financial_risk_assessment.yaml", {"pdf_url": "..."})
"""

from __future__ import annotations

from typing import Any

__all__ = ["AsyncClient", "Client", "RunResult", "aresume", "arun", "resume", "run"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    # Lazy so that `import axengine` stays cheap for the CLI and the executors.
    if name in ("run", "arun", "resume", "aresume"):
        from axengine import sdk

        return getattr(sdk, name)
    if name == "RunResult":
        from axengine.wire import RunResult

        return RunResult
    if name in ("Client", "AsyncClient"):
        from axengine import client

        return getattr(client, name)
    raise AttributeError(f"module 'axengine' has no attribute {name!r}")
