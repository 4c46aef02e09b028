"""``ax dags`` and ``ax approvals``: locally, and through an ``ax server``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from axengine.cli import main as ax
from axengine.cli.inbox import ago
from tests.test_remote_cli import AxServer, _submit_gated
from tests.test_remote_cli import server as server  # the `ax server` fixture, reused

GATE = """\
name: inbox_gated
nodes:
  review:
    type: human_gateway
    description: "check the quarterly numbers before they go out to every customer we have"
    timeout: 86400
"""


@pytest.fixture(autouse=True)
def no_ax_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AX_SERVER", "AX_TOKEN", "AX_TOKEN_FILE", "AX_HOME"):
        monkeypatch.delenv(name, raising=False)


def test_ago_uses_the_largest_unit() -> None:
    assert ago(1000.0, now=1005.0) == "5s ago"
    assert ago(1000.0, now=1000.0 + 12 * 60 + 30) == "12m ago"
    assert ago(1000.0, now=1000.0 + 3 * 3600) == "3h ago"
    assert ago(1000.0, now=1000.0 + 2 * 86400) == "2d ago"
    assert ago(1000.0, now=900.0) == "0s ago"


def test_local_dags_and_approvals(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dag = tmp_path / "gated.yaml"
    dag.write_text(GATE)
    home = str(tmp_path / "home")
    # Nothing stored yet: empty lists, headers only in the table.
    assert ax(["approvals", "--home", home, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == []
    assert ax(["run", str(dag), "--home", home, "--json"]) == 3  # paused at the gate
    run = json.loads(capsys.readouterr().out)
    task = run["task_id"]

    assert ax(["approvals", "--home", home, "--json"]) == 0
    gates = json.loads(capsys.readouterr().out)
    assert [(g["task_id"], g["node_id"], g["dag_name"]) for g in gates] == \
        [(task, "review", "inbox_gated")]
    assert gates[0]["description"].startswith("check the quarterly numbers")
    assert gates[0]["waiting_since"] > 0 and gates[0]["gate_until"] > gates[0]["waiting_since"]

    assert ax(["approvals", "--home", home]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:3] == ["TASK", "NODE", "WAITING"]
    assert task in table[1] and "review" in table[1] and "ago)" in table[1]
    assert table[1].endswith("…") and "every customer we have" not in table[1]

    assert ax(["dags", "--home", home, "--json"]) == 0
    dags = json.loads(capsys.readouterr().out)
    assert [(d["name"], d["nodes"]) for d in dags] == [("inbox_gated", 1)]
    dag_hash = dags[0]["hash"]
    assert ax(["dags", "--home", home]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[1].split() == [dag_hash[:12], "inbox_gated", "1"]

    # Decided (with edits): the gate leaves the list and passes the edited data on.
    assert ax(["approve", task, "review", "--home", home, "--data", "{oops"]) == 2
    assert "--data" in capsys.readouterr().err
    assert ax(["approve", task, "review", "--home", home, "-m", "fixed",
               "--data", '{"numbers": "corrected"}']) == 0
    assert "review approved with edits by" in capsys.readouterr().out
    assert ax(["tasks", "show", task, "--home", home, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["nodes"]["review"]["output"]["data"] == {"numbers": "corrected"}
    assert ax(["approvals", "--home", home, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == []


def test_limit_and_remote_flags_are_checked(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        ax(["dags", "--limit", "0", "--home", str(tmp_path)])
    assert "must be at least 1" in capsys.readouterr().err
    assert ax(["approvals", "--home", str(tmp_path), "--server", "http://127.0.0.1:1"]) == 2
    assert "--home names a local store" in capsys.readouterr().err


@pytest.mark.slow
def test_remote_dags_and_approvals(server: AxServer,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    task = _submit_gated(server, capsys, "inbox")
    flags = ["--server", server.url, "--token-file", server.token_file("app")]
    assert ax(["approvals", *flags, "--json", "--limit", "1000"]) == 0
    gate = next(g for g in json.loads(capsys.readouterr().out) if g["task_id"] == task)
    assert gate["node_id"] == "review" and gate["description"] == "check inbox"
    assert ax(["approvals", *flags]) == 0
    assert any(task in line and "review" in line
               for line in capsys.readouterr().out.splitlines())
    assert ax(["dags", *flags, "--json"]) == 0
    dags = json.loads(capsys.readouterr().out)
    assert "remote_gated" in [d["name"] for d in dags]
    # Without a token the server refuses, in one line.
    assert ax(["dags", "--server", server.url]) == 1
    assert "requires a token" in capsys.readouterr().err
