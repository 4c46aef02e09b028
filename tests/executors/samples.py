"""Access to ``scripts/make_sample_pdf.py`` (not a package) and the sample inputs."""

from __future__ import annotations

import functools
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]
INPUTS = ROOT / "dags" / "inputs"
ACME = INPUTS / "acme_annual_report.pdf"
GLOBEX = INPUTS / "globex_annual_report.pdf"


@functools.cache
def pdf_script() -> ModuleType:
    """The sample-PDF generator script, imported from its path."""
    path = ROOT / "scripts" / "make_sample_pdf.py"
    spec = importlib.util.spec_from_file_location("make_sample_pdf", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module
