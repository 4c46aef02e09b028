"""``ax run``, ``ax approve``, ``ax tasks``, ``ax retry``: exit codes and messages."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from axengine.cli import main as ax

ROOT = Path(__file__).resolve().parents[1]
DAG = str(ROOT / "dags" / "financial_risk_assessment.yaml")
GLOBEX = json.dumps({"pdf_url": str(ROOT / "dags/inputs/globex_annual_report.pdf")})
ACME = json.dumps({"pdf_url": str(ROOT / "dags/inputs/acme_annual_report.pdf")})


def test_run_prints_progress_and_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert ax(["run", DAG, "--input", ACME, "--home", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "parse_pdf" in out and "claimed #1" in out
    assert ("path: parse_pdf -> extract_metrics -> assess_risk -> send_medium_risk_email"
            " -> log_completion") in out
    assert "SUCCEEDED" in out


def test_gate_stops_with_exit_3_then_approve_and_resume(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    home = str(tmp_path)
    assert ax(["run", DAG, "--input", GLOBEX, "--home", home, "--json"]) == 3
    captured = capsys.readouterr()
    result = json.loads(captured.out)
    task = result["task_id"]
    assert result["status"] == "PAUSED" and result["waiting"] == ["send_high_risk_email"]
    assert f"ax approve {task} send_high_risk_email" in captured.err
    assert f"ax run --resume {task}" in captured.err

    assert ax(["approve", task, "send_high_risk_email", "-m", "ok", "--by", "carol",
               "--home", home]) == 0
    assert "approved by carol" in capsys.readouterr().out
    # A second, conflicting decision is refused and changes nothing.
    assert ax(["reject", task, "send_high_risk_email", "--home", home]) == 1
    assert "already decided" in capsys.readouterr().err

    assert ax(["run", "--resume", task, "--home", home, "--json"]) == 0
    done = json.loads(capsys.readouterr().out)
    assert done["path"][-2:] == ["notify_high_risk", "log_completion"]

    assert ax(["tasks", "show", task, "--home", home]) == 0
    shown = capsys.readouterr().out
    assert "decided" in shown and "approve by carol: ok" in shown


def test_decide_up_front(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert ax(["run", DAG, "--input", GLOBEX, "--home", str(tmp_path), "--json",
               "--decide", "send_high_risk_email=reject"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["states"]["notify_high_risk"] == "SKIPPED"
    assert result["path"][-1] == "log_completion"


def test_bad_input_and_bad_dag_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert ax(["run", DAG, "--input", "{not json", "--home", str(tmp_path)]) == 2
    assert "not valid JSON" in capsys.readouterr().err
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nnodes:\n  a:\n    type: tool_call\n    tool: echo\n    next: nope\n")
    assert ax(["run", str(bad), "--home", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"{bad}:6:" in err and "nope" in err
    assert ax(["tasks", "list", "--home", str(tmp_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == []  # nothing was stored


def test_failed_run_exits_1_and_retry_from_node(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    home = str(tmp_path)
    missing = json.dumps({"pdf_url": str(tmp_path / "missing.pdf")})
    # A missing PDF is a business result: the DAG routes it to send_alert and succeeds.
    assert ax(["run", DAG, "--input", missing, "--home", home, "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert "send_alert" in result["path"]
    task = result["task_id"]
    assert ax(["retry", task, "--from", "nope", "--home", home]) == 1
    assert "no node 'nope'" in capsys.readouterr().err
    assert ax(["retry", task, "--from", "send_alert", "--home", home]) == 0
    assert ax(["run", "--resume", task, "--home", home, "--json"]) == 0
    again = json.loads(capsys.readouterr().out.split("\n", 1)[1])
    assert again["status"] == "SUCCEEDED"
    assert again["path"].count("parse_pdf") == 1  # earlier committed nodes untouched


def test_gate_prompt_on_a_terminal(tmp_path: Path) -> None:
    """Attached to a terminal, ``ax run`` asks for the gate's decision and goes on."""
    import os
    import pty
    import subprocess
    import sys

    master, slave = pty.openpty()
    env = {k: v for k, v in os.environ.items() if not k.startswith("AX_")}
    proc = subprocess.Popen(  # our own CLI, stdin on a pseudo-terminal
        [sys.executable, "-m", "axengine.cli", "run", DAG, "--input", GLOBEX,
         "--home", str(tmp_path)],
        stdin=slave, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
    os.close(slave)
    try:
        seen = b""
        assert proc.stdout is not None
        while b"approve or reject?" not in seen:
            chunk = proc.stdout.read1(4096)
            assert chunk, seen.decode()
            seen += chunk
        assert b"== gate send_high_risk_email" in seen
        os.write(master, b"a\n")
        rest, _ = proc.communicate(timeout=60)
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
    out = (seen + rest).decode()
    assert proc.returncode == 0, out
    assert "notify_high_risk" in out and "SUCCEEDED" in out


HIGH_RISK = json.dumps({"revenue_growth": 0.3, "net_profit_margin": 0.05,
                        "debt_to_equity": 1.0})


def test_fork_with_a_set_output_then_diff_names_the_differing_nodes(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    home = str(tmp_path)
    assert ax(["run", DAG, "--input", ACME, "--home", home, "--json"]) == 0
    source = json.loads(capsys.readouterr().out)["task_id"]
    assert ax(["fork", source, "--from", "extract_metrics", "--set",
               f"extract_metrics.output={HIGH_RISK}", "--by", "carol", "--home", home]) == 0
    out = capsys.readouterr().out
    fork = out.split(" as ", 1)[1].split(";", 1)[0]
    assert f"task {source} forked at extract_metrics as {fork}" in out
    assert f"ax run --resume {fork}" in out
    assert ax(["tasks", "diff", source, fork, "--home", home]) == 0
    out = capsys.readouterr().out
    lines = {line[2:].split()[0]: line for line in out.splitlines()
             if line[:2] in ("* ", "  ") and line[2:].strip()}
    assert lines["parse_pdf"].startswith(" ")  # shared history
    assert lines["extract_metrics"].startswith("*") and "output differs" in lines[
        "extract_metrics"]
    assert lines["assess_risk"].startswith("*")
    assert "send_medium_risk_email" in lines["assess_risk"]
    assert "send_high_risk_email" in lines["assess_risk"]
    assert (f"path A ({source}, SUCCEEDED): parse_pdf -> extract_metrics -> assess_risk -> "
            "send_medium_risk_email -> log_completion") in out
    assert (f"path B ({fork}, PAUSED): parse_pdf -> extract_metrics -> assess_risk -> "
            "send_high_risk_email") in out
    assert ax(["tasks", "diff", source, fork, "--home", home, "--json"]) == 0
    diff = json.loads(capsys.readouterr().out)
    # Topological order, ties in document order.
    assert diff["differing"] == ["extract_metrics", "assess_risk", "send_high_risk_email",
                                 "notify_high_risk", "send_medium_risk_email",
                                 "log_completion"]
    assert diff["b"]["path"][-1] == "send_high_risk_email"


def test_fork_refusals_exit_1_with_the_reason(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    home = str(tmp_path)
    assert ax(["run", DAG, "--input", ACME, "--home", home, "--json"]) == 0
    source = json.loads(capsys.readouterr().out)["task_id"]
    assert ax(["fork", source, "--from", "send_alert", "--home", home]) == 1
    assert "never reached node 'send_alert'" in capsys.readouterr().err
    assert ax(["tasks", "fork", source, "--from", "parse_pdf", "--set",
               "extract_metrics.output={}", "--home", home]) == 2
    assert "only the fork point's output" in capsys.readouterr().err
    assert ax(["tasks", "diff", source, "t-missing", "--home", home]) == 1


def test_a_large_map_is_summarised_in_the_table_and_the_path(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dag = tmp_path / "bigmap.yaml"
    dag.write_text('name: bigmap\nnodes:\n  fan:\n    type: tool_call\n    tool: echo\n'
                   '    map: "{{ range(40) | list }}"\n    input: "{{ .item }}"\n'
                   '    next: done\n  done:\n    type: tool_call\n    tool: echo\n'
                   '    input: "{{ .nodes.fan.output | length }}"\n')
    home = str(tmp_path / "home")
    assert ax(["run", str(dag), "--home", home, "--quiet"]) == 0
    out = capsys.readouterr().out
    task = out.split("task ")[-1].split()[0]
    assert "path: fan[40 items] -> fan -> done" in out
    assert "fan[7] " in out and "fan[8] " not in out
    assert "fan[8..39]" in out and "32 more items: 32 SUCCEEDED" in out
    assert f"ax tasks show {task} --all" in out
    assert ax(["tasks", "show", task, "--home", home, "--all"]) == 0
    every = capsys.readouterr().out
    assert all(f"fan[{i}] " in every for i in range(40)) and "more items" not in every
