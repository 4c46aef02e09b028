"""ax: a durable DAG workflow engine for agentic work.

    import axengine as ax
    result = ax.run("dags/financial_risk_assessment.yaml", {"pdf_url": "..."})
"""

from __future__ import annotations

from typing import Any

__all__ = ["RunResult", "aresume", "arun", "resume", "run"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    # Lazy so that `import axengine` stays cheap for the CLI and the executors.
    if name in ("run", "arun", "resume", "aresume"):
        from axengine import sdk

        return getattr(sdk, name)
    if name == "RunResult":
        from axengine.local import RunResult

        return RunResult
    if name == "Client":
        from axengine.client import Client

        return Client
    raise AttributeError(f"module 'axengine' has no attribute {name!r}")
