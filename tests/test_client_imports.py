"""``import axengine.client`` stays light: no engine, worker, store, queue, DAG loader,
template sandbox or Jinja2 (the client speaks REST and decodes with ``axengine.wire``)."""

from __future__ import annotations

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
