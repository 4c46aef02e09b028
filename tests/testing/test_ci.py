"""CI for DAG repositories: ``ax validate --format github|junit``, ``ax test`` over a
folder of fixtures, and the pre-commit hooks ax ships."""

from __future__ import annotations

import re
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml

from axengine.cli import main
from axengine.cli.validate import github_annotation
from axengine.errors import DagProblem
from tests.testing.dags import EXAMPLE_FIXTURE, FINANCIAL, ROOT

BROKEN = """\
name: broken
nodes:
  start:
    type: tool_call
    tool: echo
    input: x
    next: finish
"""


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_validate_github_annotates_the_file_and_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text(BROKEN)
    code, out, _ = run(capsys, "validate", "--format", "github", str(broken), str(FINANCIAL))
    assert code == 1
    lines = out.splitlines()
    assert lines[0].startswith(f"OK {FINANCIAL} (9 nodes")
    [error] = [line for line in lines if line.startswith("::")]
    assert re.fullmatch(rf"::error file={re.escape(str(broken))},line=7::"
                        r"\[unknown-target\] node 'start': .*'finish'.*", error), error


def test_github_annotation_escapes_what_would_end_a_command() -> None:
    problem = DagProblem("50% of\nit", file="a,b:c.yaml", line=3, code="bad-value",
                         hint="fix it")
    assert github_annotation(problem) == (
        "::error file=a%2Cb%3Ac.yaml,line=3::[bad-value] 50%25 of%0Ait (hint: fix it)")
    assert github_annotation(DagProblem("gone", file="x.yaml")) == (
        "::error file=x.yaml::[invalid] gone")


def test_validate_junit_has_one_case_per_file(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text(BROKEN)
    code, out, _ = run(capsys, "validate", "--format", "junit", str(broken), str(FINANCIAL),
                       str(tmp_path / "missing.yaml"))
    assert code == 1
    suite = ET.fromstring(out).find("testsuite")
    assert suite is not None
    assert (suite.get("tests"), suite.get("failures")) == ("3", "2")
    cases = {c.get("name"): c for c in suite.iter("testcase")}
    assert set(cases) == {str(broken), str(FINANCIAL), str(tmp_path / "missing.yaml")}
    assert cases[str(FINANCIAL)].find("failure") is None
    failure = cases[str(broken)].find("failure")
    assert failure is not None and failure.get("type") == "unknown-target"
    assert failure.text is not None and f"{broken}:7: node 'start'" in failure.text


def dag_repo(tmp_path: Path, dag_text: str | None = None) -> Path:
    """A repository of DAGs: the financial DAG and the example's recorded fixture."""
    repo = tmp_path / "repo"
    (repo / "dags").mkdir(parents=True)
    (repo / "tests").mkdir()
    (repo / "dags" / "financial_risk_assessment.yaml").write_text(
        dag_text if dag_text is not None else FINANCIAL.read_text())
    shutil.copy(EXAMPLE_FIXTURE, repo / "tests" / "acme.fixture.json")
    return repo


def test_ax_test_passes_a_folder_whose_fixtures_replay(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    repo = dag_repo(tmp_path)
    code, out, _ = run(capsys, "test", str(repo))
    assert code == 0
    assert out.splitlines() == [
        f"PASS {repo}/tests/acme.fixture.json: replays on "
        f"{repo}/dags/financial_risk_assessment.yaml (9 committed nodes, none ran again)",
        "1 fixture: 1 passed, 0 failed"]


def test_ax_test_fails_with_the_diff_when_a_guard_changed(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    repo = dag_repo(tmp_path, FINANCIAL.read_text().replace(
        "debt_to_equity > 2.0: medium_risk", "debt_to_equity > 3.0: medium_risk"))
    code, out, _ = run(capsys, "test", str(repo / "tests"), str(repo / "dags"))
    assert code == 1
    assert f"FAIL {repo}/tests/acme.fixture.json does not replay on" in out
    assert ("  node assess_risk: recorded medium_risk -> send_medium_risk_email, replayed "
            "low_risk -> send_low_risk_email") in out.splitlines()
    assert out.splitlines()[-1] == "1 fixture: 0 passed, 1 failed"

    code, out, _ = run(capsys, "test", str(repo), "--format", "junit")
    case = ET.fromstring(out).find("testsuite/testcase/failure")
    assert code == 1 and case is not None
    assert case.get("message", "").startswith("node assess_risk: recorded medium_risk")


def test_ax_test_reports_a_broken_dag_an_ambiguity_and_an_empty_folder(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    repo = dag_repo(tmp_path, FINANCIAL.read_text().replace("next: assess_risk",
                                                            "next: assess_risks"))
    code, out, _ = run(capsys, "test", str(repo))
    assert code == 1 and "does not validate" in out and "assess_risks" in out

    repo = dag_repo(tmp_path / "two")
    shutil.copy(FINANCIAL, repo / "tests" / "financial_copy.yaml")
    (repo / "tests" / "acme.fixture.json").rename(repo / "acme.fixture.json")
    code, out, _ = run(capsys, "test", str(repo))
    assert code == 1 and "several DAG files are named 'financial_risk_assessment'" in out
    # Given on the command line, one DAG file settles it.
    code, out, _ = run(capsys, "test", str(repo), "--dag", str(repo / "dags" /
                                                               "financial_risk_assessment.yaml"))
    assert code == 0, out

    empty = tmp_path / "empty"
    empty.mkdir()
    code, _, err = run(capsys, "test", str(empty))
    assert code == 2 and "no *.fixture.json files under" in err


def test_the_pre_commit_hooks_run_ax_on_the_files_they_select(
        capsys: pytest.CaptureFixture[str]) -> None:
    hooks = {h["id"]: h for h in yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())}
    assert set(hooks) == {"ax-validate", "ax-test"}
    for hook in hooks.values():
        assert hook["language"] == "python" and hook["entry"].startswith("ax ")
    # What pre-commit does for ax-validate: the entry, then the staged files that match.
    validate = hooks["ax-validate"]
    tracked = [p.relative_to(ROOT).as_posix() for p in ROOT.rglob("*.y*ml")
               if ".venv" not in p.parts]
    selected = sorted(p for p in tracked if re.search(validate["files"], p))
    assert "dags/financial_risk_assessment.yaml" in selected
    assert all("dags" in p.split("/")[:-1] for p in selected)
    assert not re.search(validate["files"], ".pre-commit-hooks.yaml")
    # This repository's own DAGs (the tools demo's need its tools installed: pre-commit's
    # additional_dependencies, docs/testing.md#pre-commit).
    selected = [p for p in selected if p.startswith("dags/")]
    code, out, _ = run(capsys, *validate["entry"].split()[1:],
                       *(str(ROOT / p) for p in selected))
    assert code == 0 and out.count("OK ") == len(selected)
    assert hooks["ax-test"]["pass_filenames"] is False
    assert re.search(hooks["ax-test"]["files"], "tests/acme.fixture.json")
