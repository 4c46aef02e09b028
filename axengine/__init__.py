"""ax: a durable DAG workflow engine for agentic work.

    import axengine as ax
    result = ax.run("dags/financial_risk_assessment.yaml", {"pdf_url": "..."})

    with ax.open() as engine:                  # many runs: the engine is set up once
        result = engine.run("dags/financial_risk_assessment.yaml", {"pdf_url": "..."})

    with ax.Client("http://127.0.0.1:8080", token=TOKEN) as client:   # an ax api server
        result = client.run("dags/financial_risk_assessment.yaml", {"pdf_url": "..."})
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the real types for checkers; at run time these stay lazy (below)
    from executors.tools import ToolError, tool

__all__ = [
    "AsyncClient",
    "Client",
    "RunResult",
    "ToolError",
    "aopen",
    "aresume",
    "arun",
    "open",
    "resume",
    "run",
    "tool",
]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    # Lazy so that `import axengine` stays cheap for the CLI and the executors.
    if name in ("run", "arun", "resume", "aresume", "open", "aopen"):
        from axengine import sdk

        return getattr(sdk, name)
    if name == "RunResult":
        from axengine.wire import RunResult

        return RunResult
    if name in ("tool", "ToolError"):
        # The one tool registry lives with the handlers (executors never import axengine).
        from executors import tools

        return getattr(tools, name)
    if name in ("Client", "AsyncClient"):
        from axengine import client

        return getattr(client, name)
    if name == "testing":
        # `ax.testing.stub(...)` without a separate import of the test helpers.
        import importlib

        return importlib.import_module("axengine.testing")
    raise AttributeError(f"module 'axengine' has no attribute {name!r}")
