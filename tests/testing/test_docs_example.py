"""docs/testing.md and its worked example (examples/testing/): the example's tests pass
under plain pytest with ax's plugin found through its entry point, and what the page
shows — code, CI workflow, messages — is what the files hold and what ax prints."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from axengine.cli import main as ax_main
from axengine.testing import AxTestEngine, ReplayMismatch, UnstubbedNodeError, assert_replays
from tests.testing.dags import EXAMPLE_FIXTURE, FINANCIAL, METRICS, ROOT

EXAMPLE = ROOT / "examples" / "testing"
DOC = ROOT / "docs" / "testing.md"
WORKFLOW = EXAMPLE / "github-workflow.yml"


def pytest_env() -> dict[str, str]:
    # The child is a user's plain pytest: none of this session's pytest settings.
    return {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}


def test_the_example_passes_under_plain_pytest_with_the_plugin_from_its_entry_point(
        record_property: Any) -> None:
    assert not list(EXAMPLE.rglob("conftest.py"))  # nothing but the entry point loads it
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "examples/testing", "-p", "no:cacheprovider",
         "--durations=0", "--durations-min=0"],
        cwd=ROOT, env=pytest_env(), capture_output=True, text=True, timeout=25)
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"^7 passed", done.stdout.splitlines()[-1].strip("= ")), done.stdout
    # Reported, not asserted (a figure, not a timed test): the day-long gate timeout's
    # wall time.
    gate = [line.strip() for line in done.stdout.splitlines()
            if "call" in line and "rejected_after_24_hours" in line]
    record_property("summary", f"example: {done.stdout.splitlines()[-1].strip('= ')}; "
                               f"gate timeout test {gate}")
    [plugins] = [line for line in done.stdout.splitlines() if line.startswith("plugins:")]
    assert "axengine-" in plugins
    assert "configfile: pytest.ini" in done.stdout  # the example's own settings, not ours

    listed = subprocess.run([sys.executable, "-m", "pytest", "--version", "--version"],
                            cwd=EXAMPLE, env=pytest_env(), capture_output=True, text=True,
                            timeout=25)
    registered = listed.stdout.split("registered third-party plugins:")[1]
    assert re.search(r"axengine-\S+ at \S+axengine/pytest_plugin\.py", registered), registered


def test_the_plugin_defines_fixtures_only_and_imports_no_engine() -> None:
    code = ("import sys, axengine.pytest_plugin as p; "
            "print(sorted(n for n in vars(p) if n.startswith('pytest_')), "
            "'axengine.testing' in sys.modules, 'axengine.engine' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=25, check=True)
    assert done.stdout.split() == ["[]", "False", "False"]


def documented_blocks() -> list[tuple[str, str]]:
    """Code blocks of the page marked ``<!-- from PATH -->``: (path, code)."""
    text = DOC.read_text()
    return re.findall(r"<!-- from (\S+) -->\n```\w*\n(.*?)```", text, flags=re.S)


def test_the_page_shows_the_example_files_as_they_are() -> None:
    blocks = documented_blocks()
    assert {path for path, _ in blocks} == {"examples/testing/test_financial_dag.py",
                                           "examples/testing/github-workflow.yml"}
    assert len(blocks) >= 5
    for path, code in blocks:
        assert code in (ROOT / path).read_text(), f"docs/testing.md quotes {path} wrongly"


def test_the_readme_links_the_page() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "[docs/testing.md](docs/testing.md)" in readme
    assert readme.splitlines()[2:6] == [
        "```bash",
        "scripts/run-example   # run dags/financial_risk_assessment.yaml end to end "
        "(embedded, no servers)",
        "scripts/test          # the whole test suite (lint, types, real etcd + Redis "
        "started by the tests)",
        "```"]


def test_the_ci_workflow_steps_pass_on_this_repository(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    steps = yaml.safe_load(WORKFLOW.read_text())["jobs"]["dags"]["steps"]
    commands = [s["run"] for s in steps if "run" in s]
    assert commands == ["pip install axengine pytest", "ax validate --format github dags",
                        "ax test dags examples/testing", "python -m pytest examples/testing"]
    monkeypatch.chdir(ROOT)
    for command in commands[1:3]:
        assert ax_main(shlex.split(command)[1:]) == 0, command
    out = capsys.readouterr().out
    assert "::error" not in out
    assert ("PASS examples/testing/fixtures/acme_medium.fixture.json: replays on "
            "dags/financial_risk_assessment.yaml") in out
    # The last step is the example's pytest run (the first test of this module).


def shown() -> list[str]:
    """The lines of the page's ``text`` blocks."""
    blocks = re.findall(r"```text\n(.*?)```", DOC.read_text(), flags=re.S)
    return [line for block in blocks for line in block.splitlines()]


def test_the_page_shows_the_messages_ax_prints(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    lines = shown()
    with AxTestEngine(tmp_path / "engine") as engine, pytest.raises(UnstubbedNodeError) as e:
        engine.run(FINANCIAL, {"pdf_url": "r.pdf"}, decide={"send_high_risk_email": "approve"},
                   stubs={"parse_pdf": {"status": "success", "text": "..."},
                          "model:gpt-4-turbo": METRICS["high_risk"]})
    assert f"UnstubbedNodeError: {e.value}" in lines

    monkeypatch.chdir(ROOT)
    edited = tmp_path / "financial_risk_assessment.yaml"
    edited.write_text(FINANCIAL.read_text().replace("debt_to_equity > 2.0: medium_risk",
                                                    "debt_to_equity > 3.0: medium_risk"))
    with pytest.raises(ReplayMismatch) as mismatch:
        assert_replays(EXAMPLE_FIXTURE.relative_to(ROOT), dag=edited, home=tmp_path / "r")
    report = str(mismatch.value).replace(str(edited), "dags/financial_risk_assessment.yaml")
    first, *rest = report.splitlines()
    assert f"ReplayMismatch: {first}" in lines
    assert all(line in lines for line in rest)

    monkeypatch.chdir(tmp_path)
    newer = json.loads(EXAMPLE_FIXTURE.read_text())
    Path("old.fixture.json").write_text(json.dumps({**newer, "version": 3}))
    Path("notes.json").write_text(json.dumps({"tasks": []}))
    for name in ("old.fixture.json", "notes.json"):
        assert ax_main(["replay", name]) == 1
        assert capsys.readouterr().err.strip() in lines
