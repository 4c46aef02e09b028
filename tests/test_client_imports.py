"""``import axengine.client`` stays light: no engine, worker, store, queue, DAG loader,
template sandbox or Jinja2 (the client speaks REST and decodes with ``axengine.wire``)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

FORBIDDEN = ("axengine.engine", "axengine.worker", "axengine.template", "axengine.store",
             "axengine.queue", "axengine.dag", "jinja2")


@pytest.mark.parametrize("module", ["axengine.client", "axengine.wire"])
def test_import_loads_no_heavy_module(module: str) -> None:
    code = f"import sys, {module}; print('\\n'.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60).stdout.split()
    assert module in out
    loaded = [m for m in out if m.split(".")[0] == "jinja2"
              or any(m == p or m.startswith(p + ".") for p in FORBIDDEN)]
    assert loaded == [], f"import {module} loads {loaded}"


#: What only a running API server needs.
SERVER_FRAMEWORKS = ("fastapi", "starlette", "uvicorn", "axengine.api._rest",
                     "axengine.api._server", "axengine.api._grpc")


def test_the_command_line_loads_no_server_framework_until_a_server_starts() -> None:
    """Every ``ax`` command imports ``axengine.cli``; the server's frameworks load only
    when ``ax api`` / ``ax server`` start one (they took 0.3 s of every command)."""
    code = ("import sys, axengine.cli, axengine.api; from axengine.api import parse_address; "
            "print('\\n'.join(sorted(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60).stdout.split()
    loaded = [m for m in out if any(m == p or m.startswith(p + ".") for p in SERVER_FRAMEWORKS)]
    assert loaded == [], loaded
    # Named on first use, the rest of the package is still there.
    code = "from axengine.api import create_app, serve, ApiServer; print(create_app.__module__)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, timeout=60).stdout.strip() == "axengine.api._rest"


def test_importing_ax_turns_grpc_fork_handlers_off_unless_told_otherwise() -> None:
    """ax forks only to exec; gRPC's fork handlers restart its poller in the child, which
    can die on a closed epoll descriptor before it execs (grpc/grpc#43055)."""
    code = "import os, axengine, grpc; print(os.environ['GRPC_ENABLE_FORK_SUPPORT'])"
    env = {k: v for k, v in os.environ.items() if k != "GRPC_ENABLE_FORK_SUPPORT"}
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, timeout=60, env=env).stdout.strip() == "0"
    env["GRPC_ENABLE_FORK_SUPPORT"] = "1"  # an operator's explicit choice stands
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, timeout=60, env=env).stdout.strip() == "1"
