"""Write the sample annual-report PDFs used by the example DAGs.

The PDFs are built by hand from raw PDF syntax (one page, one Helvetica text stream, a
cross-reference table with exact byte offsets) so the repository needs no PDF-writing
dependency and the files are byte-for-byte reproducible: no timestamps, no random ids.

Usage::

    python scripts/make_sample_pdf.py            # writes dags/inputs/*.pdf
    python scripts/make_sample_pdf.py --out-dir /tmp/pdfs --check

``--check`` re-reads each written file with pypdf and verifies that every metric line
comes back out, which is what the ``pdf_parser`` tool and the simulated model rely on.

The figures are chosen against the seed DAG's risk rule (``high_risk`` if revenue growth
> 15% and net profit margin < 12%; elif debt-to-equity > 2.0 ``medium_risk``; else
``low_risk``): ACME lands on ``medium_risk`` and GLOBEX on ``high_risk``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["REPORTS", "Report", "build_pdf", "main", "write_reports"]

#: Where the example DAGs look for their sample inputs.
DEFAULT_OUT_DIR = Path(__file__).resolve().parent.parent / "dags" / "inputs"


@dataclass(frozen=True)
class Report:
    """One fictional company's annual report summary.

    Attributes:
        filename: File name under the output directory.
        lines: Text lines, top to bottom.
        expected_risk: The seed rule's verdict for these figures (documentation and
            test oracle; not written into the PDF).
    """

    filename: str
    lines: tuple[str, ...]
    expected_risk: str


REPORTS: tuple[Report, ...] = (
    Report(
        filename="acme_annual_report.pdf",
        lines=(
            "ACME Corporation - Annual Report 2024 (summary)",
            "Fictional company; figures for the ax example DAGs.",
            "",
            "Revenue: 1,240.5 million USD",
            "Revenue growth: 8.0%",
            "Net profit margin: 14.0%",
            "Debt-to-equity ratio: 2.4",
            "Employees: 5,300",
            "",
            "Outlook: steady demand for anvils and rocket skates; refinancing of the",
            "2026 bond is the main balance-sheet risk.",
        ),
        expected_risk="medium_risk",
    ),
    Report(
        filename="globex_annual_report.pdf",
        lines=(
            "Globex Corporation - Annual Report 2024 (summary)",
            "Fictional company; figures for the ax example DAGs.",
            "",
            "Revenue: 3,870.0 million USD",
            "Revenue growth: 22.0%",
            "Net profit margin: 9.0%",
            "Debt-to-equity ratio: 1.1",
            "Employees: 12,800",
            "",
            "Outlook: aggressive expansion into new markets compresses margins while",
            "marketing spend stays high.",
        ),
        expected_risk="high_risk",
    ),
)

_FONT_SIZE = 12
_LEADING = 16
_LEFT = 72
_TOP = 760


def _escape(text: str) -> str:
    """Escape a line for a PDF literal string (only Latin-1 text is supported)."""
    text.encode("latin-1")  # fail loudly rather than write mojibake into the sample
    return text.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")


def _content_stream(lines: Sequence[str]) -> bytes:
    # One Tj per line with T* between them: pypdf turns each line advance into a
    # newline, so the extracted text has exactly one metric per line.
    ops = ["BT", f"/F1 {_FONT_SIZE} Tf", f"{_LEADING} TL", f"{_LEFT} {_TOP} Td"]
    for i, line in enumerate(lines):
        if i:
            ops.append("T*")
        ops.append(f"({_escape(line)}) Tj")
    ops.append("ET")
    return ("\n".join(ops) + "\n").encode("latin-1")


def build_pdf(lines: Sequence[str]) -> bytes:
    """Build a one-page PDF showing ``lines``.

    Args:
        lines: Text lines (Latin-1), top to bottom; at most about 40 fit on the page.

    Returns:
        The PDF file's bytes, identical for identical ``lines``.
    """
    stream = _content_stream(lines)
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] "
        b"/Resources << /Font << /F1 4 0 R >> >> /Contents 5 0 R >>",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /Encoding /WinAnsiEncoding >>",
        b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"endstream",
    ]
    # The binary comment on line 2 tells transfer tools the file is binary.
    out = bytearray(b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n")
    offsets: list[int] = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref_at = len(out)
    out += b"xref\n0 %d\n" % (len(objects) + 1)
    # Each xref entry is exactly 20 bytes, including its two-byte line end.
    out += b"0000000000 65535 f \n"
    for offset in offsets:
        out += b"%010d 00000 n \n" % offset
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\n" % (len(objects) + 1)
    out += b"startxref\n%d\n%%%%EOF\n" % xref_at
    return bytes(out)


def _check(path: Path, report: Report) -> list[str]:
    """Lines of ``report`` that pypdf does not extract from ``path`` (empty: all good)."""
    from pypdf import PdfReader

    text = "\n".join(page.extract_text() or "" for page in PdfReader(path).pages)
    extracted = {line.strip() for line in text.splitlines()}
    return [line for line in report.lines if line and line not in extracted]


def write_reports(out_dir: Path, *, check: bool = False) -> list[Path]:
    """Write every sample report into ``out_dir``.

    Args:
        out_dir: Target directory (created if missing).
        check: Re-read each file with pypdf and fail if a line does not come back.

    Returns:
        The written paths.

    Raises:
        RuntimeError: ``check`` is set and pypdf lost a line.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for report in REPORTS:
        path = out_dir / report.filename
        path.write_bytes(build_pdf(report.lines))
        written.append(path)
        if check and (missing := _check(path, report)):
            raise RuntimeError(f"{path}: pypdf did not extract {missing!r}")
    return written


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out-dir", type=Path, default=DEFAULT_OUT_DIR)
    parser.add_argument("--check", action="store_true", help="verify extraction with pypdf")
    args = parser.parse_args(argv)
    for path in write_reports(args.out_dir, check=args.check):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
