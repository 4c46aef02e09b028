"""Every broken DAG under ``tests/data/bad_dags`` is rejected with the expected problem.

Each file starts with ``# expect: <line> <code> <message substring>``; the substring is
looked for in the formatted problem (message and hint).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from axengine.cli import main
from axengine.dag import validate_file

BAD_DAGS = Path(__file__).resolve().parents[1] / "data" / "bad_dags"
FILES = sorted(BAD_DAGS.glob("*.yaml"))

#: Problem classes ``ax validate`` must cover (DESIGN §2), each by at least one file.
REQUIRED_CODES = {
    "yaml-syntax", "unquoted-template", "not-a-mapping", "missing-field",
    "unknown-node-type", "unknown-field", "bad-value", "unknown-target", "cycle",
    "unreachable", "template-syntax", "unknown-label", "bad-edge", "unknown-tool",
    "unknown-model", "bad-reference", "duplicate-key", "too-large", "unsafe-template",
    "unknown-name",
}


def expectation(path: Path) -> tuple[int, str, str]:
    first = path.read_text(encoding="utf-8").splitlines()[0]
    assert first.startswith("# expect: "), f"{path.name} lacks its '# expect:' line"
    line, code, substring = first.removeprefix("# expect: ").split(" ", 2)
    return int(line), code, substring


def test_the_directory_covers_every_problem_class() -> None:
    codes = {expectation(path)[1] for path in FILES}

    assert len(FILES) >= 18
    assert codes >= REQUIRED_CODES, REQUIRED_CODES - codes


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_expected_problem_is_reported(path: Path) -> None:
    line, code, substring = expectation(path)

    problems = validate_file(path)

    found = [(p.line, p.code, p.format()) for p in problems]
    assert any(
        (p_line, p_code) == (line, code) and substring in text for p_line, p_code, text in found
    ), found
    assert all(p.file == str(path) for p in problems)


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_ax_validate_fails_with_file_and_line(
    path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    line, _, _ = expectation(path)

    code = main(["validate", str(path)])

    out = capsys.readouterr().out
    assert code == 1
    assert f"{path}:{line}: " in out
    assert "OK " not in out
