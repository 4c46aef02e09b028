"""The CLI's sharp edges: refusals that used to be silent, the gate prompt, Ctrl-C, pipes,
help text and one spelling per option. Local store only (``tests/test_remote_cli.py``
covers ``--server``)."""

from __future__ import annotations

import argparse
import datetime as dt
import getpass
import json
import os
import pty
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from axengine.cli import build_parser
from axengine.cli import main as ax
from axengine.cli.run import gate_text, parse_answer
from axengine.dag import load_dag_text
from axengine.engine import TaskView
from axengine.records import NodeState, Snapshot, TaskRecord

ROOT = Path(__file__).resolve().parents[1]
DAG = str(ROOT / "dags" / "financial_risk_assessment.yaml")
GLOBEX = json.dumps({"pdf_url": str(ROOT / "dags/inputs/globex_annual_report.pdf")})
ECHO = "name: echo_once\nnodes:\n  a: {type: tool_call, tool: echo, input: hi}\n"
SLEEP = ("name: nap\nnodes:\n  nap:\n    type: tool_call\n    tool: sleep\n    input: 30\n"
         "    timeout: 120\n")
GATE = """\
name: gated
nodes:
  review:
    type: human_gateway
    description: "check it"
    timeout: 86400
"""


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("AX_")}


def _cli(*args: str, **kw: Any) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "axengine.cli", *args], cwd=ROOT,
                            env=_env(), **kw)


# ---------------------------------------------------------------------------- refusals


