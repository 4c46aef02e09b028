"""JSON arguments read from files (``--input``, ``--data``, ``--settings``, ``--set``) and
the ``--config`` file: bounded, regular files of UTF-8 text, parsed as strict JSON.
Every refusal is one ``ax: error:`` line naming the option and the file, never a
traceback, a hang on a FIFO or a read without end."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from axengine.cli import main as ax
from axengine.limits import MAX_JSON_BYTES

ROOT = Path(__file__).resolve().parents[1]
ECHO = "name: echo_once\nnodes:\n  a: {type: tool_call, tool: echo, input: hi}\n"


@pytest.fixture
def dag(tmp_path: Path) -> str:
    path = tmp_path / "ok.yaml"
    path.write_text(ECHO)
    return str(path)


def _refused(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """Run ``ax argv``; it must exit 2 with one error line; return that line."""
    assert ax(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.startswith("ax: error: "), err
    return err.strip()


def test_an_input_file_larger_than_the_limit_is_refused(
        tmp_path: Path, dag: str, capsys: pytest.CaptureFixture[str]) -> None:
    big = tmp_path / "big.json"
    with big.open("wb") as file:  # sparse: one byte past the limit, nothing written
        file.truncate(MAX_JSON_BYTES + 1)

    err = _refused(capsys, ["run", dag, "--input", str(big), "--home", str(tmp_path)])

    assert err == f"ax: error: --input: {big} is larger than the limit of {MAX_JSON_BYTES} bytes"


def test_an_input_file_at_the_limit_is_read(
        tmp_path: Path, dag: str, capsys: pytest.CaptureFixture[str]) -> None:
    doc = tmp_path / "padded.json"
    body = '{"a": 1}'
    doc.write_text(body + " " * (MAX_JSON_BYTES - len(body)))

    assert ax(["run", dag, "--input", str(doc), "--home", str(tmp_path), "-q"]) == 0


@pytest.mark.parametrize("kind", ["fifo", "device", "directory"])
def test_an_input_that_is_not_a_regular_file_is_refused_unread(
        kind: str, tmp_path: Path, dag: str, capsys: pytest.CaptureFixture[str]) -> None:
    # A FIFO with no writer used to block ax for ever, /dev/zero to fill the memory.
    if kind == "fifo":
        path = tmp_path / "pipe"
        os.mkfifo(path)
    elif kind == "device":
        path = Path("/dev/zero")
    else:
        path = tmp_path / "dir"
        path.mkdir()

    err = _refused(capsys, ["run", dag, "--input", str(path), "--home", str(tmp_path)])

    assert f"--input: {path} is " in err
    assert "not a regular file" in err or "is a directory" in err


def test_every_json_file_argument_has_the_same_limits(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)

    err = _refused(capsys, ["approve", "t-x", "review", "--data", str(fifo),
                            "--home", str(tmp_path)])
    assert err == f"ax: error: --data: {fifo} is not a regular file"
    err = _refused(capsys, ["k8s", "job", str(ROOT / "dags/financial_risk_assessment.yaml"),
                            "parse_pdf", "--input", str(fifo)])
    assert err == f"ax: error: --input: {fifo} is not a regular file"


def test_an_input_file_that_is_not_utf8_is_refused(
        tmp_path: Path, dag: str, capsys: pytest.CaptureFixture[str]) -> None:
    binary = tmp_path / "input.bin"
    binary.write_bytes(b"\xff\xfe{\x00}\x00")

    err = _refused(capsys, ["run", dag, "--input", str(binary), "--home", str(tmp_path)])

    assert err == f"ax: error: --input: {binary} is not UTF-8 text"


def test_a_config_file_that_is_not_utf8_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    binary = tmp_path / "ax.toml"
    binary.write_bytes(b"home = '\xff'\n")

    err = _refused(capsys, ["--config", str(binary), "tasks", "list",
                            "--home", str(tmp_path)])

    assert err == f"ax: error: configuration file {binary}: not UTF-8 text"
    # The same file named by AX_CONFIG, and a FIFO (which would block the read for ever).
    monkeypatch.setenv("AX_CONFIG", str(binary))
    err = _refused(capsys, ["tasks", "list", "--home", str(tmp_path)])
    assert err == f"ax: error: configuration file {binary}: not UTF-8 text"
    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)
    monkeypatch.setenv("AX_CONFIG", str(fifo))
    err = _refused(capsys, ["tasks", "list", "--home", str(tmp_path)])
    assert err == f"ax: error: configuration file {fifo}: not a regular file"


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e400"])
def test_inline_json_is_strict(literal: str, tmp_path: Path, dag: str,
                               capsys: pytest.CaptureFixture[str]) -> None:
    # Accepted by Python's json module, refused by every other reader of the value:
    # refused here as bad input (exit 2) naming the option, before anything is submitted.
    err = _refused(capsys, ["run", dag, "--input", f'{{"x": {literal}}}',
                            "--home", str(tmp_path)])

    assert err.startswith("ax: error: --input: the argument is not valid JSON: "), err
    assert ax(["tasks", "list", "--home", str(tmp_path), "--json"]) == 0
    assert capsys.readouterr().out.strip() == "[]"


def test_a_json_file_with_nan_is_refused_naming_the_file(
        tmp_path: Path, dag: str, capsys: pytest.CaptureFixture[str]) -> None:
    doc = tmp_path / "input.json"
    doc.write_text('{"x": NaN}')

    err = _refused(capsys, ["run", dag, "--input", str(doc), "--home", str(tmp_path)])

    assert err == f"ax: error: --input: {doc} is not valid JSON: NaN is not a JSON number"
