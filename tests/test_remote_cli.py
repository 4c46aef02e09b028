"""The store commands with ``--server``: against a real ``ax server`` (a subprocess, the
embedded store, a tokens file), each works with a token and fails with one clear line
without; and the listing routes ``GET /v1/dags`` and ``GET /v1/approvals``."""

from __future__ import annotations

import json
import os
import pty
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from axengine.cli import main as ax
from axengine.client import Client
from axengine.client._core import Core
from axengine.client._sync import sync_op
from tests.servers import ax_server_process, free_port

#: A real `ax server` subprocess, like tests/api/test_server.py.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
TOKENS = {"root": ("tok-root-0123456789", "admin"), "alice": ("tok-alice-0123456789", "approve"),
          "app": ("tok-app-012345678901", "submit"),
          "dana": ("tok-dana-0123456789", "submit,approve")}
GATED = """\
name: remote_gated
nodes:
  draft:
    type: tool_call
    tool: echo
    input: {text: "{{ .input.text }}"}
    next: review
  review:
    type: human_gateway
    description: "check {{ .input.text }}"
    input: "{{ .nodes.draft.output }}"
    timeout: 3600
    next:
      - condition: "{{ .output.decision == 'approve' }}"
        target: publish
  publish:
    type: tool_call
    tool: echo
    input: {done: true}
"""


@dataclass
class AxServer:
    url: str
    dir: Path

    def token_file(self, name: str) -> str:
        return str(self.dir / f"{name}.token")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AxServer]:
    where = tmp_path_factory.mktemp("remote")
    tokens = where / "tokens.yaml"
    tokens.write_text(json.dumps({"tokens": [
        {"name": name, "token": token, "roles": role.split(",")}
        for name, (token, role) in TOKENS.items()]}))
    tokens.chmod(0o600)
    for name, (token, _) in TOKENS.items():
        (where / f"{name}.token").write_text(f"# {name}\n{token}\n")
    (where / "gated.yaml").write_text(GATED)
    with ax_server_process(tokens, where / "home") as url:
        yield AxServer(url, where)


@pytest.fixture(autouse=True)
def no_ax_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AX_SERVER", "AX_TOKEN", "AX_TOKEN_FILE", "AX_HOME"):
        monkeypatch.delenv(name, raising=False)


def _submit_gated(server: AxServer, capsys: pytest.CaptureFixture[str], text: str) -> str:
    code = ax(["run", str(server.dir / "gated.yaml"), "-i", json.dumps({"text": text}),
               "--server", server.url, "--token-file", server.token_file("root"), "--json"])
    captured = capsys.readouterr()
    assert code == 3, captured
    return str(json.loads(captured.out)["task_id"])


