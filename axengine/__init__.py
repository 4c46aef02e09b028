"""ax: a durable DAG workflow engine for agentic work.

    import axengine as ax
    result = ax.run("dags/financial_risk_assessment.yaml", {"pdf_url": "..."})

    with ax.open() as engine:                  # many runs: the engine is set up once
        result = engine.run("dags/financial_risk_assessment.yaml", {"pdf_url": "..."})

    with ax.Client("http://127.0.0.1:8080", token=TOKEN) as client:   # an ax api server
        result = client.run("dags/financial_risk_assessment.yaml", {"pdf_url": "..."})
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

# ax forks only to exec (the subprocess runner's node processes, servers in tests), so
# gRPC's fork handlers are of no use to it, and with grpcio >= 1.81 they restart gRPC's
# poller in the child, which fails on the epoll descriptor `Popen(close_fds=True)`
# closes: the child logs "epoll_wait error: Bad file descriptor" and may die before it
# execs (grpc/grpc#43055). Off before anything imports grpc; an explicit setting wins.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "0")

if TYPE_CHECKING:  # the real types for checkers; at run time these stay lazy (below)
    from executors.contract import inline
    from executors.tools import ToolError, tool

__all__ = [
    "AsyncClient",
    "Client",
    "RunResult",
    "ToolError",
    "aopen",
    "aresume",
    "arun",
    "inline",
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
    if name == "inline":
        from executors.contract import inline

        return inline
    if name in ("Client", "AsyncClient"):
        from axengine import client

        return getattr(client, name)
    if name == "testing":
        # `ax.testing.stub(...)` without a separate import of the test helpers.
        import importlib

        return importlib.import_module("axengine.testing")
    raise AttributeError(f"module 'axengine' has no attribute {name!r}")
