"""The fixture format: redaction at export, and a version that old fixtures keep
loading under and that newer or foreign files are refused with."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from axengine.cli import main as ax_main
from axengine.errors import InputError
from axengine.fixtures import (
    FIXTURE_VERSION,
    READABLE_VERSIONS,
    REDACTED,
    load_fixture,
    redact_fixture,
)
from axengine.testing import ReplayMismatch, assert_replays
from tests.testing.dags import EXAMPLE_FIXTURE, FINANCIAL, LEGACY_FIXTURES, ROOT

PDF = "dags/inputs/acme_annual_report.pdf"


def legacy() -> dict[str, Any]:
    return load_fixture(LEGACY_FIXTURES / "financial_success.json")


def test_a_redacted_field_and_every_copy_of_its_text_are_gone() -> None:
    original = legacy()
    assert PDF in json.dumps(original)
    data = redact_fixture(original, ["input.pdf_url"])
    assert data["task"]["input"] == {"pdf_url": REDACTED}
    # Copies in outputs, rendered inputs and events are scrubbed too; the DAG is code.
    text = json.dumps({k: v for k, v in data.items() if k != "dag"})
    assert PDF not in text
    outputs = {s["node_id"]: s["output"] for s in data["snapshots"]}
    assert outputs["parse_pdf"]["source"] == REDACTED
    assert (data["version"], data["redacted"]) == (FIXTURE_VERSION, ["input.pdf_url"])
    # Hashes of what changed are recomputed (a hash of a short value can be reversed),
    # the payload hash of the redacted input dropped; the rest is untouched.
    assert data["task"]["payload_sha256"] == ""
    before = {s["node_id"]: s for s in original["snapshots"]}
    after = {s["node_id"]: s for s in data["snapshots"]}
    assert after["parse_pdf"]["output_sha256"] != before["parse_pdf"]["output_sha256"]
    assert after["extract_metrics"]["output_sha256"] == before["extract_metrics"][
        "output_sha256"]
    assert original["task"]["input"] == {"pdf_url": PDF}  # the input is not modified


def test_wildcards_list_items_and_numbers() -> None:
    data = redact_fixture(legacy(), ["nodes.*.output.status",
                                     "nodes.extract_metrics.output.debt_to_equity"])
    outputs = {s["node_id"]: s["output"] for s in data["snapshots"]}
    assert outputs["parse_pdf"]["status"] == REDACTED
    assert outputs["extract_metrics"]["debt_to_equity"] == REDACTED
    # A number is replaced where it is, never scrubbed from other text.
    assert outputs["extract_metrics"]["revenue_growth"] == 0.08


def test_records_keep_their_names_when_a_redacted_text_is_in_them(tmp_path: Path) -> None:
    """The condition's label "medium_risk" is redacted: scrubbed from every output and
    event detail, but not from node ids such as send_medium_risk_email."""
    data = redact_fixture(load_fixture(EXAMPLE_FIXTURE), ["nodes.assess_risk.output"])
    outputs = {s["node_id"]: s["output"] for s in data["snapshots"]}
    assert outputs["assess_risk"] == REDACTED
    assert outputs["log_completion"]["risk"] == REDACTED
    assert "send_medium_risk_email" in outputs
    assert "label=medium_risk" not in json.dumps(data["events"])
    # Nothing routed on the label's text: the fixture restores and replays.
    replay = assert_replays(data, dag=FINANCIAL, home=tmp_path)
    assert "send_medium_risk_email" in replay.result.path


@pytest.mark.parametrize(("path", "words"), [
    ("input.ssn", "input has no 'ssn'; it has pdf_url"),
    ("nodes.parse_pd.output.text", "no node 'parse_pd'; did you mean 'parse_pdf'?"),
    ("nodes.parse_pdf.output.text.first", "nodes.parse_pdf.output.text is a text, with no"),
    ("output.text", "a path starts with input. or nodes.<id>.output"),
])
def test_a_path_that_matches_nothing_is_an_error(path: str, words: str) -> None:
    with pytest.raises(InputError) as caught:
        redact_fixture(legacy(), [path])
    assert words in str(caught.value)


def test_export_redacts_and_the_redacted_fixture_still_replays(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    home = str(tmp_path / "home")
    account = "DE89 3704 0044 0532 0130 00"
    assert ax_main(["run", str(FINANCIAL), "--input", json.dumps(
        {"pdf_url": str(ROOT / PDF), "account": account}), "--home", home, "--json"]) == 0
    task_id = json.loads(capsys.readouterr().out)["task_id"]
    out = tmp_path / "run.fixture.json"
    assert ax_main(["snapshot", "export", task_id, "--home", home, "-o", str(out),
                    "--redact", "input.account", "--redact", "nodes.parse_pdf.output.text"]) == 0
    text = out.read_text()
    assert account not in text and "Revenue growth: 8.0%" not in text
    assert json.loads(text)["redacted"] == ["input.account", "nodes.parse_pdf.output.text"]
    # No decision read those fields: the fixture replays.
    replay = assert_replays(out, dag=FINANCIAL, home=tmp_path / "replay")
    assert replay.redacted == ("input.account", "nodes.parse_pdf.output.text")
    assert ax_main(["snapshot", "export", task_id, "--home", home, "--redact",
                    "input.acount"]) == 1
    assert "input has no 'acount'; it has account, pdf_url" in capsys.readouterr().err


def test_a_decision_that_read_a_redacted_field_does_not_replay(tmp_path: Path) -> None:
    data = redact_fixture(load_fixture(EXAMPLE_FIXTURE),
                          ["nodes.extract_metrics.output.debt_to_equity"])
    with pytest.raises(ReplayMismatch) as caught:
        assert_replays(data, dag=FINANCIAL, home=tmp_path)
    message = str(caught.value)
    assert ("node assess_risk: recorded medium_risk -> send_medium_risk_email, replayed "
            "FAILED -> (no edge taken) (") in message
    [note] = [line for line in message.splitlines() if "Note:" in line]
    assert "nodes.extract_metrics.output.debt_to_equity" in note


def test_every_readable_version_loads() -> None:
    assert READABLE_VERSIONS == (1, 2) and FIXTURE_VERSION == 2
    assert legacy()["version"] == 1  # recorded before redaction existed
    assert load_fixture(EXAMPLE_FIXTURE)["version"] == 2


@pytest.mark.parametrize(("content", "words"), [
    ({**json.loads((LEGACY_FIXTURES / "financial_success.json").read_text()), "version": 3},
     "is fixture format version 3, newer than this ax reads (1 to 2): upgrade axengine"),
    ({"version": 0, "dag": {}}, "has fixture format version 0, which no ax reads"),
    ({"version": "2"}, "has fixture format version '2', which no ax reads"),
    ({"tasks": []}, "is not an ax snapshot fixture (it has no format version)"),
    ({"version": 2, "dag": {}}, "a version-2 fixture needs dag_hash, task, snapshots"),
])
def test_a_file_this_ax_cannot_read_is_refused_clearly(tmp_path: Path, content: Any,
                                                       words: str) -> None:
    path = tmp_path / "f.json"
    path.write_text(json.dumps(content))
    with pytest.raises(InputError) as caught:
        load_fixture(path)
    assert str(caught.value).startswith(str(path))
    assert words in str(caught.value)


def test_the_cli_says_why_a_fixture_is_refused(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    newer = tmp_path / "newer.json"
    newer.write_text(json.dumps({"version": 9}))
    not_json = tmp_path / "notes.json"
    not_json.write_text("recorded on Monday")
    assert ax_main(["replay", str(newer)]) == 1
    assert "newer than this ax reads" in capsys.readouterr().err
    assert ax_main(["snapshot", "import", str(not_json), "--home", str(tmp_path)]) == 1
    assert f"{not_json} is not JSON" in capsys.readouterr().err
