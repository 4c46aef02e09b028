"""The hand-written sample PDFs: valid structure, stable bytes, extractable metrics."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from pypdf import PdfReader

from tests.executors.samples import INPUTS, pdf_script

script = pdf_script()


def test_build_is_deterministic() -> None:
    lines = ("Revenue growth: 1.0%", "a (paren) and \\ backslash")
    assert script.build_pdf(lines) == script.build_pdf(lines)


def test_xref_offsets_point_at_their_objects() -> None:
    data = script.build_pdf(("Hello",))
    match = re.search(rb"startxref\n(\d+)\n", data)
    assert match is not None
    startxref = int(match.group(1))
    assert data[startxref:].startswith(b"xref\n0 6\n")
    entries = re.findall(rb"(\d{10}) 00000 n \n", data[startxref:])
    assert len(entries) == 5
    for number, offset in enumerate(entries, start=1):
        assert data[int(offset):].startswith(b"%d 0 obj\n" % number)


def test_escapes_parentheses_and_backslashes(tmp_path: Path) -> None:
    path = tmp_path / "x.pdf"
    path.write_bytes(script.build_pdf(("a (b) c \\ d",)))
    assert PdfReader(path, strict=True).pages[0].extract_text().strip() == "a (b) c \\ d"


@pytest.mark.parametrize("report", script.REPORTS, ids=lambda r: r.filename)
def test_committed_samples_match_the_generator(report: Any) -> None:
    committed = INPUTS / report.filename
    assert committed.read_bytes() == script.build_pdf(report.lines), (
        "regenerate with: python scripts/make_sample_pdf.py"
    )


@pytest.mark.parametrize("report", script.REPORTS, ids=lambda r: r.filename)
def test_pypdf_extracts_every_line(report: Any, tmp_path: Path) -> None:
    written = script.write_reports(tmp_path, check=True)
    assert [p.name for p in written] == [r.filename for r in script.REPORTS]
    reader = PdfReader(tmp_path / report.filename, strict=True)
    lines = {ln.strip() for ln in reader.pages[0].extract_text().splitlines()}
    for line in report.lines:
        if line:
            assert line in lines


def test_main_writes_into_out_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert script.main(["--out-dir", str(tmp_path), "--check"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "acme_annual_report.pdf", "globex_annual_report.pdf",
    ]
    assert "acme_annual_report.pdf" in capsys.readouterr().out
