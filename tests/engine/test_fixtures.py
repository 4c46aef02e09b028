"""Snapshot fixtures of the financial DAG: restore into a fresh embedded store, resume,
assert the path — and that no node committed before the snapshot runs again."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from axengine.cli import main as ax_main
from axengine.testing import replay_fixture

FIXTURES = Path(__file__).resolve().parents[1] / "data" / "fixtures"
MEDIUM = ["parse_pdf", "extract_metrics", "assess_risk", "send_medium_risk_email",
          "log_completion"]


def test_success_fixture_resumes_the_claimed_email(tmp_path: Path) -> None:
    replay = replay_fixture(FIXTURES / "financial_success.json", home=tmp_path)
    assert replay.result.status == "SUCCEEDED"
    assert list(replay.result.path) == MEDIUM
    assert replay.executed == ["send_medium_risk_email", "log_completion"]
    assert replay.rerun == []
    assert len(list((tmp_path / "mail").glob("*.eml"))) == 1


def test_timeout_fixture_retries_only_the_timed_out_node(tmp_path: Path) -> None:
    replay = replay_fixture(FIXTURES / "financial_timeout.json", home=tmp_path)
    assert replay.result.status == "SUCCEEDED"
    assert list(replay.result.path) == MEDIUM
    assert replay.executed[0] == "extract_metrics"
    assert "parse_pdf" not in replay.executed
    assert replay.rerun == []


def test_malformed_output_fixture_stays_failed_and_runs_nothing(tmp_path: Path) -> None:
    replay = replay_fixture(FIXTURES / "financial_malformed_output.json", home=tmp_path)
    assert replay.result.status == "FAILED"
    assert list(replay.result.path) == ["parse_pdf", "extract_metrics"]
    assert replay.executed == []
    assert "revenue_growth" in replay.result.errors["assess_risk"]


@pytest.mark.parametrize("name", ["financial_success", "financial_timeout",
                                  "financial_malformed_output"])
def test_fixtures_hold_no_secrets_and_match_their_dag(name: str) -> None:
    data = json.loads((FIXTURES / f"{name}.json").read_text())
    text = json.dumps(data).lower()
    for word in ("api_key", "password", "secret", "authorization", "smtp_url"):
        assert word not in text
    assert data["task"]["dag_hash"] == data["dag_hash"]


def test_cli_export_then_replay_round_trip(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    home = str(tmp_path / "home")
    root = Path(__file__).resolve().parents[2]
    code = ax_main(["run", str(root / "dags/financial_risk_assessment.yaml"), "--input",
                    json.dumps({"pdf_url": str(root / "dags/inputs/acme_annual_report.pdf")}),
                    "--home", home, "--json"])
    assert code == 0
    task_id = json.loads(capsys.readouterr().out)["task_id"]
    out = tmp_path / "task.json"
    assert ax_main(["snapshot", "export", task_id, "--home", home, "-o", str(out)]) == 0
    capsys.readouterr()
    assert ax_main(["replay", str(out)]) == 0
    assert capsys.readouterr().out.strip() == "SUCCEEDED: " + " -> ".join(MEDIUM)


def test_replay_refuses_a_bad_decide_and_a_fixture_off_its_hash_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = json.loads((FIXTURES / "financial_success.json").read_text())
    data["dag_hash"] = "0" * 64  # edited by hand
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps(data))

    assert ax_main(["replay", str(FIXTURES / "financial_success.json"),
                    "--decide", "gate"]) == 2
    assert capsys.readouterr().err.strip() == \
        "ax: error: --decide must look like KEY=VALUE, not 'gate'"
    assert ax_main(["replay", str(edited)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"ax: error: {edited}: the fixture's DAG does not match its "
                          "recorded hash")
    assert "Traceback" not in err