def test_run_approve_resume_through_the_server(
        server: AxServer, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    task = _submit_gated(server, capsys, "one")
    # ...the hints name remote commands, never the token.
    code = ax(["run", "--resume", task, "--server", server.url,
               "--token-file", server.token_file("root")])
    captured = capsys.readouterr()
    assert code == 3
    assert f"ax approve {task} review --server {server.url}" in captured.err
    assert f"ax run --resume {task} --server {server.url}" in captured.err
    assert "tok-" not in captured.out + captured.err

    # Deciding needs the approve role: a submitter's token is refused with a 403 line.
    assert ax(["approve", task, "review", "--server", server.url,
               "--token-file", server.token_file("app")]) == 1
    err = capsys.readouterr().err
    assert "403" in err and "lacks the role" in err and len(err.strip().splitlines()) == 1
    assert ax(["approve", task, "review", "-m", "fine", "--server", server.url,
               "--token-file", server.token_file("alice")]) == 0
    assert f"--server {server.url}" in capsys.readouterr().out
    assert ax(["run", "--resume", task, "--server", server.url, "--json",
               "--token-file", server.token_file("root")]) == 0
    done = json.loads(capsys.readouterr().out)
    assert done["status"] == "SUCCEEDED" and done["path"][-1] == "publish"

    # show and list, with the token in the environment this time.
    monkeypatch.setenv("AX_SERVER", server.url)
    monkeypatch.setenv("AX_TOKEN_FILE", server.token_file("app"))
    assert ax(["tasks", "show", task]) == 0
    shown = capsys.readouterr().out
    assert "status SUCCEEDED" in shown and "approve by alice: fine" in shown
    assert ax(["tasks", "list", "--status", "succeeded", "--json"]) == 0
    assert task in [t["task_id"] for t in json.loads(capsys.readouterr().out)]


def test_the_gate_prompt_of_a_remote_run_decides_as_the_token(
        server: AxServer, capsys: pytest.CaptureFixture[str]) -> None:
    """`ax run --server` on a terminal asks at the gate; the decision is recorded by the
    token's principal (dana), never by the local user name."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "axengine.cli", "run", str(server.dir / "gated.yaml"), "-i",
         json.dumps({"text": "prompted"}), "--server", server.url,
         "--token-file", server.token_file("dana")],
        cwd=ROOT, stdin=slave, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        env={k: v for k, v in os.environ.items() if not k.startswith("AX_")})
    os.close(slave)
    seen = b""
    try:
        assert proc.stdout is not None
        while b"approve or reject?" not in seen:
            chunk = proc.stdout.read1(4096)
            assert chunk, seen.decode()
            seen += chunk
        os.write(master, b"a\n")
        rest, _ = proc.communicate(timeout=30)
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    out = (seen + rest).decode()
    assert proc.returncode == 0, out
    task = re.search(r"task (t-\w+)", out)
    assert task is not None, out
    with Client(server.url, token=TOKENS["root"][0]) as client:
        review = client.task_view(task.group(1)).snapshots["review"]
    assert review.decision is not None
    assert review.decision["by"] == "dana" and review.decision["decision"] == "approve"
    assert review.decision["comment"] == "decided with ax run"
    # The history is shown before the prompt, and once.
    assert out.index("waiting for a decision") < out.index("approve or reject?")
    assert out.count("committed  -> review") == 1


def test_reject_cancel_retry_export(server: AxServer, capsys: pytest.CaptureFixture[str],
                                    tmp_path: Path) -> None:
    admin = ["--server", server.url, "--token-file", server.token_file("root")]
    rejected = _submit_gated(server, capsys, "two")
    assert ax(["reject", rejected, "review", *admin]) == 0
    assert "rejected" in capsys.readouterr().out
    cancelled = _submit_gated(server, capsys, "three")
    assert ax(["cancel", cancelled, *admin]) == 0
    assert f"task {cancelled}: cancelled" in capsys.readouterr().out
    # --by is the local store's: the server records the token's name.
    assert ax(["tasks", "cancel", cancelled, "--by", "bob", *admin]) == 2
    assert "token" in capsys.readouterr().err
    assert ax(["retry", cancelled, "--from", "review", *admin]) == 0
    assert f"ax run --resume {cancelled} --server {server.url}" in capsys.readouterr().out

    out = tmp_path / "fixture.json"
    assert ax(["snapshot", "export", rejected, "-o", str(out), *admin]) == 0
    fixture = json.loads(out.read_text())
    assert fixture["task"]["task_id"] == rejected and fixture["dag"]["name"] == "remote_gated"
    review = next(s for s in fixture["snapshots"] if s["node_id"] == "review")
    assert review["decision"]["decision"] == "reject" and review["decision"]["by"] == "root"
    assert any(e["kind"] == "decided" for e in fixture["events"])
    # The fixture restores into a local store.
    home = str(tmp_path / "home")
    assert ax(["snapshot", "import", str(out), "--home", home]) == 0
    capsys.readouterr()
    assert ax(["tasks", "show", rejected, "--home", home]) == 0
    assert "remote_gated" in capsys.readouterr().out


def test_fork_and_diff_through_the_server(server: AxServer,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    admin = ["--server", server.url, "--token-file", server.token_file("root")]
    source = _submit_gated(server, capsys, "four")
    assert ax(["reject", source, "review", *admin]) == 0
    capsys.readouterr()
    # --by is the local store's; a submitter may not fork.
    assert ax(["fork", source, "--from", "draft", "--by", "bob", *admin]) == 2
    assert "token" in capsys.readouterr().err
    assert ax(["fork", source, "--from", "draft", "--server", server.url,
               "--token-file", server.token_file("app")]) == 1
    capsys.readouterr()
    assert ax(["fork", source, "--from", "draft", "--set",
               'draft.output={"text": "forked"}', *admin]) == 0
    out = capsys.readouterr().out
    fork = out.split(" as ", 1)[1].split(";", 1)[0]
    assert f"ax run --resume {fork} --server {server.url}" in out
    assert ax(["tasks", "diff", source, fork, *admin, "--json"]) == 0
    diff = json.loads(capsys.readouterr().out)
    assert diff["a"]["status"] == "SUCCEEDED" and diff["b"]["status"] == "PAUSED"
    assert diff["differing"][:2] == ["draft", "review"]
    assert diff["nodes"][0]["b"]["output"] == {"text": "forked"}


@pytest.mark.parametrize("argv", [
    ["run", "{gated}"], ["run", "--resume", "t-x"], ["tasks", "list"], ["tasks", "show", "t-x"],
    ["approve", "t-x", "review"], ["reject", "t-x", "review"], ["cancel", "t-x"],
    ["retry", "t-x", "--from", "review"], ["snapshot", "export", "t-x"],
])
def test_every_remote_command_fails_clearly_without_a_token(
        server: AxServer, capsys: pytest.CaptureFixture[str], argv: list[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    argv = [a.format(gated=server.dir / "gated.yaml") for a in argv]
    assert ax([*argv, "--server", server.url]) == 1
    err = capsys.readouterr().err.strip()
    assert err.splitlines() == [err]  # one line, no traceback
    assert "requires a token (401)" in err and "--token-file" in err
    monkeypatch.setenv("AX_SERVER", server.url)
    monkeypatch.setenv("AX_TOKEN", "tok-unknown-000000000")
    assert ax(argv) == 1
    err = capsys.readouterr().err
    assert "does not know the token from $AX_TOKEN (401" in err


def test_unreachable_server_and_bad_settings(capsys: pytest.CaptureFixture[str],
                                             tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    assert ax(["tasks", "list", "--server", url]) == 1
    assert f"cannot reach an ax server at {url}" in capsys.readouterr().err
    assert ax(["tasks", "list", "--server", url, "--home", str(tmp_path)]) == 2
    assert "--home names a local store" in capsys.readouterr().err
    assert ax(["tasks", "list", "--server", url, "--token-file", str(tmp_path / "no")]) == 2
    assert "--token-file" in capsys.readouterr().err
    assert ax(["tasks", "list", "--server", "127.0.0.1:8080"]) == 2
    assert "give the REST URL" in capsys.readouterr().err


# ---------------------------------------------------------------------------- new routes


def test_dags_and_approvals_routes(server: AxServer,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    task = _submit_gated(server, capsys, "four")
    token = TOKENS["app"][0]
    with httpx.Client(base_url=server.url, timeout=30,
                      headers={"Authorization": f"Bearer {token}"}) as http:
        dags = http.get("/v1/dags").json()
        mine = [d for d in dags["dags"] if d["name"] == "remote_gated"]
        assert len(mine) == 1 and mine[0]["nodes"] == 3 and mine[0]["stored_revision"] > 0
        assert http.get(f"/v1/dags/{mine[0]['hash']}").json()["name"] == "remote_gated"
        approvals = http.get("/v1/approvals").json()
        gate = next(a for a in approvals["approvals"] if a["task_id"] == task)
        assert gate["node_id"] == "review" and gate["description"] == "check four"
        assert gate["submitted_by"] == "root" and gate["dag_name"] == "remote_gated"
        assert gate["input"] == {"text": "four"}
        assert gate["waiting_since"] > 0 and gate["gate_until"] > gate["waiting_since"]
        assert http.get("/v1/approvals", params={"limit": 0}).status_code == 400
        assert http.get("/v1/dags", params={"page_token": "zz"}).status_code == 400
        # Pages: one DAG per page walks them all by hash.
        seen, params = [], {"limit": 1}
        while True:
            page = http.get("/v1/dags", params=params).json()
            seen += [d["hash"] for d in page["dags"]]
            if not page["next_page_token"]:
                break
            params = {"limit": 1, "page_token": page["next_page_token"]}
        assert seen == sorted(d["hash"] for d in dags["dags"])
    assert httpx.get(f"{server.url}/v1/approvals", timeout=30).status_code == 401

    with Client(server.url, token) as client:
        listed = sync_op(Core.list_dags)(client)
        assert {d["hash"] for d in listed} == set(seen)
        waiting = sync_op(Core.list_approvals)(client, limit=1000)
        assert task in [a["task_id"] for a in waiting]
    with Client(server.url, TOKENS["alice"][0]) as client:
        client.approve(task, "review")
        assert task not in [a["task_id"] for a in sync_op(Core.list_approvals)(client)]