def test_unknown_gate_in_decide_is_an_error(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    home = str(tmp_path)
    assert ax(["run", DAG, "--input", GLOBEX, "--home", home,
               "--decide", "send_high_risk_mail=approve"]) == 2
    err = capsys.readouterr().err
    assert "no human_gateway node 'send_high_risk_mail'" in err
    assert "its gates: send_high_risk_email" in err
    # A node that exists but is no gate is refused too; nothing was submitted.
    assert ax(["run", DAG, "--input", GLOBEX, "--home", home,
               "--decide", "parse_pdf=approve"]) == 2
    assert ax(["tasks", "list", "--home", home, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == []


def test_unknown_status_is_an_error_and_case_is_free(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        ax(["tasks", "list", "--status", "DONE", "--home", str(tmp_path)])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "unknown status 'DONE'" in err and "SUCCEEDED" in err
    assert ax(["tasks", "list", "--status", "paused", "--home", str(tmp_path)]) == 0


def test_missing_input_file_says_no_such_file(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert ax(["run", DAG, "-i", "missing.json", "--home", str(tmp_path)]) == 2
    assert "--input: no such file: missing.json" in capsys.readouterr().err
    assert ax(["retry", "t-x", "--from", "a", "--input", "nope.json",
               "--home", str(tmp_path)]) == 2
    assert "no such file: nope.json" in capsys.readouterr().err
    # Inline JSON that is no object still works as before.
    assert ax(["run", DAG, "-i", "{bad", "--home", str(tmp_path)]) == 2
    assert "not valid JSON" in capsys.readouterr().err


EXECUTOR = ["executor", "--api", "h:1", "--queue", "redis://h"]


@pytest.mark.parametrize("argv", [
    ["run", DAG, "--concurrency"],  # 0 submitted the task and waited for ever
    ["server", "--concurrency"],
    [*EXECUTOR, "--concurrency"],
    ["tasks", "list", "--limit"],
], ids=["run", "server", "executor", "tasks-list"])
@pytest.mark.parametrize("value", ["0", "-1"])
def test_counts_below_one_are_refused_by_the_parser(
        argv: list[str], value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args([*argv, value])
    assert exc.value.code == 2
    assert f"error: argument {argv[-1]}: must be at least 1" in capsys.readouterr().err
    assert getattr(build_parser().parse_args([*argv, "1"]), argv[-1][2:]) == 1


def test_a_label_the_engine_would_refuse_is_refused_before_any_task_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = ax(["run", str(ROOT / "dags" / "report_digest.yaml"), "--home", str(tmp_path),
               "--label", "ax.forked_from=t-1@a"])
    out, err = capsys.readouterr()
    assert code == 2
    assert err.strip() == ("ax: error: labels: key 'ax.forked_from': keys starting with "
                           "'ax.' are set by ax itself")
    assert "running" not in out + err  # no task line for a task that was never made


def test_a_refused_input_names_no_task_and_a_run_prints_its_task_line_first(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert ax(["run", str(ROOT / "dags" / "report_digest.yaml"), "--home", str(tmp_path),
               "--input", "{}"]) != 0
    out, err = capsys.readouterr()
    assert "'pdf_url' is a required property" in err
    assert "t-" not in out + err  # no task line for a task that was never made
    # A run's task line comes before the events of its submit (held until it is made).
    ax(["run", str(ROOT / "dags" / "financial_risk_assessment.yaml"), "--home",
        str(tmp_path)])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("task t-") and "running financial_risk_assessment" in lines[0]
    assert "submitted" in lines[1]


def test_graph_of_a_directory_explains_one_dag_per_graph(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert ax(["graph", str(ROOT / "dags")]) == 2
    err = capsys.readouterr().err
    assert "one DAG per graph" in err and "financial_risk_assessment.yaml" in err
    assert f"ax validate {ROOT / 'dags'}" in err


# ---------------------------------------------------------------------------- listing


def test_tasks_list_is_newest_first(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dag = tmp_path / "echo.yaml"
    dag.write_text(ECHO)
    home = str(tmp_path / "home")
    made = []
    for n in range(3):
        assert ax(["run", str(dag), "-i", json.dumps({"n": n}), "--home", home, "--json"]) == 0
        made.append(json.loads(capsys.readouterr().out)["task_id"])
    assert ax(["tasks", "list", "--home", home, "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [t["task_id"] for t in listed] == made[::-1]
    assert [t["created_at"] for t in listed] == sorted((t["created_at"] for t in listed),
                                                      reverse=True)


def test_tasks_show_into_a_closed_pipe_is_quiet(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    dag = tmp_path / "echo.yaml"
    dag.write_text(ECHO)
    home = str(tmp_path / "home")
    assert ax(["run", str(dag), "--home", home, "--json"]) == 0
    task = json.loads(capsys.readouterr().out)["task_id"]
    # `ax tasks show T | head -0`: the reader is gone before the first write.
    proc = _cli("tasks", "show", task, "--home", home, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    with proc.stderr:
        err = proc.stderr.read().decode()
    assert proc.wait(60) == 0, err
    assert "Traceback" not in err and "BrokenPipe" not in err


# ---------------------------------------------------------------------------- the gate prompt


def _gate_view(gate_until: float, payload: object) -> TaskView:
    dag = load_dag_text(GATE)
    snap = Snapshot("t-1", "review", NodeState.PAUSED, gate_until=gate_until,
                    input={"description": "check the numbers", "input": payload})
    return TaskView(task=TaskRecord("t-1", dag.hash, "gated"), dag=dag,
                    snapshots={"review": snap}, revision=1)


def test_gate_text_shows_indented_json_and_local_deadline() -> None:
    now = 1_750_000_000.0
    view = _gate_view(now + 86_399, {"company": "Globex", "metrics": {"debt": 1.5}})
    text = gate_text(view, "review", now=now)
    assert "== gate review: check the numbers" in text
    assert '\n       "company": "Globex",\n' in text  # json.dumps(indent=2), indented
    assert '\n         "debt": 1.5\n' in text
    local = dt.datetime.fromtimestamp(now + 86_399).astimezone().isoformat(timespec="seconds")
    assert f"deadline: {local} (in 23h 59m)" in text
    big = gate_text(_gate_view(0, list(range(100))), "review", now=now)
    assert "more lines (ax tasks show t-1 --json)" in big and "deadline" not in big
    assert len(big.splitlines()) < 40


def test_unknown_answers_are_not_decide_later() -> None:
    assert parse_answer(" A ") == "approve" and parse_answer("no") == "reject"
    assert parse_answer("") == ""  # decide later
    assert parse_answer("maybe") is None and parse_answer("later") is None  # ask again


def test_prompt_reasks_and_records_the_user(tmp_path: Path) -> None:
    home = str(tmp_path)
    master, slave = pty.openpty()
    proc = _cli("run", DAG, "--input", GLOBEX, "--home", home, stdin=slave,
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    os.close(slave)
    try:
        assert proc.stdout is not None
        seen = b""

        def until(marker: bytes) -> None:
            nonlocal seen
            while marker not in seen:
                chunk = proc.stdout.read1(4096)  # type: ignore[union-attr]
                assert chunk, seen.decode()
                seen += chunk

        until(b"approve or reject?")
        os.write(master, b"maybe\n")
        until(b"is not an answer")
        os.write(master, b"a\n")
        rest, _ = proc.communicate(timeout=60)
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
    out = (seen + rest).decode()
    assert proc.returncode == 0, out
    assert "'maybe' is not an answer" in out and "   input:\n     {" in out
    task = next(line.split()[1].rstrip(":") for line in out.splitlines()
                if line.startswith("task t-"))
    export = subprocess.run([sys.executable, "-m", "axengine.cli", "snapshot", "export", task,
                             "--home", home], cwd=ROOT, env=_env(), capture_output=True,
                            check=True, text=True)
    snaps = {s["node_id"]: s for s in json.loads(export.stdout)["snapshots"]}
    assert snaps["send_high_risk_email"]["decision"]["by"] == getpass.getuser()


# ---------------------------------------------------------------------------- Ctrl-C


def test_ctrl_c_says_stopping_at_once_and_twice_aborts_quietly(tmp_path: Path) -> None:
    dag = tmp_path / "nap.yaml"
    dag.write_text(SLEEP)
    proc = _cli("run", str(dag), "--home", str(tmp_path / "home"), stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT)
    assert proc.stdout is not None
    lines: list[str] = []
    claimed = threading.Event()
    stopping = threading.Event()

    def pump() -> None:
        for raw in proc.stdout:  # type: ignore[union-attr]
            line = raw.decode(errors="replace")
            lines.append(line)
            if "claimed" in line:
                claimed.set()
            if "stopping… (Ctrl-C again to abort)" in line:
                stopping.set()

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        assert claimed.wait(60), "".join(lines)
        proc.send_signal(signal.SIGINT)
        start = time.monotonic()
        assert stopping.wait(10), "".join(lines)
        assert time.monotonic() - start < 5
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        reader.join(10)
        proc.stdout.close()
    assert "Traceback" not in "".join(lines)


# ---------------------------------------------------------------------------- help, spelling


def _parsers(parser: argparse.ArgumentParser, path: str = "ax"
             ) -> list[tuple[str, argparse.ArgumentParser]]:
    out = [(path, parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out += _parsers(sub, f"{path} {name}")
    return out


def test_every_option_has_help() -> None:
    missing = [f"{path}: {'/'.join(action.option_strings) or action.dest}"
               for path, parser in _parsers(build_parser())
               for action in parser._actions
               if not isinstance(action, argparse._HelpAction | argparse._SubParsersAction)
               and not action.help]
    assert missing == []


def test_server_help_names_no_etcd_or_redis() -> None:
    helps = dict(_parsers(build_parser()))
    text = helps["ax server"].format_help().lower()
    assert "etcd" not in text and "redis" not in text
    assert "etcd" in helps["ax api"].format_help().lower()


def test_one_spelling_per_option_old_ones_still_accepted() -> None:
    parser = build_parser()
    helps = dict(_parsers(parser))
    for command in ("api", "server"):
        text = helps[f"ax {command}"].format_help()
        assert "--no-auth" in text and "--insecure-no-auth" not in text
        assert parser.parse_args([command, "--insecure-no-auth"]).no_auth
        assert parser.parse_args([command, "--no-auth"]).no_auth
    for argv in (["api"], ["server"], ["executor", "--api", "h:1", "--queue", "redis://h"]):
        assert parser.parse_args([*argv, "--log-level", "DEBUG"]).log_level == "debug"
        assert parser.parse_args([*argv, "--log-level", "debug"]).log_level == "debug"
        assert "DEBUG" not in helps[f"ax {argv[0]}"].format_help()


@pytest.mark.parametrize("command", [
    ["tasks", "list"], ["tasks", "show", "t-1"], ["tasks", "diff", "t-1", "t-2"],
    ["cancel", "t-1"], ["approve", "t-1", "gate"], ["reject", "t-1", "gate"],
    ["resume", "t-1", "gate"], ["dags"], ["approvals"], ["history", "export"],
    ["snapshot", "export", "t-1"], ["fork", "t-1", "--from", "n"],
    ["retry", "t-1", "--from", "n"],
    ["run", str(ROOT / "dags" / "financial_risk_assessment.yaml")],
])
def test_a_home_that_is_a_file_is_one_line(tmp_path: Path, command: list[str],
                                           capsys: pytest.CaptureFixture[str]) -> None:
    home = tmp_path / "home"
    home.write_text("not a directory")
    assert ax([*command, "--home", str(home / "sub")]) == 1
    out, err = capsys.readouterr()
    assert err == (f"ax: error: cannot create the directory of {home / 'sub' / 'ax.db'}: "
                   f"{home} is not a directory\n")
    assert out == ""  # (no line about a task that was never created)
    assert home.read_text() == "not a directory"


@pytest.mark.parametrize("command", [["tasks", "show"], ["cancel"], ["tasks", "list", "--dag"],
                                     ["snapshot", "export"]])
def test_an_argument_that_is_not_utf8_is_one_line(
        tmp_path: Path, command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    # What Python makes of the byte 0xff in argv (surrogateescape).
    bad = os.fsdecode(b"\xff")
    assert ax([*command, bad, "--home", str(tmp_path)]) == 2
    assert capsys.readouterr().err == ("ax: error: argument '\\udcff' is not UTF-8 text: task "
                                       "ids, node ids, names and labels are\n")


def test_a_file_name_that_is_not_utf8_still_names_its_file(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = os.fsdecode(bytes(tmp_path) + b"/caf\xe9.yaml")
    Path(path).write_text("name: x\nnodes:\n  a: {type: tool_call, tool: echo}\n")
    assert ax(["validate", path, "--format", "json"]) == 0  # (JSON escapes the name)
    assert ax(["graph", path]) == 0
    assert "tool_call: echo" in capsys.readouterr().out


@pytest.mark.parametrize("command", [["validate"], ["graph"]])
def test_a_name_too_long_for_the_system_is_one_line(
        command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    name = "d" * 5000
    assert ax([*command, name]) == 1
    out, err = capsys.readouterr()
    said = out if command == ["validate"] else err  # (validate reports on stdout)
    assert said == f"{name}: cannot read the file: File name too long\n", said[-200:]
